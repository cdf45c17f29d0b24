"""Slurm hostlist expressions: expand ``gpu-node[1-2,4]`` and compress a list of names back.

Pure functions, no Slurm needed (``scontrol show hostnames`` does the same on a cluster).
"""
from __future__ import annotations

import re
from collections.abc import Iterable

_BRACKET = re.compile(r"^(?P<prefix>[^\[\]]*)\[(?P<ranges>[^\[\]]+)\](?P<suffix>[^\[\]]*)$")
_TAIL_NUM = re.compile(r"^(?P<prefix>.*?)(?P<num>\d+)$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def expand(expr: str) -> list[str]:
    """``gpu-node[01-03,7]`` -> ``['gpu-node01', 'gpu-node02', 'gpu-node03', 'gpu-node7']``."""
    out: list[str] = []
    for part in _split_top(expr):
        m = _BRACKET.match(part)
        if not m:
            if "[" in part or "]" in part:
                raise ValueError(f"bad hostlist term {part!r}")
            out.append(part)
            continue
        for rng in m["ranges"].split(","):
            rng = rng.strip()
            if "-" in rng:
                lo, hi = rng.split("-", 1)
                if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                    raise ValueError(f"bad range {rng!r} in hostlist {expr!r}")
                width = len(lo) if lo.startswith("0") else 0
                out.extend(f"{m['prefix']}{i:0{width}d}{m['suffix']}" for i in range(int(lo), int(hi) + 1))
            elif rng.isdigit():
                out.append(f"{m['prefix']}{rng}{m['suffix']}")
            else:
                raise ValueError(f"bad range {rng!r} in hostlist {expr!r}")
    return out


def compress(names: Iterable[str]) -> str:
    """Inverse of :func:`expand`, keeping the given order of prefixes.

    ``['gpu-node1', 'gpu-node2', 'mig-node1']`` -> ``'gpu-node[1-2],mig-node1'``.
    Names are grouped by (prefix, digit width); a group of one stays a plain name.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    order: list[tuple[str, int] | str] = []
    for name in names:
        m = _TAIL_NUM.match(name)
        if not m:
            order.append(name)
            continue
        num = m["num"]
        width = len(num) if num.startswith("0") and len(num) > 1 else 0
        key = (m["prefix"], width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(num))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, width = item
        nums = sorted(set(groups[item]))
        if len(nums) == 1:
            out.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        out.append(f"{prefix}[{ranges(nums, width)}]")
    return ",".join(out)


def ranges(nums: Iterable[int], width: int = 0) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2,5'`` (zero-padded to ``width``)."""
    nums = sorted(set(nums))
    spans: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        lo, hi = nums[i], nums[j]
        spans.append(f"{lo:0{width}d}" if lo == hi else f"{lo:0{width}d}-{hi:0{width}d}")
        i = j + 1
    return ",".join(spans)


def parse_ranges(text: str) -> list[int]:
    """``'0-3,8'`` -> ``[0, 1, 2, 3, 8]`` (a CPU / core list)."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            if not (lo.isdigit() and hi.isdigit()) or int(lo) > int(hi):
                raise ValueError(f"bad range {part!r}")
            out.extend(range(int(lo), int(hi) + 1))
        elif part.isdigit():
            out.append(int(part))
        else:
            raise ValueError(f"bad range {part!r}")
    return out
