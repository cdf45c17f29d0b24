#!/usr/bin/env bash
# sshd.sh start|stop - a throwaway OpenSSH server on 127.0.0.1:$PORT (default 2222) for the
# SSH transport tests, with its own host key, client key and known_hosts under $D.
# `start` prints the environment the tests read (GPUHPC_TEST_SSH_*).
set -euo pipefail
D=${D:-/var/tmp/gpuhpc-sshd}; PORT=${PORT:-2222}
case "${1:-start}" in
start)
  mkdir -p "$D" /run/sshd; chmod 700 "$D"
  [ -f "$D/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$D/host_ed25519"
  [ -f "$D/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$D/id_ed25519"
  cp "$D/id_ed25519.pub" "$D/authorized_keys"; chmod 600 "$D/authorized_keys"
  echo "[127.0.0.1]:$PORT $(cat "$D/host_ed25519.pub" | cut -d' ' -f1-2)" > "$D/known_hosts"
  cat > "$D/sshd_config" <<EOC
Port $PORT
ListenAddress 127.0.0.1
HostKey $D/host_ed25519
PidFile $D/sshd.pid
AuthorizedKeysFile $D/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
AcceptEnv LANG LC_*
EOC
  if ! { [ -s "$D/sshd.pid" ] && kill -0 "$(cat "$D/sshd.pid")" 2>/dev/null; }; then
    /usr/sbin/sshd -f "$D/sshd_config" -E "$D/sshd.log"
    for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  fi
  echo "GPUHPC_TEST_SSH_HOST=root@127.0.0.1:$PORT GPUHPC_TEST_SSH_KEY=$D/id_ed25519 GPUHPC_TEST_SSH_KNOWN_HOSTS=$D/known_hosts"
  ;;
stop) [ -s "$D/sshd.pid" ] && kill "$(cat "$D/sshd.pid")" 2>/dev/null; rm -f "$D/sshd.pid" ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
