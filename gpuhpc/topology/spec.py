"""Node names (and NVLink domains) from a cluster spec YAML, read loosely on purpose.

The typed model lives in :mod:`gpuhpc.spec`; this reader only needs node names, so it takes
``node_groups[*].hostname`` (a ``{n}`` pattern, ``count``, ``start``), or a hostlist
expression, or plain ``nodes`` lists, and ignores everything else. An optional
``nvlink_domain`` / ``nvlink_domains`` key on a node group names the domain(s) for
``--format block``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import expand


def _names_of_group(group: dict[str, Any], where: str) -> list[str]:
    pattern = group.get("hostname") or group.get("hostnames") or group.get("pattern")
    count = group.get("count", 1)
    start = group.get("start", 1)
    if pattern is None:
        if "nodes" in group:
            return _names_of_list(group["nodes"], f"{where}.nodes")
        if "name" in group and "count" not in group:
            return [str(group["name"])]
        raise UserInputError("node group has no hostname pattern", field=where)
    if not isinstance(count, int) or not isinstance(start, int):
        raise UserInputError("count/start must be integers", field=where)
    pattern = str(pattern)
    if "{" in pattern:
        try:
            return [pattern.format(n=i, index=i) for i in range(start, start + count)]
        except (KeyError, IndexError, ValueError) as exc:
            raise UserInputError(f"bad hostname pattern {pattern!r} ({exc})", field=f"{where}.hostname") from None
    if "%" in pattern:
        try:
            return [pattern % i for i in range(start, start + count)]
        except (TypeError, ValueError) as exc:
            raise UserInputError(f"bad hostname pattern {pattern!r} ({exc})", field=f"{where}.hostname") from None
    if "[" in pattern:
        return expand(pattern)
    if count == 1:
        return [pattern]
    m = re.match(r"^(.*?)(#+)(.*)$", pattern)
    if m:
        return [f"{m.group(1)}{str(i).zfill(len(m.group(2)))}{m.group(3)}" for i in range(start, start + count)]
    return [f"{pattern}{i}" for i in range(start, start + count)]


def _names_of_list(items: Any, where: str) -> list[str]:
    out: list[str] = []
    if isinstance(items, str):
        return expand(items)
    if not isinstance(items, list):
        raise UserInputError("expected a list", field=where)
    for i, item in enumerate(items):
        if isinstance(item, str):
            out.extend(expand(item))
        elif isinstance(item, dict):
            out.extend(_names_of_group(item, f"{where}[{i}]"))
    return out


def _load(path: str | Path) -> dict[str, Any]:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise UserInputError(f"no such file: {p}", field="--spec") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise UserInputError(f"not valid YAML ({getattr(exc, 'problem', exc)})", field=where) from None
    if not isinstance(data, dict):
        raise UserInputError("a cluster spec is a YAML mapping", field=str(p))
    return data


def spec_nodes(path: str | Path) -> list[str]:
    """Every node name of the spec, in spec order, without duplicates."""
    data = _load(path)
    names: list[str] = []
    if "node_groups" in data:
        names = _names_of_list(data["node_groups"], "node_groups")
    elif "nodegroups" in data:
        names = _names_of_list(data["nodegroups"], "nodegroups")
    elif "nodes" in data:
        names = _names_of_list(data["nodes"], "nodes")
    if not names:
        raise UserInputError("the spec lists no nodes (node_groups[*].hostname + count)", field=str(path))
    return list(dict.fromkeys(names))


def spec_domains(path: str | Path) -> dict[str, str]:
    """host -> NVLink domain for node groups that declare ``nvlink_domain`` (one domain for the
    group), ``nvlink_domain_size`` (consecutive chunks of that many nodes) or ``nvlink_domains``
    (a list of hostlists)."""
    data = _load(path)
    out: dict[str, str] = {}
    groups = data.get("node_groups") or data.get("nodegroups") or []
    for i, g in enumerate(groups if isinstance(groups, list) else []):
        if not isinstance(g, dict):
            continue
        where = f"node_groups[{i}]"
        gname = str(g.get("name", f"group{i}"))
        if "nvlink_domains" in g:
            for j, hl in enumerate(g["nvlink_domains"] or []):
                for h in expand(str(hl)):
                    out[h] = f"{gname}-nvl{j + 1}"
            continue
        if "nvlink_domain" in g or "nvlink_domain_size" in g:
            names = _names_of_group(g, where)
            size = g.get("nvlink_domain_size")
            if size:
                for k, h in enumerate(names):
                    out[h] = f"{gname}-nvl{k // int(size) + 1}"
            else:
                for h in names:
                    out[h] = str(g["nvlink_domain"])
    return out


def read_cliques(path: str | Path) -> dict[str, str]:
    """``host clique-id`` lines (e.g. collected from ``nvidia-smi -q``: ClusterUUID + CliqueId)."""
    out: dict[str, str] = {}
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UserInputError(f"no such file: {p}", field="--cliques") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.replace(",", " ").replace(":", " ", 1).split()
        if len(parts) < 2:
            raise UserInputError(f"expected 'HOST CLIQUE', got {line!r}", field=f"{p}:{lineno}")
        out[parts[0]] = " ".join(parts[1:])
    return out


def spec_hcas(path: str | Path) -> set[str]:
    """Compute HCA names the spec lists (``node_groups[*].ib_hcas``); storage HCAs are left out
    of it by the admin, so ``--rail auto`` only picks among these."""
    data = _load(path)
    groups = data.get("node_groups") or data.get("nodegroups") or []
    out: set[str] = set()
    for g in groups if isinstance(groups, list) else []:
        if isinstance(g, dict) and isinstance(g.get("ib_hcas"), list):
            out.update(str(x) for x in g["ib_hcas"])
    return out
