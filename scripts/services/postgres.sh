#!/usr/bin/env bash
# postgres.sh start|stop|wipe|url - a throwaway PostgreSQL 15 cluster on 127.0.0.1:$PORT
# (default 55432) under $D (default /var/tmp/gpuhpc-pg), no systemd. Idempotent: `start` on a
# running cluster only prints the URL. `start` and `url` print the SQLAlchemy URL, alone on
# the last line, for the ledger tests:
#   export GPUHPC_TEST_PG_URL=$(scripts/services/postgres.sh start | tail -1)
#   -> postgresql+psycopg://postgres@127.0.0.1:55432/postgres
set -euo pipefail
. "$(dirname "$0")/lib.sh"
D=${D:-/var/tmp/gpuhpc-pg}; PORT=${PORT:-${PGPORT_TEST:-55432}}
BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
URL="postgresql+psycopg://postgres@127.0.0.1:$PORT/postgres"
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); OWNER=postgres; else AS=(); OWNER=$(id -un); fi
running() { [ -f "$D/pgdata/PG_VERSION" ] && "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" status >/dev/null 2>&1; }
# the server's files belong to $OWNER; $D itself is the caller's, 0755, closed to writes by others
private_dir "$D" 755
case "${1:-start}" in
start)
  if ! running; then
    if [ ! -f "$D/pgdata/PG_VERSION" ]; then
      install -d -o "$OWNER" -m 700 "$D/pgdata"; install -d -o "$OWNER" "$D/sock"
      "${AS[@]}" "$BIN/initdb" -D "$D/pgdata" -U postgres -A trust --no-sync -E UTF8 --locale=C.UTF-8 >/dev/null
      cat >> "$D/pgdata/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$D/sock'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOC
    fi
    if (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then echo "port $PORT already in use" >&2; exit 1; fi
    "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" -l "$D/pgdata/pg.log" -w -t 60 start >/dev/null
  fi
  "${AS[@]}" "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qtAc "select 1" >/dev/null
  echo "$URL"
  ;;
url) echo "$URL" ;;
stop) if running; then "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" -m fast -w stop >/dev/null; fi ;;
wipe)
  if running; then "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" -m immediate -w stop >/dev/null 2>&1 || true; fi
  rm -rf "$D/pgdata" "$D/sock"
  ;;
*) echo "usage: $0 start|stop|wipe|url" >&2; exit 2 ;;
esac
