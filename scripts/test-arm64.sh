#!/usr/bin/env bash
# make test-arm64: a Raspberry Pi-like aarch64 device, emulated with qemu-user, installs the
# device part of clusterfed (`pip install clusterfed`, no extras) and joins a TLS SuperLink on
# 127.0.0.1 for one round of a real run beside two native SuperNodes. Writes
# benchmarks/results/arm64/ (install size before/after, state_dict check, round times).
#
# Works from a fresh clone on a Debian 12 x86_64 host as root: installs qemu-user-static,
# binfmt-support and debootstrap (apt), builds a Debian 12 arm64 rootfs (Python 3.11.2) under
# $CLUSTERFED_CACHE/arm64 (default /var/cache/clusterfed; reused on later runs: the first
# takes ~30 min) and a venv in it. Under qemu aarch64 is ~100x slower than native: the run
# is one round of FedAvg on digits with 3 clients.
#
# Environment: CLUSTERFED_CACHE, CLUSTERFED_VENV (the host's venv with clusterfed[server]
# and flwr; default .venv, which `make test-arm64` creates), PORT (SuperLink, default 9390).
# Steps: scripts/test-arm64.sh [setup] [rootfs] [install] [before] [x86] [models] [native] [emulated]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${CLUSTERFED_CACHE:-/var/cache/clusterfed}/arm64
VENV=${CLUSTERFED_VENV:-$ROOT/.venv}
ROOTFS=$CACHE/rootfs
RESULTS=$ROOT/benchmarks/results/arm64
PORT=${PORT:-9390}
RUN=$CACHE/run                 # host side of the run: certs, data, outputs, logs
DEV_RUN=/opt/run               # the same files inside the rootfs
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$CACHE" "$RESULTS" "$RUN"
TIMINGS=$CACHE/timings.txt
touch "$TIMINGS"

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

timed() {
    local name=$1 t0 t1
    shift
    t0=$(date +%s.%N)
    "$@"
    t1=$(date +%s.%N)
    sed -i "/^$name /d" "$TIMINGS"
    echo "$name $(echo "$t1 - $t0" | bc)" >> "$TIMINGS"
    log "$name: $(echo "$t1 - $t0" | bc) s"
}

[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap, chroot, binfmt)" >&2; exit 1; }

# Run a command on the emulated device: a clean environment (nothing of the host's leaks in),
# the Cortex-A72 of a Raspberry Pi 4 as CPU model.
dev() {
    chroot "$ROOTFS" /usr/bin/env -i PATH=/opt/device/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LANG=C.UTF-8 QEMU_CPU=cortex-a72 PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$@"
}

mounts() {
    # /proc and /dev, never /sys (torch segfaults under qemu-user when it can read /sys)
    mountpoint -q "$ROOTFS/proc" || mount -t proc proc "$ROOTFS/proc"
    mountpoint -q "$ROOTFS/dev" || mount --rbind /dev "$ROOTFS/dev"
    cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
}

unmount() {
    mountpoint -q "$ROOTFS/proc" && umount "$ROOTFS/proc" || true
    mountpoint -q "$ROOTFS/dev" && umount -R "$ROOTFS/dev" || true
}

setup() {
    local need=()
    for pkg in qemu-user-static binfmt-support debootstrap bc curl openssl; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    if [ ${#need[@]} -gt 0 ]; then
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
    fi
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable qemu-aarch64 || true
    grep -q enabled /proc/sys/fs/binfmt_misc/qemu-aarch64
}

rootfs() {
    if [ ! -f "$ROOTFS/.clusterfed-stage2" ]; then
        rm -rf "$ROOTFS"
        timed debootstrap_stage1 nice -n 19 debootstrap --arch=arm64 --foreign --variant=minbase \
            --include=python3,python3-venv,python3-pip,ca-certificates bookworm "$ROOTFS" \
            http://deb.debian.org/debian
        timed debootstrap_stage2 nice -n 19 chroot "$ROOTFS" /debootstrap/debootstrap --second-stage
        touch "$ROOTFS/.clusterfed-stage2"
    fi
    # pip on the device trusts what this machine's pip trusts (the CAs added here)
    if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
        cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
        dev update-ca-certificates >/dev/null
    fi
    dev python3 --version
}

# Resolve on the device (its own markers: platform_machine == "aarch64"), download on the host
# (qemu makes TLS slow), install on the device from those files only.
# fetch REPORT DIR: download every file of a pip --report into DIR
fetch() {
    "$VENV/bin/python" - "$1" "$2" <<'PY'
import json, pathlib, subprocess, sys
report, folder = json.load(open(sys.argv[1])), pathlib.Path(sys.argv[2])
folder.mkdir(parents=True, exist_ok=True)
for item in report["install"]:
    url = item["download_info"]["url"]
    if url.startswith("file:"):
        continue
    target = folder / url.rsplit("/", 1)[1]
    if not target.exists():
        subprocess.run(["curl", "-sSfL", "--retry", "3", "-o", str(target) + ".part", url], check=True)
        target.with_name(target.name + ".part").rename(target)
PY
}

install() {
    mounts
    rm -rf "$CACHE/dist" && mkdir -p "$CACHE/dist"
    "$VENV/bin/python" -m pip wheel -q --no-deps "$ROOT" -w "$CACHE/dist"
    local wheel
    wheel=$(basename "$CACHE"/dist/clusterfed-*.whl)
    rm -rf "$ROOTFS/opt/dist" && cp -r "$CACHE/dist" "$ROOTFS/opt/dist"
    # the device's pip, as a Pi would run it: `pip install "clusterfed-*.whl[torch]"` (torch is an extra)
    timed resolve_after dev python3 -m pip install -q --dry-run --ignore-installed \
        --break-system-packages --report /opt/dist/report-after.json "/opt/dist/$wheel[torch]"
    fetch "$ROOTFS/opt/dist/report-after.json" "$CACHE/wheels"
    rm -rf "$ROOTFS/opt/wheels" && mkdir -p "$ROOTFS/opt/wheels"
    cp "$CACHE"/wheels/* "$ROOTFS/opt/wheels/"
    rm -rf "$ROOTFS/opt/device"
    dev python3 -m venv /opt/device
    timed install_after dev /opt/device/bin/pip install -q --no-index --find-links /opt/wheels \
        "/opt/dist/$wheel[torch]"
    dev /opt/device/bin/pip freeze > "$CACHE/freeze-after.txt"
    du -sb "$ROOTFS/opt/device" | cut -f1 > "$CACHE/venv-after.bytes"
    du -sb "$ROOTFS/opt/device/lib/python3.11/site-packages"/* | sort -rn | sed -n 1,12p > "$CACHE/largest-after.txt"
    cp "$ROOTFS/opt/dist/report-after.json" "$CACHE/report-after.json"
}

# What `pip install` asked for before this change on a Pi (torch 2.14.1, torchvision 0.29.1):
# resolved on the device, downloaded on the host, unpacked on the host (not installed: 3+ GB
# under qemu) and measured.
before() {
    mounts
    # a fixed past state: resolved once (8 min under qemu), then reused; FORCE_BEFORE=1 redoes it
    if [ -f "$CACHE/report-before.json" ] && [ "${FORCE_BEFORE:-0}" != 1 ]; then
        fetch "$CACHE/report-before.json" "$CACHE/wheels-before"
        return 0
    fi
    mkdir -p "$ROOTFS/opt/dist"
    timed resolve_before dev python3 -m pip install -q --dry-run --ignore-installed \
        --break-system-packages --report /opt/dist/report-before.json \
        flwr==1.41.0 torch==2.14.1 torchvision==0.29.1 "numpy>=1.26" "pydantic>=2.6"
    cp "$ROOTFS/opt/dist/report-before.json" "$CACHE/report-before.json"
    fetch "$CACHE/report-before.json" "$CACHE/wheels-before"
}

# The same wheel on this x86_64 host (pins unchanged there): the size of a device install.
x86() {
    local venv=$CACHE/x86-device python
    python=$("$VENV/bin/python" -c 'import sys; print(sys._base_executable)')
    [ -f "$(ls "$CACHE"/dist/clusterfed-*.whl 2>/dev/null | head -1)" ] \
        || "$VENV/bin/python" -m pip wheel -q --no-deps "$ROOT" -w "$CACHE/dist"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    timed install_x86_64 "$venv/bin/pip" install -q "$(ls "$CACHE"/dist/clusterfed-*.whl | head -1)"
    "$venv/bin/pip" freeze > "$CACHE/freeze-x86_64.txt"
    du -sb "$venv" | cut -f1 > "$CACHE/venv-x86_64.bytes"
    rm -rf "$venv"
}

models() {
    mounts
    mkdir -p "$ROOTFS$DEV_RUN"
    cp "$ROOT/scripts/arm64/model_shapes.py" "$ROOTFS$DEV_RUN/"
    timed model_shapes_emulated dev /opt/device/bin/python "$DEV_RUN/model_shapes.py" > "$CACHE/shapes-aarch64.json"
    PYTHONPATH=$ROOT "$VENV/bin/python" "$ROOT/scripts/arm64/model_shapes.py" > "$CACHE/shapes-x86_64.json"
    # qemu's slowdown of pure computation, beside the round times
    cp "$ROOT/scripts/arm64/compute_bench.py" "$ROOTFS$DEV_RUN/"
    dev /opt/device/bin/python "$DEV_RUN/compute_bench.py" > "$CACHE/compute-aarch64.json"
    PYTHONPATH=$ROOT "$VENV/bin/python" "$ROOT/scripts/arm64/compute_bench.py" > "$CACHE/compute-x86_64.json"
}

PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    done
    PIDS=()
    # warm workers are not the SuperNodes' children: stop them by their pid files
    for pid in "$ROOTFS"/tmp/clusterfed-0/*.pid "$RUN"/workers/*.pid; do
        [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
    done
}
trap 'cleanup; unmount' EXIT

prepare_run() {
    if [ ! -f "$RUN/certs/ca.crt" ]; then
        sh "$ROOT/scripts/make-certs.sh" "$RUN/certs" 127.0.0.1 localhost
    fi
    if [ ! -f "$RUN/parts/part-2.npz" ]; then
        "$VENV/bin/clusterfed" partition --out "$RUN/parts" --set num-clients=3 \
            --set partitioner=label-groups --set label-groups="0,1;2,3"
    fi
    mkdir -p "$ROOTFS$DEV_RUN"
    cp -r "$RUN/certs" "$RUN/parts" "$ROOTFS$DEV_RUN/"
    mkdir -p "$RUN/flwr-home"
    mkdir -p -m 700 "$RUN/workers"
    printf '[superlink.arm64]\naddress = "127.0.0.1:%s"\nroot-certificates = "%s"\n' \
        "$PORT" "$RUN/certs/ca.crt" > "$RUN/flwr-home/config.toml"
}

superlink() {
    PATH=$VENV/bin:$PATH setsid "$VENV/bin/flower-superlink" --ssl-ca-certfile "$RUN/certs/ca.crt" \
        --ssl-certfile "$RUN/certs/server.pem" --ssl-keyfile "$RUN/certs/server.key" \
        --host 127.0.0.1 --port "$PORT" --disable-runtime-dependency-installation \
        > "$RUN/superlink-$1.log" 2>&1 &
    PIDS+=($!)
    local i
    for i in $(seq 60); do
        curl -sf --cacert "$RUN/certs/ca.crt" "https://127.0.0.1:$PORT/health" >/dev/null && return 0
        sleep 1
    done
    echo "SuperLink did not start" >&2
    tail -20 "$RUN/superlink-$1.log" >&2
    return 1
}

native_node() {  # native_node PART MODE
    CLUSTERFED_WORKER_DIR=$RUN/workers PATH=$VENV/bin:$PATH setsid "$VENV/bin/flower-supernode" \
        --root-certificates "$RUN/certs/ca.crt" --superlink "127.0.0.1:$PORT" --port $((PORT + 10 + $1)) \
        --node-config "client-key=\"x86-$1\" data-path=\"$RUN/parts/part-$1.npz\"" \
        > "$RUN/supernode-$2-$1.log" 2>&1 &
    PIDS+=($!)
}

emulated_node() {  # emulated_node PART MODE
    setsid chroot "$ROOTFS" /usr/bin/env -i PATH=/opt/device/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 \
        QEMU_CPU=cortex-a72 flower-supernode --root-certificates "$DEV_RUN/certs/ca.crt" \
        --superlink "127.0.0.1:$PORT" --port $((PORT + 20 + $1)) \
        --node-config "client-key=\"pi-$1\" data-path=\"$DEV_RUN/parts/part-$1.npz\"" \
        > "$RUN/supernode-$2-$1.log" 2>&1 &
    PIDS+=($!)
}

flwr_run() {  # flwr_run MODE
    rm -rf "$RUN/out-$1"
    (cd "$ROOT" && FLWR_HOME=$RUN/flwr-home timed "run_$1" timeout 3600 "$VENV/bin/flwr" run . arm64 --stream \
        --run-config "strategy=\"fedavg\" rounds=1 num-clients=3 min-clients=3 wait-timeout=1800.0 \
timeout=3000.0 partitioner=\"label-groups\" label-groups=\"0,1;2,3\" out-dir=\"$RUN/out-$1\"") \
        > "$RUN/flwr-run-$1.log" 2>&1
    cat "$RUN/out-$1/status.json"
    echo
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(s["status"] != "ok")' "$RUN/out-$1/status.json"
}

native() {  # the reference: three native SuperNodes
    mounts
    prepare_run
    superlink native
    native_node 0 native
    native_node 1 native
    native_node 2 native
    flwr_run native
    cleanup
}

emulated() {  # part 0 on the emulated aarch64 device, parts 1 and 2 native
    mounts
    prepare_run
    superlink emulated
    emulated_node 0 emulated
    native_node 1 emulated
    native_node 2 emulated
    flwr_run emulated
    cp "$ROOTFS"/tmp/clusterfed-0/w-*.log "$RUN/" 2>/dev/null || true
    cleanup
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(setup rootfs install before x86 models native emulated)
for step in "${steps[@]}"; do
    "$step"
done
"$VENV/bin/python" "$ROOT/scripts/arm64/report.py" "$CACHE" "$RESULTS"
log "results in $RESULTS"
