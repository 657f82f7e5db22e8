#!/usr/bin/env bash
# Before anything is built or started: what would stop the compose federation on this host.
#   docker/preflight.sh            # prints one line per check; exit 1 when something must change
# Checks: a container engine and a compose tool (ENGINE=docker|podman, default: whichever is
# there); the published port SUPERLINK_PORT (9093) free; the torch build argument the images
# need (a wheel in docker/wheels/ must match TORCH, or PyTorch's CPU index must answer); on the
# host, what docker/prepare.sh and `flwr run` use (Python >= 3.11, openssl, the clusterfed and
# flwr commands: CLUSTERFED, FLWR); memory and disk for 6 devices' limits (DEVICES).
# Nothing is written, built or started.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
PORT=${SUPERLINK_PORT:-9093}
DEVICES=${DEVICES:-6}
CLUSTERFED=${CLUSTERFED:-clusterfed}
FLWR=${FLWR:-flwr}
PROBLEMS=0

ok() { echo "ok    $*"; }
bad() { echo "FIX   $*"; PROBLEMS=$((PROBLEMS + 1)); }

# --- engine and compose ------------------------------------------------------------------------
ENGINE=${ENGINE:-$(command -v docker >/dev/null && echo docker || echo podman)}
if command -v "$ENGINE" >/dev/null; then
    ok "engine: $($ENGINE --version 2>/dev/null | head -1)"
else
    bad "no container engine: install Docker Engine >= 23 or podman >= 4.3 (ENGINE=$ENGINE)"
fi
if [ "$ENGINE" = docker ]; then
    if docker compose version >/dev/null 2>&1; then ok "compose: $(docker compose version | head -1)"
    else bad "no 'docker compose' (the Compose v2 plugin): install docker-compose-plugin"; fi
else
    compose=$(command -v podman-compose || true)
    version=$([ -n "$compose" ] && podman-compose --version 2>/dev/null | sed -n 's/.*podman-compose version \([0-9.]*\).*/\1/p' | head -1)
    case $version in
        '') bad "no podman-compose: pip install podman-compose==1.6.0 (Debian's 1.0.3 is not tested)" ;;
        0.* | 1.0.*) bad "podman-compose $version is too old: pip install podman-compose==1.6.0" ;;
        *) ok "compose: podman-compose $version" ;;
    esac
fi

# --- the published port --------------------------------------------------------------------------
if python3 - "$PORT" <<'PY' 2>/dev/null
import socket, sys
with socket.socket() as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", int(sys.argv[1])))
PY
then
    ok "port $PORT is free (SUPERLINK_PORT)"
else
    bad "port $PORT is taken on this host: stop what listens there (ss -ltnp 'sport = :$PORT') or choose another, e.g. SUPERLINK_PORT=9193, and use it in the connection's address"
fi

# --- the images' torch ---------------------------------------------------------------------------
wheel=$(cd "$HERE/wheels" 2>/dev/null && ls torch-*.whl 2>/dev/null | head -1)
default=$(sed -n 's/^ARG TORCH="\(torch==[^ "]*\).*/\1/p' "$HERE/Dockerfile")
if [ -n "$wheel" ]; then
    # torch-2.13.0+cpu-cp311-... -> torch==2.13.0+cpu
    need="torch==$(printf '%s' "$wheel" | cut -d- -f2)"
    case " ${TORCH:-$default} " in
        *" $need "*) ok "torch: docker/wheels/$wheel, and TORCH asks for $need" ;;
        *) bad "docker/wheels/ holds $wheel but the build asks for '${TORCH:-$default}': add --build-arg TORCH=\"$need\" to both image builds (or export TORCH=\"$need\" before this check)" ;;
    esac
else
    index=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
    if curl -sf -m 10 -o /dev/null "$index/torch/"; then ok "torch: $index answers"
    else bad "torch: $index does not answer and docker/wheels/ holds no torch wheel: put a CPU wheel there (pip download --no-deps -d docker/wheels \"torch==2.13.0+cpu\") or pass --build-arg TORCH_INDEX=..."; fi
fi

# --- the host ------------------------------------------------------------------------------------
if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then ok "python3 $(python3 -c 'import platform; print(platform.python_version())')"
else bad "python3 >= 3.11 is needed on the host (Flower 1.41 requires it)"; fi
command -v openssl >/dev/null && ok "openssl" || bad "openssl not found (apt-get install openssl): docker/prepare.sh makes the certificates with it"
command -v "$CLUSTERFED" >/dev/null && ok "clusterfed: $(command -v "$CLUSTERFED")" \
    || bad "'$CLUSTERFED' not found: pip install -e . in a venv on this host (no torch needed) or set CLUSTERFED=/path/to/venv/bin/clusterfed"
command -v "$FLWR" >/dev/null && ok "flwr: $(command -v "$FLWR")" \
    || bad "'$FLWR' not found: it comes with clusterfed's install (or set FLWR=/path/to/venv/bin/flwr)"
# the limits' defaults for DEVICES devices (docs/deployment.md, Limits), in MiB
need_mib=$((1024 + 2048 + 512 + DEVICES * (384 + 1024)))
have_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo 2>/dev/null || echo 0)
if [ "$have_mib" -ge "$need_mib" ]; then ok "memory: $have_mib MiB available, the limits add up to $need_mib MiB"
else bad "memory: $have_mib MiB available, the default limits for $DEVICES devices add up to $need_mib MiB: lower CLIENTAPP_MEMORY (docs: Limits) or use fewer devices"; fi
store=$([ "$ENGINE" = docker ] && echo /var/lib/docker || echo /var/lib/containers)
free_gb=$(df -Pk "$(test -d "$store" && echo "$store" || echo /)" | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "${free_gb:-0}" -ge 6 ]; then ok "disk: $free_gb GB free for images (two of ~1.7 GB)"
else bad "disk: $free_gb GB free under $store; the images and their build need about 6 GB"; fi

if [ "$PROBLEMS" -gt 0 ]; then
    echo "docker/preflight.sh: $PROBLEMS to fix before building or starting" >&2
    exit 1
fi
echo "docker/preflight.sh: ready"
