"""Run the health checks on a node: fetch each check's text through a :class:`Runner`, call the
pure checks, time the run. Two sets:

- ``prolog``: the fast subset for Slurm's Prolog (goal: well under 1 s): GPU device files vs
  gres.conf, required mounts, scratch space, the spec's filesystems (mounted, writable), munge.
- ``full``: adds what needs the driver or the kernel log: ``nvidia-smi -L`` (count, types, MIG
  layout), XIDs since the last run, ECC/row-remap/retired pages, clocks and throttle reasons,
  GPU processes left without a job, PCIe link width, NVLink, Fabric Manager, IB ports
  (``ibstat``) and their error counters, nv_peermem, host memory and CPUs. For
  HealthCheckProgram, the epilog, and ``gpuhpc node health``.

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
SMI_APPS = ("nvidia-smi", "--query-compute-apps=pid,process_name", "--format=csv,noheader")
SMI_PCIE = ("nvidia-smi", f"--query-gpu={','.join(c.PCIE_FIELDS)}", "--format=csv,noheader")
SMI_NVLINK = ("nvidia-smi", "nvlink", "--status")
SMI_QUERY = ("nvidia-smi", "-q")
FM_ACTIVE = ("systemctl", "is-active", "nvidia-fabricmanager")
ONLINE_CPUS = ("getconf", "_NPROCESSORS_ONLN")

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
               record: bool = True, slurm_node=None) -> c.Report:
    """All checks of ``mode`` for ``node`` (the Slurm node name: gres.conf lines are per node).
    ``record``: store the XID high-water mark and the IB counters for the next run (a run that
    acts on its findings does; a look that changes nothing leaves what it saw for the run that
    acts). ``slurm_node``: the node as Slurm knows it (:class:`gpuhpc.slurm.parsers.NodeInfo`: its
    state says whether a job runs there, its RealMemory and CPUs are the host's expectations);
    None: the checks that need it skip."""
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

    add(c.check_filesystems(spec.filesystems, mounts_text, probe_filesystems(runner, spec.filesystems, mounts_text)))

    enc = run_if_installed(runner, ["munge", "-n"], timeout=10)
    if enc is None:
        add(c.fail("munge", "munge", c.SW))
    else:
        dec = run_if_installed(runner, ["unmunge"], input=enc.stdout, timeout=10) if enc.ok else None
        add(c.check_munge(enc.returncode, dec.returncode if dec else 1, dec.stdout if dec else ""))

    if mode == "full":
        smi = _full(node, runner, spec, lines, add, record)
        _site(node, runner, spec, lines, add, record, slurm_node, smi)
    report.elapsed_s = time.perf_counter() - t0
    return report


def _full(node: str, runner: Runner, spec: HealthSpec, lines: list[c.GresLine], add, record: bool) -> bool:
    """The GPU and IB checks; whether nvidia-smi answered here."""
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
        add(c.skip("ib-errors", "no IB in the spec", c.DEV))
    else:
        ib = run_if_installed(runner, ["ibstat"])
        add(c.check_ib(ib.stdout if ib and ib.ok else None, min_rate=spec.ib_min_rate, ports=spec.ib_ports))
        _ib_errors(node, runner, spec, ib.stdout if ib and ib.ok else "", add, record)
    return listing is not None


def _ib_errors(node: str, runner: Runner, spec: HealthSpec, ibstat_text: str, add, record: bool) -> None:
    """IB error counters (``perfquery -C CA -P PORT`` for each InfiniBand port ibstat lists): their
    growth since the last run of this boot, kept in ``state_dir/ib-<node>``."""
    now: dict[str, dict[str, int]] = {}
    for p in c.parse_ibstat(ibstat_text):
        if p.link_layer != "InfiniBand":
            continue
        res = run_if_installed(runner, ["perfquery", "-C", p.ca, "-P", str(p.port)])
        if res is None:
            add(c.skip("ib-errors", "no perfquery on this node", c.DEV))
            return
        counters = c.parse_perfquery(res.stdout) if res.ok else {}
        if counters:
            now[f"{p.ca}/{p.port}"] = counters
    path = os.path.join(spec.state_dir, f"ib-{node}")
    boot = (read_or_none(runner, BOOT_ID) or "").strip()
    prev = c.ib_counters_state(read_or_none(runner, path), boot)
    add(c.check_ib_counters(now, prev, max_link_downed=spec.ib_max_link_downed,
                            max_symbol_errors=spec.ib_max_symbol_errors))
    if record and now and now != prev and not write_state(runner, spec.state_dir, path, c.ib_counters_text(now, boot)):
        add(c.warn("ib-state", f"cannot record the IB counters in {path}", c.DEV))


def probe_filesystems(runner: Runner, paths, mounts_text: str, timeout: float = 10) -> dict[str, str | None]:
    """Create and delete a file in each of ``paths`` that is mounted read-write ({path: None when
    both worked, else what failed}). ``mktemp`` then ``rm`` through the runner, each with a timeout
    (a hung NFS server must not hang the check)."""
    opts = c.parse_mount_options(mounts_text)
    out: dict[str, str | None] = {}
    for path in paths:
        p = path.rstrip("/") or "/"
        if p not in opts or "ro" in opts[p]:
            continue
        try:
            made = run_if_installed(runner, ["mktemp", "-p", p, ".gpuhpc-health.XXXXXX"], timeout=timeout)
            if made is None or not made.ok or not made.stdout.strip():
                err = (made.stderr.strip().splitlines() or [f"exit {made.returncode}"])[-1] if made else "no mktemp"
                out[p] = f"create: {err.rsplit(':', 1)[-1].strip()[:60]}"
                continue
            gone = run_if_installed(runner, ["rm", "-f", made.stdout.strip()], timeout=timeout)
            out[p] = None if gone is not None and gone.ok else "delete failed"
        except TransportError as exc:        # the runner's timeout: a hung server
            out[p] = "timed out" if "timed out" in exc.message.lower() else exc.message[:60]
    return out


def _site(node: str, runner: Runner, spec: HealthSpec, lines: list[c.GresLine], add, record: bool,
          slurm_node, smi: bool) -> None:
    """The checks of the broken nodes a site sees: GPU processes left without a job, PCIe width,
    NVLink, Fabric Manager, nv_peermem, host memory and CPUs (the IB error counters go with ibstat)."""
    gpus = bool(c.expected_counts(lines))

    # GPU processes while Slurm runs no job on the node
    if not smi:
        add(c.skip("gpu-procs", "no GPUs" if not gpus else "no nvidia-smi on this node", c.DEV))
    else:
        apps = run_if_installed(runner, list(SMI_APPS))
        if apps is None or not apps.ok:
            add(c.skip("gpu-procs", "nvidia-smi does not list compute processes here", c.DEV))
        else:
            running = c.jobs_running(slurm_node.state) if slurm_node is not None else None
            add(c.check_gpu_processes(apps.stdout, jobs_running=running, ignore=spec.gpu_process_ignore))

    # PCIe link width
    pcie = run_if_installed(runner, list(SMI_PCIE)) if smi else None
    if pcie is None or not pcie.ok:
        add(c.skip("pcie", "no PCIe link figures from nvidia-smi"))
    else:
        add(c.check_pcie(pcie.stdout, width=spec.pcie_width))

    # NVLink (only where the spec says the GPUs have it)
    if spec.nvlink_links is None:
        add(c.check_nvlink(None, links=None))
    else:
        nvl = run_if_installed(runner, list(SMI_NVLINK)) if gpus else None
        if not gpus:
            add(c.skip("nvlink", "no GPUs in gres.conf for this node"))
        else:
            add(c.check_nvlink(nvl.stdout if nvl is not None and nvl.ok else None, links=spec.nvlink_links,
                               min_gbps=spec.nvlink_min_gbps))

    # Fabric Manager (an NVSwitch system, in the spec)
    if not spec.fabric_manager or not gpus:
        add(c.check_fabric_manager(None, None, required=False) if not spec.fabric_manager
            else c.skip("fabric-manager", "no GPUs in gres.conf for this node"))
    else:
        q = run_if_installed(runner, list(SMI_QUERY), timeout=60)
        fabric = q.stdout if q is not None and q.ok else None
        service = None
        if not c.parse_fabric(fabric or ""):
            fm = run_if_installed(runner, list(FM_ACTIVE))
            service = fm.stdout if fm is not None else None
        add(c.check_fabric_manager(fabric, service, required=True))

    # GPUDirect RDMA
    add(c.check_peermem(read_or_none(runner, "/proc/modules") if spec.gpudirect else None, required=spec.gpudirect))

    # host memory and CPUs against the spec (a number, or the node's RealMemory / CPUs in Slurm)
    def want(v, slurm_value):
        if v == "slurm":
            return slurm_value if slurm_node is not None else None
        return v

    mem = want(spec.host_memory_mb, slurm_node.real_memory_mb if slurm_node is not None else None)
    cpus = want(spec.host_cpus, slurm_node.cpus if slurm_node is not None else None)
    if (spec.host_memory_mb is not None or spec.host_cpus is not None) and mem is None and cpus is None:
        add(c.skip("host", "the node's RealMemory and CPUs are not known (Slurm not asked)"))
    else:
        meminfo = read_or_none(runner, "/proc/meminfo") if mem is not None else None
        ncpu = run_if_installed(runner, list(ONLINE_CPUS)) if cpus is not None else None
        add(c.check_host(meminfo, ncpu.stdout if ncpu is not None and ncpu.ok else None, memory_mb=mem,
                         cpus=cpus))


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

