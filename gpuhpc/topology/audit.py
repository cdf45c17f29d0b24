"""``gpuhpc topology audit``: what a fabric engineer would fix in a parsed fabric.

Pure: a :class:`~gpuhpc.topology.fabric.Fabric` in, :class:`Finding` records out. Every norm is
the fabric's own majority, so nothing here knows a vendor's cabling plan:

* **degraded**: a link narrower or slower than the majority of its class (host links and
  switch-to-switch links are judged separately);
* **rail**: an HCA cabled to a leaf whose other HCAs belong to another rail, or to a different
  leaf than the same HCA of the host's peers (the hosts that share a leaf with it on its other
  rails);
* **missing**: a multi-homed host with fewer rails than its peers, a leaf with fewer uplink
  switches than the other leaves of its rail, a leaf/spine pair with fewer cables than the norm;
* **duplicated**: two HCAs with the same host and HCA name, a leaf/spine pair with more cables
  than the norm.

Each finding names the ports involved (``switch NAME port N``).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

from gpuhpc.hostlist import natural_key
from gpuhpc.topology.fabric import SPEED_RANK, WIDTH_RANK, Fabric, Hca

KINDS = ("degraded", "rail", "missing", "duplicated")


@dataclass(frozen=True)
class Finding:
    kind: str                 # one of KINDS
    message: str
    ports: tuple[str, ...] = field(default_factory=tuple)
    line: int | None = None   # the dump's line, where one says it

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ports"] = list(self.ports)
        return d


def audit(fab: Fabric) -> list[Finding]:
    """Every finding, in kind order (degraded, rail, missing, duplicated)."""
    out = degraded(fab) + rail_pattern(fab) + missing_hosts(fab) + uplinks(fab) + duplicated_hcas(fab)
    return sorted(out, key=lambda f: KINDS.index(f.kind))


def _end(fab: Fabric, nid: str, port: int) -> str:
    node = fab.dump.nodes[nid]
    if node.kind == "switch":
        return fab.switch_port_name(nid, port)
    return f"{node.desc or nid} port {port}"


def _hca_port(fab: Fabric, h: Hca) -> str:
    return fab.switch_port_name(h.switch, h.port) if h.switch else "-"


def _majority(c: Counter) -> str:
    return c.most_common(1)[0][0] if c else ""


def degraded(fab: Fabric) -> list[Finding]:
    """Links narrower or slower than the majority of their class (host or switch links)."""
    nodes = fab.dump.nodes
    classes: dict[str, list] = defaultdict(list)
    for link in fab.dump.links:
        if not (link.width or link.speed):
            continue
        both = nodes[link.a].kind == "switch" and nodes[link.b].kind == "switch"
        classes["switch" if both else "host"].append(link)
    out = []
    for cls, links in classes.items():
        maj_w = _majority(Counter(l.width for l in links if l.width))
        maj_s = _majority(Counter(l.speed for l in links if l.speed))
        for l in links:
            low_w = l.width and WIDTH_RANK.get(l.width, 0) < WIDTH_RANK.get(maj_w, 0)
            low_s = l.speed and SPEED_RANK.get(l.speed, 0) < SPEED_RANK.get(maj_s, 0)
            if low_w or low_s:
                a, b = _end(fab, l.a, l.a_port), _end(fab, l.b, l.b_port)
                out.append(Finding("degraded", f"{a} <-> {b} runs at {l.width}{l.speed}; {cls} links run at "
                                               f"{maj_w}{maj_s}", (a, b), l.line))
    return out


def _rail_of(fab: Fabric) -> dict[tuple[str, str], int]:
    return {(h.host, h.name): r.index for r in fab.rails for h in r.hcas}


def rail_pattern(fab: Fabric) -> list[Finding]:
    """HCAs cabled against the rail pattern: onto another rail's leaf, or away from their peers."""
    if len(fab.rails) < 2:
        return []
    rail_of = _rail_of(fab)
    on_leaf: dict[str, Counter] = defaultdict(Counter)
    leaf_of: dict[tuple[str, int], str] = {}                    # (host, rail) -> leaf id
    hosts_on: dict[tuple[str, int], set[str]] = defaultdict(set)  # (leaf, rail) -> hosts
    hcas = [h for r in fab.rails for h in r.hcas if h.switch]
    for h in hcas:
        r = rail_of[(h.host, h.name)]
        on_leaf[h.switch][r] += 1
        leaf_of.setdefault((h.host, r), h.switch)
        hosts_on[(h.switch, r)].add(h.host)
    out: list[Finding] = []
    flagged: set[tuple[str, str]] = set()
    for h in sorted(hcas, key=lambda h: (natural_key(h.host), natural_key(h.name))):
        r = rail_of[(h.host, h.name)]
        major, n = on_leaf[h.switch].most_common(1)[0]
        if major != r and n * 2 > sum(on_leaf[h.switch].values()):
            port = _hca_port(fab, h)
            out.append(Finding("rail", f"host {h.host} {h.name} (rail {r}) is cabled to {port}, a leaf of rail "
                                       f"{major} ({fab.rails[major].label})", (f"host {h.host} {h.name}", port), h.line))
            flagged.add((h.host, h.name))
    rails_of_host: dict[str, set[int]] = defaultdict(set)
    for host, r in leaf_of:
        rails_of_host[host].add(r)
    for h in sorted(hcas, key=lambda h: (natural_key(h.host), natural_key(h.name))):
        if (h.host, h.name) in flagged:
            continue
        r = rail_of[(h.host, h.name)]
        votes: Counter = Counter()
        for s in rails_of_host[h.host] - {r}:
            for peer in hosts_on[(leaf_of[(h.host, s)], s)] - {h.host}:
                if (peer, r) in leaf_of:
                    votes[leaf_of[(peer, r)]] += 1
        if not votes:
            continue
        expected, n = votes.most_common(1)[0]
        if expected != h.switch and n * 2 > sum(votes.values()):
            port = _hca_port(fab, h)
            out.append(Finding("rail", f"host {h.host} {h.name} (rail {r}) is cabled to {port}; the same HCA of "
                                       f"its peers is on switch {fab.names[expected]}",
                               (f"host {h.host} {h.name}", port), h.line))
    return out


def missing_hosts(fab: Fabric) -> list[Finding]:
    """Multi-homed hosts with fewer rails than most multi-homed hosts."""
    rails_of_host: dict[str, set[int]] = defaultdict(set)
    for r in fab.rails:
        if r.storage:
            continue
        for h in r.hcas:
            rails_of_host[h.host].add(r.index)
    multi = {h: rs for h, rs in rails_of_host.items() if len(rs) > 1}
    if not multi:
        return []
    full = set().union(*multi.values())
    norm = _majority(Counter(len(rs) for rs in multi.values()))
    out = []
    for host in sorted(multi, key=natural_key):
        lacking = sorted(full - multi[host])
        if len(multi[host]) < norm and lacking:
            labels = ", ".join(f"rail {i} ({fab.rails[i].label})" for i in lacking)
            out.append(Finding("missing", f"host {host} has no named HCA on {labels}: a missing cable, or an HCA "
                                          f"with a default NodeDesc", (f"host {host}",)))
    return out


def uplinks(fab: Fabric) -> list[Finding]:
    """Leaves with fewer uplink switches than the other leaves of their rail; leaf/uplink pairs
    with fewer (missing) or more (duplicated) cables than the norm."""
    nodes = fab.dump.nodes
    cables: dict[tuple[str, str], list] = defaultdict(list)
    for link in fab.dump.links:
        if nodes[link.a].kind == "switch" and nodes[link.b].kind == "switch" and link.a != link.b:
            if link.a in fab.edge and link.b not in fab.edge:
                cables[(link.a, link.b)].append((link.a_port, link.b_port))
            elif link.b in fab.edge and link.a not in fab.edge:
                cables[(link.b, link.a)].append((link.b_port, link.a_port))
    groups: dict[object, list[str]] = defaultdict(list)         # leaves of one rail (or component)
    rail_leaves = {leaf: r.index for r in fab.rails for leaf in r.leaves}
    for leaf in fab.edge:
        groups[rail_leaves.get(leaf, ("component", fab.component.get(leaf)))].append(leaf)
    out = []
    for leaves in groups.values():
        ups = {leaf: {s for (l, s) in cables if l == leaf} for leaf in leaves}
        norm_ups = _majority(Counter(len(u) for u in ups.values()))
        norm_cables = _majority(Counter(len(cables[(l, s)]) for l in leaves for s in ups[l]))
        for leaf in sorted(leaves, key=lambda s: natural_key(fab.names[s])):
            if norm_ups and len(ups[leaf]) < norm_ups:
                common = {s for s in set().union(*ups.values()) if sum(s in u for u in ups.values()) * 2 > len(leaves)}
                lacking = ", ".join(sorted((fab.names[s] for s in common - ups[leaf]), key=natural_key)) or "?"
                out.append(Finding("missing", f"switch {fab.names[leaf]} has {len(ups[leaf])} uplink switch(es); "
                                              f"the other leaves of its rail have {norm_ups} (no cable to {lacking})",
                                   (f"switch {fab.names[leaf]}",)))
            for s in sorted(ups[leaf], key=lambda s: natural_key(fab.names[s])):
                got = cables[(leaf, s)]
                if not norm_cables or len(got) == norm_cables:
                    continue
                kind = "missing" if len(got) < norm_cables else "duplicated"
                ports = tuple(f"{fab.switch_port_name(leaf, a)} <-> {fab.switch_port_name(s, b)}" for a, b in got)
                out.append(Finding(kind, f"switch {fab.names[leaf]} <-> switch {fab.names[s]}: {len(got)} cable(s), "
                                         f"the norm is {norm_cables}", ports))
    return out


def duplicated_hcas(fab: Fabric) -> list[Finding]:
    """Two HCAs (two CAs) with the same host and HCA name."""
    seen: dict[tuple[str, str], list[Hca]] = defaultdict(list)
    for h in fab.hcas:
        if h.name:
            seen[(h.host, h.name)].append(h)
    out = []
    for (host, name), hs in sorted(seen.items(), key=lambda kv: (natural_key(kv[0][0]), natural_key(kv[0][1]))):
        if len(hs) > 1:
            out.append(Finding("duplicated", f"host {host} {name} appears on {len(hs)} CAs",
                               tuple(_hca_port(fab, h) for h in hs), hs[0].line))
    return out
