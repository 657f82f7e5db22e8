#!/usr/bin/env bash
# Prepare the compose federation: each device's data, the TLS certificates, and the device
# services. Run it from anywhere, before `up` (and again to change the number of devices):
#   docker/prepare.sh                       # 6 devices in 2 groups (digits 0-4 and 5-9)
#   DEVICES=12 docker/prepare.sh            # any number from 3 (FedClust needs 3 clients) to 64
# Writes, all in docker/ (ignored by git):
#   data/part-<i>.npz, data/manifest.json   `clusterfed partition` (label-groups: device i is in
#                                           group i mod 2), readable by the containers' uid 49999
#   certs/                                  a CA and one server certificate for superlink,
#                                           localhost, 127.0.0.1, supernode-1 ... supernode-64 and
#                                           CERT_NAMES (kept if there; never needed again per device)
#   compose.devices.yml                     supernode-<n> + clientapp-<n> for n = 1 .. DEVICES
#   compose.devices.tls.yml                 their TLS overlay
# Environment: DEVICES (6), DATASET (digits), LABEL_GROUPS ("0-4;5-9"), MIN_SAMPLES (samples per
# device at least, 600 / DEVICES), CERT_NAMES (more names or IPs for the certificate, e.g. the
# host's name for devices elsewhere), CLUSTERFED (the clusterfed command, default `clusterfed`).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
DEVICES=${DEVICES:-6}
DATASET=${DATASET:-digits}
LABEL_GROUPS=${LABEL_GROUPS:-0-4;5-9}
CERT_DEVICES=64
CLUSTERFED=${CLUSTERFED:-clusterfed}
APP_UID=49999  # the user of Flower's images

fail() { echo "docker/prepare.sh: $*" >&2; exit 1; }

# --- everything is checked before anything is written -------------------------------------
case $DEVICES in
    '' | *[!0-9]*) fail "DEVICES=$DEVICES is not a number" ;;
esac
[ "$DEVICES" -ge 3 ] && [ "$DEVICES" -le "$CERT_DEVICES" ] \
    || fail "DEVICES=$DEVICES: give 3 to $CERT_DEVICES (the certificate names supernode-1 ... supernode-$CERT_DEVICES)"
# at least this many samples per device (digits has 1,797 in all)
MIN_SAMPLES=${MIN_SAMPLES:-$((600 / DEVICES))}
# `up` with an older compose file that mounted docker/data/part-<i>.npz before the file existed
# leaves a directory there, made by the engine as root
for path in "$HERE"/data/part-*.npz "$HERE"/certs/ca.crt "$HERE"/certs/server.pem "$HERE"/certs/server.key; do
    if [ -d "$path" ]; then
        fail "$path is a directory, not a file: the container engine made it when the federation was
brought up before this script ran. Take the federation down and remove it (as root if needed:
sudo rm -r '$HERE/data' '$HERE/certs'), then run docker/prepare.sh again."
    fi
done
command -v "$CLUSTERFED" >/dev/null \
    || fail "'$CLUSTERFED' not found: install clusterfed on this host (pip install -e . in a venv) or set CLUSTERFED=/path/to/venv/bin/clusterfed"
command -v openssl >/dev/null || fail "openssl not found (apt-get install openssl)"
if [ -f "$HERE/certs/server.pem" ] \
    && ! openssl x509 -in "$HERE/certs/server.pem" -noout -text | grep -q "DNS:supernode-$DEVICES\b"; then
    fail "docker/certs/server.pem does not name supernode-$DEVICES: remove docker/certs to make new
certificates (and give the new ca.crt to every client), or use fewer devices"
fi

# --- data ------------------------------------------------------------------------------------
mkdir -p "$HERE/data"
rm -f "$HERE"/data/part-*.npz
"$CLUSTERFED" partition --out "$HERE/data" --set num-clients="$DEVICES" --set dataset="$DATASET" \
    --set partitioner=label-groups --set label-groups="\"$LABEL_GROUPS\"" --set min-samples="$MIN_SAMPLES"
chmod 755 "$HERE/data"
chmod 644 "$HERE"/data/*

# --- certificates ------------------------------------------------------------------------------
if [ ! -f "$HERE/certs/server.pem" ]; then
    # shellcheck disable=SC2046,SC2086  # one argument per name
    sh "$ROOT/scripts/make-certs.sh" "$HERE/certs" 127.0.0.1 localhost superlink \
        $(seq -f 'supernode-%g' 1 "$CERT_DEVICES") ${CERT_NAMES:-} | cut -c1-120
fi
# the SuperLink and SuperNodes run as uid 49999 and read the server key
if [ "$(id -u)" = 0 ]; then
    chown "$APP_UID:$APP_UID" "$HERE/certs/server.key"
elif command -v podman >/dev/null && podman info --format '{{.Host.Security.Rootless}}' 2>/dev/null | grep -q true; then
    podman unshare chown "$APP_UID:$APP_UID" "$HERE/certs/server.key"
else
    chmod 644 "$HERE/certs/server.key"
    echo "docker/prepare.sh: not root: docker/certs/server.key made readable by every local user (uid $APP_UID must read it)" >&2
fi

# --- device services ---------------------------------------------------------------------------
health=$(sed -n '/^x-health-check:/,/^$/p' "$HERE/compose.yml" | sed '1d;/^$/d;s/^ *//' | tr '\n' ' ' | sed 's/ $//')
{
    echo "# written by docker/prepare.sh (DEVICES=$DEVICES): do not edit, run it again"
    echo "services:"
    for n in $(seq 1 "$DEVICES"); do
        cat <<YAML
  supernode-$n:
    image: flwr/supernode:\${FLWR_VERSION:-1.41.0}
    command:
      - --insecure
      - --superlink=superlink:9093
      - --isolation=process
      - --host=0.0.0.0
      - --port=9094
      - --node-config=client-key="device-$n" data-path="/data/part-$((n - 1)).npz"
    restart: on-failure
    init: true
    cpus: \${SUPERNODE_CPUS:-0.5}
    mem_limit: \${SUPERNODE_MEMORY:-384m}
    pids_limit: \${SUPERNODE_PIDS:-128}
    depends_on:
      superlink:
        condition: service_healthy
    healthcheck:
      test: ["CMD", "python", "-c", "$health", "supernode-$n:9094"]
      interval: 15s
      timeout: 30s
      retries: 10
      start_period: 120s
  clientapp-$n:
    build:
      context: ..
      dockerfile: docker/Dockerfile
    image: clusterfed-client:0.1.0
    command: ["--insecure", "--runtime-api-address=supernode-$n:9094"]
    volumes:
      - ./data/part-$((n - 1)).npz:/data/part-$((n - 1)).npz:ro  # the ClientApp, not the SuperNode, reads data-path
    restart: on-failure
    init: true
    cpus: \${CLIENTAPP_CPUS:-1.0}
    mem_limit: \${CLIENTAPP_MEMORY:-1g}
    pids_limit: \${CLIENTAPP_PIDS:-128}
    depends_on:
      supernode-$n:
        condition: service_healthy
YAML
    done
} > "$HERE/compose.devices.yml"
{
    echo "# written by docker/prepare.sh (DEVICES=$DEVICES): do not edit, run it again"
    echo "services:"
    for n in $(seq 1 "$DEVICES"); do
        cat <<YAML
  supernode-$n:
    command:
      - --root-certificates=/certs/ca.crt
      - --superlink=superlink:9093
      - --isolation=process
      - --host=0.0.0.0
      - --port=9094
      - --ssl-ca-certfile=/certs/ca.crt
      - --ssl-certfile=/certs/server.pem
      - --ssl-keyfile=/certs/server.key
      - --node-config=client-key="device-$n" data-path="/data/part-$((n - 1)).npz"
    volumes:
      - ./certs:/certs:ro
  clientapp-$n:
    command: ["--root-certificates=/certs/ca.crt", "--runtime-api-address=supernode-$n:9094"]
    volumes:
      - ./certs:/certs:ro
YAML
    done
} > "$HERE/compose.devices.tls.yml"

echo "docker/prepare.sh: $DEVICES devices (data in docker/data, certificates in docker/certs,"
echo "services in docker/compose.devices.yml and compose.devices.tls.yml)"
