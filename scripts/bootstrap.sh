#!/usr/bin/env bash
# bootstrap.sh - install everything gpuhpc needs on a fresh Debian 12 machine (as root):
# OS packages (Slurm 22.05, munge, MariaDB, PostgreSQL, Prometheus, debootstrap tools) and a Python venv
# at .venv with gpuhpc installed (editable) and its pinned dependencies (constraints.txt).
# Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[bootstrap] %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "bootstrap.sh must run as root (it installs Debian packages)" >&2; exit 1; }

pkgs=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server libslurm-dev
      postgresql-15 openssh-server openssh-client python3 python3-venv python3-dev gcc libc6-dev curl ca-certificates openssl iproute2 util-linux bc
      prometheus prometheus-node-exporter chromium
      prometheus-alertmanager   # the local stack's Alertmanager (scripts/services/prometheus.sh)
      rdma-core infiniband-diags perftest   # what gpuhpc_gpudirect_rdma installs (its test then runs changed=0)
      logrotate      # the collection's log rotation (gpuhpc_slurm_common), tested on the local cluster
      python3-torch  # real torch (1.13, CPU, gloo) for Debian's python3: the jobs tests' torch programs (tests/integration/jobs/torch_compat.py)
      libopenmpi-dev openmpi-bin   # Open MPI (with PMIx) for the MPI program in an image (tests/integration/containers)
      debootstrap)   # the multi-host lab's image (scripts/lab.sh bake)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
  # no systemd here: policy-rc.d keeps postinst scripts from starting daemons; we start them ourselves
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
say "OS packages ok (slurm $(dpkg-query -W -f='${Version}' slurmctld))"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.gpuhpc-installed
want=$(cat pyproject.toml constraints.txt | md5sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "pip install -e '.[test,postgres,ansible]'"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q -c constraints.txt -e '.[test,postgres,ansible]' --config-settings editable_mode=compat 2>&1 \
    | grep -v -E "^WARNING: (Location|The directory)" || true
  .venv/bin/python -c "import gpuhpc, sqlalchemy, submitit, click" 
  echo "$want" > "$stamp"
fi
# .venv/bin/gpuhpc stays pip's Python console script: the command server and its compiled
# client are opt-in (docs/cmdserver.md). A client left here by an older bootstrap goes unless
# the user enabled the server; an enabled one is rebuilt when client.c changed.
if [ "$(head -c4 .venv/bin/gpuhpc 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; then
  .venv/bin/python -m gpuhpc cmdserver uninstall-client --if-disabled >/dev/null
  if [ "$(head -c4 .venv/bin/gpuhpc | od -An -c | tr -d ' ')" = '177ELF' ] && [ gpuhpc/cmdserver/client.c -nt .venv/bin/gpuhpc ]; then
    say "rebuilding the gpuhpc client (gpuhpc cmdserver install-client)"
    .venv/bin/python -m gpuhpc cmdserver install-client >/dev/null
  fi
fi
say "python ok ($(.venv/bin/python --version), gpuhpc $(.venv/bin/python -c 'import gpuhpc; print(gpuhpc.__version__)'))"
