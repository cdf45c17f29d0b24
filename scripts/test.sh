#!/usr/bin/env bash
# test.sh - run the whole gpuhpc test suite on this machine (as root), for real:
#   1. bootstrap (OS packages + .venv)             scripts/bootstrap.sh
#   2. start PostgreSQL on 127.0.0.1:55432           scripts/services/postgres.sh
#   3. stand up the local GPU Slurm cluster          scripts/cluster.sh up   (our Ansible roles)
#   4. pytest tests/unit tests/integration, in two stages (a: features, b: long fault-injection runs)
#   4b. the multi-host lab, its own stage (tests/integration/lab, scripts/lab.sh; LAB=0 skips it)
#   5. tear the cluster and services down again (also on failure)
# Extra arguments go to pytest (e.g. scripts/test.sh -k ledger -x).
# KEEP_UP=1 leaves the cluster and services running afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
# Every job on the local cluster has a private /tmp (job_container/tmpfs): it could not see a
# checkout under /tmp. Such a checkout (a CI clone, say) is copied to /var/tmp, its tracked and
# untracked-but-not-ignored files, and the suite runs from the copy.
case "$PWD/" in
  /tmp/*)
    dest="/var/tmp/gpuhpc-checkout-$(printf '%s' "$PWD" | sha256sum | cut -c1-12)"
    echo "[test] this checkout is under /tmp, which jobs see as their own: running from a copy in $dest"
    rm -rf "$dest" && mkdir -p "$dest"
    git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -cf - | tar -C "$dest" -xf -
    cp -a .git "$dest/.git"
    exec bash "$dest/scripts/test.sh" "$@"
    ;;
esac
T0=$(date +%s)
say() { printf '[test %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
unset SLURM_CONF

bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"

teardown() {
  rc=$?
  if [ "${KEEP_UP:-0}" != 1 ]; then
    say "teardown"
    bash scripts/cluster.sh down >/tmp/gpuhpc-teardown.log 2>&1 || { echo "cluster teardown failed:"; tail -20 /tmp/gpuhpc-teardown.log; }
    [ -x scripts/services/postgres.sh ] && bash scripts/services/postgres.sh stop >/dev/null 2>&1 || true
    bash scripts/services/sshd.sh stop >/dev/null 2>&1 || true
    bash scripts/services/s3.sh stop >/dev/null 2>&1 || true
    bash scripts/services/prometheus.sh stop >/dev/null 2>&1 || true
    .venv/bin/python -m gpuhpc cmdserver stop >/dev/null 2>&1 || true
  fi
  say "done (exit $rc)"
  exit $rc
}
trap teardown EXIT

if [ -x scripts/services/postgres.sh ]; then
  say "postgresql"
  export GPUHPC_TEST_PG_URL=$(bash scripts/services/postgres.sh start | tail -1)
fi

say "S3 (SeaweedFS) on 127.0.0.1:8333"
# a fresh store every run: each test makes its own bucket (a SeaweedFS collection with its own
# volumes), and a store kept across runs runs out of volumes ("No writable volumes")
bash scripts/services/s3.sh wipe >/dev/null 2>&1 || true
bash scripts/services/s3.sh start >/dev/null

say "sshd on 127.0.0.1:2222 (SSH transport tests)"
bash scripts/services/sshd.sh start >/dev/null

say "cluster up (scripts/cluster.sh up: ansible-galaxy collection build + install, then gpuhpc.cluster.site via ansible/inventories/local)"
bash scripts/cluster.sh up >/tmp/gpuhpc-cluster-up.log 2>&1 || { tail -60 /tmp/gpuhpc-cluster-up.log; exit 1; }
grep -A20 "PLAY RECAP" /tmp/gpuhpc-cluster-up.log || true
sinfo -N -o '%12N %10P %6t %G'

say "prometheus on 127.0.0.1:9090, node/Slurm/GPU exporters (scripts/services/prometheus.sh)"
bash scripts/services/prometheus.sh start >/dev/null

say "pytest"
# the ledger's default SQLite lives under GPUHPC_DATA_DIR; keep test runs away from a user's real one
# (under /var/tmp: jobs inherit it, and a job's /tmp is its own)
export GPUHPC_DATA_DIR=${GPUHPC_DATA_DIR:-$(mktemp -d /var/tmp/gpuhpc-test-data.XXXXXX)}
# Stages, each well under 30 minutes, all of them run: (a) unit tests and the integration tests
# of every feature, (b) the long fault-injection runs (preemption/requeue chaos, slurmctld
# restarts, budgets binding plain sbatch, the private cluster's restart/reconfigure), (c) the lab.
LONG=(tests/integration/jobs/test_multinode_chaos.py tests/integration/jobs/test_multinode_long_save.py tests/integration/jobs/test_jobs_requeue.py
      tests/integration/sweeps/test_sweeps_chaos.py tests/integration/quota tests/integration/cluster/test_collection.py)
FAILED=""   # every stage runs; the script fails at the end if any did
PYTEST=(python -m pytest -p no:cacheprovider --timeout=900 --durations=15)
if [ $# -eq 0 ]; then
  say "stage a: unit + integration"
  "${PYTEST[@]}" tests/unit tests/integration --ignore=tests/integration/lab "${LONG[@]/#/--ignore=}" || FAILED+=" a"
  say "stage b: fault-injection runs"
  "${PYTEST[@]}" "${LONG[@]}" || FAILED+=" b"
else
  "${PYTEST[@]}" tests/unit tests/integration --ignore=tests/integration/lab "$@"
fi

# its own stage: four systemd hosts in namespaces, deployed over SSH (scripts/lab.sh, ~8 min;
# LAB=0 skips it). It touches nothing of the local cluster above; run it alone with
# `python -m pytest -s tests/integration/lab`.
if [ "${LAB:-1}" != 0 ] && [ $# -eq 0 ]; then   # a selection (-k ...) is for the main suite
  say "multi-host lab (scripts/lab.sh: 4 hosts, systemd PID 1, gpuhpc.cluster.site over SSH)"
  python -m pytest -p no:cacheprovider --timeout=1800 -s tests/integration/lab "$@" || FAILED+=" lab"
fi
if [ -n "$FAILED" ]; then
  say "failed stages:$FAILED"
  exit 1
fi
