#!/usr/bin/env bash
# quickstart.sh - README command (a): on a fresh Debian 12 machine (as root) set everything up
# and run the main job:
#   1. bootstrap: Debian packages (Slurm 22.05, MariaDB, ...) and .venv with gpuhpc
#   2. stand up the local GPU Slurm cluster with our Ansible roles
#   3. ledger: create the database, a price book and a quota for account "research"
#   4. submit a sample training job on 2 H100s, preempt it with a high-priority job, and watch
#      it checkpoint, requeue and resume to the same final result
#   5. run a small sweep (job arrays) and print its best trial; with a mirror of the enroot/pyxis
#      source archives (GPUHPC_VENDOR_DIR: the cluster then has containers) a job in a container image
#   6. settle usage from sacct into the ledger and print the cost report
# Safe to run again.
#   scripts/quickstart.sh          all six steps
#   scripts/quickstart.sh demo     steps 3-6 only, on a cluster that is already up (bootstrap and
#                                  scripts/cluster.sh up done): CI's README smoke stage (scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
unset SLURM_CONF
MODE=${1:-all}
case "$MODE" in all|demo) ;; *) echo "usage: scripts/quickstart.sh [demo]" >&2; exit 2 ;; esac

if [ "$MODE" = all ]; then
say "1/6 bootstrap"
bash scripts/bootstrap.sh
export PATH="$REPO/.venv/bin:$PATH"

say "2/6 local GPU Slurm cluster (the gpuhpc.cluster Ansible collection: built, installed, run with ansible/local/up.yml)"
bash scripts/cluster.sh up > /var/tmp/gpuhpc-quickstart-ansible.log 2>&1 \
  || { tail -40 /var/tmp/gpuhpc-quickstart-ansible.log; exit 1; }
grep -A8 "PLAY RECAP" /var/tmp/gpuhpc-quickstart-ansible.log || true
fi
export PATH="$REPO/.venv/bin:$PATH"
sinfo
gpuhpc cluster status

say "3/6 ledger: schema, price book, quota"
gpuhpc db upgrade
gpuhpc ledger price set --gpu-type h100 --rate 2.50
gpuhpc ledger price set --gpu-type 3g.40gb --of h100 --fraction 3/7
gpuhpc ledger price set --gpu-type 1g.10gb --of h100 --fraction 1/7
gpuhpc ledger price set --partition gpu --multiplier 0.6     # preemptible capacity is cheaper
gpuhpc ledger account add research >/dev/null 2>&1 || true
gpuhpc quota set research --gpu-hours 1000 --period month && gpuhpc ledger sync-slurm >/dev/null   # Slurm binds it (plain sbatch too)
gpuhpc ledger price list

say "4/6 sample training job: 2 × H100, checkpoint every 20 steps"
DEMO=/var/tmp/gpuhpc-demo
rm -rf "$DEMO/ckpt"; mkdir -p "$DEMO"
JOB=$(gpuhpc submit --name sample-train --account research --partition gpu --nodelist gpu-node1 \
        --gpus 2 --gpu-type h100 --time 30m --checkpoint-dir "$DEMO/ckpt" \
        -- python3 "$REPO/examples/train.py" --steps 300 --ckpt-every 20 --step-seconds 0.1)
echo "submitted job $JOB"
until [ "$(squeue -h -j "$JOB" -o %T)" = RUNNING ]; do sleep 1; done
# preempted once it has a checkpoint to resume from (its first one, after 20 steps)
for _ in $(seq 600); do
  [ -n "$(find "$DEMO/ckpt" -type f -print -quit 2>/dev/null)" ] && break
  [ -n "$(squeue -h -j "$JOB" -o %T)" ] || break
  sleep 0.2
done
echo "preempting it with a high-priority job that needs all 8 GPUs of gpu-node1 ..."
HI=$(gpuhpc submit --name urgent-eval --account research --partition gpu-hi --nodelist gpu-node1 \
        --gpus 8 --gpu-type h100 --time 15m --no-requeue -- sleep 5)
echo "high-priority job $HI"
while :; do
  state=$(gpuhpc status "$JOB" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["state"])')
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY) break ;; esac
  sleep 3
done
echo "job $JOB finished: $state"
gpuhpc logs "$JOB" | grep -E "resume_step|SIGUSR2|requeue|done" || true
sacct -j "$JOB" --duplicates -X -o JobID,JobName,Partition,State,Elapsed,AllocTRES%50
[ "$state" = COMPLETED ] || { echo "the sample job did not complete" >&2; exit 1; }

say "5/6 a small sweep: 12 trials as job arrays on the cpu partition, the best one printed"
SWEEP=$(cd "$REPO" && gpuhpc sweep run examples/sweeps/quick.yaml --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["sweep_id"])')
echo "sweep $SWEEP submitted"
gpuhpc sweep wait "$SWEEP" --timeout 600 || { gpuhpc sweep status "$SWEEP" >&2; exit 1; }
gpuhpc sweep status "$SWEEP"
gpuhpc sweep best "$SWEEP" --json
gpuhpc sweep report "$SWEEP" --html "$DEMO/sweep.html"

# a job in a container image (enroot + pyxis, docs/containers.md): only on a cluster that
# scripts/cluster.sh up gave containers, which it does with a mirror of their source archives
if [ -n "${GPUHPC_VENDOR_DIR:-}" ] && [ -f /etc/slurm/plugstack.conf.d/pyxis.conf ]; then
  say "5+/6 a job in a container image: the local registry's test image, pinned by digest"
  IMAGE=$(bash scripts/services/registry.sh start | tail -1)
  CJOB=$(gpuhpc submit --name in-image --account research --partition cpu --time 5m --image "$IMAGE" \
           -- cat /etc/os-release)
  echo "job $CJOB runs cat /etc/os-release in $IMAGE"
  while [ -n "$(squeue -h -j "$CJOB" -o %i)" ]; do sleep 0.5; done
  gpuhpc logs "$CJOB" | grep PRETTY_NAME || { echo "the job in the image printed no os-release" >&2; exit 1; }
elif [ -n "${GPUHPC_VENDOR_DIR:-}" ]; then
  echo "(skipped: a job in a container image: this cluster has no enroot/pyxis; scripts/cluster.sh up with GPUHPC_VENDOR_DIR set installs them)"
else
  echo "(skipped: a job in a container image: no GPUHPC_VENDOR_DIR, the mirror of the enroot/pyxis source archives the cluster's containers are built from; docs/containers.md)"
fi

say "6/6 settle usage (the training job and the sweep) into the ledger and report cost"
gpuhpc ledger ingest
gpuhpc report cost --by user --period day
gpuhpc report cost --by gpu-type --period day --html "$DEMO/cost.html"
gpuhpc quota show research

echo
echo "cost report with charts: $DEMO/cost.html; sweep report: $DEMO/sweep.html"
echo "next: source .venv/bin/activate; gpuhpc --help   (README.md has the tour)"
