#!/usr/bin/env bash
# cluster.sh build|install|up|ensure|down|purge - the local GPU Slurm cluster on this machine, stood up by
# our Ansible collection (gpuhpc.cluster) exactly as a site installs it:
#   build    copy ansible/ + slurm-conf/*.j2 into a staging tree, `ansible-galaxy collection build`
#            -> .ansible/dist/gpuhpc-cluster-<version>.tar.gz (prints the path)
#   install  build, then `ansible-galaxy collection install` it into .ansible/collections
#   up       install, then ansible/local/up.yml on the inventory ansible/inventories/local (the spec
#            rendered for this checkout, test machinery, gpuhpc.cluster.site);
#            idempotent: a second run reports changed=0 and restarts nothing; with GPUHPC_VENDOR_DIR
#            (a mirror of the enroot/pyxis source archives) the nodes also get containers
#   ensure   up, unless this checkout's last up is current: the same sources (ansible/, slurm-conf/,
#            the local spec, the gpuhpc code that renders and checks it), the same files deployed on
#            this machine (another checkout's up changes them), and slurmctld answers `scontrol ping`
#            (what scripts/test.sh -k ... runs: seconds instead of a play)
#   down     stop every daemon (gpuhpc.cluster.teardown); purge also deletes state
set -euo pipefail
cd "$(dirname "$0")/.."
unset SLURM_CONF   # the local cluster lives at /etc/slurm/slurm.conf
ROOT=$PWD
export ANSIBLE_CONFIG="$ROOT/ansible/ansible.cfg" PATH="$ROOT/.venv/bin:$PATH"
export ANSIBLE_COLLECTIONS_PATH="$ROOT/.ansible/collections"
LOCAL=ansible/inventories/local   # inventory only
PLAYS=ansible/local               # the local cluster's playbooks and test roles (not in the collection)
STAMP=$ROOT/.ansible/local/up.stamp   # "sources deployed" hashes after the last successful up of this checkout
mkdir -p "$ROOT/.ansible/local"

# containers (enroot + pyxis) only with a mirror of their source archives: GPUHPC_VENDOR_DIR (CI sets it);
# without one the cluster gets none and nothing is downloaded (docs/containers.md)
CONTAINERS=()
if [ -n "${GPUHPC_VENDOR_DIR:-}" ]; then
  if [ ! -f "$GPUHPC_VENDOR_DIR/SHA256SUMS" ]; then
    echo "cluster.sh: GPUHPC_VENDOR_DIR=$GPUHPC_VENDOR_DIR has no SHA256SUMS: point it at the enroot/pyxis source-archive mirror, or unset it for a cluster without containers" >&2
    exit 2
  fi
  CONTAINERS=(-e "$(python -c 'import json, sys; print(json.dumps({"gpuhpc_local_containers_mirror": sys.argv[1]}))' \
    "$(cd "$GPUHPC_VENDOR_DIR" && pwd)")")
fi
# a hash of what the local cluster is made from (taken before the play: an edit during it counts as new)
sources() {
  { echo "containers=${#CONTAINERS[@]}"
    git ls-files -z --cached --others --exclude-standard -- ansible slurm-conf examples/clusters/local.yaml \
      constraints.txt gpuhpc/conf gpuhpc/spec gpuhpc/health gpuhpc/topology gpuhpc/hostlist.py 2>/dev/null \
      | xargs -0 -r sha256sum 2>/dev/null || true; } | sha256sum | cut -c1-16
}
# a hash of what is deployed from it on this machine (another checkout's up changes it)
deployed() {
  { sha256sum /etc/slurm/*.conf /etc/slurm/job_submit.lua /etc/gpuhpc/hooks.env /etc/gpuhpc/billing.json 2>/dev/null || true; } \
    | sha256sum | cut -c1-16
}

build() {
  local stage="$ROOT/.ansible/build/$$" dist="$ROOT/.ansible/dist"
  rm -rf "$stage" && mkdir -p "$stage" "$dist"
  tar -C ansible --exclude=./inventories --exclude=./local --exclude=./ansible_collections --exclude=.ansible --exclude=__pycache__ --exclude='*.pyc' -cf - . \
    | tar -C "$stage" -xf -
  # the one source of the Slurm templates is slurm-conf/: the collection carries a copy
  # (slurmdbd.conf in its own role, every other template in gpuhpc_slurm_common)
  mkdir -p "$stage/roles/gpuhpc_slurm_common/templates" "$stage/roles/gpuhpc_slurmdbd/templates"
  find slurm-conf -maxdepth 1 -name '*.j2' ! -name slurmdbd.conf.j2 -exec cp {} "$stage/roles/gpuhpc_slurm_common/templates/" \;
  cp slurm-conf/slurmdbd.conf.j2 "$stage/roles/gpuhpc_slurmdbd/templates/"
  cp slurm-conf/job_submit.lua "$stage/roles/gpuhpc_slurm_common/templates/"
  # gpuhpc_login builds its venv from the project's pinned constraints: one source, carried as a copy
  mkdir -p "$stage/roles/gpuhpc_login/files"
  cp constraints.txt "$stage/roles/gpuhpc_login/files/"
  ansible-galaxy collection build "$stage" --output-path "$dist" --force >&2
  rm -rf "$stage"
  local version
  version=$(sed -n 's/^version: *//p' ansible/galaxy.yml)
  echo "$dist/gpuhpc-cluster-$version.tar.gz"
}

install() {
  # one build+install at a time; an unchanged collection is not reinstalled. Each build is installed
  # into its own directory (.ansible/versions/<digest of its FILES.json>) and the collection's path
  # becomes a link to it, swapped at once: a play still running from the previous one (another test
  # run, the lab) keeps finding every file, never a half-replaced tree
  mkdir -p "$ROOT/.ansible"
  exec 8>"$ROOT/.ansible/install.lock"
  flock 8
  local tarball link="$ANSIBLE_COLLECTIONS_PATH/ansible_collections/gpuhpc/cluster" digest dir
  tarball=$(build)
  if [ -f "$link/FILES.json" ] && tar -xzOf "$tarball" FILES.json | cmp -s - "$link/FILES.json"; then
    echo "gpuhpc.cluster: the installed collection is current" >&2
  else
    digest=$(tar -xzOf "$tarball" FILES.json | sha256sum | cut -c1-16)
    dir="$ROOT/.ansible/versions/$digest"
    rm -rf "$dir"
    ansible-galaxy collection install "$tarball" -p "$dir" --force >&2
    mkdir -p "${link%/*}"
    [ -L "$link" ] || rm -rf "$link"             # an install from before versions: a real directory
    ln -sfn "$dir/ansible_collections/gpuhpc/cluster" "$link.new" && mv -Tf "$link.new" "$link"
    # keep the five newest versions (a play that outlives five installs is not expected)
    ls -1dt "$ROOT/.ansible/versions"/*/ 2>/dev/null | tail -n +6 | xargs -r rm -rf
  fi
  flock -u 8
}

# one up/ensure/down at a time on this machine's checkout: a second waits, then finds the cluster
# current (ensure) instead of reinstalling the collection under the first one's running play
case "${1:-up}" in
  up|ensure|down|purge) exec 9>"$ROOT/.ansible/up.lock"; flock 9 ;;
esac
case "${1:-up}" in
  build)   build ;;
  install) install ;;
  up)      case "$ROOT/" in /tmp/*)   # jobs here get a private /tmp (job_container/tmpfs): they could not see the checkout
             echo "cluster.sh: this checkout is under /tmp ($ROOT), which every job on the local cluster sees as its own empty /tmp; clone gpuhpc elsewhere (e.g. /var/tmp or your home)" >&2; exit 2 ;;
           esac
           src=$(sources)
           install && ansible-playbook -i "$LOCAL" "$PLAYS/up.yml" "${CONTAINERS[@]}" "${@:2}" && echo "$src $(deployed)" > "$STAMP" ;;
  ensure)  if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(sources) $(deployed)" ] && timeout 20 scontrol ping 2>/dev/null | grep -q " is UP"; then
             echo "cluster.sh: the local cluster is up and current (this checkout's last up): nothing to do" >&2
           else
             exec bash "$ROOT/scripts/cluster.sh" up "${@:2}"
           fi ;;
  down)    rm -f "$STAMP"; install && ansible-playbook -i "$LOCAL" "$PLAYS/down.yml" "${@:2}" ;;
  purge)   rm -f "$STAMP"; install && ansible-playbook -i "$LOCAL" "$PLAYS/down.yml" -e gpuhpc_teardown_purge=true "${@:2}" ;;
  *) echo "usage: scripts/cluster.sh build|install|up|ensure|down|purge [ansible-playbook args]" >&2; exit 2 ;;
esac
