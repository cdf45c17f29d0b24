"""Deep health checks: DCGM diagnostics (``dcgmi diag -r 2|3 -j``) and nccl-tests all-reduce
bus bandwidth (``all_reduce_perf``) against the node's baseline in the ledger database.

They take minutes and need the node's GPUs to themselves, so they run as a Slurm job that
holds the whole node, never beside a user's job (:func:`run_held`): a maintenance reservation
of the node (``MAINT,IGNORE_JOBS``: from then on no other job starts there; running ones run
on), then an ``--exclusive`` job in it pinned to the node with all its GPUs (all its MIG
devices on a MIG node), which Slurm starts once the node's jobs have ended. A node gpuhpc's
deep checks may return (a deep check's drain, or a regular hardware drain) is resumed inside
the reservation for the job, and drained again unless the checks pass; a node drained by
someone else is not tested (nothing the checks find would change it). A MIG node runs the
checks that fit MIG: ``dcgmi diag`` at ``deep.mig_dcgm_level`` (1: software and deployment),
no nccl (an all-reduce does not run across MIG instances).

The job (``python -m gpuhpc.health --mode deep-job``) only measures: it writes its results as
JSON (its output file, in ``deep.results_dir``, a directory the nodes and gpuhpc share) and
holds no ledger or drain rights; gpuhpc, where it was asked (``gpuhpc node health --deep``, or
the scheduled ``python -m gpuhpc.health --mode deep``, both on the controller), reads it,
records the baseline in the ledger and drains or resumes through the same gate as the other
checks: a failure drains with ``gpuhpc:hw: dcgm diag ...`` or ``gpuhpc:perf: nccl 310<375
GB/s``; only a drain of these checks is undone when they pass again (:data:`DEEP_CHECKS`).

The parsers are pure (recorded outputs in ``tests/unit/health/fixtures``); :func:`run_deep_checks`
runs the tools through a :class:`~gpuhpc.transport.Runner` (the job's own host).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from gpuhpc.errors import GpuhpcError
from gpuhpc.health import checks as c

DCGM, NCCL = "dcgm-diag", "nccl-allreduce"
DEEP_CHECKS = (DCGM, NCCL)
# the words a deep check's drain reason starts with (after "gpuhpc:<category>: "): how the gate
# tells a deep check's drain from the regular checks' (each set undoes only its own)
DEEP_REASON_WORDS = ("dcgm diag", "nccl ")
BASELINE = "nccl_allreduce_busbw"
PASSING = {"pass", "passed"}
FAILING = {"fail", "failed"}


# ------------------------------------------------------------------ DCGM
@dataclass(frozen=True)
class DiagFailure:
    category: str
    test: str
    gpus: str
    detail: str


def parse_dcgm_diag(text: str) -> tuple[list[DiagFailure], int, str] | None:
    """``dcgmi diag -j`` output -> (failures, tests seen, DCGM version); None when there is no
    JSON document in it. DCGM 3.x's shape (``"DCGM GPU Diagnostic" > test_categories > tests >
    results``); text before the document (DCGM prints warnings there) is ignored; statuses are
    compared case-blind (``PASS``, ``Pass``, ``Fail``); warnings are strings or objects with a
    ``warning``/``message`` field."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        doc = json.loads(text[start:end + 1])
    except ValueError:
        return None
    root = doc.get("DCGM GPU Diagnostic", doc.get("DCGM Diagnostic", doc)) if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        return None
    failures, seen = [], 0
    for cat in root.get("test_categories") or []:
        if not isinstance(cat, dict):
            continue
        for test in cat.get("tests") or []:
            if not isinstance(test, dict):          # DCGM 3.1 writes `null` between tests
                continue
            for res in test.get("results") or []:
                if not isinstance(res, dict):
                    continue
                seen += 1
                status = str(res.get("status", "")).strip().lower()
                if status in FAILING:
                    warnings = res.get("warnings") or []
                    first = warnings[0] if warnings else ""
                    if isinstance(first, dict):
                        first = first.get("warning") or first.get("message") or ""
                    failures.append(DiagFailure(str(cat.get("category", "")), str(test.get("name", "")),
                                                str(res.get("gpu_ids", "")), " ".join(str(first).split())))
    return failures, seen, str(root.get("version", ""))


def check_dcgm(text: str | None, returncode: int, level: int) -> c.Result:
    """A DCGM diagnostic run's verdict: FAIL (hw) naming the first failed test and its GPUs."""
    if text is None:
        return c.skip(DCGM, "no dcgmi on this node")
    parsed = parse_dcgm_diag(text)
    if parsed is None or parsed[1] == 0:
        return c.fail(DCGM, f"dcgm diag -r {level}: no result (exit {returncode})", c.SW)
    failures, seen, version = parsed
    if not failures:
        return c.ok(DCGM, f"dcgm diag -r {level}: {seen} results pass (DCGM {version or '?'})")
    f = failures[0]
    gpus = f"gpu {f.gpus}" if f.gpus else "all GPUs"
    more = f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""
    detail = f": {f.detail[:80]}" if f.detail else ""
    return c.fail(DCGM, f"dcgm diag -r {level} {f.test} {gpus}{more}{detail}", c.HW)


# ------------------------------------------------------------------ nccl-tests
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", re.M)
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(\w+)", re.M)


@dataclass(frozen=True)
class AllReduce:
    busbw: float            # "Avg bus bandwidth", GB/s
    wrong: int              # "Out of bounds values" (data errors)


def parse_all_reduce(text: str) -> AllReduce | None:
    """``all_reduce_perf`` output -> its average bus bandwidth and wrong values; None when the
    summary lines are missing (the run died)."""
    m = _AVG.search(text or "")
    if not m:
        return None
    oob = _OOB.search(text)
    return AllReduce(float(m.group(1)), int(oob.group(1)) if oob else 0)


def check_nccl(text: str | None, returncode: int, baseline: float | None, min_ratio: float) -> c.Result:
    """Bus bandwidth against ``min_ratio`` × the node's baseline: FAIL (perf)
    ``nccl 310<375 GB/s``; wrong values FAIL (hw); no baseline yet: OK (the caller records one)."""
    if text is None:
        return c.skip(NCCL, "no all_reduce_perf on this node", c.PERF)
    res = parse_all_reduce(text)
    if res is None:
        return c.fail(NCCL, f"nccl all_reduce_perf: no result (exit {returncode})", c.SW)
    if res.wrong:
        return c.fail(NCCL, f"nccl all_reduce {res.wrong} wrong values", c.HW)
    if baseline is None:
        return c.ok(NCCL, f"nccl {res.busbw:.0f} GB/s (no baseline yet)", c.PERF)
    need = baseline * min_ratio
    if res.busbw < need:
        return c.fail(NCCL, f"nccl {res.busbw:.0f}<{need:.0f} GB/s", c.PERF)
    return c.ok(NCCL, f"nccl {res.busbw:.0f} GB/s (baseline {baseline:.0f}, need {need:.0f})", c.PERF)


def is_deep_reason(reason: str | None) -> bool:
    """Whether a gpuhpc drain reason came from a deep check (``gpuhpc:perf: nccl ...``)."""
    text = (reason or "").strip()
    if not text.startswith("gpuhpc:"):
        return False
    _, _, rest = text.partition(": ")
    return rest.startswith(DEEP_REASON_WORDS)


# ------------------------------------------------------------------ running them
def dcgm_argv(level: int) -> list[str]:
    return ["dcgmi", "diag", "-r", str(level), "-j"]


def nccl_argv(gpus: int) -> list[str]:
    return ["all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", str(max(gpus, 1))]


def run_deep_checks(node: str, runner, spec, *, baseline: float | None = None,
                    mig: bool = False) -> tuple[c.Report, float | None]:
    """DCGM diagnostics and the all-reduce bandwidth for ``node`` through ``runner`` (the job's
    host), against ``baseline``; returns the report and the bandwidth measured (None: none).
    ``mig``: the checks that fit MIG (diag at ``spec.deep_mig_dcgm_level``, no nccl)."""
    import time

    from gpuhpc.health.collect import read_or_none, run_if_installed

    t0 = time.perf_counter()
    report = c.Report(node)
    gres = read_or_none(runner, spec.gres_conf_path(runner.getenv("SLURM_CONF")))
    gpus = sum(c.expected_counts(c.parse_gres_conf(gres, node)).values()) if gres else 0
    if not gpus:
        report.results += [c.skip(DCGM, "no GPUs in gres.conf for this node"),
                           c.skip(NCCL, "no GPUs in gres.conf for this node", c.PERF)]
        report.elapsed_s = time.perf_counter() - t0
        return report, None
    level = min(spec.deep_dcgm_level, spec.deep_mig_dcgm_level) if mig else spec.deep_dcgm_level
    res = run_if_installed(runner, dcgm_argv(level), timeout=spec.deep_timeout_s)
    report.results.append(check_dcgm(res.stdout if res else None, res.returncode if res else 127, level))
    if mig:
        report.results.append(c.skip(NCCL, "MIG node: an nccl all-reduce does not run across MIG instances",
                                     c.PERF))
        report.elapsed_s = time.perf_counter() - t0
        return report, None
    res = run_if_installed(runner, nccl_argv(gpus), timeout=spec.deep_timeout_s)
    report.results.append(check_nccl(res.stdout if res else None, res.returncode if res else 127, baseline,
                                     spec.deep_nccl_min_ratio))
    measured = parse_all_reduce(res.stdout) if res is not None else None
    report.elapsed_s = time.perf_counter() - t0
    return report, measured.busbw if measured is not None and not measured.wrong else None


def run_deep(node: str, runner, spec, *, baselines=None) -> c.Report:
    """:func:`run_deep_checks` here, with the baseline from ``baselines`` (a :class:`Baselines`;
    None: none read or recorded); the first passing measurement becomes the baseline."""
    base = baselines.get(node) if baselines is not None else None
    report, measured = run_deep_checks(node, runner, spec, baseline=base)
    record_baseline(node, report, measured, base, baselines)
    return report


def record_baseline(node: str, report: c.Report, measured: float | None, base: float | None, baselines) -> None:
    """The first passing all-reduce measurement is the node's baseline."""
    nccl = [r for r in report.results if r.check == NCCL]
    if baselines is not None and base is None and measured is not None and nccl and nccl[0].status is c.Status.OK:
        baselines.record(node, measured)


# ------------------------------------------------------------------ the job that holds the node
JOB_NAME = "gpuhpc-deep"
RESULT_KIND = "gpuhpc-deep-result"
_MIG_TYPE = re.compile(r"(^|_)\d+g\.\d+gb$")
_ACTIVE_JOB = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING",
               "REQUEUE_HOLD", "REQUEUE_FED", "STAGE_OUT", "SIGNALING", "PREEMPTED")


def is_mig_node(gpus_total: dict[str, int]) -> bool:
    """A node whose GRES types are MIG profiles (``1g.10gb``, ``nvidia_h100_80gb_hbm3_1g.10gb``)."""
    return bool(gpus_total) and all(_MIG_TYPE.search(t) for t in gpus_total)


def gres_request(gpus_total: dict[str, int]) -> str:
    """All of a node's GPUs (or MIG devices) as one ``--gres`` value."""
    return ",".join(f"gpu:{n}" if t == "gpu" else f"gpu:{t}:{n}" for t, n in sorted(gpus_total.items()) if n)


def pick_partition(node_partitions, partitions, wanted: str | None = None) -> str | None:
    """``wanted`` if given, else the node's partition with the lowest PriorityTier (the deep job
    preempts no one; a higher tier may preempt it, and it runs again later), ties in the node's
    order."""
    if wanted:
        return wanted
    tiers = {p.name: p.priority_tier for p in partitions}
    names = [p for p in node_partitions if p in tiers] or list(node_partitions)
    return min(names, key=lambda p: tiers.get(p, 0)) if names else None


def results_dir(runner, spec) -> str:
    return runner.getenv("GPUHPC_DEEP_RESULTS") or spec.deep_results_dir


def job_script(node: str, python: str, *, baseline: float | None, mig: bool, spec_path: str | None) -> str:
    """The batch script of the deep-check job: the checks, their JSON on stdout."""
    import shlex

    argv = [python, "-m", "gpuhpc.health", "--mode", "deep-job", "--node", node]
    if baseline is not None:
        argv += ["--baseline", f"{baseline:.6g}"]
    if mig:
        argv.append("--mig")
    if spec_path:
        argv += ["--spec", spec_path]
    return "#!/bin/sh\n# gpuhpc deep health checks, alone on the node (gpuhpc.health.deep)\nexec " + \
        " ".join(shlex.quote(a) for a in argv) + "\n"


def job_result(node: str, job_id: str, report: c.Report, measured: float | None) -> str:
    """The job's one line of JSON (the last line of its output file)."""
    return json.dumps({"kind": RESULT_KIND, "node": node, "job_id": job_id, "results": [r.to_dict() for r in
                                                                                        report.results],
                       "busbw": measured, "elapsed_s": round(report.elapsed_s, 3)})


def parse_job_result(text: str | None, node: str, job_id: str) -> tuple[c.Report, float | None] | None:
    """The results a deep-check job wrote (its output file); None when there are none, or they
    are another node's or job's."""
    for line in reversed((text or "").splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("kind") != RESULT_KIND or doc.get("node") != node \
                or str(doc.get("job_id")) != str(job_id):
            return None
        report = c.Report(node)
        try:
            for r in doc.get("results") or []:
                report.results.append(c.Result(str(r["check"]), c.Status(r["status"]), str(r.get("message", "")),
                                               str(r.get("category", c.HW))))
            report.elapsed_s = float(doc.get("elapsed_s") or 0.0)
            busbw = doc.get("busbw")
            return report, float(busbw) if isinstance(busbw, (int, float)) else None
        except (KeyError, ValueError, TypeError):
            return None
    return None


@dataclass
class HeldRun:
    """One deep run through Slurm: the job, what it found, and how the node was held."""

    report: c.Report
    job_id: str | None = None
    reservation: str | None = None
    resumed: bool = False           # the node was drained and resumed inside the reservation
    measured: float | None = None


def run_held(node: str, info, client, runner, spec, *, baseline: float | None, drained: str | None = None,
             spec_path: str | None = None, wait_s: float | None = None, on_queued=None, sleep=None) -> HeldRun:
    """Hold ``node`` (a maintenance reservation; a drained node, ``drained`` its reason, is
    resumed inside it), run the checks as an exclusive job in it, wait for the job to end
    (``wait_s``, default ``spec.deep_wait_s``; it waits for the node's running jobs first) and
    read what it found. The caller decides and then calls :func:`release` (always: it deletes
    the reservation, and drains a resumed node again if the decision left it so); an error on
    the way releases the node with its old drain back.
    ``on_queued(job_id)``: called once the job is submitted (tests watch it wait)."""
    import getpass
    import math
    import sys
    import time

    from gpuhpc.slurm import reservations

    sleep = sleep or time.sleep
    wait_s = spec.deep_wait_s if wait_s is None else wait_s
    mig = is_mig_node(info.gpus_total)
    out_dir = results_dir(runner, spec)
    if runner.is_local:
        from gpuhpc.fsutil import check_root_dir

        check_root_dir(out_dir, create=0o700)
    else:
        runner.makedirs(out_dir)        # a job whose output file cannot be opened tests nothing
    job_min = math.ceil(2 * spec.deep_timeout_s / 60) + 1
    user = runner.getenv("USER") or (getpass.getuser() if runner.is_local else "root")
    run = HeldRun(c.Report(node), reservation=f"gpuhpc-deep-{node}")
    reservations.delete(client, run.reservation)        # one an interrupted run left behind
    reservations.create(client, run.reservation, node, user, math.ceil(wait_s / 60) + job_min + 5)
    try:
        if drained is not None:
            client.resume_node(node)
            run.resumed = True
        python = runner.getenv("GPUHPC_PYTHON") or (sys.executable if runner.is_local else "python3")
        partition = pick_partition(info.partitions, client.partitions(), spec.deep_partition)
        extra = [f"--job-name={JOB_NAME}", f"--reservation={run.reservation}", "--exclusive", f"--nodelist={node}",
                 "--nodes=1", "--mem=0", f"--time={job_min}", f"--output={out_dir}/deep-{node}-%j.json",
                 *([f"--gres={gres_request(info.gpus_total)}"] if info.gpus_total else []),
                 *([f"--partition={partition}"] if partition else [])]
        run.job_id = client.submit_script(job_script(node, python, baseline=baseline, mig=mig, spec_path=spec_path),
                                          extra=extra)
        if on_queued is not None:
            on_queued(run.job_id)
        deadline, state = time.monotonic() + wait_s, "PENDING"
        while True:
            rows = client.queue(job_ids=[run.job_id])
            state = rows[0].state.raw.split()[0] if rows and rows[0].state.raw else "GONE"
            if state not in _ACTIVE_JOB:
                break
            if time.monotonic() > deadline:
                client.cancel(run.job_id)
                run.report.results = [c.skip(DCGM, f"deep-check job {run.job_id} waited {wait_s:.0f} s for the "
                                                   f"node ({state}): cancelled, nothing tested"),
                                      c.skip(NCCL, "not run", c.PERF)]
                return run
            sleep(1.0)
        try:
            text = runner.read_file(f"{out_dir}/deep-{node}-{run.job_id}.json")
        except GpuhpcError:
            text = None
        got = parse_job_result(text, node, run.job_id)
        if got is None and state in ("CANCELLED", "GONE", "COMPLETED"):
            # cancelled (by an admin, or before it ran), or ended well with a result this host
            # cannot read (a results directory the nodes do not share): gpuhpc's trouble, not the
            # node's; nothing was tested here, nothing is decided
            run.report.results = [c.skip(DCGM, f"deep-check job {run.job_id} {state.lower()}: no result in "
                                               f"{out_dir} (shared with the nodes?)"),
                                  c.skip(NCCL, "not run", c.PERF)]
        elif got is None:
            run.report.results = [c.fail(DCGM, f"dcgm diag: deep-check job {run.job_id} ended {state} "
                                               "with no result", c.SW)]
        else:
            run.report, run.measured = got
        return run
    except BaseException:
        release(client, node, run, drained or None)
        raise


def release(client, node: str, run: HeldRun, drain_again: str | None) -> None:
    """After the decision: a node resumed for the job is drained again with ``drain_again``
    (its old reason: the decision neither drained it anew nor returned it); the reservation goes."""
    from gpuhpc.slurm import reservations

    try:
        if run.resumed and drain_again:
            client.drain_node(node, drain_again)
    finally:
        if run.reservation:
            reservations.delete(client, run.reservation)


class Baselines:
    """Per-node all-reduce baselines in the ledger database (``node_baselines``, migration 0005):
    the first passing measurement, or what an admin set (``gpuhpc node baseline``)."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url

    def get(self, node: str) -> float | None:
        from sqlalchemy import select

        from gpuhpc.ledger import db
        from gpuhpc.ledger.orm import NodeBaseline

        with db.session_scope(self.url) as s:
            return s.scalar(select(NodeBaseline.value).where(NodeBaseline.node == node,
                                                             NodeBaseline.name == BASELINE))

    def record(self, node: str, value: float, source: str = "measured") -> None:
        from sqlalchemy import select

        from gpuhpc.ledger import db
        from gpuhpc.ledger.orm import NodeBaseline, utcnow

        with db.session_scope(self.url) as s:
            row = s.scalar(select(NodeBaseline).where(NodeBaseline.node == node, NodeBaseline.name == BASELINE)
                           .with_for_update())
            if row is None:
                s.add(NodeBaseline(node=node, name=BASELINE, value=value, unit="GB/s", source=source,
                                   updated_at=utcnow()))
            elif source == "admin" or row.source != "admin":
                row.value, row.source, row.updated_at = value, source, utcnow()


def node_busy(node: str, client=None) -> str | None:
    """Why the scheduled deep run must not test ``node`` now (it runs jobs, or Slurm does not
    know it), else None. A node drained by anyone and running nothing may be tested."""
    from gpuhpc.slurm.client import SlurmClient

    info = (client or SlurmClient()).node(node)
    if info is None:
        return "not a Slurm node"
    state = info.state.upper()
    for word in ("ALLOC", "MIX", "COMPLETING", "DRAINING"):
        if word in state:
            return f"running jobs ({info.state})"
    return None


# ------------------------------------------------------------------ the cap on concurrent nodes
class Slot:
    """One of ``cap`` slots: an exclusive ``flock`` on ``<dir>/deep-slot-<i>`` (a directory all
    nodes share, e.g. on the shared filesystem). Released on exit, or when the process dies.
    The directory must be root's and closed to writes by others (created 0700; refused
    otherwise) and the slot files are 0600, opened O_NOFOLLOW: ``flock`` works on a read-only
    descriptor, so a slot another user can open is a slot they can squat."""

    def __init__(self, directory: str, cap: int) -> None:
        self.directory, self.cap, self.fd, self.index = directory, cap, None, None

    def acquire(self) -> bool:
        import fcntl
        import os
        import stat

        from gpuhpc.fsutil import check_root_dir

        check_root_dir(self.directory, create=0o700)
        for i in range(self.cap):
            path = os.path.join(self.directory, f"deep-slot-{i}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                    raise PermissionError(f"{path} is not a regular file of uid {os.geteuid()}; remove it")
                os.fchmod(fd, 0o600)          # a slot made 0644 by an older gpuhpc
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            except BaseException:
                os.close(fd)
                raise
            self.fd, self.index = fd, i
            return True
        return False

    def release(self) -> None:
        import os

        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
