"""Metric names a PromQL expression reads (for checking dashboards and rules against what
the exporters export): quoted strings and label matchers removed, then every identifier that
names a gpuhpc or node-exporter series."""
from __future__ import annotations

import re

_STR = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_BY = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_NAME = re.compile(r"\b((?:gpuhpc[_:]|node_)[A-Za-z0-9_:]*)")


def metric_names(expr: str) -> set[str]:
    text = _STR.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _BY.sub("", text)
    return set(_NAME.findall(text))


def dashboard_exprs(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel (rows' nested panels included), and
    (variable name, query) for query variables."""
    out = []

    def walk(panels):
        for p in panels or []:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", ""), t["expr"]))
            walk(p.get("panels"))

    walk(dashboard.get("panels"))
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and q:
            out.append((f"${v['name']}", q))
    return out
