"""The normalized template context: everything ``slurm-conf/*.j2`` needs, as plain JSON data.

Both renderers use it: :mod:`gpuhpc.conf.render` (``gpuhpc conf render``) and the Ansible roles,
which read it from ``gpuhpc conf context SPEC`` and pass it to the same templates as
``gpuhpc_conf``. All logic (hostlist compression, MIG mapping, TRES lists, %n paths) lives here,
so the templates stay plain Jinja with standard filters only.
"""
from __future__ import annotations

import posixpath
import re
from fractions import Fraction
from typing import Any

from gpuhpc.conf.validate import resolve_nodes
from gpuhpc import hostlist
from gpuhpc.spec.cluster import ARCHIVE_PURGE, ClusterSpec, NodeGroup

FAKE_GPU_MAJOR = 195     # nvidia's character-device major
# the Slurm release the files are for when none is given: Debian 12's. The roles pass the release
# their hosts run (`gpuhpc conf context --slurm-version`); Debian 13 ships 24.11.
DEFAULT_SLURM_VERSION = "22.05"

MIG_MINOR_BASE = 100     # fake MIG devices get minors 100, 101, ...


def slurm_release(version: str) -> tuple[int, int]:
    """(major, minor) of a Slurm version as ``sinfo --version`` or dpkg write it: ``24.11``,
    ``24.11.5``, ``24.11.5-1``, ``slurm 22.05.8``, ``slurm-wlm 22.05.8-4+deb12u3``."""
    m = re.search(r"(?:^|\s)(\d{2})\.(\d{2})(?:[.\-+~]|$)", version.strip())
    if not m:
        from gpuhpc.errors import UserInputError

        raise UserInputError(f"slurm_version {version!r} is not a Slurm version",
                             field="slurm_version", hint="give MAJOR.MINOR, e.g. 22.05 or 24.11")
    return int(m.group(1)), int(m.group(2))


def _yesno(v: bool) -> str:
    return "YES" if v else "NO"


def _node_gpus(g: NodeGroup, node: str) -> list[dict[str, Any]]:
    """One entry per schedulable GPU (a whole GPU or a MIG instance), in device order."""
    gp = g.gpus
    if gp is None:
        return []
    out: list[dict[str, Any]] = []
    mig_index = 0
    for i in range(gp.count):
        cores = gp.cpu_affinity[i] if gp.cpu_affinity else None
        layout = gp.mig[i] if gp.mig is not None else []
        if not layout:
            out.append({"type": gp.type, "file": gp.device.format(index=i, node=node), "minor": i,
                        "cores": cores, "mig": False})
            continue
        for prof in layout:
            out.append({"type": prof, "file": gp.mig_device.format(index=mig_index, node=node),
                        "minor": MIG_MINOR_BASE + mig_index, "cores": cores, "mig": True})
            mig_index += 1
    return out


def _gres_string(gpus: list[dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for d in gpus:
        counts[d["type"]] = counts.get(d["type"], 0) + 1
    return ",".join(f"gpu:{t}:{c}" for t, c in counts.items())


def _merge(rows: list[dict[str, Any]], key: str = "nodes") -> list[dict[str, Any]]:
    """Merge rows that differ only in ``key`` (a node name) into one row with a hostlist."""
    merged: list[tuple[dict[str, Any], list[str]]] = []
    for row in rows:
        rest = {k: v for k, v in row.items() if k != key}
        for other, names in merged:
            if other == rest:
                names.append(row[key])
                break
        else:
            merged.append((rest, [row[key]]))
    return [{key: hostlist.compress(names), **rest} for rest, names in merged]


def _per_gpu_defaults(spec: ClusterSpec, p: Any, node_rows: list[dict[str, Any]]) -> dict[str, int | None]:
    """DefCpuPerGPU / DefMemPerGPU of a partition: as given, else, for a partition whose nodes
    all have GPUs, each node's CPUs and RealMemory divided by its GPUs (MIG instances count
    as GPUs), on the partition's smallest node. So a GPU job that asks for no CPUs or memory
    gets its share of the node instead of one CPU."""
    rows = {r["nodes"]: r for r in node_rows}
    names = ([r["nodes"] for r in node_rows] if list(p.nodes) == ["ALL"]
             else resolve_nodes(spec, list(p.nodes), ""))
    cpu, mem = p.def_cpu_per_gpu, p.def_mem_per_gpu_mb
    shares = []
    for n in names:
        row = rows.get(n)
        gres = (row or {}).get("gres") or ""
        gpus = sum(int(part.rsplit(":", 1)[1]) for part in gres.split(",") if part.startswith("gpu:"))
        if not gpus:
            shares = []
            break
        shares.append((row["cpus"] // gpus, row["real_memory"] // gpus))
    if shares:
        cpu = cpu if cpu is not None else max(1, min(c for c, _ in shares))
        mem = mem if mem is not None else max(1, min(m for _, m in shares))
    return {"def_cpu_per_gpu": cpu, "def_mem_per_gpu": mem}


def _nccl_profiles(spec: ClusterSpec) -> list[dict[str, Any]]:
    """Per node group with GPUs: the NCCL/IB environment its jobs source (``nccl.env.j2``)."""
    out = []
    for g in spec.node_groups:
        if g.gpus is None:
            continue
        env: list[tuple[str, str]] = []
        if g.ib_hcas:                              # rail order: as the spec lists them
            env.append(("NCCL_IB_HCA", "=" + ",".join(f"{h}:1" for h in g.ib_hcas)))
        if spec.nccl.ib_gid_index is not None:
            env.append(("NCCL_IB_GID_INDEX", str(spec.nccl.ib_gid_index)))
        if spec.nccl.socket_ifname is not None:
            env.append(("NCCL_SOCKET_IFNAME", spec.nccl.socket_ifname))
        env.append(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))
        env.extend(sorted(spec.nccl.env.items()))
        out.append({"group": g.name, "nodes": hostlist.compress(g.node_names()), "env": env})
    return out


def _fmt_weight(w: Fraction) -> str:
    """A billing weight as Slurm reads it (a decimal, at most 6 places, no trailing zeros)."""
    q = round(w * 1_000_000)
    whole, frac = divmod(q, 1_000_000)
    return str(whole) + (f".{frac:06d}".rstrip("0") if frac else "")


def billing_weights(billing: dict[str, Any] | None, partitions: list[dict[str, Any]],
                    node_rows: list[dict[str, Any]], gpu_types: list[str]) -> dict[str, str]:
    """``TRESBillingWeights`` per partition from the ledger's billing document
    (``gpuhpc ledger billing``: ``{"rates": {gpu type or "*": weight per GPU}, "partitions":
    {name: multiplier}}``, weights in billing units, docs/ledger.md).

    A partition's weights are its GPU types' rates × its multiplier, written as ``GRES/gpu=<the
    lowest>`` plus ``GRES/gpu:<type>=<rate - lowest>`` for the dearer types: a typed request
    is billed its type's rate exactly, and an untyped one (``--gpus=1``) is estimated at the
    partition's lowest rate until its GPU is allocated. CPUs and memory are not billed
    (``CPU=0``), as in the ledger."""
    if not billing:
        return {}
    rates = {str(k): Fraction(str(v)) for k, v in (billing.get("rates") or {}).items()}
    mults = {str(k): Fraction(str(v)) for k, v in (billing.get("partitions") or {}).items()}
    types_of: dict[str, list[str]] = {}
    for row in node_rows:
        for part in (row.get("gres") or "").split(","):
            if part.startswith("gpu:"):
                types_of.setdefault(row["nodes"], []).append(part.split(":")[1])
    out: dict[str, str] = {}
    for p in partitions:
        names = list(types_of) if p["nodes"] == "ALL" else hostlist.expand(p["nodes"])
        types = [t for t in gpu_types if any(t in types_of.get(n, []) for n in names)]
        priced = {t: rates.get(t, rates.get("*")) for t in types}
        priced = {t: r * mults.get(p["name"], Fraction(1)) for t, r in priced.items() if r is not None}
        if not priced:
            out[p["name"]] = "CPU=0"
            continue
        low = min(priced.values())
        parts = ["CPU=0", f"GRES/gpu={_fmt_weight(low)}"]
        parts += [f"GRES/gpu:{t}={_fmt_weight(r - low)}" for t, r in priced.items() if r != low]
        out[p["name"]] = ",".join(parts)
    return out


# AuthInfo cred_expire for a cluster with cloud nodes when runtime.cred_expire is not set: Slurm's
# and slurm-gcp's 120 s, written out. A requeued job (a spot reclaim, a node that never booted) may
# start again only cred_expire + 1 s later, but a shorter lifetime lets a job credential expire
# before a busy slurmd (a node booting, a loaded controller) takes it: the step fails. A site that
# wants faster requeues lowers it knowingly (docs/elastic.md); the tests do.
ELASTIC_CRED_EXPIRE = 120
ELASTIC_SUSPEND_TIME = 300      # SuspendTime when no cloud group sets idle_timeout
RESUME_TIMEOUT_MARGIN = 30      # ResumeTimeout default: the slowest boot_timeout + this


def _power(spec: ClusterSpec, release: tuple[int, int] = (22, 5)) -> dict[str, Any] | None:
    """Slurm's power-saving block for the ``capacity: cloud`` groups, None without any. Slurm
    22.05 has one SuspendTime and ResumeTimeout for the cluster: the shortest idle_timeout and
    the slowest boot (+ a margin). Static nodes are excluded from power saving; ResumeRate and
    SuspendRate 0 (no limit): the provider, not Slurm, paces launches. ``idle_on_node_suspend``
    returns a node that was DOWN (a reclaim, a capacity error) to the pool once it is powered down."""
    cloud = [g for g in spec.node_groups if g.capacity == "cloud"]
    if not cloud:
        return None
    pw = spec.power
    static = [n for g in spec.node_groups if g.capacity == "static" for n in g.node_names()]
    boots = [g.boot_timeout for g in cloud if g.boot_timeout is not None]
    idles = [g.idle_timeout for g in cloud if g.idle_timeout is not None]
    params = ["idle_on_node_suspend"] + (["cloud_dns"] if pw.cloud_dns else [])
    prog = lambda name: posixpath.join(pw.programs_dir, name)  # noqa: E731
    return {
        "resume_program": prog("gpuhpc-power-resume"),
        "suspend_program": prog("gpuhpc-power-suspend"),
        "resume_fail_program": prog("gpuhpc-power-resume-fail"),
        "suspend_time": min(idles) if idles else ELASTIC_SUSPEND_TIME,
        "resume_timeout": pw.resume_timeout or (max(boots) + RESUME_TIMEOUT_MARGIN if boots else 300),
        "suspend_timeout": pw.suspend_timeout,
        "suspend_exc_nodes": hostlist.compress(static) if static else None,
        "resume_rate": 0,
        "suspend_rate": 0,
        # without resolvable names slurmctld must not fan messages out through nodes (slurm.conf(5), CLOUD)
        "tree_width": None if pw.cloud_dns else 65533,
        # 22.05 hides powered-down cloud nodes without it; 23.02 shows them and dropped the value
        "private_data_cloud": release < (23, 2),
        "slurmctld_parameters": params,
        # not used by the templates; for gpuhpc power and the gpuhpc_elastic role
        "state_dir": pw.state_dir,
        "orphan_grace": pw.orphan_grace,
        "groups": [{"name": g.name, "nodes": hostlist.compress(g.node_names()), "provider": g.provider,
                    "market": g.market, "instance_types": list(g.instance_types),
                    "max_nodes": g.max_nodes or g.count, "boot_timeout": g.boot_timeout,
                    "idle_timeout": g.idle_timeout, "capacity_cooldown": g.capacity_cooldown,
                    "price_tier": g.price_tier,
                    **{k: v for k, v in (("single_zone", g.single_zone), ("placement_group", g.placement_group),
                                         ("capacity_reservation_id", g.capacity_reservation_id),
                                         ("capacity_type", g.capacity_type)) if v is not None and v is not True}}
                   for g in cloud],
    }


def _reboot(spec: ClusterSpec, power: dict[str, Any] | None) -> dict[str, Any] | None:
    """RebootProgram and the ResumeTimeout a reboot needs (``scontrol reboot``, ``gpuhpc node
    reboot``); None without a program or where several slurmd share a host. With cloud groups the
    power block's ResumeTimeout stands (22.05 has one per cluster)."""
    rt = spec.runtime
    if not rt.reboot_program or rt.multiple_slurmd:
        return None
    return {"program": rt.reboot_program, "resume_timeout": None if power else rt.reboot_timeout}


HOOKS_ENV_FILE = "/etc/gpuhpc/hooks.env"   # the hooks read it (gpuhpc/health/hooks/*; $GPUHPC_HOOKS_ENV)


def _health(spec: ClusterSpec) -> dict[str, Any] | None:
    """HealthCheckProgram/Interval/NodeState, Prolog and Epilog (the gpuhpc hooks), and what the
    gpuhpc_slurm_common role writes to the hooks' env file; None without ``health`` in the spec."""
    h = spec.health
    if h is None:
        return None
    hook = lambda name: posixpath.join(h.hooks_dir, name)  # noqa: E731
    return {
        "program": h.program or hook("gpuhpc-healthcheck"),
        "interval": h.interval,
        "node_state": ",".join(h.node_state),
        "prolog": hook("gpuhpc-prolog") if h.prolog else None,
        "epilog": hook("gpuhpc-epilog") if h.epilog else None,
        # not used by the templates; for the gpuhpc_slurm_common role (hooks and hooks.env)
        "hooks_dir": h.hooks_dir,
        "hooks": ["gpuhpc-healthcheck"] + (["gpuhpc-prolog"] if h.prolog else []) + (["gpuhpc-epilog"] if h.epilog else []),
        "env_file": HOOKS_ENV_FILE,
        "env": {"GPUHPC_PYTHON": h.python, "GPUHPC_JOBMAP_DIR": h.jobmap_dir,
                **({"GPUHPC_HEALTH_SPEC": h.spec_file} if h.spec_file else {})},
    }


def _nvlink_blocks(spec: ClusterSpec, release: tuple[int, int]) -> list[dict[str, str]]:
    """topology/block's blocks: one per NVLink domain (``topology.plugin: block``). Slurm has
    topology/block from 23.11; for an older release it is refused (the domains are node features
    ``nvl-<domain>`` on every release)."""
    if spec.topology.plugin != "block":
        return []
    if release < (23, 11):
        from gpuhpc.errors import UserInputError

        raise UserInputError(f"topology/block needs Slurm 23.11 or later, not {release[0]}.{release[1]:02d}",
                             field="topology.plugin", hint="use tree (NVLink domains are the node features "
                             "nvl-<domain> on every release), or render for the release the cluster runs")
    by: dict[str, list[str]] = {}
    for node, dom in spec.nvlink_domains().items():
        by.setdefault(dom, []).append(node)
    if not by:
        from gpuhpc.errors import UserInputError

        raise UserInputError("topology/block needs NVLink domains", field="topology.plugin",
                             hint="give node groups nvlink_domain, nvlink_domain_size or nvlink_domains")
    return [{"name": d, "nodes": hostlist.compress(nodes)} for d, nodes in by.items()]


def _nodes(spec: ClusterSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The node groups: for the roles (one entry per node), slurm.conf's NodeName rows, gres.conf's
    rows, and the GPU types in the order they first appear."""
    rt = spec.runtime
    run = rt.run_dir
    log = rt.log_dir
    nodes: list[dict[str, Any]] = []
    node_rows: list[dict[str, Any]] = []
    gres_rows: list[dict[str, Any]] = []
    gpu_types: list[str] = []
    for g in spec.node_groups:
        nvl = g.nvlink_domain_of()     # NVLink domains as node features nvl-<domain> (docs/sprints.md)
        for k, name in enumerate(g.node_names()):
            gpus = _node_gpus(g, name)
            for d in gpus:
                if d["type"] not in gpu_types:
                    gpu_types.append(d["type"])
            port = g.port + k if g.port is not None else None
            row = {
                "nodes": name,
                "hostname": g.node_hostname,
                "addr": g.addr,
                "port": port,
                "cpus": g.cpus,
                "sockets": g.sockets,
                "cores_per_socket": g.cores_per_socket,
                "threads_per_core": g.threads_per_core,
                "real_memory": g.real_memory_mb or g.memory_mb,
                "tmp_disk": g.scratch.size_gb * 1024 if g.scratch and g.scratch.size_gb else None,
                "gres": _gres_string(gpus) or None,
                "features": ",".join([*g.features, *([f"nvl-{nvl[name]}"] if name in nvl else [])]) or None,
                "weight": g.weight,
                "state": "CLOUD" if g.capacity == "cloud" else "UNKNOWN",
            }
            node_rows.append(row)
            # gres.conf: one row per (type, cores) on this node; with AutoDetect=nvml, MIG
            # instances are found by NVML, so their rows carry Count= instead of File=
            per: dict[tuple[str, str | None, bool], list[str]] = {}
            for d in gpus:
                per.setdefault((d["type"], d["cores"], d["mig"]), []).append(d["file"])
            for (typ, cores, mig), files in per.items():
                by_nvml = mig and rt.gres_autodetect == "nvml"
                gres_rows.append({"nodes": name, "type": typ, "file": None if by_nvml else hostlist.compress(files),
                                  "count": len(files) if by_nvml else None, "cores": cores})
            nodes.append({
                "name": name,
                "group": g.name,
                "port": port if port is not None else rt.slurmd_port,
                "addr": g.addr or name,
                "hostname": g.node_hostname or name,
                "scratch": g.scratch.path if g.scratch else None,
                # the gpuhpc_nvme_scratch role's drives and mount options (spec scratch.devices)
                "scratch_devices": list(g.scratch.devices) if g.scratch else [],
                "scratch_mount_options": list(g.scratch.mount_options) if g.scratch else [],
                "ib_hcas": list(g.ib_hcas),
                "gpus": gpus,
                # the spec's GPU model and MIG layout per GPU (None: MIG not managed), for gpuhpc_nvidia_gpu
                "gpu_type": g.gpus.type if g.gpus else None,
                "mig_layouts": [list(x) for x in g.gpus.mig] if g.gpus and g.gpus.mig is not None else None,
                # the slices' device pattern ({index}: the nvidia-caps minor the node's driver gives,
                # gpuhpc node mig-gres); gres_lines number them in spec order until the node is read
                "mig_device": g.gpus.mig_device if g.gpus else None,
                # slurmd fetches its files from the controllers (slurmd --conf-server; configless)
                "configless": g.configless,
                "spool_dir": rt.slurmd_spool_dir + (f"/{name}" if rt.multiple_slurmd else ""),
                "pid_file": posixpath.join(run, f"slurmd-{name}.pid" if rt.multiple_slurmd else "slurmd.pid"),
                "log_file": posixpath.join(log, f"slurmd-{name}.log" if rt.multiple_slurmd else "slurmd.log"),
            })

    return nodes, node_rows, gres_rows, gpu_types


def _partitions(spec: ClusterSpec, node_rows: list[dict[str, Any]], billing: dict[str, Any] | None,
                gpu_types: list[str]) -> list[dict[str, Any]]:
    """slurm.conf's PartitionName rows, with the price book's TRESBillingWeights."""
    partitions = []
    for p in spec.partitions:
        per_gpu = _per_gpu_defaults(spec, p, node_rows)
        partitions.append({
            "name": p.name,
            "nodes": "ALL" if list(p.nodes) == ["ALL"] else hostlist.compress(resolve_nodes(spec, list(p.nodes), "")),
            "default": _yesno(p.default) if p.default else None,
            "priority_tier": p.priority_tier,
            "preempt_mode": p.preempt_mode,
            "grace_time": p.grace_time,
            "max_time": p.max_time,
            "default_time": p.default_time,
            "allow_accounts": ",".join(p.allow_accounts) if p.allow_accounts else None,
            "allow_qos": ",".join(p.allow_qos) if p.allow_qos else None,
            "qos": p.qos,
            "oversubscribe": p.oversubscribe,
            "state": p.state,
            **per_gpu,
        })

    weights = billing_weights(billing, partitions, node_rows, gpu_types)
    for p in partitions:
        if p["name"] in weights:
            p["tres_billing_weights"] = weights[p["name"]]

    weights = billing_weights(billing, partitions, node_rows, gpu_types)
    for p in partitions:
        if p["name"] in weights:
            p["tres_billing_weights"] = weights[p["name"]]
    return partitions


def _accounting(spec: ClusterSpec, gpu_types: list[str]) -> dict[str, Any] | None:
    """slurmdbd and the accounting lines of slurm.conf (None: no accounting)."""
    rt = spec.runtime
    run = rt.run_dir
    log = rt.log_dir
    dbd = spec.slurmdbd
    if dbd is None:
        return None
    tres = ["gres/gpu"] + ([f"gres/gpu:{t}" for t in gpu_types] if dbd.track_gpu_types else []) if gpu_types else []
    slurm_name = {"txn": "TXN"}   # ArchiveTXN, PurgeTXNAfter; the others capitalised
    retention = [[key, value] for key, value in (("ArchiveDir", dbd.archive_dir), ("ArchiveScript", dbd.archive_script))
                 if value is not None]
    retention += [[f"Archive{slurm_name.get(what, what.capitalize())}", "yes"]
                  for what in ARCHIVE_PURGE if getattr(dbd, f"archive_{what}")]
    retention += [[f"Purge{slurm_name.get(what, what.capitalize())}After", getattr(dbd, f"purge_{what}_after")]
                  for what in ARCHIVE_PURGE.values() if getattr(dbd, f"purge_{what}_after") is not None]
    return {
        "host": dbd.host,
        "port": dbd.port,
        # the slurmctld -> slurmdbd connection ignores AuthInfo; it takes the munge socket from here
        "pass": rt.munge_socket,
        "enforce": ",".join(dbd.enforce) or None,
        "tres": ",".join(tres) or None,
        "storage_host": dbd.storage_host,
        "storage_port": dbd.storage_port,
        "storage_user": dbd.storage_user,
        "storage_db": dbd.storage_db,
        "log_file": posixpath.join(log, "slurmdbd.log"),
        "pid_file": posixpath.join(run, "slurmdbd.pid"),
        # the gpuhpc_slurmdbd role makes it (SlurmUser's, 0700)
        "archive_dir": dbd.archive_dir,
        # slurmdbd.conf's Archive* and Purge*After lines, [name, value] in slurmdbd.conf(5)'s order;
        # none by default: Slurm keeps every record
        "retention": retention,
    }


def _preemption_parameters(spec: ClusterSpec, release: tuple[int, int],
                           power: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """SlurmctldParameters and PreemptParameters: where each release wants the user-signal switch,
    and what power saving and configless node groups add (merged with the spec's own values)."""
    rt = spec.runtime
    pre = spec.preemption
    # with preemption on, a preempted job gets its --signal (SIGUSR2) at the start of GraceTime
    # instead of SIGTERM, which srun answers by killing every task (docs/jobs.md, issue 15)
    ctld_params = list(rt.slurmctld_parameters)
    preempt_params: list[str] = []
    if release >= (23, 2) and (pre.type != "none" or "preempt_send_user_signal" in ctld_params):
        ctld_params = [x for x in ctld_params if x != "preempt_send_user_signal"]
        preempt_params.append("send_user_signal")
    elif pre.type != "none" and "preempt_send_user_signal" not in ctld_params:
        ctld_params.append("preempt_send_user_signal")
    for param in (power or {}).get("slurmctld_parameters", []):
        if param not in ctld_params:
            ctld_params.append(param)
    # configless node groups fetch their files from slurmctld, which serves them only with this
    if any(g.configless for g in spec.node_groups) and "enable_configless" not in ctld_params:
        ctld_params.append("enable_configless")
    return ctld_params, preempt_params


SLURMCTLD_DEFAULT_PORT = 6817


def _conf_server(spec: ClusterSpec) -> str | None:
    """``slurmd --conf-server``'s value for configless nodes: the controllers in SlurmctldHost
    order (the first by its addr when the spec gives one), ``:port`` when not Slurm's 6817; None
    when no node group is configless."""
    if not any(g.configless for g in spec.node_groups):
        return None
    c = spec.controller
    port = "" if spec.runtime.slurmctld_port == SLURMCTLD_DEFAULT_PORT else f":{spec.runtime.slurmctld_port}"
    return ",".join(f"{h}{port}" for h in [c.addr or c.hosts[0], *c.hosts[1:]])


def _switches(spec: ClusterSpec) -> list[dict[str, Any]]:
    """topology.conf's SwitchName rows."""
    return [{
        "name": s.name,
        "nodes": hostlist.compress(resolve_nodes(spec, list(s.nodes), "")) if s.nodes else None,
        "switches": hostlist.compress(s.switches) if s.switches else None,
        "link_speed": s.link_speed,
    } for s in spec.topology.switches]


def build_context(spec: ClusterSpec, billing: dict[str, Any] | None = None,
                  slurm_version: str = DEFAULT_SLURM_VERSION) -> dict[str, Any]:
    """The template context for ``spec`` (call :func:`gpuhpc.conf.validate.validate` first).
    ``billing``: the ledger's billing document, rendered as ``TRESBillingWeights`` per partition.
    ``slurm_version``: the release the daemons run; what later releases renamed or removed is
    written their way (checked against each release's slurm.conf(5)):
    ``topology/none`` is ``topology/default`` from 23.11, and so is a tree without switches (24.11's
    topology/tree refuses every job then); ``PrivateData=cloud`` is gone from 23.02
    (cloud nodes are shown); ``SlurmctldParameters=preempt_send_user_signal`` is
    ``PreemptParameters=send_user_signal`` from 23.02; ``task/none``, ``preempt/none`` and
    ``jobcomp/none`` are no longer listed in 24.11, where leaving the parameter out means the same."""
    release = slurm_release(slurm_version)
    rt = spec.runtime
    pn = "-%n" if rt.multiple_slurmd else ""
    run = rt.run_dir
    log = rt.log_dir
    power = _power(spec, release)
    cred_expire = rt.cred_expire or (ELASTIC_CRED_EXPIRE if power else None)
    auth_info = f"socket={rt.munge_socket}" + (f",cred_expire={cred_expire}" if cred_expire else "")
    nodes, node_rows, gres_rows, gpu_types = _nodes(spec)
    partitions = _partitions(spec, node_rows, billing, gpu_types)
    accounting = _accounting(spec, gpu_types)
    pre = spec.preemption
    preempt_mode = pre.mode + (",GANG" if pre.gang else "")
    ctld_params, preempt_params = _preemption_parameters(spec, release, power)
    switches = _switches(spec)

    constrain = set(rt.cgroup_constrain)
    ctld_host = spec.controller.hosts[0] + (f"({spec.controller.addr})" if spec.controller.addr else "")
    return {
        "cluster_name": spec.name,
        "slurm_version": f"{release[0]}.{release[1]:02d}",
        "slurmctld_hosts": [ctld_host, *spec.controller.hosts[1:]],
        "slurmctld_timeout": spec.controller.timeout,
        # not used by the templates; for the roles: slurmd --conf-server of the configless nodes
        "conf_server": _conf_server(spec),
        "slurm_user": rt.slurm_user,
        "slurmd_user": rt.slurmd_user,
        "auth_info": auth_info,
        "munge_socket": rt.munge_socket,
        "slurmctld_port": rt.slurmctld_port,
        "slurmd_port": rt.slurmd_port,
        "conf_dir": rt.conf_dir,
        "state_save_location": rt.state_save_location,
        "slurmd_spool_dir": rt.slurmd_spool_dir + ("/%n" if rt.multiple_slurmd else ""),
        # several slurmd on one host share its /tmp, where mpi/pmix makes each step's client directory
        # (spmix_appdir_<uid>_<job>.<step>) under TmpFS: the second node of a step would find the first's
        # and fail. Each node's own spool directory (which exists, %n expanded by slurmd) keeps them apart.
        "tmp_fs": rt.slurmd_spool_dir + "/%n" if rt.multiple_slurmd else None,
        "slurmctld_pid_file": posixpath.join(run, "slurmctld.pid"),
        "slurmd_pid_file": posixpath.join(run, f"slurmd{pn}.pid"),
        "slurmctld_log_file": posixpath.join(log, "slurmctld.log"),
        "slurmd_log_file": posixpath.join(log, f"slurmd{pn}.log"),
        "run_dir": run,
        "log_dir": log,
        "debug": rt.debug,
        "mpi_default": rt.mpi_default,
        "proctrack_type": f"proctrack/{rt.proctrack}",
        "uses_cgroup": rt.proctrack == "cgroup" or "cgroup" in rt.task_plugins,
        "task_plugin": ",".join(f"task/{t}" for t in rt.task_plugins
                                if t != "none" or release < (24, 11)) or None,
        "job_container_type": "job_container/tmpfs" if rt.job_container == "tmpfs" else None,
        "select_type_parameters": rt.select_type_parameters,
        "def_mem_per_cpu": rt.def_mem_per_cpu,
        "scheduler_parameters": ",".join(rt.scheduler_parameters) or None,
        "slurmctld_parameters": ",".join(ctld_params) or None,
        "slurmd_parameters": ",".join(rt.slurmd_parameters) or None,
        "return_to_service": rt.return_to_service,
        "reboot": _reboot(spec, power),
        "enforce_part_limits": rt.enforce_part_limits,
        "min_job_age": rt.min_job_age,
        "max_array_size": rt.max_array_size,
        "max_job_count": rt.max_job_count,
        "kill_wait": rt.kill_wait,
        "job_requeue": 1 if rt.job_requeue else 0,
        "gres_types": "gpu" if gpu_types else None,
        "gpu_types": gpu_types,
        "gres_autodetect": rt.gres_autodetect,
        "jobcomp_type": None if rt.jobcomp == "none" and release >= (24, 11) else f"jobcomp/{rt.jobcomp}",
        "jobcomp_loc": posixpath.join(log, "jobcomp.txt") if rt.jobcomp == "filetxt" else None,
        # a tree without switches is flat: 24.11's topology/tree refuses every job then ("Requested
        # topology configuration is not available"), 22.05's schedules as if flat
        "topology_plugin": "topology/default" if release >= (23, 11) and (
            spec.topology.plugin == "none" or (spec.topology.plugin == "tree" and not switches))
        else f"topology/{spec.topology.plugin}",
        "nvlink_blocks": _nvlink_blocks(spec, release),
        "preempt_type": None if pre.type == "none" and release >= (24, 11) else f"preempt/{pre.type}",
        "preempt_parameters": ",".join(preempt_params) or None,

        "preempt_mode": preempt_mode,
        "accounting": accounting,
        "priority": None if spec.priority is None else {
            "type": f"priority/{spec.priority.type}",
            "decay_half_life": spec.priority.decay_half_life,
            "usage_reset_period": spec.priority.usage_reset_period,
            "calc_period": spec.priority.calc_period_min,
        },
        "job_submit_lua": spec.job_submit_lua,
        "health": _health(spec),
        "power": power,
        "billing_unit": (billing or {}).get("unit"),
        "node_lines": _merge(node_rows),
        "gres_lines": _merge(gres_rows),
        "partitions": partitions,
        "switches": switches,
        "cgroup": {
            "constrain_cores": _yesno("cores" in constrain),
            "constrain_devices": _yesno("devices" in constrain),
            "constrain_ram_space": _yesno("ram" in constrain),
            "constrain_swap_space": _yesno("swap" in constrain),
        },
        # not used by the templates; for the Ansible roles
        "nodes": nodes,
        "nccl_profiles": _nccl_profiles(spec),
        "fake_gpu_major": FAKE_GPU_MAJOR,
        "qos": [q.model_dump() for q in spec.qos],
        "accounts": [a.model_dump() for a in spec.accounts],
        "management_networks": list(spec.management_networks),
        "filesystems": _filesystems(spec),
    }


def _filesystems(spec: ClusterSpec) -> dict[str, Any]:
    """What gpuhpc_lustre_client and gpuhpc_beegfs_client mount (spec ``filesystems``). A BeeGFS
    mount names the variable that holds its connection-auth secret, never the secret."""
    fs = spec.filesystems
    lustre = None
    if fs.lustre is not None:
        lustre = {
            "lnet": [{"net": n.net, "interfaces": list(n.interfaces)} for n in fs.lustre.lnet],
            "mounts": [{"fsname": m.fsname, "source": m.source(), "mountpoint": m.mountpoint,
                        "options": list(m.options)} for m in fs.lustre.mounts],
        }
    return {"lustre": lustre, "beegfs": [b.model_dump() for b in fs.beegfs]}
