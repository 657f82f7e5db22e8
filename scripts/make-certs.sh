#!/bin/sh
# Make a CA and a server certificate for the SuperLink (and SuperNodes' Runtime API).
#   scripts/make-certs.sh OUT_DIR NAME_OR_IP [NAME_OR_IP ...]
#   e.g. scripts/make-certs.sh certs/ 127.0.0.1 localhost superlink myhost.lan
# Writes OUT_DIR/ca.crt, ca.key, server.pem, server.key. Every name or IP given goes into
# the server certificate's subjectAltName: it must hold what devices dial.
set -eu

if [ "$#" -lt 2 ]; then
    echo "usage: $0 OUT_DIR NAME_OR_IP [NAME_OR_IP ...]" >&2
    exit 2
fi
out=$1
shift
days=${CERT_DAYS:-365}

san=""
for name in "$@"; do
    case $name in
        *:*) entry="IP:$name" ;;  # IPv6
        *[!0-9.]*) entry="DNS:$name" ;;  # anything but digits and dots is a DNS name
        *) entry="IP:$name" ;;
    esac
    san="${san:+$san,}$entry"
done

mkdir -p "$out"
umask 077
openssl genrsa -out "$out/ca.key" 4096 2>/dev/null
openssl req -x509 -new -key "$out/ca.key" -sha256 -days "$days" -subj "/CN=clusterfed CA" -out "$out/ca.crt"
openssl genrsa -out "$out/server.key" 4096 2>/dev/null
conf="$out/server.cnf"
cat > "$conf" <<CONF
[req]
distinguished_name = dn
prompt = no
req_extensions = req_ext
[dn]
CN = $1
[req_ext]
subjectAltName = $san
basicConstraints = CA:FALSE
keyUsage = digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
CONF
openssl req -new -key "$out/server.key" -config "$conf" -out "$out/server.csr"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$conf" -extensions req_ext -out "$out/server.pem" 2>/dev/null
rm -f "$out/server.csr" "$conf" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/server.pem"
echo "certificates in $out (subjectAltName: $san)"
