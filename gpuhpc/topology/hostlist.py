"""Slurm hostlist expressions: ``dgx[01-04,07]`` <-> ``[dgx01, dgx02, dgx03, dgx04, dgx07]``.

Only the last run of digits in a name is bracketed (what Slurm itself prints for
``a08-p1-dgx-04-c[01-17]``). Zero padding is kept: ``n[01-10]`` expands to ``n01 .. n10``.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from gpuhpc.errors import UserInputError

_TAIL = re.compile(r"^(.*?)(\d+)$")
_NAT = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders ``n2`` before ``n10``."""
    return tuple(int(p) if p.isdigit() else p for p in _NAT.split(name))


def _ranges(nums: list[int], width: int) -> str:
    out: list[str] = []
    start = prev = nums[0]
    for n in nums[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        a, b = str(start).zfill(width), str(prev).zfill(width)
        out.append(a if start == prev else f"{a}-{b}")
        if n is not None:
            start = prev = n
    return ",".join(out)


def compress(names: Iterable[str]) -> str:
    """Names -> a Slurm hostlist expression; duplicates are dropped, order is natural."""
    uniq = sorted(set(names), key=natural_key)
    groups: dict[tuple[str, int], list[int]] = {}
    padded: dict[str, set[int]] = {}
    plain: list[str] = []
    split: list[tuple[str, str]] = []
    for name in uniq:
        m = _TAIL.match(name)
        if not m:
            plain.append(name)
            continue
        prefix, digits = m.group(1), m.group(2)
        split.append((prefix, digits))
        if len(digits) > 1 and digits.startswith("0"):
            padded.setdefault(prefix, set()).add(len(digits))
    for prefix, digits in split:
        width = len(digits) if len(digits) in padded.get(prefix, ()) else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    parts: list[tuple[tuple, str]] = [((natural_key(p), 0, -1), p) for p in plain]
    for (prefix, width), nums in groups.items():
        nums = sorted(set(nums))
        if len(nums) == 1:
            text = f"{prefix}{str(nums[0]).zfill(width)}"
        else:
            text = f"{prefix}[{_ranges(nums, width)}]"
        parts.append(((natural_key(prefix), width, nums[0]), text))
    parts.sort(key=lambda t: t[0])
    return ",".join(text for _, text in parts)


def _split_top(expr: str) -> list[str]:
    items, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UserInputError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise UserInputError(f"unbalanced '[' in hostlist {expr!r}")
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


def expand(expr: str) -> list[str]:
    """``gpu[01-03,07],cpu1`` -> ``[gpu01, gpu02, gpu03, gpu07, cpu1]`` (one bracket per item)."""
    out: list[str] = []
    for item in _split_top(expr):
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", item)
        if not m:
            if "[" in item or "]" in item:
                raise UserInputError(f"cannot expand hostlist item {item!r} (one [..] range per name)")
            out.append(item)
            continue
        prefix, body, suffix = m.groups()
        for part in body.split(","):
            part = part.strip()
            if "-" in part:
                a, b = part.split("-", 1)
                if not (a.isdigit() and b.isdigit()) or int(b) < int(a):
                    raise UserInputError(f"bad range {part!r} in hostlist {expr!r}")
                width = len(a) if a.startswith("0") else 0
                out.extend(f"{prefix}{str(n).zfill(width)}{suffix}" for n in range(int(a), int(b) + 1))
            elif part.isdigit():
                out.append(f"{prefix}{part}{suffix}")
            else:
                raise UserInputError(f"bad range {part!r} in hostlist {expr!r}")
    return out
