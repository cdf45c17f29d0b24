#!/usr/bin/env bash
# cluster.sh up|down|purge - the local GPU Slurm cluster on this machine, stood up by our own
# Ansible roles (ansible/site.yml with ansible/inventories/local). `up` is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
unset SLURM_CONF   # the local cluster lives at /etc/slurm/slurm.conf
export ANSIBLE_CONFIG="$PWD/ansible/ansible.cfg" PATH="$PWD/.venv/bin:$PATH"
case "${1:-up}" in
  up)    ansible-playbook -i ansible/inventories/local ansible/site.yml "${@:2}" ;;
  down)  ansible-playbook -i ansible/inventories/local ansible/teardown.yml "${@:2}" ;;
  purge) ansible-playbook -i ansible/inventories/local ansible/teardown.yml -e gpuhpc_teardown_purge=true "${@:2}" ;;
  *) echo "usage: scripts/cluster.sh up|down|purge [ansible-playbook args]" >&2; exit 2 ;;
esac
