"""From a parsed dump to a Slurm tree: hosts, rails, leaves, spines, warnings.

Vocabulary:

* **host HCA**: a CA whose NodeDesc is ``"<host> <hca>"`` (``"gpu001 HCA-1"``,
  ``"a08-p1-dgx-04-c01 mlx5_5"``). CAs with a default NodeDesc (``"MT4129 ConnectX7
  Mellanox Technologies"``) have no host name and are reported, SHARP aggregation nodes
  (``"Mellanox Technologies Aggregation Node"``) are ignored.
* **edge switch**: a switch with at least one such CA (a leaf of *some* rail).
* **rail**: where each HCA of a multi-homed host lands. When the switches fall apart into
  several connected components (planes), a rail is a plane. When they form one fabric
  (rail-optimised fat tree, spines shared by all rails), a rail is the n-th HCA name of each
  naming scheme: ``mlx5_0`` and ``HCA-1`` are both rail 0, ``mlx5_5`` and ``HCA-6`` rail 3.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import compress, natural_key
from gpuhpc.topology.ibnetdiscover import Dump, Link, switch_label

_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_HCA_RE = re.compile(r"^(mlx\d+_\d+|HCA-\d+|hfi\d+_\d+|ib[a-z]*\d+|mthca\d+|qib\d+|irdma\d+|bnxt_re\d+|roce\S*|ionic_\d+|erdma_\d+|\S+_\d+)$")
_DEFAULT_DESC = re.compile(r"(Mellanox Technologies|^MT\d+\b|^ConnectX|NVIDIA Technologies|^localhost\b)", re.I)
_AGG_DESC = re.compile(r"Aggregation Node", re.I)

WIDTH_RANK = {"1x": 1, "2x": 2, "4x": 4, "8x": 8, "12x": 12}
SPEED_RANK = {"SDR": 1, "DDR": 2, "QDR": 3, "FDR10": 4, "FDR": 5, "EDR": 6, "HDR": 7, "NDR": 8, "XDR": 9}


@dataclass(slots=True)
class Hca:
    host: str
    name: str            # "mlx5_0", "HCA-1" ("" when the NodeDesc is only a host name)
    node: str            # "H-..." id
    switch: str | None   # id of the switch its port 1 is cabled to
    port: int | None     # that switch's port
    line: int


@dataclass
class Rail:
    index: int
    label: str                       # "mlx5_0|HCA-1" or "plane 2 (mlx5_3)"
    names: set[str]
    hcas: list[Hca] = field(default_factory=list)
    storage: bool = False            # looks like a storage/management rail

    @property
    def hosts(self) -> set[str]:
        return {h.host for h in self.hcas}

    @property
    def leaves(self) -> set[str]:
        return {h.switch for h in self.hcas if h.switch}


@dataclass
class Fabric:
    dump: Dump
    names: dict[str, str]                      # switch id -> Slurm switch name
    adj: dict[str, set[str]]                   # switch id -> neighbour switch ids
    hcas: list[Hca]
    edge: set[str]                             # switches with non-aggregation CAs
    unnamed: dict[str, list[tuple[int, str]]]  # switch id -> [(port, desc)] of CAs without a host name
    component: dict[str, int]                  # switch id -> connected component
    rails: list[Rail]
    planes: bool                               # rails are separate planes (components)
    warnings: list[str] = field(default_factory=list)

    def switch_port_name(self, sid: str, port: int) -> str:
        return f"switch {self.names.get(sid, sid)} port {port}"


def _sanitize(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "switch"


def split_desc(desc: str) -> tuple[str, str] | None:
    """NodeDesc of a CA -> (host, hca), or None for default/aggregation descriptions."""
    d = desc.strip()
    if not d or _AGG_DESC.search(d) or _DEFAULT_DESC.search(d):
        return None
    parts = d.split()
    if len(parts) == 1:
        return (parts[0], "") if _HOST_RE.match(parts[0]) else None
    if len(parts) == 2 and _HOST_RE.match(parts[0]):
        return parts[0], parts[1]
    if _HOST_RE.match(parts[0]) and _HCA_RE.match(parts[-1]):
        return parts[0], parts[-1]
    return None


def _family(name: str) -> tuple[str, int]:
    m = re.match(r"^(.*?)(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def analyse(dump: Dump) -> Fabric:
    nodes = dump.nodes
    warnings: list[str] = []
    # ---- switch names, unique
    names: dict[str, str] = {}
    used: Counter[str] = Counter()
    labels = {}
    for n in dump.switches():
        label, _model = switch_label(n.desc)
        if not label or _DEFAULT_DESC.search(label) or " " in label.strip():
            label = f"sw-{n.id[2:]}"
        labels[n.id] = _sanitize(label)
        used[labels[n.id]] += 1
    for sid, label in labels.items():
        names[sid] = label if used[label] == 1 else f"{label}-{sid[-6:]}"
    # ---- graph
    adj: dict[str, set[str]] = {sid: set() for sid in names}
    ca_link: dict[str, tuple[str, int, Link]] = {}
    for link in dump.links:
        ka, kb = nodes[link.a].kind, nodes[link.b].kind
        if ka == "switch" and kb == "switch":
            if link.a != link.b:
                adj[link.a].add(link.b)
                adj[link.b].add(link.a)
        elif ka == "switch" and kb == "ca":
            ca_link.setdefault(link.b, (link.a, link.a_port, link))
        elif ka == "ca" and kb == "switch":
            ca_link.setdefault(link.a, (link.b, link.b_port, link))
    # ---- CAs
    hcas: list[Hca] = []
    edge: set[str] = set()
    unnamed: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for ca in dump.cas():
        sw = ca_link.get(ca.id)
        if _AGG_DESC.search(ca.desc):
            continue
        if sw:
            edge.add(sw[0])
        split = split_desc(ca.desc)
        if split is None:
            if sw:
                unnamed[sw[0]].append((sw[1], ca.desc))
            else:
                warnings.append(f"CA {ca.id} ({ca.desc!r}, line {ca.line}) has no host name and no switch link; ignored")
            continue
        host, hca = split
        hcas.append(Hca(host, hca, ca.id, sw[0] if sw else None, sw[1] if sw else None, ca.line))
    for sid, cas in sorted(unnamed.items(), key=lambda kv: natural_key(names[kv[0]])):
        ports = ", ".join(str(p) for p, _ in sorted(cas)[:8]) + (" ..." if len(cas) > 8 else "")
        warnings.append(f"switch {names[sid]}: {len(cas)} CA(s) with a default NodeDesc "
                        f"({cas[0][1]!r}) on port(s) {ports}: no host name, left out "
                        f"(set the NodeDesc, e.g. via rdma-ndd)")
    # ---- components
    component: dict[str, int] = {}
    for start in sorted(names, key=lambda s: natural_key(names[s])):
        if start in component:
            continue
        cid = len(set(component.values()))
        component[start] = cid
        q = deque([start])
        while q:
            s = q.popleft()
            for t in adj[s]:
                if t not in component:
                    component[t] = cid
                    q.append(t)
    fab = Fabric(dump, names, adj, hcas, edge, dict(unnamed), component, [], False, warnings)
    _detect_rails(fab)
    _degraded_links(fab)
    for link in dump.one_sided[:20]:
        fab.warnings.append(f"cable {_end(fab, link.a, link.a_port)} <-> {_end(fab, link.b, link.b_port)} "
                            f"(line {link.line}) is listed from one end only")
    if len(dump.one_sided) > 20:
        fab.warnings.append(f"... and {len(dump.one_sided) - 20} more cables listed from one end only")
    return fab


def _end(fab: Fabric, nid: str, port: int) -> str:
    node = fab.dump.nodes[nid]
    if node.kind == "switch":
        return fab.switch_port_name(nid, port)
    split = split_desc(node.desc)
    if split:
        return f"host {split[0]} ({split[1] or 'HCA'}) port {port}"
    return f"CA {nid} ({node.desc!r}) port {port}"


def _degraded_links(fab: Fabric) -> None:
    links = [l for l in fab.dump.links if l.width or l.speed]
    if not links:
        return
    widths = Counter(l.width for l in links if l.width)
    speeds = Counter(l.speed for l in links if l.speed)
    maj_w = widths.most_common(1)[0][0] if widths else ""
    maj_s = speeds.most_common(1)[0][0] if speeds else ""
    for l in links:
        low_w = l.width and WIDTH_RANK.get(l.width, 0) < WIDTH_RANK.get(maj_w, 0)
        low_s = l.speed and SPEED_RANK.get(l.speed, 0) < SPEED_RANK.get(maj_s, 0)
        if low_w or low_s:
            fab.warnings.append(
                f"degraded link: {_end(fab, l.a, l.a_port)} <-> {_end(fab, l.b, l.b_port)} runs at "
                f"{l.width}{l.speed}, the fabric majority is {maj_w}{maj_s} (line {l.line})")


def _detect_rails(fab: Fabric) -> None:
    named = [h for h in fab.hcas if h.switch]
    comps = sorted({fab.component[h.switch] for h in named})
    per_host: dict[str, int] = Counter(h.host for h in named)
    multi = any(c > 1 for c in per_host.values())
    rails: list[Rail] = []
    if not named:
        fab.rails = rails
        return
    if not multi:
        rails.append(Rail(0, "|".join(sorted({h.name for h in named}, key=natural_key)) or "HCA", {h.name for h in named}, named))
    elif len(comps) > 1:
        fab.planes = True
        by_comp: dict[int, list[Hca]] = defaultdict(list)
        for h in named:
            by_comp[fab.component[h.switch]].append(h)
        order = sorted(by_comp, key=lambda c: natural_key(min((h.name for h in by_comp[c]), key=natural_key)))
        for i, c in enumerate(order):
            hs = by_comp[c]
            counts = Counter(h.name for h in hs)
            label = "|".join(sorted(counts, key=lambda n: (-counts[n], natural_key(n))))
            rails.append(Rail(i, f"plane {i} ({label})", set(counts), hs))
    else:
        # one fabric: n-th HCA name of each naming scheme
        fam_hosts: dict[str, Counter[int]] = defaultdict(Counter)
        for h in named:
            pre, num = _family(h.name)
            fam_hosts[pre][num] += 1
        ordinal: dict[str, int] = {}
        strays: list[str] = []
        for pre, nums in fam_hosts.items():
            top = max(nums.values())
            main = sorted(n for n, c in nums.items() if c * 4 >= top)
            for i, n in enumerate(main):
                ordinal[f"{pre}{n}"] = i
            strays.extend(f"{pre}{n}" for n, c in nums.items() if c * 4 < top)
        nmain = max(ordinal.values(), default=-1) + 1
        for i, s in enumerate(sorted(strays, key=natural_key)):
            ordinal[s] = nmain + i
        # rebuild names from numbers (a name like "HCA" without digits maps to family HCA, 0)
        by_idx: dict[int, list[Hca]] = defaultdict(list)
        for h in named:
            pre, num = _family(h.name)
            by_idx[ordinal.get(f"{pre}{num}", 0)].append(h)
        for i in sorted(by_idx):
            hs = by_idx[i]
            nm = {h.name for h in hs}
            rails.append(Rail(i, "|".join(sorted(nm, key=natural_key)), nm, hs))
    # storage / management rails: most of their hosts are on no other rail
    if len(rails) > 1 and multi:
        for r in rails:
            single = sum(1 for host in r.hosts if per_host[host] == 1)
            r.storage = single * 2 >= len(r.hosts)
    fab.rails = rails


def pick_rails(fab: Fabric, rail: str = "auto", warnings: list[str] | None = None,
               compute_hcas: set[str] | None = None) -> tuple[list[Rail], set[str] | None]:
    """``auto`` | ``all`` | comma list of HCA names -> (chosen rails, HCA names to use or None=all).

    ``compute_hcas`` (the spec's ``ib_hcas``) limits ``auto``/``all`` to rails holding those names."""
    warnings = warnings if warnings is not None else []
    rails = fab.rails
    if compute_hcas and (rail or "auto").strip() in ("auto", "all"):
        keep = [r for r in rails if r.names & compute_hcas]
        if keep:
            dropped = [r for r in rails if r not in keep]
            if dropped:
                warnings.append("rails with no HCA from the spec's ib_hcas left out: "
                                + "; ".join(f"rail {r.index} = {r.label}" for r in dropped))
            rails = keep
    if not rails:
        return [], None
    spec = (rail or "auto").strip()
    if spec == "all":
        return [r for r in rails if not r.storage] or rails, None
    if spec == "auto":
        cands = [r for r in rails if not r.storage] or rails
        best = max(cands, key=lambda r: (len(r.hosts), -r.index))
        return [best], None
    wanted = [w.strip() for w in spec.split(",") if w.strip()]
    known = {n for r in rails for n in r.names}
    bad = [w for w in wanted if w not in known]
    if bad:
        raise UserInputError(f"no HCA named {', '.join(bad)} in the fabric",
                             field="--rail",
                             hint=f"HCA names seen: {', '.join(sorted(known, key=natural_key))}; or use auto/all")
    chosen = [r for r in rails if r.names & set(wanted)]
    for r in chosen:
        missing = r.names - set(wanted)
        if missing:
            n = len({h.host for h in r.hcas if h.name in missing})
            warnings.append(f"rail {r.index} also holds HCA name(s) {', '.join(sorted(missing, key=natural_key))} "
                                f"({n} host(s)), not in --rail: those hosts are left out of that rail")
    return chosen, set(wanted)


@dataclass
class TreeSwitch:
    id: str
    name: str
    level: int
    nodes: list[str] = field(default_factory=list)      # hosts (leaves only)
    children: list[str] = field(default_factory=list)   # switch names


@dataclass
class Tree:
    switches: list[TreeSwitch]
    rails: list[Rail]
    hosts: dict[str, list[str]]        # host -> leaf names it was placed under
    warnings: list[str]

    def leaf_of(self) -> dict[str, str]:
        return {h: v[0] for h, v in self.hosts.items() if v}


def build_tree(fab: Fabric, rail: str = "auto", spec_hosts: list[str] | None = None,
               compute_hcas: set[str] | None = None) -> Tree:
    """Place every host of the chosen rail(s) under the leaf its HCA is cabled to, then walk
    up through the non-edge switches to find spines (level 1), cores (level 2) ...

    The graph walk (:func:`place_hosts`, :func:`switch_levels`, :func:`left_out_switches`,
    :func:`tree_switches`, :func:`reaches_all`) returns facts; :func:`_warnings` words them."""
    warnings = list(fab.warnings)
    if not fab.names:
        warnings.append(_no_switches_warning(fab))
        return Tree([], [], {}, warnings)
    chosen, use_names = pick_rails(fab, rail, warnings, compute_hcas)
    spec_set = set(spec_hosts) if spec_hosts is not None else None
    placement = place_hosts(fab, chosen, use_names, spec_set)
    level, children = switch_levels(fab, placement.leaf_hosts)
    switches = tree_switches(fab, level, children, placement.leaf_hosts)
    facts = _TreeFacts(chosen, spec_set, placement, left_out_switches(fab, level, placement.leaf_hosts, spec_set),
                       reaches_all(switches, set(placement.placed)))
    warnings = _rails_summary(fab, chosen) + warnings + _warnings(fab, facts)
    return Tree(switches, chosen, {h: [fab.names[s] for s in v] for h, v in placement.placed.items()}, warnings)


# ---------------------------------------------------------------- the graph walk (no text)
@dataclass
class Placement:
    placed: dict[str, list[str]]                   # host -> leaf ids (one per chosen rail)
    leaf_hosts: dict[str, set[str]]                # leaf id -> hosts placed under it
    multi_leaf: list[tuple[str, int, list[Hca]]]   # (host, rail index, its HCAs) cabled to >1 leaf of a rail


def place_hosts(fab: Fabric, chosen: list[Rail], use_names: set[str] | None,
                spec_set: set[str] | None) -> Placement:
    """Each host under the leaf of its first HCA (natural name order) on each chosen rail."""
    placed: dict[str, list[str]] = defaultdict(list)
    leaf_hosts: dict[str, set[str]] = defaultdict(set)
    multi: list[tuple[str, int, list[Hca]]] = []
    for r in chosen:
        per_host: dict[str, list[Hca]] = defaultdict(list)
        for h in r.hcas:
            if use_names is not None and h.name not in use_names:
                continue
            if spec_set is not None and h.host not in spec_set:
                continue
            per_host[h.host].append(h)
        for host, hs in per_host.items():
            hs.sort(key=lambda h: natural_key(h.name))
            if len({h.switch for h in hs}) > 1:
                multi.append((host, r.index, hs))
            placed[host].append(hs[0].switch)
            leaf_hosts[hs[0].switch].add(host)
    return Placement(placed, leaf_hosts, multi)


def switch_levels(fab: Fabric, leaves) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Breadth-first from the leaves through non-edge switches: (switch -> level, switch ->
    children one level down). Leaves are level 0."""
    level: dict[str, int] = {s: 0 for s in leaves}
    children: dict[str, set[str]] = defaultdict(set)
    frontier, lvl = list(leaves), 0
    while frontier:
        nxt = []
        for s in frontier:
            for t in fab.adj[s]:
                if t in fab.edge:
                    continue
                if t not in level:
                    level[t] = lvl + 1
                    nxt.append(t)
                if level[t] == lvl + 1:
                    children[t].add(s)
        frontier = nxt
        lvl += 1
    return level, children


def left_out_switches(fab: Fabric, level: dict[str, int], leaf_hosts: dict[str, set[str]],
                      spec_set: set[str] | None) -> list[tuple[str, str]]:
    """Switches of the used fabric parts the walk did not reach, as (switch id, why): ``unnamed``
    (only default NodeDescs), ``not-in-spec`` (an edge switch without spec hosts), ``unreached``."""
    used_comps = {fab.component[s] for s in leaf_hosts}
    out: list[tuple[str, str]] = []
    for sid in sorted(fab.names, key=lambda s: natural_key(fab.names[s])):
        if sid in level or fab.component[sid] not in used_comps:
            continue
        if sid in fab.edge:
            if sid in fab.unnamed and not any(h.switch == sid for h in fab.hcas):
                out.append((sid, "unnamed"))
            elif spec_set is not None and not any(h.switch == sid and h.host in spec_set for h in fab.hcas):
                out.append((sid, "not-in-spec"))
            continue
        out.append((sid, "unreached"))
    return out


def tree_switches(fab: Fabric, level: dict[str, int], children: dict[str, set[str]],
                  leaf_hosts: dict[str, set[str]]) -> list[TreeSwitch]:
    """The switches of topology.conf, by level then natural name."""
    out: list[TreeSwitch] = []
    for sid, lv in level.items():
        ts = TreeSwitch(sid, fab.names[sid], lv)
        if lv == 0:
            ts.nodes = sorted(leaf_hosts[sid], key=natural_key)
        else:
            ts.children = sorted((fab.names[c] for c in children[sid]), key=natural_key)
        out.append(ts)
    out.sort(key=lambda t: (t.level, natural_key(t.name)))
    return out


def reaches_all(switches: list[TreeSwitch], hosts: set[str]) -> bool:
    """Whether some top-level switch reaches every host through its descendants (what Slurm's
    topology/tree checks); True for an empty tree."""
    if not switches:
        return True
    top = max(t.level for t in switches)
    below: dict[str, set[str]] = {}
    for t in switches:
        below[t.name] = set(t.nodes) if t.level == 0 else set().union(*(below.get(c, set()) for c in t.children))
    return any(below[t.name] >= hosts for t in switches if t.level == top)


# ---------------------------------------------------------------- the words
@dataclass
class _TreeFacts:
    chosen: list[Rail]
    spec_set: set[str] | None
    placement: Placement
    left_out: list[tuple[str, str]]
    reaches_all: bool


def _no_switches_warning(fab: Fabric) -> str:
    hosts = sorted({f"{h.host} ({h.name or 'HCA'})" for h in fab.hcas}) or [n.desc for n in fab.dump.cas()]
    return (f"no switches in this dump (CAs: {', '.join(hosts[:5])}): the host that ran "
            "ibnetdiscover is not cabled to a switch, or its port is down; topology.conf has no switches")


def _rails_summary(fab: Fabric, chosen: list[Rail]) -> list[str]:
    if len(fab.rails) <= 1:
        return []
    picked = {r.index for r in chosen}
    desc = "; ".join(f"rail {r.index}{'*' if r.index in picked else ''} = {r.label}: "
                     f"{len(r.hosts)} hosts, {len(r.leaves)} leaves{' (storage/mgmt?)' if r.storage else ''}"
                     for r in fab.rails)
    return [f"{len(fab.rails)} rails found ({'separate planes' if fab.planes else 'one fabric'}), "
            f"* = used (--rail): {desc}"]


def _warnings(fab: Fabric, f: _TreeFacts) -> list[str]:
    """What the tree leaves out or cannot do, in the order an admin fixes it: spec differences,
    multi-homed hosts, hosts left out, rails, switches left out, reachability."""
    out: list[str] = []
    all_hosts = {h.host for h in fab.hcas}
    if f.spec_set is not None:
        extra = sorted(all_hosts - f.spec_set, key=natural_key)
        if extra:
            out.append(f"{len(extra)} host(s) in the fabric are not in the spec, left out: {compress(extra)}")
        gone = sorted(f.spec_set - all_hosts, key=natural_key)
        if gone:
            out.append(f"{len(gone)} spec host(s) are not in the fabric (down, uncabled or NodeDesc unset): "
                       f"{compress(gone)}")
    for host, rail_index, hs in f.placement.multi_leaf:
        out.append(f"host {host} has {len(hs)} HCAs on rail {rail_index} "
                   f"({', '.join(f'{h.name} on {fab.names[h.switch]} port {h.port}' for h in hs)}); "
                   f"using {hs[0].name}")
    placed = f.placement.placed
    missing = sorted((all_hosts if f.spec_set is None else all_hosts & f.spec_set) - set(placed), key=natural_key)
    if missing and len(fab.rails) > 1:
        out.append(f"{len(missing)} host(s) have no HCA on the chosen rail(s), left out: {compress(missing)}")
    elif missing:
        out.append(f"{len(missing)} host(s) are not cabled to a switch, left out: {compress(missing)}")
    if not placed:
        out.append(f"no host names in this fabric ({len(fab.names)} switches, {len(fab.dump.cas())} CAs, none "
                   "with a '<host> <hca>' NodeDesc cabled to a switch): topology.conf has no switches")
    if len(f.chosen) > 1:
        out.append(f"{len(f.chosen)} rails chosen: each host is listed under one leaf per rail; Slurm's "
                   "topology/tree logs 'Multiple leaf switches contain nodes' and treats them as multi-homed")
    for sid, why in f.left_out:
        name = fab.names[sid]
        if why == "unnamed":
            out.append(f"switch {name} has no hosts with a name (only default NodeDescs); left out")
        elif why == "not-in-spec":
            if len(fab.rails) <= 1:
                out.append(f"switch {name} has no hosts from the spec; left out")
        else:
            out.append(f"switch {name} has no hosts and reaches no leaf of the chosen rail(s); left out")
    if not f.reaches_all:
        out.append("no switch reaches all nodes through its descendants (Slurm warns the same): "
                   "jobs cannot span the disconnected parts")
    return out
