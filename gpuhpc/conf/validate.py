"""Cross-field rules for a cluster spec: what Slurm (or the hardware) would reject.

:func:`validate` raises :class:`~gpuhpc.errors.SpecError` naming the field path of the first
problem and returns the list of warnings (e.g. a low CPU:GPU ratio). It never touches disk.
"""
from __future__ import annotations

from gpuhpc import hostlist
from gpuhpc.errors import SpecError, UserInputError
from gpuhpc.slurm.durations import parse_duration
from gpuhpc.spec.cluster import ClusterSpec, NodeGroup
from gpuhpc.spec.gpus import check_mig_layout, gpu_model

MIN_CPUS_PER_GPU = 2
DEFAULT_QOS = "normal"   # slurmdbd always has it
ROOT_ACCOUNT = "root"    # and the account root's jobs run under by default


def _seconds(time: str) -> float:
    """A validated Slurm time in seconds, INFINITE as infinity."""
    seconds = parse_duration(time)
    return float("inf") if seconds is None else seconds


def _dupes(items: list[str]) -> str | None:
    seen: set[str] = set()
    for it in items:
        if it in seen:
            return it
        seen.add(it)
    return None


def resolve_nodes(spec: ClusterSpec, terms: list[str], field: str) -> list[str]:
    """Expand partition/switch node terms (names, hostlists, group names, ALL) to node names."""
    names = [n for _, n in spec.nodes()]
    known = set(names)
    groups = {g.name: g.node_names() for g in spec.node_groups}
    out: list[str] = []
    for i, term in enumerate(terms):
        if term == "ALL":
            out.extend(names)
            continue
        if term in groups and term not in known:
            out.extend(groups[term])
            continue
        out.extend(_expand_nodes(term, known, f"{field}[{i}]", "unknown node {n!r}",
                                 "name a node from node_groups, a hostlist of them, a node-group name or ALL"))
    # keep first occurrence order
    return list(dict.fromkeys(out))


def _expand_nodes(term: str, known: set[str], field: str, unknown: str, hint: str) -> list[str]:
    """A hostlist term's node names; SpecError at ``field`` for bad syntax or a name not in ``known``
    (``unknown`` words it, with ``{n}`` for the name)."""
    try:
        expanded = hostlist.expand(term)
    except UserInputError as exc:
        raise SpecError(exc.message, field=field, hint=exc.hint) from None
    for n in expanded:
        if n not in known:
            raise SpecError(unknown.format(n=n), field=field, hint=hint)
    return expanded


def _check_nvlink(g: NodeGroup, gf: str, names: list[str], warnings: list[str]) -> None:
    """NVLink domains name nodes of their own group, each node at most once."""
    if g.nvlink_domain_size is not None and g.count % g.nvlink_domain_size:
        warnings.append(f"{gf}: {g.count} nodes in NVLink domains of {g.nvlink_domain_size}: the last domain has "
                        f"{g.count % g.nvlink_domain_size} node(s)")
    if g.nvlink_domains is None:
        return
    mine, placed = set(names), {}
    for j, expr in enumerate(g.nvlink_domains):
        members = _expand_nodes(expr, mine, f"{gf}.nvlink_domains[{j}]", "{n!r} is not a node of this group",
                                f"the group's nodes: {hostlist.compress(names)}")
        for n in members:
            if n in placed:
                raise SpecError(f"{n!r} is already in nvlink_domains[{placed[n]}]", field=f"{gf}.nvlink_domains[{j}]")
            placed[n] = j
    if left := [n for n in names if n not in placed]:
        warnings.append(f"{gf}: {hostlist.compress(left)} in no NVLink domain (left out of topology/block)")


def _preempted_by(spec: ClusterSpec, index: int) -> list[str]:
    """The partitions whose jobs partition ``index`` preempts (preempt/partition_prio): those of a
    lower PriorityTier on a shared node that are not PreemptMode=OFF."""
    p = spec.partitions[index]
    mine = set(resolve_nodes(spec, list(p.nodes), ""))
    cluster_off = spec.preemption.mode == "OFF"
    return [o.name for oi, o in enumerate(spec.partitions)
            if oi != index and o.priority_tier < p.priority_tier
            and (o.preempt_mode or ("OFF" if cluster_off else "")) != "OFF"
            and mine & set(resolve_nodes(spec, list(o.nodes), ""))]


def validate(spec: ClusterSpec) -> list[str]:
    """Raise SpecError on the first problem (sections in this order); return warnings."""
    warnings: list[str] = []
    if d := _dupes(list(spec.controller.hosts)):
        raise SpecError(f"duplicate controller host {d!r}", field="controller.hosts")
    _check_node_groups(spec, warnings)
    known_qos, acct_names = _check_qos_and_accounts(spec)
    _check_preemption(spec)
    _check_partitions(spec, known_qos, acct_names)
    _check_preempt_plugin(spec)
    _check_isolation(spec, warnings)
    _check_topology(spec)
    _check_power(spec)
    _check_filesystems(spec)
    _check_configless(spec)
    return warnings


def _check_node_groups(spec: ClusterSpec, warnings: list[str]) -> None:
    """Node groups and nodes: unique names, ports, memory, each group's GPUs."""
    rt = spec.runtime
    if d := _dupes([g.name for g in spec.node_groups]):
        i = [g.name for g in spec.node_groups].index(d, [g.name for g in spec.node_groups].index(d) + 1)
        raise SpecError(f"duplicate node group name {d!r}", field=f"node_groups[{i}].name")
    seen_nodes: dict[str, int] = {}
    endpoints: dict[tuple[str, int], str] = {}
    reserved_ports = {rt.slurmctld_port: "slurmctld"}
    if spec.slurmdbd:
        reserved_ports[spec.slurmdbd.port] = "slurmdbd"
    for gi, g in enumerate(spec.node_groups):
        gf = f"node_groups[{gi}]"
        names = g.node_names()
        if g.count > 1 and len(set(names)) == 1:
            raise SpecError(f"pattern {g.hostname!r} gives every node the same name", field=f"{gf}.hostname",
                            hint="use {n}, e.g. 'gpu-node{n}'")
        for n in names:
            if n in seen_nodes:
                raise SpecError(f"duplicate node name {n!r} (also in node_groups[{seen_nodes[n]}])",
                                field=f"{gf}.hostname")
            seen_nodes[n] = gi
        _check_nvlink(g, gf, names, warnings)
        if g.real_memory_mb is not None and g.real_memory_mb > g.memory_mb:
            raise SpecError(f"real_memory_mb {g.real_memory_mb} is above the physical memory_mb {g.memory_mb}",
                            field=f"{gf}.real_memory_mb")
        if rt.def_mem_per_cpu and rt.def_mem_per_cpu > (g.real_memory_mb or g.memory_mb):
            raise SpecError(f"runtime.def_mem_per_cpu {rt.def_mem_per_cpu} is above the node memory",
                            field="runtime.def_mem_per_cpu")
        if g.port is not None:
            if g.port + g.count - 1 > 65535:
                raise SpecError(f"ports {g.port}..{g.port + g.count - 1} run past 65535", field=f"{gf}.port")
            addr = g.addr or "*"
            for k, n in enumerate(names):
                port = g.port + k
                if port in reserved_ports:
                    raise SpecError(f"node {n} port {port} is the {reserved_ports[port]} port", field=f"{gf}.port")
                if (addr, port) in endpoints:
                    raise SpecError(f"node {n} port {port} is already used by {endpoints[(addr, port)]}",
                                    field=f"{gf}.port")
                endpoints[(addr, port)] = n
        if g.node_hostname and g.count > 1 and g.port is None:
            raise SpecError("several nodes share one node_hostname but have no distinct ports",
                            field=f"{gf}.port", hint="set port (each node counts up from it)")
        if g.node_hostname and g.count > 1 and not rt.multiple_slurmd:
            raise SpecError("several nodes share one node_hostname", field="runtime.multiple_slurmd",
                            hint="set runtime.multiple_slurmd: true (one slurmd per node on the same host)")
        if g.gpus is not None:
            _check_gpus(g, gf, warnings)


def _check_gpus(g: NodeGroup, gf: str, warnings: list[str]) -> None:
    """One node group's GPUs: CPU affinity, MIG layouts, CPUs per GPU."""
    gp = g.gpus
    model = gpu_model(gp.type)
    cores = g.sockets * g.cores_per_socket
    if gp.cpu_affinity is not None:
        if len(gp.cpu_affinity) != gp.count:
            raise SpecError(f"has {len(gp.cpu_affinity)} entries for {gp.count} GPUs",
                            field=f"{gf}.gpus.cpu_affinity", hint="one core list per GPU, e.g. '0-27'")
        for ai, aff in enumerate(gp.cpu_affinity):
            try:
                ids = hostlist.expand_ranges(aff)
            except UserInputError as exc:
                raise SpecError(exc.message, field=f"{gf}.gpus.cpu_affinity[{ai}]", hint=exc.hint) from None
            if not ids:
                raise SpecError("empty core list", field=f"{gf}.gpus.cpu_affinity[{ai}]", hint="e.g. '0-27'")
            if max(ids) >= cores:
                raise SpecError(f"core {max(ids)} does not exist (the node has {cores} cores, 0-{cores - 1})",
                                field=f"{gf}.gpus.cpu_affinity[{ai}]")
    if gp.mig is not None:
        if model is None:
            raise SpecError(f"unknown GPU type {gp.type!r} cannot be MIG-partitioned",
                            field=f"{gf}.gpus.type", hint="MIG types: a100-40gb, a100-80gb, h100, h200, gh200, a30")
        if len(gp.mig) != gp.count:
            raise SpecError(f"has {len(gp.mig)} layouts for {gp.count} GPUs", field=f"{gf}.gpus.mig",
                            hint="one layout per GPU; [] leaves a GPU whole")
        for mi, layout in enumerate(gp.mig):
            if why := check_mig_layout(model, list(layout)):
                raise SpecError(why, field=f"{gf}.gpus.mig[{mi}]")
    n_gpus = gp.count   # physical GPUs: MIG slices share their GPU's CPUs
    if g.cpus / max(n_gpus, 1) < MIN_CPUS_PER_GPU:
        warnings.append(
            f"{gf} ({g.name}): {g.cpus} vCPUs for {n_gpus} GPUs is below {MIN_CPUS_PER_GPU} vCPU/GPU "
            f"(training wants 2 to 8 vCPU per GPU)")


def _check_qos_and_accounts(spec: ClusterSpec) -> tuple[set[str], list[str]]:
    """QOS and accounts; returns the QOS names a reference may use and the account names."""
    qos_names = [q.name for q in spec.qos]
    if d := _dupes(qos_names):
        raise SpecError(f"duplicate QOS {d!r}", field=f"qos[{qos_names.index(d, qos_names.index(d) + 1)}].name")
    known_qos = set(qos_names) | {DEFAULT_QOS}
    for qi, q in enumerate(spec.qos):
        for pi, p in enumerate(q.preempt):
            if p not in known_qos:
                raise SpecError(f"unknown QOS {p!r}", field=f"qos[{qi}].preempt[{pi}]")
            if p == q.name:
                raise SpecError("a QOS cannot preempt itself", field=f"qos[{qi}].preempt[{pi}]")
    acct_names = [a.name for a in spec.accounts]
    if d := _dupes(acct_names):
        raise SpecError(f"duplicate account {d!r}", field=f"accounts[{acct_names.index(d, acct_names.index(d) + 1)}].name")
    for ai, a in enumerate(spec.accounts):
        for qi, q in enumerate(a.qos):
            if q not in known_qos:
                raise SpecError(f"unknown QOS {q!r}", field=f"accounts[{ai}].qos[{qi}]")
        if a.default_qos and a.default_qos not in (a.qos or [DEFAULT_QOS]):
            raise SpecError(f"default_qos {a.default_qos!r} is not in this account's qos list",
                            field=f"accounts[{ai}].default_qos")
    if (spec.qos or spec.accounts) and spec.slurmdbd is None:
        raise SpecError("QOS and accounts need accounting", field="slurmdbd", hint="add a slurmdbd section")
    return known_qos, acct_names


def _check_preemption(spec: ClusterSpec) -> None:
    """The preemption section on its own."""
    pre = spec.preemption
    if pre.type == "qos" and spec.slurmdbd is None:
        raise SpecError("preempt/qos needs slurmdbd accounting", field="preemption.type")
    if pre.mode == "SUSPEND" and not pre.gang:
        raise SpecError("PreemptMode=SUSPEND requires GANG", field="preemption.mode", hint="set preemption.gang: true")


def _check_partitions(spec: ClusterSpec, known_qos: set[str], acct_names: list[str]) -> None:
    """Partitions: names, the default, nodes, preemption, limits, the QOS and accounts they name."""
    rt = spec.runtime
    pre = spec.preemption
    part_names = [p.name for p in spec.partitions]
    if d := _dupes(part_names):
        raise SpecError(f"duplicate partition {d!r}", field=f"partitions[{part_names.index(d, part_names.index(d) + 1)}].name")
    defaults = [i for i, p in enumerate(spec.partitions) if p.default]
    if len(defaults) > 1:
        raise SpecError("more than one default partition", field=f"partitions[{defaults[1]}].default")
    spot_nodes = {n for g in spec.node_groups if g.capacity == "cloud" and g.market == "spot" for n in g.node_names()}
    for pi, p in enumerate(spec.partitions):
        pf = f"partitions[{pi}]"
        p_nodes = resolve_nodes(spec, list(p.nodes), f"{pf}.nodes")
        if not rt.job_requeue and spot_nodes.intersection(p_nodes):
            # a spot reclaim sets the node DOWN: Slurm requeues a job only if it is requeueable
            raise SpecError("a partition of spot nodes with runtime.job_requeue false: a spot reclaim would end "
                            "its jobs NODE_FAIL instead of requeueing them", field=f"{pf}.nodes",
                            hint="set runtime.job_requeue: true (a job opts out with --no-requeue)")
        if p.preempt_mode not in (None, "OFF") and pre.type == "none":
            raise SpecError(f"PreemptMode={p.preempt_mode} but preemption.type is none", field=f"{pf}.preempt_mode",
                            hint="set preemption.type: partition_prio or qos")
        if p.preempt_mode == "REQUEUE" and not rt.job_requeue:
            raise SpecError("PreemptMode=REQUEUE with runtime.job_requeue false: jobs would be cancelled",
                            field=f"{pf}.preempt_mode")
        if p.preempt_mode == "SUSPEND" and not pre.gang:
            raise SpecError("PreemptMode=SUSPEND requires GANG", field=f"{pf}.preempt_mode",
                            hint="set preemption.gang: true")
        if p.default_time and _seconds(p.default_time) > _seconds(p.max_time):
            raise SpecError(f"default_time {p.default_time} is longer than max_time {p.max_time}",
                            field=f"{pf}.default_time")
        for li, q in enumerate(p.allow_qos or []):
            if q not in known_qos:
                raise SpecError(f"unknown QOS {q!r}", field=f"{pf}.allow_qos[{li}]")
        if p.qos and p.qos not in known_qos:
            raise SpecError(f"unknown QOS {p.qos!r}", field=f"{pf}.qos")
        for li, a in enumerate(p.allow_accounts or []):
            if a not in acct_names and a != ROOT_ACCOUNT:
                raise SpecError(f"unknown account {a!r}", field=f"{pf}.allow_accounts[{li}]")
        if pre.type == "partition_prio" and not (p.allow_accounts or p.allow_qos):
            victims = _preempted_by(spec, pi)
            if victims:
                raise SpecError(f"partition {p.name!r} preempts {', '.join(victims)} and is open to every account",
                                field=f"{pf}.allow_accounts",
                                hint="set allow_accounts or allow_qos to those who may preempt others")
        if (p.allow_qos or p.qos) and spec.slurmdbd is None:
            raise SpecError("QOS need slurmdbd accounting", field=f"{pf}.allow_qos")


def _check_preempt_plugin(spec: ClusterSpec) -> None:
    """Cluster-wide, after the partitions' own rules; read_config.c: "PreemptType and PreemptMode
    values incompatible" (slurmctld does not start)."""
    pre = spec.preemption
    if pre.type != "none" and pre.mode == "OFF":
        raise SpecError(f"preempt/{pre.type} with PreemptMode=OFF: Slurm refuses this config", field="preemption.mode",
                        hint="set preemption.mode (REQUEUE, CANCEL, SUSPEND) or preemption.type: none")
    if pre.type == "none" and pre.mode != "OFF":
        raise SpecError(f"PreemptMode={pre.mode} without a preempt plugin: Slurm refuses this config",
                        field="preemption.mode", hint="set preemption.type: partition_prio or qos, or mode: OFF")


def _check_isolation(spec: ClusterSpec, warnings: list[str]) -> None:
    """What one user can do to others: GPUs fenced by cgroups, a submit limit per user."""
    rt = spec.runtime
    gpu_groups = [g.name for g in spec.node_groups if g.gpus is not None]
    constrained = (rt.proctrack == "cgroup" and "cgroup" in rt.task_plugins and "devices" in rt.cgroup_constrain)
    if gpu_groups and not constrained and not rt.unconstrained_gpus_reason:
        raise SpecError(f"node groups {', '.join(gpu_groups)} have GPUs, but without proctrack cgroup, task plugin "
                        "cgroup and cgroup_constrain devices every job can open every GPU of its node",
                        field="runtime.task_plugins",
                        hint="use proctrack: cgroup, task_plugins: [affinity, cgroup], or say why in "
                             "runtime.unconstrained_gpus_reason")
    if spec.slurmdbd is not None and not any(q.max_submit_jobs_per_user for q in spec.qos):
        warnings.append("no QOS sets max_submit_jobs_per_user: one user can fill MaxJobCount and stop everyone's "
                        "submissions")


def _check_topology(spec: ClusterSpec) -> None:
    """topology.switches: unique names, one leaf per node, known children, a plugin that reads them."""
    sw_names = [s.name for s in spec.topology.switches]
    if d := _dupes(sw_names):
        raise SpecError(f"duplicate switch {d!r}", field=f"topology.switches[{sw_names.index(d, sw_names.index(d) + 1)}].name")
    leaf_of: dict[str, str] = {}
    for si, s in enumerate(spec.topology.switches):
        if not s.nodes and not s.switches:
            raise SpecError("a switch needs nodes or switches", field=f"topology.switches[{si}]")
        for n in resolve_nodes(spec, list(s.nodes), f"topology.switches[{si}].nodes"):
            if n in leaf_of:
                raise SpecError(f"node {n!r} is already under switch {leaf_of[n]!r}",
                                field=f"topology.switches[{si}].nodes", hint="a node hangs off exactly one leaf switch")
            leaf_of[n] = s.name
        for ci, c in enumerate(s.switches):
            if c not in sw_names:
                raise SpecError(f"unknown switch {c!r}", field=f"topology.switches[{si}].switches[{ci}]")
            if c == s.name:
                raise SpecError("a switch cannot contain itself", field=f"topology.switches[{si}].switches[{ci}]")
    if spec.topology.switches and spec.topology.plugin == "none":
        raise SpecError("switches are listed but topology.plugin is none", field="topology.plugin")


def _check_power(spec: ClusterSpec) -> None:
    """Elastic capacity (docs/elastic.md): Slurm marks a node DOWN when it has not registered
    ResumeTimeout after its ResumeProgram ran, so a ResumeTimeout below a group's boot time fails
    every boot; and 22.05 ignores Weight between powered-down nodes, so a partition with cloud
    nodes holds one price tier only (one partition per tier, ordered by PriorityTier)."""
    cloud = [(i, g) for i, g in enumerate(spec.node_groups) if g.capacity == "cloud"]
    rto = spec.power.resume_timeout
    for i, g in cloud:
        if rto is not None and g.boot_timeout is not None and rto < g.boot_timeout:
            raise SpecError(f"resume_timeout {rto}s is shorter than node_groups[{i}] ({g.name}) boot_timeout "
                            f"{g.boot_timeout}s: every boot would be marked DOWN", field="power.resume_timeout",
                            hint=f"set it to at least {g.boot_timeout} (or leave it out: slowest boot + 30 s)")
    tier_of = {n: g.price_tier for _, g in cloud for n in g.node_names()}
    for pi, p in enumerate(spec.partitions):
        tiers = sorted({tier_of[n] for n in resolve_nodes(spec, list(p.nodes), f"partitions[{pi}].nodes")
                        if n in tier_of})
        if len(tiers) > 1:
            raise SpecError(f"partition {p.name!r} holds cloud nodes of price tiers {tiers}: Slurm 22.05 ignores "
                            "Weight between powered-down nodes", field=f"partitions[{pi}].nodes",
                            hint="one partition per price tier, the cheaper one with the higher priority_tier")


def _lnet_net(net: str) -> str:
    """``o2ib`` and ``o2ib0`` are one LNet network."""
    return net if net[-1].isdigit() else net + "0"


def _check_filesystems(spec: ClusterSpec) -> None:
    """Mount points are distinct (filesystems and node scratch), every MGS is on a client LNet
    network, BeeGFS mounts differ in name and client port (one client instance per UDP port)."""
    if d := _dupes(spec.management_networks):
        raise SpecError(f"duplicate network {d!r}", field="management_networks")
    fs = spec.filesystems
    mounts: dict[str, str] = {}
    for gi, g in enumerate(spec.node_groups):
        if g.scratch and g.scratch.devices and (d := _dupes(list(g.scratch.devices))):
            raise SpecError(f"device {d!r} is listed twice", field=f"node_groups[{gi}].scratch.devices")

    def overlap(path: str) -> str | None:
        for other, where in mounts.items():
            if path == other or path.startswith(other.rstrip("/") + "/") or other.startswith(path.rstrip("/") + "/"):
                return f"{other} ({where})"
        return None

    def claim(path: str, field: str) -> None:
        if where := overlap(path):
            raise SpecError(f"mount point {path} overlaps {where}", field=field)
        mounts[path] = field

    if fs.lustre is not None:
        nets = [_lnet_net(n.net) for n in fs.lustre.lnet]
        if d := _dupes(nets):
            raise SpecError(f"LNet network {d} is listed twice", field="filesystems.lustre.lnet")
        names = [m.fsname for m in fs.lustre.mounts]
        if d := _dupes(names):
            raise SpecError(f"Lustre filesystem {d!r} is mounted twice", field="filesystems.lustre.mounts")
        for mi, m in enumerate(fs.lustre.mounts):
            mf = f"filesystems.lustre.mounts[{mi}]"
            claim(m.mountpoint, f"{mf}.mountpoint")
            for ni, nid in enumerate(m.mgs_nids):
                net = _lnet_net(nid.rsplit("@", 1)[1])
                if net not in nets:
                    raise SpecError(f"MGS {nid} is on LNet network {net}, which no client network in "
                                    f"filesystems.lustre.lnet reaches", field=f"{mf}.mgs_nids[{ni}]",
                                    hint=f"add {{net: {net}, interfaces: [...]}} to filesystems.lustre.lnet")
    names = [b.name for b in fs.beegfs]
    if d := _dupes(names):
        raise SpecError(f"duplicate BeeGFS mount name {d!r}",
                        field=f"filesystems.beegfs[{names.index(d, names.index(d) + 1)}].name")
    ports: dict[int, str] = {}
    for bi, b in enumerate(fs.beegfs):
        bf = f"filesystems.beegfs[{bi}]"
        claim(b.mountpoint, f"{bf}.mountpoint")
        port = b.client_port or 8004          # connClientPortUDP's default
        if port in ports:
            raise SpecError(f"client port {port} is also {ports[port]}'s: each BeeGFS mount needs its own",
                            field=f"{bf}.client_port", hint="set client_port (and helperd_port) per mount")
        ports[port] = bf
    for gi, g in enumerate(spec.node_groups):
        if g.scratch and (where := overlap(g.scratch.path)):
            raise SpecError(f"scratch {g.scratch.path} overlaps {where}", field=f"node_groups[{gi}].scratch.path")


def _check_configless(spec: ClusterSpec) -> None:
    """``configless`` node groups take every file slurmctld serves (slurm.conf, gres.conf,
    topology.conf, cgroup.conf, ...) from the controller, the same for every node: refuse what
    needs a file of the node's own."""
    rt = spec.runtime
    for gi, g in enumerate(spec.node_groups):
        if not g.configless:
            continue
        gf = f"node_groups[{gi}].configless"
        if rt.multiple_slurmd:
            raise SpecError("several slurmd on one host (runtime.multiple_slurmd) cannot run configless: they "
                            "would share the host's one cache of the fetched files (/run/slurm/conf)", field=gf,
                            hint="drop configless for this group, or run one slurmd per host")
        if g.gpus is not None and g.gpus.mig is not None and rt.gres_autodetect != "nvml":
            raise SpecError("a MIG node's gres.conf is numbered on the node itself (its driver's nvidia-cap "
                            "minors); a configless node would get the controller's gres.conf", field=gf,
                            hint="set runtime.gres_autodetect: nvml (slurmd finds the slices itself), or drop configless")
