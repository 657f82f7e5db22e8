#!/usr/bin/env bash
# make test-containers: build docker/Dockerfile's images with podman and run the compose
# federation for real, as docs/deployment.md (Containers) tells an operator to:
#   plain  docker/prepare.sh (DEVICES=6, 2 groups), compose.yml + compose.devices.yml up; every
#          service is killed (kill -9 of its process) once and must come back; a FedClust run
#          (`flwr run --stream`, 2 rounds) whose status.json must say "ok" and whose clusters are the groups
#   tls    the same with compose.tls.yml + compose.devices.tls.yml, `restart` of the SuperLink,
#          and the recovery check: during the FedClust run a SuperNode and another device's
#          ClientApp container are killed (kill -9) and the SuperLink is stopped and started;
#          the run must end "ok" with every round in rounds.jsonl, every device back in the last
#          round, and the results copied to the host (`compose exec -T serverapp tar ...`)
#   semantics  what podman's restart policy does after kill -9, `podman kill`, `podman stop`,
#          `podman start`, `podman restart` (engine/semantics.json)
#   soak   the TLS federation run by the keeper service (nobody re-runs anything) while
#          scripts/containers/soak.py kills a SuperNode every SOAK_KILL_EVERY rounds, kills the
#          SuperLink twice, turns one device's data bad, and samples status.json and the Flower
#          app processes in every container (soak-short/, or SOAK_NAME)
# Writes benchmarks/results/containers/ (result.json, README.md between its generated-section
# markers, manifest.json, each run's status/summary/clusters files, engine/, soak*/) only when
# every step passed: the steps write to a copy under the cache, which is then copied over;
# a failed run leaves the committed files as they were. Hand-written README lines and
# result.json keys the script does not write are kept.
#
# Works from a fresh clone on Debian 12 as root: installs podman, buildah, runc, netavark,
# aardvark-dns, iptables, debootstrap (apt) and podman-compose 1.6.0 (PyPI, into a venv under
# the cache; Debian's 1.0.3 is not used), and a small host venv with clusterfed's core (no
# torch) under the cache; podman reads a containers.conf of its own under the cache
# (CONTAINERS_CONF: runc, open-files limit), nothing under /etc is changed. It builds local base
# images, because no container registry is reachable here:
#   localhost/clusterfed-py311:bookworm      Debian 12 minbase + python3 (debootstrap), with this
#                                            machine's CA bundle (pip in builds trusts what the
#                                            machine's pip trusts: PIP_CERT / local CAs)
#   docker.io/flwr/{superlink,supernode,superexec}:1.41.0
#                                            stand-ins (scripts/containers/flwr-standin.Containerfile)
# With Docker and a registry none of this is needed: see docs/deployment.md, Containers.
#
# torch in the images: TORCH_INDEX set → from there (TORCH as the Dockerfile's default unless set);
# else a torch wheel in docker/wheels/; else PyTorch's CPU index if it answers within 10 s; else
# the CPU wheel this machine's pip has (`pip download torch==$LOCAL_TORCH`, 2.13.0+cpu here),
# copied to docker/wheels/ (without torchvision: no CPU build of it is at hand then).
#
# Environment: CLUSTERFED_CACHE (default /var/cache/clusterfed), CLUSTERFED_VENV (the host's
# venv with `clusterfed` and `flwr`, default the cache's host-venv, which setup makes),
# DEVICES (6), ROUNDS (4: the TLS run; the plain one runs 2), SOAK_ROUNDS (6), SOAK_KILL_EVERY
# (1), SOAK_NAME (soak-short), SOAK_MAX_MINUTES (120), SUPERLINK_PORT (9093), KEEP_UP=1 (leave
# the last federation running). Steps: scripts/test-containers.sh [setup] [preflight] [base]
# [images] [semantics] [plain] [tls] [soak] (default: all).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CLUSTERFED_CACHE:-/var/cache/clusterfed}/containers
VENV=${CLUSTERFED_VENV:-$CACHE/host-venv}
COMMITTED=$ROOT/benchmarks/results/containers
# everything is written to a copy of the committed results; copied back only when every step
# passed, so a failed run leaves benchmarks/results/containers/ as it was
RESULTS=$CACHE/results-staging
FLWR_VERSION=$(sed -n 's/^ARG FLWR_VERSION=//p' "$ROOT/docker/Dockerfile")
BASE_IMAGE=localhost/clusterfed-py311:bookworm
PROJECT=clusterfed
# the published port (compose.yml reads the same variable); another one where 9093 is taken
PORT=${SUPERLINK_PORT:-9093}
export SUPERLINK_PORT=$PORT
DEVICES=${DEVICES:-6}
ROUNDS=${ROUNDS:-4}
LOCAL_TORCH=${LOCAL_TORCH:-2.13.0}
mkdir -p "$CACHE"
TIMINGS=$CACHE/timings.txt
EVENTS=$CACHE/events.txt   # "NAME VALUE" lines for the report: restarts, recovery facts
NOISE=$CACHE/engine.log    # what podman and podman-compose print (shown when a step fails)

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
event() { echo "$*" >> "$EVENTS"; }

# timed NAME CMD...: run CMD, append "NAME SECONDS" to $TIMINGS
timed() {
    local name=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    echo "$name $(echo "$t1 - $t0" | bc)" >> "$TIMINGS"
    log "$name: $(echo "$t1 - $t0" | bc) s"
}

[ "$(id -u)" = 0 ] || { echo "run as root (podman rootful, debootstrap)" >&2; exit 1; }

setup() {
    local need=()
    for pkg in podman buildah runc netavark aardvark-dns iptables debootstrap bc curl openssl; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        log "apt-get install ${need[*]}"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
    fi
    if [ ! -x "$CACHE/tools/bin/podman-compose" ]; then
        python3 -m venv "$CACHE/tools"
        "$CACHE/tools/bin/pip" install -q "podman-compose==1.6.0"
    fi
    # the host's own venv: clusterfed's core (flwr, NumPy, SciPy, scikit-learn; no torch) for
    # docker/prepare.sh's `clusterfed partition` and `flwr run`, as the docs tell an operator
    if [ ! -x "$VENV/bin/flwr" ]; then
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install -q "$ROOT"
    fi
    # this checkout's code (the dependencies are already there)
    "$VENV/bin/pip" install -q --no-deps --force-reinstall "$ROOT"
}

# crun refuses this machine's hybrid cgroups: runc. Podman's default open-files limit is too
# low for Flower's servers. In a file of our own (CONTAINERS_CONF): /etc/containers is left as it is.
export CONTAINERS_CONF=$CACHE/containers.conf
cat > "$CONTAINERS_CONF" <<'CONF'
# written by clusterfed scripts/test-containers.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF

# podman-compose's own chatter and podman's `level=error ... systemd` lines (no systemd here to
# time health checks) go to $NOISE; shown when the command fails
compose() {
    echo "+ podman-compose $*" >> "$NOISE"
    if ! "$CACHE/tools/bin/podman-compose" --project-name "$PROJECT" "$@" >> "$NOISE" 2>&1; then
        tail -30 "$NOISE" >&2
        return 1
    fi
}

# preflight: docker/preflight.sh as the docs have an operator run it, before anything is built
# or started (the engine, the free port, the torch build argument, the host's commands, memory)
preflight() {
    torch_source
    PATH="$CACHE/tools/bin:$PATH" ENGINE=podman CLUSTERFED="$VENV/bin/clusterfed" FLWR="$VENV/bin/flwr" \
        DEVICES=$DEVICES TORCH="${TORCH:-}" "$ROOT/docker/preflight.sh" | tee "$CACHE/preflight.txt" >&2
}

base() {
    local rootfs=$CACHE/py311-rootfs
    if ! podman image exists "$BASE_IMAGE"; then
        if [ ! -x "$rootfs/usr/bin/python3" ]; then
            rm -rf "$rootfs"
            timed debootstrap_base nice -n 19 debootstrap --variant=minbase \
                --include=python3,python3-venv,python3-pip,ca-certificates,openssl \
                bookworm "$rootfs" http://deb.debian.org/debian > "$CACHE/debootstrap.log"
        fi
        # the CAs added to this machine (its pip uses /etc/ssl/certs/ca-certificates.crt)
        if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
            cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        fi
        chroot "$rootfs" update-ca-certificates >/dev/null
        chroot "$rootfs" apt-get clean
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/debootstrap
        timed import_base sh -c "tar -C '$rootfs' -c . | podman import -q --change 'CMD [\"/bin/bash\"]' - '$BASE_IMAGE'"
    fi
    for target in superlink supernode superexec; do
        timed "build_standin_$target" podman build -q --runtime runc \
            -f "$ROOT/scripts/containers/flwr-standin.Containerfile" --target "$target" \
            --build-arg BASE="$BASE_IMAGE" --build-arg FLWR_VERSION="$FLWR_VERSION" \
            -t "docker.io/flwr/$target:$FLWR_VERSION" "$ROOT/scripts/containers" > /dev/null
    done
}

# torch_source: where the images' torch comes from (TORCH_INDEX, a wheel in docker/wheels/, PyTorch's
# CPU index, or this machine's pip, downloaded into docker/wheels/), into TORCH_ARGS and TORCH;
# the preflight checks the same choice the build then makes
TORCH_ARGS=()
torch_source() {
    local wheel
    TORCH_ARGS=()
    wheel=$(ls "$ROOT"/docker/wheels/torch-*.whl 2>/dev/null | head -1 || true)
    if [ -n "${TORCH_INDEX:-}" ]; then
        TORCH_ARGS+=(--build-arg TORCH_INDEX="$TORCH_INDEX")
        echo "index $TORCH_INDEX" > "$CACHE/torch_source.txt"
    elif [ -z "$wheel" ] && curl -sf -m 10 -o /dev/null https://download.pytorch.org/whl/cpu/torch/; then
        echo "index https://download.pytorch.org/whl/cpu" > "$CACHE/torch_source.txt"
    else
        if [ -z "$wheel" ]; then
            log "PyTorch's CPU index does not answer: torch==$LOCAL_TORCH+cpu from this machine's pip"
            "$VENV/bin/python" -m pip download -q --no-deps -d "$ROOT/docker/wheels" "torch==$LOCAL_TORCH+cpu" \
                || { echo "no CPU torch wheel: put one in docker/wheels/ or set TORCH_INDEX" >&2; exit 1; }
            wheel=$(ls "$ROOT"/docker/wheels/torch-*.whl | head -1)
        fi
        echo "wheel docker/wheels/$(basename "$wheel")" > "$CACHE/torch_source.txt"
    fi
    if [ -n "$wheel" ] && [ -z "${TORCH:-}" ]; then
        # torch-2.13.0+cpu-cp311-... → torch==2.13.0+cpu
        TORCH="torch==$(basename "$wheel" | cut -d- -f2)"
    fi
    [ -z "${TORCH:-}" ] || TORCH_ARGS+=(--build-arg TORCH="$TORCH")
}

images() {
    local args
    torch_source
    args=("${TORCH_ARGS[@]}")
    log "torch: $(cat "$CACHE/torch_source.txt") ${TORCH:-}"
    timed build_client podman build -q --runtime runc -f "$ROOT/docker/Dockerfile" "${args[@]}" \
        -t clusterfed-client:0.1.0 "$ROOT" > /dev/null
    timed build_server podman build -q --runtime runc -f "$ROOT/docker/Dockerfile" "${args[@]}" \
        --build-arg EXTRAS="[server]" -t clusterfed-server:0.1.0 "$ROOT" > /dev/null
    # what each image holds: no CUDA, no Ray on the server
    for image in client server; do
        podman run --rm --entrypoint python "clusterfed-$image:0.1.0" -c \
            "import importlib.util as u, torch; print('$image', torch.__version__, 'cuda' if torch.version.cuda else 'cpu', 'ray' if u.find_spec('ray') else 'no-ray', 'torchvision' if u.find_spec('torchvision') else 'no-torchvision')" \
            >> "$CACHE/image_contents.txt"
    done
}

container() { echo "${PROJECT}_$1_1"; }
pid_of() { podman inspect --format '{{.State.Pid}}' "$(container "$1")"; }

# wait_healthy SERVICE SECONDS: podman 4.3 runs no health checks by itself here (no systemd
# timers): run the container's own check by hand until it passes
wait_healthy() {
    wait_until "$1 to be healthy" "$2" "podman healthcheck run $(container "$1") >/dev/null 2>&1" "$1"
}

# crash SERVICE: kill -9 the container's process (a crash, not `podman stop`/`kill`, which the
# restart policy treats as meant) and wait until the engine has started it again
crash() {
    local service=$1 old new t0=$SECONDS
    old=$(pid_of "$service")
    kill -9 "$old"
    while true; do
        new=$(pid_of "$service" 2>/dev/null || echo 0)
        if [ "$new" != 0 ] && [ "$new" != "$old" ]; then break; fi
        if [ $((SECONDS - t0)) -ge 90 ]; then
            echo "$service was not restarted within 90 s after kill -9" >&2
            podman ps -a --filter "name=$(container "$service")" >&2
            return 1
        fi
        sleep 1
    done
    event "restarted_after_kill_9_$MODE $service $((SECONDS - t0))"
}

services() {
    echo superlink serverapp
    local n
    for n in $(seq 1 "$DEVICES"); do echo "supernode-$n clientapp-$n"; done
}

wait_all_healthy() {
    wait_healthy superlink 120
    local n
    for n in $(seq 1 "$DEVICES"); do wait_healthy "supernode-$n" 120; done
}

volume_dir() { podman volume inspect "${PROJECT}_results" --format '{{.Mountpoint}}'; }
rounds_done() { awk 'END { print NR }' "$(volume_dir)/$1/rounds.jsonl" 2>/dev/null || echo 0; }
rounds_at_least() { [ "$(rounds_done "$1")" -ge "$2" ]; }
run_ended() { case $(run_status "$1") in ok | failed) return 0 ;; *) return 1 ;; esac; }
run_status() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("status", "?"))' \
        "$(volume_dir)/$1/status.json" 2>/dev/null || echo none
}

# federation MODE FILE...: prepare, up, crash every service, FedClust run (with the recovery
# check in the TLS mode), results to the host, down
federation() {
    local mode=$1
    shift
    MODE=$mode
    local files=() f
    for f in "$@"; do files+=(-f "$ROOT/docker/$f"); done
    log "federation $mode: ${*}"
    # what an earlier run left (the device files exist once prepare.sh has run)
    if [ -f "$ROOT/docker/compose.devices.yml" ]; then compose "${files[@]}" down -v > /dev/null 2>&1 || true; fi
    # the documented data step, then up -d without --build (the images were built and timed above)
    CLUSTERFED="$VENV/bin/clusterfed" DEVICES=$DEVICES "$ROOT/docker/prepare.sh" > "$CACHE/prepare_$mode.log"
    timed "up_$mode" compose "${files[@]}" up -d
    local t0=$SECONDS
    wait_all_healthy
    echo "healthy_$mode $((SECONDS - t0))" >> "$TIMINGS"

    # every service comes back after a crash
    local service
    for service in $(services); do crash "$service"; done
    if [ "$mode" = tls ]; then
        podman restart "$(container superlink)" >> "$NOISE" 2>&1
        event "superlink_podman_restart ok"
    fi
    wait_all_healthy
    # shellcheck disable=SC2046  # one argument per container
    podman inspect --format '{{.Name}} {{.State.Status}} restarts={{.RestartCount}}' \
        $(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT") > "$CACHE/ps_$mode.txt"

    local home=$CACHE/flwr-home-$mode
    rm -rf "$home" && mkdir -p "$home"
    # the connection as docs/deployment.md writes it: absolute certificate path, insecure for plain
    if [ "$mode" = tls ]; then
        CONNECTION=clusterfed-compose
        printf '[superlink.%s]\naddress = "127.0.0.1:%s"\nroot-certificates = "%s"\n' \
            "$CONNECTION" "$PORT" "$ROOT/docker/certs/ca.crt" > "$home/config.toml"
    else
        CONNECTION=clusterfed-plain
        printf '[superlink.%s]\naddress = "127.0.0.1:%s"\ninsecure = true\n' "$CONNECTION" "$PORT" > "$home/config.toml"
    fi
    local out=containers-$mode rounds=$ROUNDS
    [ "$mode" = tls ] || rounds=2
    local config="strategy=\"fedclust\" num-clients=$DEVICES min-clients=$DEVICES rounds=$rounds \
partitioner=\"label-groups\" label-groups=\"0-4;5-9\" absent-after=2 timeout=300.0 \
resume-from=\"auto\" out-dir=\"results/$out\""
    export FLWR_HOME=$home
    local flwr=$VENV/bin/flwr
    if [ "$mode" = plain ]; then
        (cd "$ROOT" && timed "flwr_run_$mode" timeout 1800 "$flwr" run . "$CONNECTION" --stream \
            --run-config "$config") > "$CACHE/flwr_run_$mode.log" 2>&1 || tail -40 "$CACHE/flwr_run_$mode.log" >&2
    else
        recovery_run "$out" "$config"
    fi
    unset FLWR_HOME

    # the results on the host, as the docs copy them out of the named volume
    local host=$CACHE/results-$mode
    rm -rf "$host" && mkdir -p "$host"
    "$CACHE/tools/bin/podman-compose" --project-name "$PROJECT" "${files[@]}" exec -T serverapp \
        tar -C /app/results -cf - "$out" 2>> "$NOISE" | tar -xf - --no-same-owner -C "$host"
    if [ ! -f "$host/$out/status.json" ]; then
        echo "no status.json from the $mode run on the host: see $CACHE/flwr_run_$mode.log" >&2
        podman logs --tail 40 "$(container serverapp)" >&2 || true
        compose "${files[@]}" down -v || true
        return 1
    fi
    ls -ln "$host/$out" "$host/$out/models" > "$CACHE/results_listing_$mode.txt" 2>&1 || true
    for f in status summary clusters; do
        if [ -f "$host/$out/$f.json" ]; then cp "$host/$out/$f.json" "$RESULTS/$f-$mode.json"; fi
    done
    cp "$host/$out/rounds.jsonl" "$RESULTS/rounds-$mode.jsonl"
    if [ "${KEEP_UP:-0}" = 1 ] && [ "$mode" = tls ]; then
        log "KEEP_UP=1: the federation stays up (podman-compose -p $PROJECT ${files[*]} down -v)"
    else
        timed "down_$mode" compose "${files[@]}" down -v
    fi
    "$VENV/bin/python" "$ROOT/scripts/containers/report.py" check "$RESULTS" "$mode" "$DEVICES" "$rounds" \
        || FAILED+=("$mode")
}

# recovery_run OUT CONFIG: the TLS run with crashes and a SuperLink stop/start in the middle
recovery_run() {
    local out=$1 config=$2 flwr=$VENV/bin/flwr run_id stream t0=$SECONDS
    run_id=$(cd "$ROOT" && "$flwr" run . "$CONNECTION" --format json --run-config "$config" \
        | python3 -c 'import json,sys; text = sys.stdin.read(); print(json.loads(text[text.index("{"):])["run-id"])')
    event "run_id $run_id"
    # the operator's view: `flwr log --stream`, which ends when the SuperLink goes away
    stream=$(follow "$run_id" 1)
    wait_until "round 1" 900 "rounds_at_least $out 1"
    crash supernode-2
    crash clientapp-3
    event "killed_after_round $(rounds_done "$out")"
    wait_until "round 2" 900 "rounds_at_least $out 2"
    event "superlink_stopped_after_round $(rounds_done "$out")"
    podman stop "$(container superlink)" >> "$NOISE" 2>&1
    sleep 10
    podman start "$(container superlink)" >> "$NOISE" 2>&1
    wait_healthy superlink 120
    unfollow "$stream" 1 30
    # reattach, as the docs say
    stream=$(follow "$run_id" 2)
    wait_until "the run to end" 900 "run_ended $out"
    if [ "$(run_status "$out")" = failed ]; then
        # the same command again: resume-from="auto" continues from out-dir's checkpoint
        event "resubmitted_after_failure 1"
        (cd "$ROOT" && "$flwr" run . "$CONNECTION" --format json --run-config "$config") >> "$CACHE/flwr_run_tls.log"
        wait_until "the resumed run to end" 900 "run_ended $out"
    fi
    unfollow "$stream" 2 60
    echo "flwr_run_tls $((SECONDS - t0))" >> "$TIMINGS"
    "$flwr" ls "$CONNECTION" > "$CACHE/flwr_ls_tls.txt" 2>&1 || true
}

# follow RUN_ID N: `flwr log RUN_ID --stream` in the background into flwr_log_stream_N.log; prints its pid
follow() {
    local log=$CACHE/flwr_log_stream_$2.log
    ("$VENV/bin/flwr" log "$1" "$CONNECTION" --stream > "$log" 2>&1; echo "exit $?" >> "$log") > /dev/null 2>&1 &
    echo $!
}

# unfollow PID N SECONDS: give the stream SECONDS to end by itself, then end it; record how it ended
unfollow() {
    local t0=$SECONDS
    while kill -0 "$1" 2>/dev/null && [ $((SECONDS - t0)) -lt "$3" ]; do sleep 1; done
    if kill -0 "$1" 2>/dev/null; then
        pkill -P "$1" 2>/dev/null || true  # the flwr process of that subshell
        kill "$1" 2>/dev/null || true
        event "flwr_log_stream_$2 still-attached-after-${3}s"
    else
        event "flwr_log_stream_$2 $(tail -1 "$CACHE/flwr_log_stream_$2.log" | tr ' ' '=')"
    fi
}

# wait_until WHAT SECONDS CONDITION [SERVICE]: poll CONDITION; past SECONDS show SERVICE's log
# (default: the ServerApp executor's) and fail
wait_until() {
    local t0=$SECONDS
    until eval "$3"; do
        if [ $((SECONDS - t0)) -ge "$2" ]; then
            echo "gave up waiting for $1 after ${2}s" >&2
            podman logs --tail 40 "$(container "${4:-serverapp}")" >&2 || true
            return 1
        fi
        sleep 3
    done
}

# semantics: what podman does with a container on restart: on-failure when its process is
# killed, when `podman kill` / `podman stop` end it, and to RestartCount on `podman start`
semantics() {
    local name=clusterfed-semantics out=$RESULTS/engine
    mkdir -p "$out"
    podman rm -f "$name" > /dev/null 2>&1 || true
    podman run -d --name "$name" --restart on-failure --init "$BASE_IMAGE" sleep 100000 > /dev/null
    inspect() { podman inspect --format "{{.State.$1}}" "$name"; }
    wait_pid() {  # until the container runs a process other than $1, at most 30 s
        local t0=$SECONDS
        while [ $((SECONDS - t0)) -lt 30 ]; do
            local pid; pid=$(inspect Pid)
            if [ "$pid" != 0 ] && [ "$pid" != "$1" ] && [ "$(inspect Status)" = running ]; then echo yes; return; fi
            sleep 1
        done
        echo no
    }
    {
        echo "{"
        local pid
        pid=$(inspect Pid); kill -9 "$pid"
        echo "\"kill_9_of_its_process\": {\"restarted\": \"$(wait_pid "$pid")\", \"restart_count\": $(podman inspect --format '{{.RestartCount}}' "$name")},"
        pid=$(inspect Pid); podman kill -s KILL "$name" > /dev/null; sleep 15
        echo "\"podman_kill_s_KILL\": {\"restarted\": \"$(wait_pid "$pid")\", \"exit_code\": $(inspect ExitCode), \"status\": \"$(inspect Status)\"},"
        podman start "$name" > /dev/null
        echo "\"restart_count_after_podman_start\": $(podman inspect --format '{{.RestartCount}}' "$name"),"
        pid=$(inspect Pid); podman stop "$name" > /dev/null; sleep 15
        echo "\"podman_stop\": {\"restarted\": \"$(wait_pid "$pid")\", \"exit_code\": $(inspect ExitCode), \"status\": \"$(inspect Status)\"},"
        podman start "$name" > /dev/null; pid=$(inspect Pid); podman restart "$name" > /dev/null
        echo "\"podman_restart\": {\"running\": \"$(wait_pid "$pid")\", \"restart_count\": $(podman inspect --format '{{.RestartCount}}' "$name")}"
        echo "}"
    } > "$out/semantics.json.tmp"
    podman rm -f "$name" > /dev/null
    python3 -m json.tool "$out/semantics.json.tmp" > "$out/semantics.json" && rm "$out/semantics.json.tmp"
    "$VENV/bin/python" - "$out" <<'PY'
import subprocess
import sys
from clusterfed.experiments.manifest import start_manifest, write_manifest
manifest = start_manifest({}, ["scripts/test-containers.sh", "semantics"])
engine = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout.strip()
write_manifest(sys.argv[1], manifest, engine=engine, note="a container of the base image running `sleep` under --init with --restart on-failure; each line of semantics.json is one action on it, in order")
PY
    log "podman semantics: $(tr -d '\n ' < "$out/semantics.json")"
}

# soak: the TLS federation run by the keeper service while soak.py breaks things (SuperNode
# kill -9 every SOAK_KILL_EVERY rounds, two SuperLink kill -9s, one device's data turned bad,
# the ServerApp's process killed once)
# and samples status.json and the app processes. `make test-containers` runs a short one
# (SOAK_ROUNDS=6, into soak-short/); SOAK_ROUNDS=20 SOAK_KILL_EVERY=3 SOAK_NAME=soak for the full one.
soak() {
    # every round by default: in a 6-round soak the SuperLink's kills take rounds 2 and 4, so the
    # SuperNodes die after rounds 1, 3 and 5
    local rounds=${SOAK_ROUNDS:-6} name=${SOAK_NAME:-soak-short} every=${SOAK_KILL_EVERY:-1}
    local files=(-f "$ROOT/docker/compose.yml" -f "$ROOT/docker/compose.devices.yml" -f "$ROOT/docker/compose.tls.yml"
                 -f "$ROOT/docker/compose.devices.tls.yml")
    MODE=soak
    log "soak: $rounds rounds, SuperNode kill every $every rounds, SuperLink kills after $((rounds / 3)) and $((2 * rounds / 3))"
    if [ -f "$ROOT/docker/compose.devices.yml" ]; then compose "${files[@]}" --profile keeper down -v > /dev/null 2>&1 || true; fi
    CLUSTERFED="$VENV/bin/clusterfed" DEVICES=$DEVICES "$ROOT/docker/prepare.sh" > "$CACHE/prepare_soak.log"
    rm -rf "$CACHE/soak-clean-data" && cp -r "$ROOT/docker/data" "$CACHE/soak-clean-data"
    local manifest_t0; manifest_t0=$(date -u +%Y-%m-%dT%H:%M:%S+00:00)
    export RUN_CONFIG="strategy=\"fedclust\" num-clients=$DEVICES min-clients=$((DEVICES - 1)) rounds=$rounds \
partitioner=\"label-groups\" label-groups=\"0-4;5-9\" absent-after=2 timeout=120.0 out-dir=\"results/$name\""
    export KEEPER_POLL=5
    # the documented way up: the federation and the keeper in one command; the keeper launches
    # the run as soon as the SuperLink answers, and the ServerApp waits for its devices
    timed up_soak compose "${files[@]}" --profile keeper up -d
    wait_all_healthy
    local out=$RESULTS/$name status=0
    rm -rf "$out"
    "$VENV/bin/python" "$ROOT/scripts/containers/soak.py" "$out" "$(volume_dir)" "$ROOT/docker/data" \
        --devices "$DEVICES" --rounds "$rounds" --kill-every "$every" \
        --superlink-kills "$((rounds / 3)),$((2 * rounds / 3))" --bad-after "$((rounds / 2))" \
        --serverapp-kills "$((5 * rounds / 6))" \
        --out-name "$name" --timeout 120 --poll 5 --max-minutes "${SOAK_MAX_MINUTES:-120}" || status=1
    for f in rounds.jsonl status.json clusters.json summary.json config.json; do
        if [ -f "$(volume_dir)/$name/$f" ]; then cp "$(volume_dir)/$name/$f" "$out/run-$f"; fi
    done
    podman logs "$(container keeper)" > "$out/keeper.log" 2>&1 || true
    # the clean twin (same data before it was spoiled, same keys and config) in the server image
    podman run --rm --entrypoint python -v "$CACHE/soak-clean-data:/data:ro" -v "$out:/soak:ro" \
        -v "$ROOT/scripts/containers:/scripts:ro" clusterfed-server:0.1.0 /scripts/soak_clean.py /data /soak \
        > "$out/clean.json" 2> "$CACHE/soak_clean.log" || { tail -20 "$CACHE/soak_clean.log" >&2; status=1; }
    podman inspect --format '{{.Name}} {{.State.Status}} restarts={{.RestartCount}}' \
        $(podman ps -aq --filter "label=io.podman.compose.project=$PROJECT") > "$out/containers.txt" 2>&1 || true
    "$VENV/bin/python" - "$out" "$manifest_t0" "$RUN_CONFIG" <<'PY'
import sys
from clusterfed.experiments.manifest import start_manifest, write_manifest
manifest = start_manifest({"run_config": sys.argv[3]}, ["scripts/test-containers.sh", "soak"])
manifest["started"] = sys.argv[2]
write_manifest(sys.argv[1], manifest, run_config=sys.argv[3])
PY
    if [ "${KEEP_UP:-0}" != 1 ]; then compose "${files[@]}" --profile keeper down -v || true; fi
    cp "$CACHE"/soak-clean-data/part-*.npz "$ROOT/docker/data/"  # the spoiled device's file back
    [ "$status" = 0 ] || FAILED+=(soak)
}

plain() { federation plain compose.yml compose.devices.yml; }
tls() { federation tls compose.yml compose.devices.yml compose.tls.yml compose.devices.tls.yml; }

report() {
    podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
        | grep -E 'clusterfed|flwr' > "$CACHE/images.txt" || true
    "$VENV/bin/python" "$ROOT/scripts/containers/report.py" write "$CACHE" "$RESULTS" "$DEVICES" "$ROUNDS"
}

FAILED=()
steps=("$@")
rm -rf "$RESULTS" && mkdir -p "$(dirname "$RESULTS")" && cp -r "$COMMITTED" "$RESULTS"
STAGED=$CACHE/results-staged-at  # what the steps wrote is newer than this
touch "$STAGED"
if [ ${#steps[@]} -eq 0 ]; then
    steps=(setup preflight base images semantics plain tls soak)
    : > "$TIMINGS"
    : > "$EVENTS"
    : > "$CACHE/image_contents.txt"
    : > "$NOISE"
fi
date +%s > "$CACHE/started.txt"
for step in "${steps[@]}"; do
    "$step"
done
# only a run of a federation has something to report: `setup base` alone leaves the results be
case " ${steps[*]} " in
    *" plain "* | *" tls "*) report ;;
esac
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "containers: the ${FAILED[*]} check failed (see above and $RESULTS); benchmarks/results/containers/ is left as it was" >&2
    exit 1
fi
# only what this run wrote: a file edited in the checkout meanwhile is not put back
(cd "$RESULTS" && find . -type f -newer "$STAGED" -exec cp --parents {} "$COMMITTED"/ \;)
log "results in $COMMITTED"
