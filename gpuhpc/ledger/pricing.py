"""Pricing: pure functions over an in-memory price book snapshot (no database here).

Cost of a run = GPUs × hours × rate(GPU type, at) × partition multiplier × QOS multiplier.
A MIG profile is priced either with its own rate or as an exact fraction of its parent GPU
(``3g.40gb`` = 3/7 of ``h100``). Arithmetic is exact (``Fraction``) and money is rounded
once, half-even, to 6 decimals (the ``Numeric(20, 6)`` columns).

* **GPU-hours weigh a MIG slice by its fraction of a full GPU** (:func:`gpu_weight`: ``1g.10gb``
  = 1/7, ``3g.40gb`` = 3/7; A30's four-slice profiles by quarters): an hour on a ``1g.10gb`` is
  1/7 GPU-hour in every GPU-hour quota, at admission (:func:`worst_case`) and at ingest
  (:class:`PriceCache`) alike. A price's ``rate`` is per (weighted) GPU-hour, so ``amount =
  gpu_hours × rate`` still holds; the price book's own rates stay per device (slice) hour.
* **Pricing policy** (``gpuhpc ledger policy set pricing per_gpu|max_share``): ``per_gpu``
  (the default) charges a run its GPUs; ``max_share`` (Slurm's ``PriorityFlags=MAX_TRES``
  semantics) charges the largest of its shares of its nodes' GPUs (by price), CPUs and memory
  times the nodes' full price (:func:`max_share_price`): a job holding 1 of 8 GPUs and all 16
  CPUs pays for the node. GPU-hours stay the GPUs it held.
"""
from __future__ import annotations

import bisect
import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import NamedTuple

from gpuhpc.errors import LedgerError, UserInputError

QUANTUM = Decimal("0.000001")
WILDCARD = "*"          # price used for GPU types without a row of their own
GENERIC = "gpu"         # untyped gres/gpu


def to_decimal(value: Fraction | Decimal | int) -> Decimal:
    if isinstance(value, Fraction):
        q = (Decimal(value.numerator) / Decimal(value.denominator)) if value.denominator != 1 else Decimal(value.numerator)
        # exact enough: Decimal context has 28 digits, far beyond the 6 kept
        return q.quantize(QUANTUM, rounding=ROUND_HALF_EVEN)
    return Decimal(value).quantize(QUANTUM, rounding=ROUND_HALF_EVEN)


def parse_fraction(text: str) -> Fraction:
    """``"3/7"`` or ``"0.5"`` -> Fraction (exact)."""
    t = str(text).strip()
    try:
        f = Fraction(t)
    except (ValueError, ZeroDivisionError):
        raise UserInputError(f"not a fraction: {text!r}", hint="write it like 3/7 or 0.5") from None
    if f <= 0:
        raise UserInputError(f"fraction must be positive: {text!r}")
    return f


def parse_money(text: str | float | Decimal, *, what: str = "amount") -> Decimal:
    try:
        d = Decimal(str(text).strip())
    except Exception:
        raise UserInputError(f"{what} is not a number: {text!r}") from None
    if not d.is_finite() or d < 0:
        raise UserInputError(f"{what} must be a non-negative number: {text!r}")
    return d


def at_sacct_resolution(t: dt.datetime) -> dt.datetime:
    """``t`` truncated to the second, the resolution of sacct's times."""
    return t.replace(microsecond=0)


MIG_RE = re.compile(r"^(\d+)g\.(\d+)gb(\+me)?$")
MIG_SLICES_PER_GPU = 7                         # A100, H100, H200: seven compute slices
A30_PROFILES = {"1g.6gb", "2g.12gb", "4g.24gb"}  # A30: four (its profile names are its own)


def mig_slices(profile: str) -> int | None:
    """``3g.40gb`` -> 3 (compute slices); None when not a MIG profile name."""
    m = MIG_RE.match(profile or "")
    return int(m.group(1)) if m else None


def gpu_weight(gpu_type: str | None) -> Fraction:
    """What one GPU of ``gpu_type`` counts for in GPU-hours: a MIG slice its fraction of a full
    GPU (``1g.10gb`` -> 1/7, ``3g.40gb`` -> 3/7, ``7g.80gb`` -> 1; A30's ``2g.12gb`` -> 1/2),
    any other type 1."""
    n = mig_slices(gpu_type or "")
    if n is None:
        return Fraction(1)
    per_gpu = 4 if (gpu_type or "").removesuffix("+me") in A30_PROFILES else MIG_SLICES_PER_GPU
    return Fraction(min(n, per_gpu), per_gpu)


# ------------------------------------------------------------------ pricing policy (ledger_policies)
POLICY = "pricing"                  # the ledger policy that chooses the mode (gpuhpc ledger policy set)
PER_GPU = "per_gpu"
MAX_SHARE = "max_share"
MODES = (PER_GPU, MAX_SHARE)


@dataclass(frozen=True)
class NodeShape:
    """A node's size as Slurm has it (``scontrol show node``): CPUs, memory (MB), GPUs by type."""

    cpus: int
    mem_mb: int
    gpus: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class Fleet:
    """The cluster's nodes for ``max_share``: each node's shape and each partition's nodes."""

    shapes: dict[str, NodeShape] = field(default_factory=dict)
    partitions: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def shapes_of(self, nodelist: str, partition: str | None, gpu_types: Iterable[str]) -> list[NodeShape] | None:
        """The shapes a run's share is taken of: its nodes' when sacct named them (all known);
        else its partition's one shape (what Slurm's per-partition ``TRESBillingWeights`` can
        mirror); else, in a partition of mixed nodes, the one shape there that has the run's GPU
        types. None when that leaves no single answer (the run is then priced per GPU)."""
        from gpuhpc import hostlist

        names: list[str] = []
        if nodelist and nodelist not in ("None assigned", "(null)"):
            try:
                names = hostlist.expand(nodelist)
            except UserInputError:
                names = []
        if names and all(n in self.shapes for n in names):
            return [self.shapes[n] for n in names]
        pool = self.partitions.get(partition or "") or tuple(self.shapes)
        kinds = {self.shapes[n] for n in pool if n in self.shapes}
        if len(kinds) == 1:
            return [kinds.pop()]
        types = set(gpu_types)
        fit = {k for k in kinds if types and types <= {t for t, _ in k.gpus}}
        return [fit.pop()] if len(fit) == 1 else None


def fleet(nodes) -> Fleet:
    """A :class:`Fleet` from :class:`gpuhpc.slurm.parsers.NodeInfo` records (read duck-typed:
    ``name``, ``cpus``, ``real_memory_mb``, ``gpus_total``, ``partitions``)."""
    shapes, parts = {}, {}
    for n in nodes:
        shapes[n.name] = NodeShape(int(n.cpus or 0), int(n.real_memory_mb or 0),
                                   tuple(sorted((t, int(c)) for t, c in (n.gpus_total or {}).items() if int(c) > 0)))
        for p in n.partitions or ():
            parts.setdefault(p, []).append(n.name)
    return Fleet(shapes, {p: tuple(ns) for p, ns in parts.items()})


_MEM_UNIT = {"K": Fraction(1, 1024), "M": Fraction(1), "G": Fraction(1024), "T": Fraction(1024 * 1024)}


def mem_mb(text: str | None) -> Fraction:
    """sacct's ``AllocTRES`` memory (``8000M``, ``62.50G``, ``1T``; a bare number is MB) in MB."""
    t = (text or "").strip().upper()
    if not t:
        return Fraction(0)
    unit = _MEM_UNIT.get(t[-1])
    try:
        return Fraction(t[:-1] if unit is not None else t) * (unit if unit is not None else 1)
    except (ValueError, ZeroDivisionError):
        return Fraction(0)


def alloc_cpus_mem(alloc_tres: dict[str, str]) -> tuple[int, Fraction]:
    """(CPUs, memory in MB) a run held, from its ``AllocTRES``."""
    try:
        cpus = int(alloc_tres.get("cpu") or 0)
    except ValueError:
        cpus = 0
    return cpus, mem_mb(alloc_tres.get("mem"))


@dataclass(frozen=True)
class PriceEntry:
    effective_from: dt.datetime
    rate: Fraction | None = None               # per GPU-hour
    base: str | None = None                    # priced as fraction × rate(base)
    fraction: Fraction | None = None


@dataclass
class PriceBook:
    """Effective-dated rates and multipliers. Build it with :meth:`add_price` /
    :meth:`add_multiplier` or :func:`gpuhpc.ledger.quota.load_price_book`.

    Effective times count from the start of their second: sacct reports run starts in whole
    seconds, so a price set at 12:39:00.125 applies to a run that started at 12:39:00."""

    prices: dict[str, list[PriceEntry]] = field(default_factory=dict)
    multipliers: dict[tuple[str, str], list[tuple[dt.datetime, Fraction]]] = field(default_factory=dict)

    def add_price(self, gpu_type: str, effective_from: dt.datetime, *, rate: Fraction | Decimal | str | None = None,
                  base: str | None = None, fraction: Fraction | str | None = None) -> None:
        if (rate is None) == (base is None):
            raise UserInputError(f"price for {gpu_type}: give either a rate or a base GPU type with a fraction")
        entry = PriceEntry(at_sacct_resolution(effective_from), Fraction(str(rate)) if rate is not None else None, base,
                           parse_fraction(str(fraction)) if base is not None else None)
        lst = self.prices.setdefault(gpu_type, [])
        lst.append(entry)
        lst.sort(key=lambda e: e.effective_from)

    def add_multiplier(self, kind: str, name: str, effective_from: dt.datetime, multiplier: Fraction | Decimal | str) -> None:
        lst = self.multipliers.setdefault((kind, name), [])
        lst.append((at_sacct_resolution(effective_from), Fraction(str(multiplier))))
        lst.sort(key=lambda e: e[0])

    # ---------------------------------------------------------------- lookups
    def _entry(self, gpu_type: str, at: dt.datetime) -> PriceEntry | None:
        lst = self.prices.get(gpu_type)
        if not lst:
            return None
        i = bisect.bisect_right([e.effective_from for e in lst], at)
        return lst[i - 1] if i else None

    def rate(self, gpu_type: str, at: dt.datetime, *, _depth: int = 0) -> Fraction | None:
        """Rate per GPU-hour (exact), or None when the price book has none for this type."""
        if _depth > 8:
            raise LedgerError(f"price book: base GPU types of {gpu_type!r} form a cycle")
        entry = self._entry(gpu_type, at)
        if entry is None:
            return None
        if entry.rate is not None:
            return entry.rate
        assert entry.base is not None and entry.fraction is not None
        base = self.rate(entry.base, at, _depth=_depth + 1)
        if base is None:
            raise LedgerError(f"price book: {gpu_type} is priced as {entry.fraction} of {entry.base}, "
                              f"which has no price at {at:%Y-%m-%d %H:%M}")
        return base * entry.fraction

    def rate_or_default(self, gpu_type: str | None, at: dt.datetime) -> Fraction | None:
        """Rate for a type, else the ``*`` wildcard rate, else None. CPU-only (None/"") is free."""
        if not gpu_type:
            return Fraction(0)
        r = self.rate(gpu_type, at)
        return r if r is not None else self.rate(WILDCARD, at)

    def multiplier(self, kind: str, name: str | None, at: dt.datetime) -> Fraction:
        if not name:
            return Fraction(1)
        lst = self.multipliers.get((kind, name))
        if not lst:
            return Fraction(1)
        i = bisect.bisect_right([e[0] for e in lst], at)
        return lst[i - 1][1] if i else Fraction(1)

    def effective_rate(self, gpu_type: str | None, partition: str | None, qos: str | None,
                       at: dt.datetime) -> Fraction | None:
        base = self.rate_or_default(gpu_type, at)
        if base is None:
            return None
        return base * self.multiplier("partition", partition, at) * self.multiplier("qos", qos, at)


class CorrectedBook(PriceBook):
    """``book`` with ``gpu_type`` at ``rate`` (per device-hour) at every time, for ``gpuhpc ledger
    reprice``: every other type keeps its own rates, a MIG profile priced as a fraction of
    ``gpu_type`` too (it is another type, repriced by its own name); multipliers unchanged."""

    def __init__(self, book: PriceBook, gpu_type: str, rate: Fraction | Decimal | str) -> None:
        super().__init__(book.prices, book.multipliers)
        self.base_book, self.gpu_type, self.fixed = book, gpu_type, Fraction(str(rate))

    def rate(self, gpu_type: str, at: dt.datetime, *, _depth: int = 0) -> Fraction | None:
        if gpu_type == self.gpu_type:
            return self.fixed
        return self.base_book.rate(gpu_type, at, _depth=_depth)


class Price(NamedTuple):
    gpu_hours: Decimal
    rate: Decimal          # effective rate per GPU-hour, multipliers applied
    amount: Decimal
    priced: bool = True    # False when the price book had no rate (amount is 0)


def price_usage(book: PriceBook, *, gpu_type: str | None, gpus: int, seconds: int,
                partition: str | None, qos: str | None, at: dt.datetime) -> Price:
    """Price ``gpus`` GPUs of ``gpu_type`` for ``seconds`` (exact, rounded once). GPU-hours weigh
    a MIG slice by :func:`gpu_weight`; the rate is per (weighted) GPU-hour."""
    device_hours = Fraction(max(gpus, 0) * max(seconds, 0), 3600)
    w = gpu_weight(gpu_type)
    hours = device_hours * w
    rate = book.effective_rate(gpu_type, partition, qos, at)
    if rate is None:
        return Price(to_decimal(hours), Decimal(0).quantize(QUANTUM), Decimal(0).quantize(QUANTUM), priced=False)
    return Price(to_decimal(hours), to_decimal(rate / w), to_decimal(device_hours * rate))


def worst_case(book: PriceBook, *, gpu_type: str | None, gpus: int, time_limit_s: int, array_size: int,
               partition: str | None, qos: str | None, at: dt.datetime) -> Price:
    """Worst case of a submission: gpus × time limit × rate × array size."""
    return price_usage(book, gpu_type=gpu_type, gpus=gpus * max(array_size, 1), seconds=time_limit_s,
                       partition=partition, qos=qos, at=at)


def request_price(book: PriceBook, *, gpu_type: str | None, gpus: int, time_limit_s: int, array_size: int,
                  partition: str | None, qos: str | None, at: dt.datetime, mode: str = PER_GPU, cpus: int = 0,
                  mem_mb: Fraction | int = 0, shapes: Iterable[NodeShape] = ()) -> Price:
    """What a submission holds: its :func:`worst_case`; under ``max_share``, with the shapes of one
    task's nodes, the largest share of them that it names (``cpus``, ``mem_mb`` of one task; 0:
    not named) × their price when that is more, as ingest will charge it (:func:`share_amount`,
    :func:`uplift`, as :func:`max_share_price`), every task of an array on nodes of its own.
    GPU-hours stay the worst case's."""
    wc = worst_case(book, gpu_type=gpu_type, gpus=gpus, time_limit_s=time_limit_s, array_size=array_size,
                    partition=partition, qos=qos, at=at)
    shapes = list(shapes)
    if mode != MAX_SHARE or not shapes or not wc.priced:
        return wc
    n = max(array_size, 1)
    return uplift(wc, share_amount(book, shapes * n, max(cpus, 0) * n, Fraction(mem_mb) * n, time_limit_s,
                                   partition, qos, at))


def q6(num: int, den: int) -> Decimal:
    """num/den rounded half-even to 6 decimals, in integers (same result as :func:`to_decimal`)."""
    n = num * 1_000_000
    quo, rem = divmod(n, den)
    twice = 2 * rem
    if twice > den or (twice == den and quo % 2):
        quo += 1
    return Decimal(quo).scaleb(-6)


class PriceCache:
    """Fast repeated pricing for ingest: effective rates memoised per (type, partition, QOS,
    price-book segment); integer rounding. Same results as :func:`price_usage`.

    ``mode`` is the pricing policy (:data:`MODES`); with :data:`MAX_SHARE` and the cluster's nodes
    (:func:`fleet`), :meth:`price_run` charges the largest share (:func:`max_share_price`)."""

    def __init__(self, book: PriceBook, *, mode: str = PER_GPU, nodes: Fleet | None = None) -> None:
        if mode not in MODES:
            raise LedgerError(f"the ledger's pricing policy is {mode!r}, not one of {', '.join(MODES)}: "
                              f"gpuhpc ledger policy set {POLICY} {PER_GPU}")
        self.book = book
        self.mode = mode
        self.max_share = mode == MAX_SHARE
        self.nodes = nodes or Fleet()
        dates = {e.effective_from for lst in book.prices.values() for e in lst}
        dates |= {d for lst in book.multipliers.values() for d, _ in lst}
        self._edges = sorted(dates)
        self._rates: dict[tuple, tuple[Fraction | None, Decimal, Fraction]] = {}
        self._shapes: dict[tuple, list[NodeShape] | None] = {}

    def price(self, gpu_type: str | None, gpus: int, seconds: int, partition: str | None, qos: str | None,
              at: dt.datetime) -> Price:
        key = (gpu_type, partition, qos, bisect.bisect_right(self._edges, at))
        hit = self._rates.get(key)
        if hit is None:
            r = self.book.effective_rate(gpu_type, partition, qos, at)
            w = gpu_weight(gpu_type)
            hit = self._rates[key] = (r, to_decimal(r / w) if r is not None else Decimal(0).quantize(QUANTUM), w)
        rate, rate_d, w = hit
        units = max(gpus, 0) * max(seconds, 0)
        hours = q6(units * w.numerator, 3600 * w.denominator)
        if rate is None:
            return Price(hours, rate_d, Decimal(0).quantize(QUANTUM), priced=False)
        return Price(hours, rate_d, q6(units * rate.numerator, 3600 * rate.denominator))

    def shapes_of(self, nodelist: str, partition: str | None, gpu_types: Iterable[str]) -> list[NodeShape] | None:
        """:meth:`Fleet.shapes_of`, memoised."""
        key = (nodelist, partition, tuple(sorted(gpu_types)))
        hit = self._shapes.get(key, False)
        if hit is False:
            hit = self._shapes[key] = self.nodes.shapes_of(nodelist, partition, key[2])
        return hit

    def price_run(self, gpus: dict[str, int], cpus: int, mem: Fraction | int, nodelist: str, seconds: int,
                  partition: str | None, qos: str | None, at: dt.datetime) -> Price:
        """A run's price under the cache's mode: its GPUs (each type priced, summed), and with
        ``max_share`` the largest share of its nodes when that is more (:func:`share_amount`)."""
        parts = [self.price(t, n, seconds, partition, qos, at) for t, n in sorted(gpus.items())] or \
            [self.price(None, 0, seconds, partition, qos, at)]
        base = combine(parts)
        if not self.max_share or not base.priced:
            return base
        shapes = self.shapes_of(nodelist, partition, gpus)
        if shapes is None:
            return base
        return uplift(base, share_amount(self.book, shapes, cpus, mem, seconds, partition, qos, at))


def combine(parts: list[Price]) -> Price:
    """Prices of one run's GPU types as one (one type: itself; several: summed, rate = amount /
    GPU-hours)."""
    if len(parts) == 1:
        return parts[0]
    hours = sum((p.gpu_hours for p in parts), Decimal(0))
    amount = sum((p.amount for p in parts), Decimal(0))
    rate = (amount / hours).quantize(QUANTUM) if hours else Decimal(0).quantize(QUANTUM)
    return Price(hours, rate, amount, all(p.priced for p in parts))


def share_amount(book: PriceBook, shapes: list[NodeShape], cpus: int, mem: Fraction | int, seconds: int,
                 partition: str | None, qos: str | None, at: dt.datetime) -> Fraction:
    """The largest of a run's shares of its nodes' CPUs and memory times the nodes' full price
    for ``seconds`` (exact). The nodes' price: every GPU on them at its effective rate
    (multipliers applied; a type without a price adds nothing); a node without GPUs costs 0."""
    total_cpus = sum(s.cpus for s in shapes)
    total_mem = sum(s.mem_mb for s in shapes)
    node_rate = sum((n * (book.effective_rate(t, partition, qos, at) or 0) for s in shapes for t, n in s.gpus),
                    Fraction(0))
    share = max(Fraction(max(cpus, 0), total_cpus) if total_cpus else Fraction(0),
                Fraction(mem) / total_mem if total_mem else Fraction(0))
    return share * node_rate * Fraction(max(seconds, 0), 3600)


def uplift(base: Price, amount: Fraction) -> Price:
    """``base`` (the run's GPUs) charged ``amount`` instead when that is more."""
    money = to_decimal(amount)
    if money <= base.amount:
        return base
    rate = (money / base.gpu_hours).quantize(QUANTUM) if base.gpu_hours else Decimal(0).quantize(QUANTUM)
    return Price(base.gpu_hours, rate, money, base.priced)


def max_share_price(book: PriceBook, *, gpus: dict[str, int], cpus: int, mem_mb: Fraction | int,
                    shapes: list[NodeShape], seconds: int, partition: str | None, qos: str | None,
                    at: dt.datetime) -> Price:
    """A run under the ``max_share`` policy: ``max(its GPUs' price, share of CPUs × the nodes'
    price, share of memory × the nodes' price)`` (Slurm's ``PriorityFlags=MAX_TRES`` with
    ``TRESBillingWeights`` ``CPU`` = node price / CPUs and ``Mem`` = node price / MB,
    :func:`max_share_weights`). Same results as :meth:`PriceCache.price_run`."""
    parts = [price_usage(book, gpu_type=t, gpus=n, seconds=seconds, partition=partition, qos=qos, at=at)
             for t, n in sorted(gpus.items())] or \
        [price_usage(book, gpu_type=None, gpus=0, seconds=seconds, partition=partition, qos=qos, at=at)]
    base = combine(parts)
    if not base.priced or not shapes:
        return base
    return uplift(base, share_amount(book, shapes, cpus, mem_mb, seconds, partition, qos, at))


# ------------------------------------------------------------------ the Slurm mirror of max_share
def fmt_weight(w: Fraction) -> str:
    """A billing weight as Slurm reads it (a decimal, at most 6 places, no trailing zeros)."""
    q = round(w * 1_000_000)
    whole, frac = divmod(q, 1_000_000)
    return str(whole) + (f".{frac:06d}".rstrip("0") if frac else "")


def max_share_weights(book: PriceBook, at: dt.datetime, partition_nodes: dict[str, list[str]],
                      shapes: dict[str, NodeShape], unit: int) -> dict[str, str]:
    """``TRESBillingWeights`` per partition that make Slurm bill what ``max_share`` charges, under
    ``PriorityFlags=MAX_TRES`` (billing = the largest weighted TRES): ``CPU`` = the node's price
    per hour / its CPUs, ``Mem`` = / its MB, ``GRES/gpu`` = the cheapest GPU type's rate and
    ``GRES/gpu:<type>`` = each dearer type's whole rate (under MAX_TRES the typed and untyped
    counts are not added up), all × ``unit`` (billing units per currency unit per hour) and the
    partition's multiplier. Only partitions whose nodes have one shape and a price; a job that
    holds two GPU types at once is billed by Slurm for the dearer type only (the ledger adds them)."""
    out: dict[str, str] = {}
    for part, names in sorted(partition_nodes.items()):
        sh = {shapes[n] for n in names if n in shapes}
        if len(sh) != 1 or len([n for n in names if n in shapes]) != len(names):
            continue
        (s,) = sh
        rates = {t: book.effective_rate(t, part, None, at) for t, _ in s.gpus}
        rates = {t: r for t, r in rates.items() if r is not None}
        node_rate = sum((n * rates.get(t, 0) for t, n in s.gpus), Fraction(0))
        if not node_rate or not s.cpus or not s.mem_mb:
            continue
        low = min(rates.values())
        w = [f"CPU={fmt_weight(node_rate / s.cpus * unit)}", f"Mem={fmt_weight(node_rate / s.mem_mb * unit)}",
             f"GRES/gpu={fmt_weight(low * unit)}"]
        w += [f"GRES/gpu:{t}={fmt_weight(r * unit)}" for t, r in sorted(rates.items()) if r != low]
        out[part] = ",".join(w)
    return out


def flags_difference(mode: str, priority_flags: str | None) -> tuple[str, str] | None:
    """``(Slurm's PriorityFlags, what the pricing policy needs)`` when Slurm's billing does not
    follow the ledger's pricing mode (``MAX_TRES`` for ``max_share``, not for ``per_gpu``)."""
    flags = {f.strip().upper() for f in (priority_flags or "").split(",") if f.strip() and f.strip() != "(null)"}
    has = "MAX_TRES" in flags
    if mode == MAX_SHARE and not has:
        return (",".join(sorted(flags)) or "(none)", "MAX_TRES (pricing policy max_share)")
    if mode != MAX_SHARE and has:
        return (",".join(sorted(flags)), f"no MAX_TRES (pricing policy {mode})")
    return None


def unmirrored_qos(book: PriceBook, at: dt.datetime) -> list[str]:
    """QOS names whose multiplier is not 1 at ``at`` or in a later-dated entry. Slurm bills a job
    by its partition's ``TRESBillingWeights`` alone, so such a multiplier exists in the ledger only
    and a money budget that Slurm enforces (``GrpTRESMins=billing``) would drift from it."""
    names = []
    for (kind, name), entries in sorted(book.multipliers.items()):
        if kind != "qos":
            continue
        later = [m for eff, m in entries if eff > at]
        if book.multiplier("qos", name, at) != 1 or any(m != 1 for m in later):
            names.append(name)
    return names
