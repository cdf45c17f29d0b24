"""Slurm hostlist expressions, the one implementation (python-hostlist underneath).

``expand("rack[1-2]-n[1-2]")`` -> ``['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']`` and
``compress(['n09', 'n10'])`` -> ``'n[09-10]'``; they mean what ``scontrol show hostnames`` and
``scontrol show hostlist`` mean (tests/integration/topology/test_hostlist_scontrol.py checks it
against the local cluster). Pure functions; bad input raises UserInputError (exit 2).

The same bracket syntax serves integer lists (CPU/core lists such as ``0-3,8``):
:func:`expand_ranges` and :func:`compress_ranges`.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

import hostlist as _hl

from gpuhpc.errors import UserInputError

_SEP = re.compile(r"\s*,\s*|\s+")


def _bad(text: str, exc: Exception, field: str | None) -> UserInputError:
    return UserInputError(f"bad hostlist {text!r}: {exc}", field=field,
                          hint="Slurm hostlist syntax, e.g. gpu-node[1-4,7],cpu-node1")


def expand(text: str, *, field: str | None = None) -> list[str]:
    """``gpu[01-03,7],cpu1`` -> ``['gpu01', 'gpu02', 'gpu03', 'gpu7', 'cpu1']``.

    Order and duplicates are kept, as ``scontrol show hostnames`` keeps them; commas and
    blanks both separate terms."""
    norm = _SEP.sub(",", text.strip())
    try:
        names = _hl.expand_hostlist(norm, allow_duplicates=True)
    except _hl.BadHostlist as exc:
        raise _bad(text, exc, field) from None
    for term in _split_terms(norm):
        if not _slurm_term(term):
            raise _bad(text, ValueError(f"Slurm allows no text after the last bracket ({term})"), field)
    return names


def compress_terms(names: Iterable[str]) -> list[str]:
    """The terms of :func:`compress`, one hostlist expression each (``['gpu-node[1-2]', 'login']``)."""
    order: dict[str, int] = {}
    for i, name in enumerate(names):
        order.setdefault(name, i)
    if not order:
        return []
    try:
        collected = _split_terms(_hl.collect_hostlist(list(order)))
    except _hl.BadHostlist as exc:  # a name with brackets or commas in it
        raise _bad(",".join(order), exc, None) from None
    # Slurm rejects text after the last bracket (``gpu[1-2]-ib``): such names stay plain, as
    # ``scontrol show hostlist`` leaves them
    terms: list[str] = []
    for t in collected:
        terms.extend([t] if _slurm_term(t) else _hl.expand_hostlist(t))
    # python-hostlist sorts the terms; keep them in the order their first name was given
    return sorted(terms, key=lambda t: min(order[n] for n in _hl.expand_hostlist(t)))


def compress(names: Iterable[str]) -> str:
    """Names -> one Slurm hostlist expression: ``['n09', 'n10', 'login']`` -> ``'n[09-10],login'``.

    Duplicates are dropped, numbers inside a bracket are sorted, and the terms keep the order in
    which their first name was given (sort the names first, with :func:`natural_key`, for a
    canonical order). Several numeric fields are bracketed: ``rack[1-2]-n[1-2]``."""
    return ",".join(compress_terms(names))


def natural_key(name: str) -> list:
    """Sort key that puts ``n2`` before ``n10``."""
    return _hl.numeric_sort_key(name)


def expand_ranges(text: str, *, field: str | None = None) -> list[int]:
    """``'0-3,8'`` -> ``[0, 1, 2, 3, 8]`` (a CPU or core list)."""
    text = text.strip()
    if not text:
        return []
    if not re.fullmatch(r"[0-9,\-\s]+", text):
        raise UserInputError(f"bad range list {text!r}", field=field, hint="numbers and ranges, e.g. 0-3,8")
    try:
        return [int(x) for x in _hl.expand_hostlist(f"[{_SEP.sub(',', text)}]", allow_duplicates=True)]
    except _hl.BadHostlist as exc:
        raise UserInputError(f"bad range list {text!r}: {exc}", field=field,
                             hint="numbers and ranges, e.g. 0-3,8") from None


def compress_ranges(nums: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2,5'``; empty -> ``''``."""
    uniq = sorted({int(n) for n in nums})
    if not uniq:
        return ""
    text = _hl.collect_hostlist([str(n) for n in uniq])
    return text[1:-1] if text.startswith("[") else text


def _slurm_term(term: str) -> bool:
    """Slurm (22.05 here) reads ``n[1-2]`` and ``rack[1-2]-n[1-2]`` but not ``n[1-2]-ib``."""
    return "[" not in term or term.endswith("]")


def _split_terms(text: str) -> list[str]:
    """Split a hostlist on the commas outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [t for t in out if t]
