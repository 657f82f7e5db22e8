#!/usr/bin/env bash
# make test-containers: build docker/Dockerfile's images with podman and run the compose
# federation for real (plain, then with the TLS overlay): a short `flwr run` whose
# out-dir/status.json must say "ok". Writes benchmarks/results/containers/ (commands,
# durations, image sizes, each run's status.json).
#
# Works from a fresh clone on Debian 12 as root: installs podman, buildah, runc, netavark,
# aardvark-dns, iptables, debootstrap (apt) and podman-compose (PyPI, into a venv under the
# cache), writes /etc/containers/containers.conf, and builds local base images, because no
# container registry is reachable here:
#   localhost/clusterfed-py311:bookworm      Debian 12 minbase + python3 (debootstrap), with this
#                                            machine's CA bundle (pip in builds trusts what the
#                                            machine's pip trusts: PIP_CERT / local CAs)
#   docker.io/flwr/{superlink,supernode,superexec}:1.41.0
#                                            stand-ins (scripts/containers/flwr-standin.Containerfile)
#   docker.io/library/alpine:3.20            stand-in for the TLS overlay's one-shot `certs`
#                                            service (the base: sh + openssl)
# With Docker and a registry none of this is needed: see docs/deployment.md, Containers.
#
# Environment: CLUSTERFED_CACHE (default /var/cache/clusterfed), CLUSTERFED_VENV (the host's
# venv with `clusterfed` and `flwr`, default .venv: `make test-containers` creates it),
# TORCH_INDEX (default: PyTorch's CPU index when reachable, else PyPI), KEEP_UP=1 (leave the
# TLS federation running).
# Steps: scripts/test-containers.sh [setup] [base] [images] [plain] [tls]   (default: all)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CLUSTERFED_CACHE:-/var/cache/clusterfed}/containers
VENV=${CLUSTERFED_VENV:-$ROOT/.venv}
RESULTS=$ROOT/benchmarks/results/containers
FLWR_VERSION=$(sed -n 's/^ARG FLWR_VERSION=//p' "$ROOT/docker/Dockerfile")
BASE_IMAGE=localhost/clusterfed-py311:bookworm
PROJECT=clusterfed
PORT=9093
mkdir -p "$CACHE" "$RESULTS"
TIMINGS=$CACHE/timings.txt

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

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

[ "$(id -u)" = 0 ] || { echo "run as root (podman rootful, debootstrap, /etc/containers)" >&2; exit 1; }

setup() {
    local need=()
    for pkg in podman buildah runc netavark aardvark-dns iptables debootstrap bc; do
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
    # crun refuses this machine's hybrid cgroups: runc. Podman's default open-files limit is too
    # low for Flower's servers.
    local conf=/etc/containers/containers.conf
    if [ ! -f "$conf" ] || grep -q "written by clusterfed" "$conf"; then
        mkdir -p /etc/containers
        cat > "$conf" <<'CONF'
# written by clusterfed scripts/test-containers.sh
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
CONF
    elif ! grep -q 'runtime *= *"runc"' "$conf"; then
        echo "$conf exists and does not set runtime = \"runc\": add it (and default_ulimits)" >&2
        exit 1
    fi
}

compose() { "$CACHE/tools/bin/podman-compose" --project-name "$PROJECT" "$@"; }

base() {
    local rootfs=$CACHE/py311-rootfs
    if ! podman image exists "$BASE_IMAGE"; then
        if [ ! -x "$rootfs/usr/bin/python3" ]; then
            rm -rf "$rootfs"
            timed debootstrap_base nice -n 19 debootstrap --variant=minbase \
                --include=python3,python3-venv,python3-pip,ca-certificates,openssl \
                bookworm "$rootfs" http://deb.debian.org/debian
        fi
        # the CAs added to this machine (its pip uses /etc/ssl/certs/ca-certificates.crt)
        if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
            cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        fi
        chroot "$rootfs" update-ca-certificates >/dev/null
        chroot "$rootfs" apt-get clean
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/debootstrap
        timed import_base sh -c "tar -C '$rootfs' -c . | podman import --change 'CMD [\"/bin/bash\"]' - '$BASE_IMAGE'"
    fi
    podman tag "$BASE_IMAGE" docker.io/library/alpine:3.20
    for target in superlink supernode superexec; do
        timed "build_standin_$target" podman build -q --runtime runc \
            -f "$ROOT/scripts/containers/flwr-standin.Containerfile" --target "$target" \
            --build-arg BASE="$BASE_IMAGE" --build-arg FLWR_VERSION="$FLWR_VERSION" \
            -t "docker.io/flwr/$target:$FLWR_VERSION" "$ROOT/scripts/containers"
    done
}

images() {
    local index=${TORCH_INDEX:-}
    if [ -z "$index" ]; then
        if curl -sf -m 15 -o /dev/null https://download.pytorch.org/whl/cpu/torch/; then
            index=https://download.pytorch.org/whl/cpu
        else
            index=https://pypi.org/simple  # no CPU index here: the x86_64 wheel (CUDA) from PyPI
        fi
    fi
    echo "$index" > "$CACHE/torch_index.txt"
    log "torch from $index"
    timed build_client podman build --runtime runc -f "$ROOT/docker/Dockerfile" \
        --build-arg TORCH_INDEX="$index" -t clusterfed-client:0.1.0 "$ROOT"
    timed build_server podman build --runtime runc -f "$ROOT/docker/Dockerfile" \
        --build-arg TORCH_INDEX="$index" --build-arg EXTRAS="[server]" -t clusterfed-server:0.1.0 "$ROOT"
}

# wait_healthy CONTAINER SECONDS: podman 4.3 runs no health checks by itself here (no systemd
# timers): run the container's own check by hand until it passes
wait_healthy() {
    local name=$1 limit=$2 t0=$SECONDS
    until podman healthcheck run "$name" >/dev/null 2>&1; do
        if [ $((SECONDS - t0)) -ge "$limit" ]; then
            echo "$name not healthy after ${limit}s" >&2
            podman logs --tail 30 "$name" >&2 || true
            return 1
        fi
        sleep 2
    done
}

# federation MODE FILE...: up, health, flwr run, status.json, down
federation() {
    local mode=$1
    shift
    local files=() f
    for f in "$@"; do files+=(-f "$ROOT/docker/$f"); done
    log "federation $mode: ${*}"
    compose "${files[@]}" down -v >/dev/null 2>&1 || true
    mkdir -p "$ROOT/docker/data"
    if [ ! -f "$ROOT/docker/data/part-1.npz" ]; then
        "$VENV/bin/clusterfed" partition --out "$ROOT/docker/data" --set num-clients=2
    fi
    chmod a+r "$ROOT"/docker/data/*.npz
    # up -d without --build: the images were built (and timed) above
    timed "up_$mode" compose "${files[@]}" up -d
    local t0=$SECONDS
    wait_healthy "${PROJECT}_superlink_1" 120
    wait_healthy "${PROJECT}_supernode-1_1" 120
    wait_healthy "${PROJECT}_supernode-2_1" 120
    echo "healthy_$mode $((SECONDS - t0))" >> "$TIMINGS"
    podman ps -a --filter "label=io.podman.compose.project=$PROJECT" \
        --format '{{.Names}} {{.Status}}' > "$CACHE/ps_$mode.txt"

    local home=$CACHE/flwr-home-$mode
    rm -rf "$home" && mkdir -p "$home"
    if [ "$mode" = tls ]; then
        printf '[superlink.containers]\naddress = "127.0.0.1:%s"\nroot-certificates = "%s"\n' \
            "$PORT" "$ROOT/docker/certs/ca.crt" > "$home/config.toml"
    else
        printf '[superlink.containers]\naddress = "127.0.0.1:%s"\ninsecure = true\n' "$PORT" > "$home/config.toml"
    fi
    local out="results/containers-$mode"
    (cd "$ROOT" && FLWR_HOME=$home timed "flwr_run_$mode" timeout 900 "$VENV/bin/flwr" run . containers --stream \
        --run-config "strategy=\"fedavg\" num-clients=2 min-clients=2 rounds=2 out-dir=\"$out\"") \
        > "$CACHE/flwr_run_$mode.log" 2>&1 || { tail -40 "$CACHE/flwr_run_$mode.log" >&2; }
    local volume
    volume=$(podman volume inspect "${PROJECT}_results" --format '{{.Mountpoint}}')
    if [ ! -f "$volume/containers-$mode/status.json" ]; then
        echo "no status.json from the $mode run: see $CACHE/flwr_run_$mode.log" >&2
        podman logs --tail 40 "${PROJECT}_serverapp_1" >&2 || true
        compose "${files[@]}" down -v >/dev/null 2>&1 || true
        return 1
    fi
    cp "$volume/containers-$mode/status.json" "$RESULTS/status-$mode.json"
    [ -f "$volume/containers-$mode/summary.json" ] && cp "$volume/containers-$mode/summary.json" "$RESULTS/summary-$mode.json"
    cat "$RESULTS/status-$mode.json"
    echo
    if [ "${KEEP_UP:-0}" = 1 ] && [ "$mode" = tls ]; then
        log "KEEP_UP=1: the federation stays up (podman-compose -p $PROJECT ${files[*]} down -v)"
    else
        timed "down_$mode" compose "${files[@]}" down -v >/dev/null
    fi
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(s["status"] != "ok")' \
        "$RESULTS/status-$mode.json"
}

plain() { federation plain compose.yml; }
tls() {
    federation tls compose.yml compose.tls.yml
}

report() {
    podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' \
        | grep -E 'clusterfed|flwr|alpine' > "$CACHE/images.txt" || true
    "$VENV/bin/python" "$ROOT/scripts/containers/report.py" "$CACHE" "$RESULTS"
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || { : > "$TIMINGS"; steps=(setup base images plain tls); }
for step in "${steps[@]}"; do
    "$step"
done
report
log "results in $RESULTS"
