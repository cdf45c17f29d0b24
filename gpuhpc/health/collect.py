"""Run the health checks on a node: fetch each check's text through a :class:`Runner`, call the
pure checks, time the run. Two sets:

- ``prolog``: the fast subset for Slurm's Prolog (goal: well under 1 s): GPU device files vs
  gres.conf, required mounts, scratch space, munge.
- ``full``: adds what needs the driver or the kernel log: ``nvidia-smi -L`` (count, types, MIG
  layout), XIDs since the last run, ECC/row-remap/retired pages, clocks and throttle reasons,
  IB ports (``ibstat``). For HealthCheckProgram, the epilog, and ``gpuhpc node health``.

A command that is not installed makes its check SKIP (no GPU driver on a CPU node, no IB),
unless the spec asks for it (IB in the spec and no ``ibstat``: FAIL).
"""
from __future__ import annotations

import os
import time

from gpuhpc.errors import TransportError
from gpuhpc.health import checks as c
from gpuhpc.health.spec import HealthSpec
from gpuhpc.transport import CommandResult, Runner

MODES = ("prolog", "full")
SMI_LIST = ("nvidia-smi", "-L")
SMI_COUNTERS = ("nvidia-smi", f"--query-gpu={','.join(c.COUNTER_FIELDS)}", "--format=csv,noheader,nounits")


def run_if_installed(runner: Runner, argv: list[str], *, input: str | None = None, timeout: float = 20) -> CommandResult | None:
    """``argv``'s result; None when the command is not installed where the runner runs."""
    try:
        res = runner.run(argv, input=input, timeout=timeout)
    except TransportError as exc:
        if "command not found" in exc.message:
            return None
        raise
    return None if res.returncode == 127 else res


def read_or_none(runner: Runner, path: str) -> str | None:
    """The file's text where the runner runs; None when it cannot be read."""
    try:
        return runner.read_file(path)
    except TransportError:
        return None


BOOT_ID = "/proc/sys/kernel/random/boot_id"


def run_checks(node: str, runner: Runner, spec: HealthSpec = HealthSpec(), *, mode: str = "full",
               record: bool = True) -> c.Report:
    """All checks of ``mode`` for ``node`` (the Slurm node name: gres.conf lines are per node).
    ``record``: store the XID high-water mark for the next run (a run that acts on its findings
    does; a look that changes nothing leaves the XIDs it saw for the run that acts)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    t0 = time.perf_counter()
    report = c.Report(node)
    add = report.results.append

    gres_path = spec.gres_conf_path(runner.getenv("SLURM_CONF"))
    gres_text = read_or_none(runner, gres_path)
    if gres_text is None:
        add(c.fail("gpu-devices", f"gres.conf unreadable: {gres_path}", c.SW))
        lines: list[c.GresLine] = []
    else:
        lines = c.parse_gres_conf(gres_text, node)
        files = [f for g in lines for f in g.files]
        present: dict[str, str] = {}
        if files:
            res = run_if_installed(runner, ["stat", "-c", "%F|%n", *files])
            present = c.parse_stat(res.stdout) if res else {}
        add(c.check_gpu_devices(lines, present))

    mounts_text = read_or_none(runner, "/proc/mounts") or ""
    add(c.check_mounts(mounts_text, spec.mounts))
    df_text = None
    if spec.scratch_path:
        res = run_if_installed(runner, ["df", "-P", "-k", spec.scratch_path])
        df_text = res.stdout if res and res.ok else None
    add(c.check_scratch(spec.scratch_path, df_text, mounts_text, min_free_gb=spec.scratch_min_free_gb,
                        must_be_mount=spec.scratch_must_be_mount))

    enc = run_if_installed(runner, ["munge", "-n"], timeout=10)
    if enc is None:
        add(c.fail("munge", "munge", c.SW))
    else:
        dec = run_if_installed(runner, ["unmunge"], input=enc.stdout, timeout=10) if enc.ok else None
        add(c.check_munge(enc.returncode, dec.returncode if dec else 1, dec.stdout if dec else ""))

    if mode == "full":
        _full(node, runner, spec, lines, add, record)
    report.elapsed_s = time.perf_counter() - t0
    return report


def _full(node: str, runner: Runner, spec: HealthSpec, lines: list[c.GresLine], add, record: bool) -> None:
    expected = c.expected_counts(lines)
    listing = run_if_installed(runner, list(SMI_LIST)) if expected else None
    if not expected:
        add(c.skip("gpu-listing", "no GPUs in gres.conf for this node"))
    elif listing is None:
        add(c.skip("gpu-listing", "no nvidia-smi on this node"))
    elif not listing.ok:
        add(c.fail("gpu-listing", f"nvidia-smi -L failed (exit {listing.returncode})", c.DEV))
    else:
        add(c.check_gpu_listing(expected, listing.stdout))

    counters = run_if_installed(runner, list(SMI_COUNTERS)) if expected and listing is not None else None
    if counters is not None and counters.ok:
        report_rows = c.check_gpu_counters(counters.stdout, spec.thresholds)
    else:
        report_rows = [c.skip("gpu-ecc", "no nvidia-smi counters"), c.skip("gpu-clocks", "no nvidia-smi counters", c.PERF)]
    for r in report_rows:
        add(r)

    dmesg = run_if_installed(runner, ["dmesg"]) if expected else None
    if dmesg is None or not dmesg.ok:
        add(c.skip("xid", "no GPUs" if not expected else "kernel log not readable here"))
    else:
        # the mark is dmesg's clock (seconds since boot), which restarts with every boot: it is
        # kept with the boot id, and a mark of another boot means every XID of this one is new
        mark_file = os.path.join(spec.state_dir, f"xid-{node}")
        boot = (read_or_none(runner, BOOT_ID) or "").strip()
        prev = read_or_none(runner, mark_file)
        since = c.xid_since(prev, boot)
        result, mark = c.check_xid(dmesg.stdout, since)
        add(result)
        text = c.xid_mark_text(boot, mark) if mark is not None else None
        if record and text is not None and text.split() != (prev or "").split():
            if not write_state(runner, spec.state_dir, mark_file, text):
                add(c.warn("xid-state", f"cannot record the XID mark in {mark_file}"))

    if spec.ib_min_rate is None and spec.ib_ports is None:
        add(c.check_ib(None, min_rate=None, ports=None))
    else:
        ib = run_if_installed(runner, ["ibstat"])
        add(c.check_ib(ib.stdout if ib and ib.ok else None, min_rate=spec.ib_min_rate, ports=spec.ib_ports))


def write_state(runner: Runner, state_dir: str, path: str, text: str) -> bool:
    """Write one of the gate's state files (``state_dir`` made when missing); False when it
    cannot be written."""
    try:
        runner.makedirs(state_dir)
        runner.write_file(path, text)
    except (OSError, TransportError):
        return False
    return True


def perf_state_path(state_dir: str, node: str) -> str:
    return os.path.join(state_dir, f"perf-{node}")

