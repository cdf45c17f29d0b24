"""Deep health checks: DCGM diagnostics (``dcgmi diag -r 2|3 -j``) and nccl-tests all-reduce
bus bandwidth (``all_reduce_perf``) against the node's baseline in the ledger database.

They take minutes and need the node's GPUs to themselves, so they run on demand
(``gpuhpc node health --deep NODE``) and on a schedule (``python -m gpuhpc.health --mode deep
--apply`` from a timer on each node, at most ``--cap`` nodes at once through a lock-based
semaphore in a shared directory; a busy node is skipped), never in the Prolog or
HealthCheckProgram. Through the same runner and the same drain/resume gate as the other checks:
a failure drains with ``gpuhpc:hw: dcgm diag ...`` or ``gpuhpc:perf: nccl 310<375 GB/s``; only
a drain of these checks is undone when they pass again (:data:`DEEP_CHECKS`).

The parsers are pure (recorded outputs in ``tests/unit/health/fixtures``); :func:`run_deep`
fetches the text through a :class:`~gpuhpc.transport.Runner`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

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


def run_deep(node: str, runner, spec, *, baselines=None) -> c.Report:
    """DCGM diagnostics and the all-reduce bandwidth for ``node`` through ``runner``.
    ``baselines``: a :class:`Baselines` (None: no baseline is read or recorded)."""
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
        return report
    res = run_if_installed(runner, dcgm_argv(spec.deep_dcgm_level), timeout=spec.deep_timeout_s)
    report.results.append(check_dcgm(res.stdout if res else None, res.returncode if res else 127,
                                     spec.deep_dcgm_level))
    res = run_if_installed(runner, nccl_argv(gpus), timeout=spec.deep_timeout_s)
    base = baselines.get(node) if baselines is not None else None
    result = check_nccl(res.stdout if res else None, res.returncode if res else 127, base, spec.deep_nccl_min_ratio)
    report.results.append(result)
    if baselines is not None and base is None and result.status is c.Status.OK and res is not None:
        measured = parse_all_reduce(res.stdout)
        if measured is not None:
            baselines.record(node, measured.busbw)
    report.elapsed_s = time.perf_counter() - t0
    return report


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
