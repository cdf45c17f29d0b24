"""What a node should look like, for the health checks: a small YAML/JSON file (or defaults).

GPU counts and types come from gres.conf (the one source, rendered from the cluster spec);
the rest is here::

    gres_conf: /etc/slurm/gres.conf     # default: next to $SLURM_CONF
    scratch: {path: /scratch, min_free_gb: 50, must_be_mount: true}
    mounts: [/home, /shared]
    ib: {min_rate: 400, ports: 8}       # Gb/s per active port; omit for no IB
    thresholds: {ecc_uncorrected: 0, min_sm_clock_ratio: 0.0}
    state_dir: /var/lib/gpuhpc/health   # XID high-water marks, perf samples
    perf: {fail_samples: 3, window: 5, min_drain_s: 600}   # perf drains: 3 of the last 5 samples
    deep: {dcgm_level: 2, nccl_min_ratio: 0.9, timeout_s: 1800,   # gpuhpc.health.deep
           mig_dcgm_level: 1, partition: null, wait_s: 86400,     # run as an exclusive Slurm job
           results_dir: /var/lib/gpuhpc/deep-results}             # shared: the job writes, gpuhpc reads
    host: {memory_mb: slurm, cpus: slurm}   # at least the node's RealMemory / CPUs (or a number)
    filesystems: [/scratch, /shared]    # mount points, read-write, root can create a file
    pcie: {width: 16}                   # default: each GPU's maximum link width
    nvlink: {links: 18, min_gbps: 26}   # per GPU; omit for no NVLink
    ib: {min_rate: 400, ports: 8, max_link_downed: 0, max_symbol_errors: 0}   # per run
    gpudirect: true                     # nv_peermem loaded
    fabric_manager: true                # NVSwitch system: fabric registration / nvidia-fabricmanager
    gpu_processes: {ignore: [nv-hostengine, nvvs, dcgmi, dcgm-exporter, all_reduce_perf]}
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from gpuhpc.errors import UserInputError
from gpuhpc.health.checks import GPU_PROCESS_IGNORE, Hysteresis, Thresholds


@dataclass(frozen=True)
class HealthSpec:
    """The expectations a node is checked against."""

    gres_conf: str | None = None
    scratch_path: str | None = None
    scratch_min_free_gb: float = 10.0
    scratch_must_be_mount: bool = True
    mounts: tuple[str, ...] = ()
    ib_min_rate: int | None = None
    ib_ports: int | None = None
    thresholds: Thresholds = field(default_factory=Thresholds)
    state_dir: str = "/var/lib/gpuhpc/health"
    deep_dcgm_level: int = 2                 # dcgmi diag -r 2 (medium) or 3 (long)
    deep_nccl_min_ratio: float = 0.9         # all-reduce bus bandwidth below this × the baseline drains
    deep_timeout_s: float = 1800
    deep_mig_dcgm_level: int = 1             # a MIG node's diag level (at most dcgm_level); no nccl there
    deep_partition: str | None = None        # None: the node's lowest-PriorityTier partition
    deep_wait_s: float = 86400               # how long the job may wait for the node's jobs to end
    deep_results_dir: str = "/var/lib/gpuhpc/deep-results"   # $GPUHPC_DEEP_RESULTS wins
    hysteresis: Hysteresis = field(default_factory=Hysteresis)
    # host memory (MiB) and CPUs: None not checked, "slurm" the node's RealMemory / CPUs in Slurm
    host_memory_mb: int | str | None = None
    host_cpus: int | str | None = None
    filesystems: tuple[str, ...] = ()          # mounted, read-write, writable by root
    pcie_width: int | None = None              # None: each GPU's own maximum
    nvlink_links: int | None = None            # NVLinks per GPU; None: not checked
    nvlink_min_gbps: float | None = None
    ib_max_link_downed: int = 0                # allowed growth per run of link_downed
    ib_max_symbol_errors: int = 0              # ... and of symbol_error
    gpudirect: bool = False                    # nv_peermem must be loaded
    fabric_manager: bool = False               # an NVSwitch system: the fabric must be up
    gpu_process_ignore: tuple[str, ...] = GPU_PROCESS_IGNORE

    def gres_conf_path(self, slurm_conf: str | None) -> str:
        if self.gres_conf:
            return self.gres_conf
        return os.path.join(os.path.dirname(slurm_conf or "/etc/slurm/slurm.conf"), "gres.conf")


_TOP = {"gres_conf", "scratch", "mounts", "ib", "thresholds", "state_dir", "deep", "perf", "host", "filesystems",
        "pcie", "nvlink", "gpudirect", "fabric_manager", "gpu_processes"}


def load(text: str, source: str = "health spec") -> HealthSpec:
    """A :class:`HealthSpec` from YAML (or JSON) text; unknown keys are an error naming the valid ones."""
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserInputError(f"{source}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{source}: expected a mapping")
    unknown = set(data) - _TOP
    if unknown:
        raise UserInputError(f"unknown key {sorted(unknown)[0]!r}", field=source,
                             hint=f"valid: {', '.join(sorted(_TOP))}")

    def sub(key: str, allowed: set[str]) -> dict:
        v = data.get(key) or {}
        if not isinstance(v, dict):
            raise UserInputError("expected a mapping", field=f"{source}.{key}")
        bad = set(v) - allowed
        if bad:
            raise UserInputError(f"unknown key {sorted(bad)[0]!r}", field=f"{source}.{key}",
                                 hint=f"valid: {', '.join(sorted(allowed))}")
        return v

    scratch = sub("scratch", {"path", "min_free_gb", "must_be_mount"})
    ib = sub("ib", {"min_rate", "ports", "max_link_downed", "max_symbol_errors"})
    host = sub("host", {"memory_mb", "cpus"})
    for key in ("memory_mb", "cpus"):
        v = host.get(key)
        if v is not None and v != "slurm" and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UserInputError(f"expected a whole number or 'slurm', got {v!r}", field=f"{source}.host.{key}",
                                 hint="'slurm': the node's RealMemory / CPUs as Slurm knows them")
    pcie = sub("pcie", {"width"})
    nvlink = sub("nvlink", {"links", "min_gbps"})
    procs = sub("gpu_processes", {"ignore"})
    ignore = procs.get("ignore", list(GPU_PROCESS_IGNORE))
    if not isinstance(ignore, list) or not all(isinstance(x, str) and x for x in ignore):
        raise UserInputError("expected a list of process names", field=f"{source}.gpu_processes.ignore")
    for key in ("gpudirect", "fabric_manager"):
        if not isinstance(data.get(key, False), bool):
            raise UserInputError(f"expected true or false, got {data[key]!r}", field=f"{source}.{key}")
    deep = sub("deep", {"dcgm_level", "nccl_min_ratio", "timeout_s", "mig_dcgm_level", "partition", "wait_s",
                        "results_dir"})
    for key, default in (("dcgm_level", 2), ("mig_dcgm_level", 1)):
        if deep.get(key, default) not in (1, 2, 3, 4):
            raise UserInputError(f"{key} must be 1, 2, 3 or 4", field=f"{source}.deep.{key}")
    part = deep.get("partition")
    if part is not None and not (isinstance(part, str) and part.replace("-", "").replace("_", "").isalnum()):
        raise UserInputError(f"not a partition name: {part!r}", field=f"{source}.deep.partition")
    res_dir = deep.get("results_dir", HealthSpec.deep_results_dir)
    if not (isinstance(res_dir, str) and res_dir.startswith("/")):
        raise UserInputError("expected an absolute path", field=f"{source}.deep.results_dir")
    perf = sub("perf", {"fail_samples", "window", "min_drain_s"})
    hyst = _hysteresis(perf, f"{source}.perf")
    th_names = {f.name for f in fields(Thresholds)}
    th = sub("thresholds", th_names)
    mounts = data.get("mounts") or []
    if not isinstance(mounts, list) or not all(isinstance(m, str) and m.startswith("/") for m in mounts):
        raise UserInputError("expected a list of absolute paths", field=f"{source}.mounts")
    filesystems = data.get("filesystems") or []
    if not isinstance(filesystems, list) or not all(isinstance(m, str) and m.startswith("/") for m in filesystems):
        raise UserInputError("expected a list of absolute paths", field=f"{source}.filesystems")
    try:
        return HealthSpec(
            gres_conf=data.get("gres_conf"),
            scratch_path=scratch.get("path"), scratch_min_free_gb=float(scratch.get("min_free_gb", 10.0)),
            scratch_must_be_mount=bool(scratch.get("must_be_mount", True)),
            mounts=tuple(mounts),
            ib_min_rate=int(ib["min_rate"]) if ib.get("min_rate") is not None else None,
            ib_ports=int(ib["ports"]) if ib.get("ports") is not None else None,
            thresholds=Thresholds(**th),
            state_dir=str(data.get("state_dir") or HealthSpec.state_dir),
            deep_dcgm_level=int(deep.get("dcgm_level", 2)),
            deep_nccl_min_ratio=float(deep.get("nccl_min_ratio", 0.9)),
            deep_timeout_s=float(deep.get("timeout_s", 1800)),
            deep_mig_dcgm_level=int(deep.get("mig_dcgm_level", 1)), deep_partition=part,
            deep_wait_s=float(deep.get("wait_s", 86400)), deep_results_dir=res_dir,
            hysteresis=hyst,
            host_memory_mb=host.get("memory_mb"), host_cpus=host.get("cpus"),
            filesystems=tuple(filesystems),
            pcie_width=int(pcie["width"]) if pcie.get("width") is not None else None,
            nvlink_links=int(nvlink["links"]) if nvlink.get("links") is not None else None,
            nvlink_min_gbps=float(nvlink["min_gbps"]) if nvlink.get("min_gbps") is not None else None,
            ib_max_link_downed=int(ib.get("max_link_downed", 0)),
            ib_max_symbol_errors=int(ib.get("max_symbol_errors", 0)),
            gpudirect=bool(data.get("gpudirect", False)), fabric_manager=bool(data.get("fabric_manager", False)),
            gpu_process_ignore=tuple(ignore),
        )
    except (TypeError, ValueError) as exc:
        raise UserInputError(f"bad value: {exc}", field=source) from None


def _hysteresis(perf: dict, where: str) -> Hysteresis:
    d = Hysteresis()

    def num(key: str, kind, default):
        v = perf.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
            raise UserInputError(f"expected a {'whole ' if kind is int else ''}number, got {v!r}",
                                 field=f"{where}.{key}")
        return kind(v)

    window = num("window", int, d.window)
    fail_samples = num("fail_samples", int, d.fail_samples)
    min_drain_s = num("min_drain_s", float, d.min_drain_s)
    if not 1 <= window <= 100:
        raise UserInputError("must be 1 to 100 samples", field=f"{where}.window")
    if not 1 <= fail_samples <= window:
        raise UserInputError(f"must be 1 to window ({window})", field=f"{where}.fail_samples",
                             hint="drain after this many failed samples of the last `window`")
    if min_drain_s < 0:
        raise UserInputError("must be 0 or more seconds", field=f"{where}.min_drain_s")
    return Hysteresis(fail_samples, window, min_drain_s)
