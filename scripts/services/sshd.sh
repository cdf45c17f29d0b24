#!/usr/bin/env bash
# sshd.sh start|stop - a throwaway OpenSSH server on 127.0.0.1:$PORT (default 2222) for the
# SSH transport tests, with its own host key, client key and known_hosts under $D.
# It also stands up what a laptop user finds on a login node (the laptop tests log in as them):
# * a non-root Unix user $LUSER (key auth only: its own key pair $D/laptop_ed25519, the public
#   half in its ~/.ssh/authorized_keys; no password, so sshd lets it in with UsePAM off);
# * a gpuhpc install every user can run: .venv's interpreter lives under /root (pyenv), which
#   other users cannot enter, so the site install is a venv of the system python3 at .venv/site
#   with this checkout installed editable (pip, constraints.txt), as a site installs gpuhpc on
#   a shared file system. (Its Slurm association is the tests' business: tests/integration/laptop.)
# `start` prints the environment the tests read (GPUHPC_TEST_SSH_*).
# $D must be root's and closed to others (lib.sh's private_dir; refused otherwise, for every
# subcommand): sshd trusts the keys in it, and `stop` signals the pid it holds.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
D=${D:-/var/tmp/gpuhpc-sshd}; PORT=${PORT:-2222}; LUSER=${LUSER:-gpuhpc-laptop}
REPO=$(cd "$(dirname "$0")/../.." && pwd); SITE=$REPO/.venv/site
private_dir "$D" 700
# put FILE MODE [OWNER]: stdin to FILE by rename, so that a login of another test running at the same
# time (the laptop tests run in two streams) never reads an empty or half-written file
put() {
  local tmp; tmp=$(mktemp "$1.XXXXXX"); cat > "$tmp"; chmod "$2" "$tmp"
  [ -z "${3:-}" ] || chown "$3" "$tmp"
  mv -f "$tmp" "$1"
}
case "${1:-start}" in
start)
  mkdir -p /run/sshd
  [ -f "$D/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$D/host_ed25519"
  [ -f "$D/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$D/id_ed25519"
  put "$D/authorized_keys" 600 < "$D/id_ed25519.pub"
  # the laptop user
  id -u "$LUSER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$LUSER"
  usermod -p '*' "$LUSER"                       # no password (not "!": sshd refuses locked accounts)
  home=$(getent passwd "$LUSER" | cut -d: -f6)
  [ -f "$D/laptop_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C "$LUSER" -f "$D/laptop_ed25519"
  install -d -m 700 -o "$LUSER" -g "$LUSER" "$home/.ssh"
  put "$home/.ssh/authorized_keys" 600 "$LUSER:$LUSER" < "$D/laptop_ed25519.pub"
  # the site install of gpuhpc: editable, so code changes need nothing; re-made (aside, then
  # swapped in) when the dependencies or constraints.txt change; one sshd.sh at a time does it
  want=$( { /usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"])' \
            "$REPO/pyproject.toml"; cat "$REPO/constraints.txt"; } | md5sum | cut -d' ' -f1)
  if [ "$(cat "$SITE/.gpuhpc-installed" 2>/dev/null)" != "$want" ]; then
    exec 9>"$D/site.lock"; flock 9
    if [ "$(cat "$SITE/.gpuhpc-installed" 2>/dev/null)" != "$want" ]; then
      new=$SITE.new; rm -rf "$new"; /usr/bin/python3 -m venv "$new"
      "$new/bin/python" -m pip install -q -c "$REPO/constraints.txt" -e "$REPO" --config-settings editable_mode=compat \
        2>&1 | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
      "$new/bin/python" -c "import gpuhpc, submitit, cloudpickle"
      chmod -R a+rX "$new"; echo "$want" > "$new/.gpuhpc-installed"
      # bin/python finds its venv by its own path, so the renamed venv works as is
      [ -d "$SITE" ] && mv "$SITE" "$SITE.old.$$"; mv "$new" "$SITE"; rm -rf "$SITE.old.$$"
    fi
    exec 9>&-
  fi
  echo "[127.0.0.1]:$PORT $(cut -d' ' -f1-2 "$D/host_ed25519.pub")" | put "$D/known_hosts" 644
  old=$(cat "$D/sshd_config" 2>/dev/null || true)
  put "$D/sshd_config" 600 <<EOC
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
Match User $LUSER
  AuthorizedKeysFile .ssh/authorized_keys
EOC
  if [ -s "$D/sshd.pid" ] && kill -0 "$(cat "$D/sshd.pid")" 2>/dev/null; then
    # running with an older configuration: SIGHUP makes sshd re-read it (sessions stay up)
    if [ "$old" != "$(cat "$D/sshd_config")" ]; then
      /usr/sbin/sshd -t -f "$D/sshd_config"; kill -HUP "$(cat "$D/sshd.pid")"; sleep 0.3
      for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
    fi
  else
    /usr/sbin/sshd -f "$D/sshd_config" -E "$D/sshd.log"
    for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null && break; sleep 0.1; done
  fi
  echo "GPUHPC_TEST_SSH_HOST=root@127.0.0.1:$PORT GPUHPC_TEST_SSH_KEY=$D/id_ed25519 GPUHPC_TEST_SSH_KNOWN_HOSTS=$D/known_hosts" \
    "GPUHPC_TEST_SSH_USER=$LUSER GPUHPC_TEST_SSH_USER_KEY=$D/laptop_ed25519 GPUHPC_TEST_SSH_USER_HOME=$home" \
    "GPUHPC_TEST_SSH_USER_PYTHON=$SITE/bin/python"
  ;;
stop) [ -s "$D/sshd.pid" ] && kill "$(cat "$D/sshd.pid")" 2>/dev/null; rm -f "$D/sshd.pid" ;;
*) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
