"""Slurm hostlist expressions: ``dgx[01-04,07]`` <-> ``[dgx01, dgx02, dgx03, dgx04, dgx07]``.

Expansion is shared with the cluster spec (:mod:`gpuhpc.spec.hostlist`); compression here
sorts names naturally, as Slurm prints them, where the spec's keeps the given order.
Only the last run of digits in a name is bracketed (what Slurm itself prints for
``a08-p1-dgx-04-c[01-17]``). Zero padding is kept: ``n[01-10]`` expands to ``n01 .. n10``.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from gpuhpc.errors import UserInputError
from gpuhpc.spec import hostlist as _spec_hostlist
from gpuhpc.spec.hostlist import ranges

_TAIL = re.compile(r"^(.*?)(\d+)$")
_NAT = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders ``n2`` before ``n10``."""
    return tuple(int(p) if p.isdigit() else p for p in _NAT.split(name))


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
            text = f"{prefix}[{ranges(nums, width)}]"
        parts.append(((natural_key(prefix), width, nums[0]), text))
    parts.sort(key=lambda t: t[0])
    return ",".join(text for _, text in parts)


def split_top(expr: str) -> list[str]:
    """Split a hostlist on the commas outside brackets (bad input exits 2)."""
    try:
        return _spec_hostlist._split_top(expr)
    except ValueError as exc:
        raise UserInputError(str(exc)) from exc


def expand(expr: str) -> list[str]:
    """``gpu[01-03,07],cpu1`` -> ``[gpu01, gpu02, gpu03, gpu07, cpu1]`` (one bracket per item).

    The same expansion the cluster spec uses; malformed input raises UserInputError (exit 2)."""
    try:
        return _spec_hostlist.expand(expr)
    except ValueError as exc:
        raise UserInputError(str(exc)) from exc
