"""Price book YAML::

    currency: USD
    effective_from: 2026-01-01        # optional, default now
    gpus:
      h100: "2.50"                    # per GPU-hour
      a100: "1.60"
      "3g.40gb": {of: h100, fraction: "3/7"}
      "*": "1.00"                     # any other GPU type
    partitions: {gpu: "1.0", preempt: "0.6"}
    qos: {low: "0.5"}
    pricing: max_share                # optional: the pricing policy (per_gpu, the default, or max_share)

``pricing`` sets the ledger policy of that name (``gpuhpc ledger policy set pricing ...``, audited)
and is checked before anything is written. A MIG profile counts in GPU-hours by its fraction of a
GPU whatever its price (:func:`gpuhpc.ledger.pricing.gpu_weight`).
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from gpuhpc.errors import UserInputError
from gpuhpc.ledger import admin, pricing


def load_file(path: Path, *, url: str | None = None) -> int:
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:
        raise UserInputError(f"{path}: not valid YAML: {exc}") from None
    return load(data or {}, url=url, source=str(path))


def load(data: dict, *, url: str | None = None, source: str = "price book") -> int:
    if not isinstance(data, dict):
        raise UserInputError(f"{source}: expected a mapping")
    unknown = set(data) - {"currency", "effective_from", "gpus", "partitions", "qos", "pricing"}
    if unknown:
        raise UserInputError(f"{source}: unknown keys {sorted(unknown)}",
                             hint="valid: currency, effective_from, gpus, partitions, qos, pricing")
    mode = data.get("pricing")
    if mode is not None and mode not in pricing.MODES:
        raise UserInputError(f"{source}: pricing {mode!r} is not a pricing policy", field="pricing",
                             hint=f"one of: {', '.join(pricing.MODES)}")
    eff = data.get("effective_from")
    if isinstance(eff, dt.date) and not isinstance(eff, dt.datetime):
        eff = dt.datetime(eff.year, eff.month, eff.day, tzinfo=dt.timezone.utc)
    elif isinstance(eff, str):
        eff = dt.datetime.fromisoformat(eff)
    if isinstance(eff, dt.datetime) and eff.tzinfo is None:
        eff = eff.replace(tzinfo=dt.timezone.utc)
    eff = eff or pricing.at_sacct_resolution(admin.utcnow())
    currency = str(data.get("currency", "USD"))
    n = 0
    for gpu_type, spec in (data.get("gpus") or {}).items():
        field = f"gpus.{gpu_type}"
        if isinstance(spec, dict):
            if set(spec) != {"of", "fraction"}:
                raise UserInputError("give {of: BASE, fraction: N/D}", field=field)
            admin.set_price(str(gpu_type), base=str(spec["of"]), fraction=str(spec["fraction"]), effective_from=eff,
                            currency=currency, url=url)
        else:
            admin.set_price(str(gpu_type), rate=pricing.parse_money(spec, what=field), effective_from=eff,
                            currency=currency, url=url)
        n += 1
    for kind, key in (("partition", "partitions"), ("qos", "qos")):
        for name, mult in (data.get(key) or {}).items():
            admin.set_multiplier(kind, str(name), pricing.parse_money(mult, what=f"{key}.{name}"), effective_from=eff,
                                 url=url)
            n += 1
    if mode is not None:
        from gpuhpc.ledger import adjust

        adjust.set_policy(pricing.POLICY, mode, url=url)
        n += 1
    return n
