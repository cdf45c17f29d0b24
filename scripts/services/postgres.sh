#!/usr/bin/env bash
# postgres.sh start|stop|wipe|url - a throwaway PostgreSQL 15 cluster on 127.0.0.1:$PORT
# (default 55432) under $D (default /var/tmp/gpuhpc-pg), no systemd. Idempotent: `start` on a
# running cluster only prints the URL. `start` and `url` print the SQLAlchemy URL, alone on
# the last line, for the ledger tests:
#   export GPUHPC_TEST_PG_URL=$(scripts/services/postgres.sh start | tail -1)
#   -> postgresql+psycopg://postgres:PASSWORD@127.0.0.1:55432/postgres
# Every connection needs a password (scram-sha-256; no `trust`: other local users are not
# superusers): the superuser's is generated at initdb into $D/postgres.password, which only the
# caller (root) may read, and into the caller's ~/.pgpass (0600), so that the caller's URLs without
# a password keep working. A cluster made by an older postgres.sh with `-A trust` is given a
# password and scram on its next `start`. PG_LISTEN (an address) and PG_HBA_NET (a network allowed to log
# in with the password) make a fresh cluster listen there as well (the lab's: tests/integration/lab).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
D=${D:-/var/tmp/gpuhpc-pg}; PORT=${PORT:-${PGPORT_TEST:-55432}}
BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PWFILE=$D/postgres.password
url() { echo "postgresql+psycopg://postgres${PWFILE:+:$(cat "$PWFILE" 2>/dev/null)}@127.0.0.1:$PORT/postgres" | sed 's/postgres:@/postgres@/'; }
PGPASS=${PGPASSFILE:-${HOME:-$(getent passwd "$(id -un)" | cut -d: -f6)}/.pgpass}
remember() {  # the caller's libpq finds the password for a URL without one; "forget" drops it
  local keep
  keep=$(grep -v "^127\.0\.0\.1:$PORT:\*:postgres:" "$PGPASS" 2>/dev/null || true)
  ( umask 077; { [ -z "$keep" ] || echo "$keep"; [ "${1:-}" = forget ] || echo "127.0.0.1:$PORT:*:postgres:$(cat "$PWFILE")"; } \
      > "$PGPASS.$$"; mv "$PGPASS.$$" "$PGPASS" )
}
if [ "$(id -u)" = 0 ]; then AS=(runuser -u postgres --); OWNER=postgres; else AS=(); OWNER=$(id -un); fi
running() { [ -f "$D/pgdata/PG_VERSION" ] && "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" status >/dev/null 2>&1; }
psql_() { PGPASSWORD=$(cat "$PWFILE") "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qtA "$@"; }
# the server's files belong to $OWNER; $D itself is the caller's, 0755, closed to writes by others
private_dir "$D" 755
case "${1:-start}" in
start)
  if ! running; then
    if [ ! -f "$D/pgdata/PG_VERSION" ]; then
      install -d -o "$OWNER" -m 700 "$D/pgdata"; install -d -o "$OWNER" -m 755 "$D/sock"
      ( umask 077; head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$PWFILE" )
      install -o "$OWNER" -m 600 "$PWFILE" "$D/sock/.pw"
      "${AS[@]}" "$BIN/initdb" -D "$D/pgdata" -U postgres --auth=scram-sha-256 --pwfile="$D/sock/.pw" \
        --no-sync -E UTF8 --locale=C.UTF-8 >/dev/null
      rm -f "$D/sock/.pw"
      cat >> "$D/pgdata/postgresql.conf" <<EOC
listen_addresses = '127.0.0.1${PG_LISTEN:+,$PG_LISTEN}'
port = $PORT
unix_socket_directories = '$D/sock'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
EOC
      [ -z "${PG_HBA_NET:-}" ] || echo "host all all $PG_HBA_NET scram-sha-256" >> "$D/pgdata/pg_hba.conf"
    fi
    if (echo > "/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then echo "port $PORT already in use" >&2; exit 1; fi
    "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" -l "$D/pgdata/pg.log" -w -t 60 start >/dev/null
  fi
  if grep -qE '^[^#]*[[:space:]]trust([[:space:]]|$)' "$D/pgdata/pg_hba.conf"; then
    # made with -A trust by an older postgres.sh: a password, then scram for every connection
    [ -s "$PWFILE" ] || ( umask 077; head -c 24 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' > "$PWFILE" )
    "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qtA \
      -c "ALTER ROLE postgres PASSWORD '$(cat "$PWFILE")'" >/dev/null
    sed -i -E '/^[^#]/s/[[:space:]]trust([[:space:]]*)$/ scram-sha-256\1/' "$D/pgdata/pg_hba.conf"
    "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" reload >/dev/null
  fi
  remember
  psql_ -c "select 1" >/dev/null
  url
  ;;
url) url ;;
stop) if running; then "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" -m fast -w stop >/dev/null; fi ;;
wipe)
  if running; then "${AS[@]}" "$BIN/pg_ctl" -D "$D/pgdata" -m immediate -w stop >/dev/null 2>&1 || true; fi
  [ -s "$PWFILE" ] && remember forget
  rm -rf "$D/pgdata" "$D/sock" "$PWFILE"
  ;;
*) echo "usage: $0 start|stop|wipe|url" >&2; exit 2 ;;
esac
