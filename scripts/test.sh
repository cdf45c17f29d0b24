#!/usr/bin/env bash
# test.sh [--fast] [pytest args] - run gpuhpc's tests on this machine (as root), for real.
#
# No arguments: the whole suite, as .ci/run runs it (README command (b)):
#   bootstrap   OS packages + .venv                          scripts/bootstrap.sh
#   services    PostgreSQL 127.0.0.1:55432, S3 :8333, sshd :2222   scripts/services/*.sh
#   cluster up  the local GPU Slurm cluster (our Ansible collection)   scripts/cluster.sh up
#   prometheus  Prometheus :9090 and the exporters               scripts/services/prometheus.sh
#   then the shared-cluster stream and, beside it, three more:
#   shared-cluster stream, serial:
#     stage a   the integration tests of every feature on the local cluster
#     stage b   the budgets that bind plain sbatch and reconfigure the cluster (LONG below)
#     stage q   README smoke: quickstart steps 3-6 on the running cluster (scripts/quickstart.sh demo)
#               and every file under examples/ (tests/integration/core/test_examples.py)
#   beside it, what never touches the local cluster (output printed when the streams have ended):
#     stage i   tests/unit and the collection's isolated role tests (tests/integration/cluster)
#     stage p   at the same time, the other integration tests marked `isolated` (own private
#               slurmctld, services only), in two streams: p1 (jobs/: preemption scenarios on
#               private GPU-shaped controllers) then stage c, and p2 (the rest)
#     lab       at the same time, the multi-host lab (tests/integration/lab, scripts/lab.sh; LAB=0
#               skips it)
#     stage c   after stage p1: containers built from third-party source archives (enroot, pyxis): only where a
#               mirror of them is given (GPUHPC_VENDOR_DIR; else ../shared/vendor when that exists,
#               the one place outside the repository the suite may read); without one it is skipped
#               and says so
#     stage s25 at the same time, at nice 10: Slurm 25.11 built from that mirror's archive and pyslurm
#               against it (scripts/slurm_build.sh, cached by source digest), then tests/integration/slurm25
#               on a private 25.11 controller; without the archive it is skipped and says so
#   teardown    the cluster and services, also on failure (KEEP_UP=1 leaves them running)
# and at the end each stage's wall time. Every stage runs; the script fails if any did.
#
# pytest arguments (e.g. scripts/test.sh -k ledger -x, or scripts/test.sh tests/integration/x/test_y.py):
# that selection (paths given: only those; else of tests/unit and tests/integration, not the lab), reusing services and a cluster that are already up and current
# (scripts/cluster.sh ensure skips the play); at the end it stops only what it started itself
# (KEEP_UP=1: nothing), so a developer iterates in seconds.
#
# --fast [pytest args]: the tier that needs nothing running (no services, no cluster; about two
# minutes): every test not under tests/integration (-m "not integration"), lint-imports and
# ansible-lint; bootstrap only makes sure the venv is there.
set -euo pipefail
cd "$(dirname "$0")/.."
# A mirror of the enroot/pyxis source archives (docs/containers.md): given, or ../shared/vendor where
# one is beside the checkout. With it the local cluster gets containers (cluster.sh up) and stage c runs
# (found before a checkout under /tmp is copied: the copy has no ../shared beside it).
if [ -z "${GPUHPC_VENDOR_DIR:-}" ] && [ -f ../shared/vendor/SHA256SUMS ]; then
  GPUHPC_VENDOR_DIR=$(cd ../shared/vendor && pwd); export GPUHPC_VENDOR_DIR
fi
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
MODE=full
if [ "${1:-}" = --fast ]; then MODE=fast; shift; elif [ $# -gt 0 ]; then MODE=select; fi

TIMES=()    # "stage seconds [failed]", printed at the end
FAILED=""   # every stage runs; the script fails at the end if any did
stage() {   # stage NAME COMMAND...: run one stage, keep its wall time; returns its status
  local name=$1 t rc=0
  shift
  t=$(date +%s)
  say "$name"
  "$@" || rc=$?
  TIMES+=("$(printf '%-12s %6ss%s' "$name" "$(( $(date +%s) - t ))" "$([ "$rc" = 0 ] || echo "   FAILED (exit $rc)")")")
  return "$rc"
}
summary() {
  echo "[test] wall time per stage:"
  printf '  %s\n' "${TIMES[@]}"
  printf '  %-12s %6ss\n' total "$(( $(date +%s) - T0 ))"
}

stage bootstrap bash scripts/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH"
# the ledger's default SQLite lives under GPUHPC_DATA_DIR; keep test runs away from a user's real one
# (under /var/tmp: jobs inherit it, and a job's /tmp is its own)
export GPUHPC_DATA_DIR=${GPUHPC_DATA_DIR:-$(mktemp -d /var/tmp/gpuhpc-test-data.XXXXXX)}

if [ "$MODE" = fast ]; then
  trap summary EXIT
  # ansible-lint runs alongside the tests (two cores); its row is the time left waiting for it
  lint_log=$(mktemp /var/tmp/gpuhpc-ansible-lint.XXXXXX)
  (cd ansible && exec ansible-lint --offline --profile production -q) >"$lint_log" 2>&1 &
  lint_pid=$!
  stage "fast tests" python -m pytest -p no:cacheprovider --timeout=300 --durations=5 -m "not integration" tests "$@" \
    || FAILED+=" tests"
  lint_imports() { lint-imports >/dev/null 2>&1 || lint-imports; }
  stage "lint-imports" lint_imports || FAILED+=" lint-imports"
  lint_ansible() { local rc=0; wait "$lint_pid" || rc=$?; tail -25 "$lint_log"; rm -f "$lint_log"; return $rc; }
  stage "ansible-lint" lint_ansible || FAILED+=" ansible-lint"
  [ -z "$FAILED" ] || { say "failed:$FAILED"; exit 1; }
  exit 0
fi

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }   # something listens on 127.0.0.1:PORT
BG_PIDS=()   # the background streams (full mode)
STARTED=()   # what this run started; a selection run stops only these
teardown() {
  rc=$?
  local t
  for pid in "${BG_PIDS[@]}"; do   # interrupted: stop stages i, c and the lab
    if kill -0 "$pid" 2>/dev/null; then pkill -TERM -P "$pid" 2>/dev/null || true; kill "$pid" 2>/dev/null || true; fi
  done
  t=$(date +%s)
  if [ "${KEEP_UP:-0}" != 1 ] && { [ "$MODE" = full ] || [ ${#STARTED[@]} -gt 0 ]; }; then
    say "teardown${STARTED[*]:+ (what this run started: ${STARTED[*]})}"
    stops() { [ "$MODE" = full ] || [[ " ${STARTED[*]} " == *" $1 "* ]]; }
    if stops cluster; then
      bash scripts/cluster.sh down >/var/tmp/gpuhpc-teardown.log 2>&1 || { echo "cluster teardown failed:"; tail -20 /var/tmp/gpuhpc-teardown.log; }
    fi
    stops postgres && { [ -x scripts/services/postgres.sh ] && bash scripts/services/postgres.sh stop >/dev/null 2>&1 || true; }
    stops sshd && { bash scripts/services/sshd.sh stop >/dev/null 2>&1 || true; }
    stops s3 && { bash scripts/services/s3.sh stop >/dev/null 2>&1 || true; }
    stops prometheus && { bash scripts/services/prometheus.sh stop >/dev/null 2>&1 || true; }
    [ "$MODE" = full ] && { .venv/bin/python -m gpuhpc cmdserver stop >/dev/null 2>&1 || true; }
    TIMES+=("$(printf '%-12s %6ss' teardown "$(( $(date +%s) - t ))")")
  fi
  summary
  say "done (exit $rc)"
  exit $rc
}
trap teardown EXIT

services() {
  if [ -x scripts/services/postgres.sh ]; then
    up 55432 || STARTED+=(postgres)
    GPUHPC_TEST_PG_URL=$(bash scripts/services/postgres.sh start | tail -1) || return 1
    export GPUHPC_TEST_PG_URL
  fi
  # S3 (SeaweedFS) on 127.0.0.1:8333. The whole suite gets a fresh store every run: each test makes
  # its own bucket (a SeaweedFS collection with its own volumes), and a store kept across runs runs
  # out of volumes ("No writable volumes"). A selection reuses a running one.
  if up 8333 && [ "$MODE" = select ]; then
    say "S3 on 127.0.0.1:8333: up, reused"
  else
    STARTED+=(s3)
    bash scripts/services/s3.sh wipe >/dev/null 2>&1 || true
    bash scripts/services/s3.sh start >/dev/null || return 1
  fi
  # sshd on 127.0.0.1:2222 (SSH transport tests)
  up 2222 || STARTED+=(sshd)
  bash scripts/services/sshd.sh start >/dev/null
}
stage services services

if [ "$MODE" = full ]; then
  cluster_up() { bash scripts/cluster.sh up >/var/tmp/gpuhpc-cluster-up.log 2>&1 || { tail -60 /var/tmp/gpuhpc-cluster-up.log; return 1; }; }
else   # an already up and current cluster is reused as it is
  cluster_up() {
    timeout 20 scontrol ping 2>/dev/null | grep -q " is UP" || STARTED+=(cluster)
    bash scripts/cluster.sh ensure >/var/tmp/gpuhpc-cluster-up.log 2>&1 || { tail -60 /var/tmp/gpuhpc-cluster-up.log; return 1; }
  }
fi
# scripts/cluster.sh: ansible-galaxy collection build + install, then ansible/local/up.yml (the spec,
# test machinery, gpuhpc.cluster.site) on the inventory ansible/inventories/local
stage "cluster up" cluster_up
grep -A20 "PLAY RECAP" /var/tmp/gpuhpc-cluster-up.log || tail -1 /var/tmp/gpuhpc-cluster-up.log
sinfo -N -o '%12N %10P %6t %G'

prometheus() {   # node/Slurm/GPU exporters; `start` on a running set re-renders and reloads
  up 9090 || STARTED+=(prometheus)
  bash scripts/services/prometheus.sh start >/dev/null
}
stage prometheus prometheus

# Two streams run at once (the suite mostly waits on Slurm, so they share the two cores well):
# - the shared-cluster stream, serial, on the local cluster: (a) the integration tests of every
#   feature, (b) the budgets binding plain sbatch and reconfiguring the cluster, (q) the README smoke;
# - beside it, what never touches that cluster: (i) the unit tests and the integration tests marked
#   `isolated` (their own private slurmctld, Ansible roles into scratch roots, services only), then
#   (c) enroot/pyxis from source archives, and the lab (own namespaces, own hosts).
# Every test is in exactly one stream: `-m "not isolated"` here, `-m "not integration or isolated"`
# there. A background stage's output is printed when it ends, whole, under its name.
# (the long preemption scenarios run isolated, on private controllers shaped as the local GPU nodes)
LONG=(tests/integration/quota)
SMOKE=(tests/integration/core/test_examples.py)
# the tests that build enroot and pyxis from their source archives (docs/containers.md)
VENDOR=(tests/integration/containers/test_build_containers.py tests/integration/containers/test_pyxis_private.py
        tests/integration/containers/test_containers_role.py)
PYTEST=(python -m pytest -p no:cacheprovider --timeout=900 --durations=15)
if [ "$MODE" = full ]; then
  RUNDIR=$(mktemp -d /var/tmp/gpuhpc-test-run.XXXXXX) && : >"$RUNDIR/stages"
  BG_PIDS=()
  bg_stage() {   # bg_stage NAME COMMAND...: in a background stream; time and status into $RUNDIR
    local name=$1 t rc=0
    shift
    t=$(date +%s)
    echo "[test] $name: started at +$(( t - T0 ))s"
    "$@" || rc=$?
    printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - t ))" "$rc" >>"$RUNDIR/stages"
  }
  isolated_stream() {   # isolated_stream NAME PYTEST-ARGS...: one stage of isolated tests
    local name=$1
    shift
    # temporary files and the default ledger of their own, apart from the other streams'
    export TMPDIR="/var/tmp/gpuhpc-pytest-${name// /-}" GPUHPC_DATA_DIR="$GPUHPC_DATA_DIR/${name// /-}"
    mkdir -p -m 1777 "$TMPDIR" && chmod 1777 "$TMPDIR" && mkdir -p "$GPUHPC_DATA_DIR"
    bg_stage "$name" "${PYTEST[@]}" -m "not integration or isolated" "$@"
  }
  lab_stream() {   # four systemd hosts in namespaces, deployed over SSH (scripts/lab.sh; LAB=0 skips it)
    # It touches nothing of the local cluster; run it alone with `python -m pytest -s tests/integration/lab`.
    if [ "${LAB:-1}" != 0 ]; then
      bg_stage lab python -m pytest -p no:cacheprovider --timeout=1800 -s tests/integration/lab
    fi
  }
  # stage p in two streams: its tests mostly wait on their own controllers (each file has its own
  # ports, state and cluster name), so two files at once share the CPU well
  P1=(tests/integration/jobs)
  p1_stream() {   # stage p1 (about 500 s alone), then stage c (about 250 s; p2: about 800 s) (enroot/pyxis on a private controller: only with the mirror)
    isolated_stream "stage p1" "${P1[@]}"
    if [ -n "${GPUHPC_VENDOR_DIR:-}" ]; then
      export TMPDIR=/var/tmp/gpuhpc-pytest-vendor GPUHPC_DATA_DIR="${GPUHPC_DATA_DIR%/stage-p1}/vendor"
      mkdir -p -m 1777 "$TMPDIR" && chmod 1777 "$TMPDIR" && mkdir -p "$GPUHPC_DATA_DIR"
      bg_stage "stage c" "${PYTEST[@]}" "${VENDOR[@]}"
    else
      echo "[test] stage c skipped: no mirror of the enroot/pyxis source archives (set GPUHPC_VENDOR_DIR; docs/containers.md)"
    fi
  }
  p2_stream() {   # stage p2: every other isolated integration test
    isolated_stream "stage p2" tests/integration --ignore=tests/integration/cluster --ignore=tests/integration/lab \
      "${P1[@]/#/--ignore=}" "${SMOKE[@]/#/--ignore=}" "${VENDOR[@]/#/--ignore=}" "${S25[@]/#/--ignore=}"
  }
  # Slurm 25.11 from the source mirror and pyslurm against it (scripts/slurm_build.sh: the
  # gpuhpc_slurm_build role, cached by the archive's sha256 and the configure flags under
  # ~/.cache/gpuhpc/slurm-build), then its tests on a private 25.11 controller (docs/admin.md).
  # On a fresh machine the build is most of its time (about 7 CPU-minutes, pyslurm 5): at nice 10
  # it takes what the other streams leave while they wait on Slurm
  S25=(tests/integration/slurm25)
  s25_stream() {
    if [ ! -f "${GPUHPC_VENDOR_DIR:-../shared/vendor}/slurm-25.11.7.tar.gz" ]; then
      echo "[test] stage s25 skipped: no slurm-25.11.7.tar.gz in the source-archive mirror (GPUHPC_VENDOR_DIR; docs/admin.md)"
      return 0
    fi
    renice -n 10 -p "$BASHPID" >/dev/null
    bg_stage "stage s25 build" bash scripts/slurm_build.sh --pyslurm
    GPUHPC_REQUIRE_SLURM25=1 isolated_stream "stage s25" "${S25[@]}"
  }
  say "stage i, stage p1 then stage c, stage p2, the lab and stage s25 start beside the shared-cluster stream (their output: at the end)"
  # i: the unit tests and the collection's role tests (Ansible: CPU); p: the other isolated tests
  # (private controllers, services: mostly waiting)
  # stage i is nearly all CPU (Ansible) and has time to spare: at nice 5 it yields the CPU to the
  # shared-cluster stream, the critical path (stage p and the lab keep nice 0: latency bounds, less slack)
  # the scratch role's test mounts a real loop device on this machine: while it ran beside stage a,
  # the local cluster's job containers broke (slurmstepd hung in setns on the jobs' .ns files, jobs
  # stayed COMPLETING); it runs after stage q instead, when the shared cluster is no longer used
  SCRATCH=(tests/integration/cluster/test_scratch_roles.py)
  ( renice -n 5 -p "$BASHPID" >/dev/null; isolated_stream "stage i" tests/unit tests/integration/cluster \
      "${SCRATCH[@]/#/--ignore=}" ) \
    >"$RUNDIR/isolated-i.log" 2>&1 &
  BG_PIDS+=($!)
  p1_stream >"$RUNDIR/isolated-p1.log" 2>&1 &
  BG_PIDS+=($!)
  p2_stream >"$RUNDIR/isolated-p2.log" 2>&1 &
  BG_PIDS+=($!)
  lab_stream >"$RUNDIR/lab.log" 2>&1 &
  BG_PIDS+=($!)
  s25_stream >"$RUNDIR/s25.log" 2>&1 &
  BG_PIDS+=($!)
  stage "stage a" "${PYTEST[@]}" --durations=40 -m "not isolated" tests/integration --ignore=tests/integration/lab "${LONG[@]/#/--ignore=}" "${SMOKE[@]/#/--ignore=}" "${VENDOR[@]/#/--ignore=}" \
    || FAILED+=" a"
  stage "stage b" "${PYTEST[@]}" -m "not isolated" "${LONG[@]}" || FAILED+=" b"
  smoke() {   # the quickstart's ledger in a data dir of its own
    GPUHPC_DATA_DIR=$(mktemp -d /var/tmp/gpuhpc-quickstart-data.XXXXXX) bash scripts/quickstart.sh demo || return 1
    "${PYTEST[@]}" "${SMOKE[@]}"
  }
  stage "stage q" smoke || FAILED+=" q"
  stage "stage scratch" "${PYTEST[@]}" -m "not integration or isolated" "${SCRATCH[@]}" || FAILED+=" scratch"
  t=$(date +%s)
  say "waiting for stages i, p1, c, p2, s25 and the lab"
  wait "${BG_PIDS[@]}" || true
  for log in isolated-i isolated-p1 isolated-p2 lab s25; do
    [ -f "$RUNDIR/$log.log" ] || continue
    echo "================ $log stream (run beside the shared-cluster stream) ================"
    cat "$RUNDIR/$log.log"
    echo "================ end of $log ================"
  done
  while IFS=$'\t' read -r name secs rc; do
    TIMES+=("$(printf '%-12s %6ss%s' "$name" "$secs" "$([ "$rc" = 0 ] || echo "   FAILED (exit $rc)")")  (beside)")
    [ "$rc" = 0 ] || FAILED+=" ${name#stage }"
  done <"$RUNDIR/stages"
  TIMES+=("$(printf '%-12s %6ss' "(waited)" "$(( $(date +%s) - t ))")")
  rm -rf "$RUNDIR"
else
  # paths among the arguments (tests/integration/x/test_y.py, a directory): only those; else every test
  # (the lab apart) that the arguments select (-k, -m)
  where=(tests/unit tests/integration --ignore=tests/integration/lab)
  for a in "$@"; do case "$a" in -*) ;; *) [ -e "${a%%::*}" ] && where=() && break ;; esac; done
  stage selection "${PYTEST[@]}" "${where[@]}" "$@" || FAILED+=" selection"
fi
if [ -n "$FAILED" ]; then
  say "failed stages:$FAILED"
  exit 1
fi
