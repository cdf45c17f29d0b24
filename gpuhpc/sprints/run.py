"""Run a sprint as a sweep and collect its figures: ``gpuhpc.sprint(...)`` and ``gpuhpc sprint FILE``.

The sprint is a grid sweep over its axes (:meth:`SprintSpec.sweep_mapping`), run by the sweeps
engine like any ``gpuhpc sweep run``. Per trial: the throughput is the median of the sprint's
metric as the trial reported it (``gpuhpc.report(samples_per_s=...)``) after the first ``warmup``
reports, with its spread (a single report: that value); GPU utilisation and
CPU use come from the job's efficiency report (the ledger's stored summary, else Prometheus:
:func:`gpuhpc.monitoring.efficiency.job_report`), else from a ``gpu_util_percent`` the trial
reported itself; the price per GPU-hour of ``gpu_type`` from the ledger's price book, else the
file's ``prices``.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.sprints.analysis import SprintResult, TrialRecord, analyse, throughput_of
from gpuhpc.sprints.spec import SprintSpec, check_cost, from_mapping, goal_of, load_file


def price(spec: SprintSpec) -> tuple[Decimal | None, str]:
    """The price per GPU-hour of the sprint's GPU type and where it came from."""
    from gpuhpc.monitoring.efficiency import gpu_rate, price_book

    rate = gpu_rate(price_book(), spec.gpu_type, str(spec.resources.get("partition", "")), "",
                    dt.datetime.now(dt.timezone.utc))
    if rate is not None:
        return rate, f"price of {spec.gpu_type} from the ledger: {rate}/GPU-hour"
    if spec.gpu_type in spec.prices:
        return spec.prices[spec.gpu_type], (f"no ledger price for {spec.gpu_type}: the sprint file's "
                                            f"{spec.prices[spec.gpu_type]}/GPU-hour")
    return None, f"no price for {spec.gpu_type} (ledger or the file's prices): no cost figures"


def _figures(job_id: str, client) -> tuple[float | None, str, float | None, float | None]:
    """(mean GPU util %, its source, CPU busy %, peak GPU memory) from the job's efficiency report."""
    from gpuhpc.monitoring.efficiency import job_report

    try:
        rep = job_report(job_id, client=client)
    except GpuhpcError:
        return None, "", None, None
    util = None
    if rep.devices:
        util = sum(d.mean_util for d in rep.devices) / len(rep.devices)
    used = rep.cpu_used_seconds
    cpu = 100 * used / (rep.cpus * rep.elapsed_s) if used is not None and rep.cpus and rep.elapsed_s else None
    mem = max((d.peak_mem_bytes for d in rep.devices), default=None)
    return util, (rep.source if util is not None else ""), cpu, mem


def records(spec: SprintSpec, rows: list[dict[str, Any]], rate: Decimal | None, *, client=None,
            utilisation: bool = True, directory: str | None = None) -> list[TrialRecord]:
    """The sweep's trial rows as :class:`TrialRecord`s (axes with one value filled in). With the
    sweep's ``directory``, a trial's throughput is the median of its reports after the sprint's
    ``warmup`` (:func:`gpuhpc.sprints.analysis.throughput_of`), else its last report."""
    from pathlib import Path

    from gpuhpc.sweeps.metrics import read_history

    out = []
    for row in rows:
        metrics = row.get("metrics") or {}
        thr = metrics.get(spec.metric)
        rec = TrialRecord(config=spec.config_of(row["params"]), state=row["state"],
                          throughput=float(thr) if thr is not None else None, rate=rate,
                          job_id=row.get("job_id") or "", trial=row["trial"])
        if directory:
            history = [v for _, v, _ in read_history(Path(directory) / "trials" / str(row["trial"]) / "metrics.jsonl",
                                                     spec.metric)]
            if history:
                rec.throughput, rec.spread, rec.reports = throughput_of(history, spec.warmup)
        out.append(rec)
    if utilisation:         # each report is a sacct and a Prometheus round trip: a few at once
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:
            figures = list(pool.map(lambda r: _figures(r.job_id, client) if r.job_id else None, out))
        for rec, fig in zip(out, figures):
            if fig is not None:
                rec.util_percent, rec.util_source, rec.cpu_percent, rec.memory_bytes = fig
    for rec, row in zip(out, rows):
        metrics = row.get("metrics") or {}
        if rec.util_percent is None and metrics.get("gpu_util_percent") is not None:
            rec.util_percent, rec.util_source = float(metrics["gpu_util_percent"]), "reported"
        if rec.cpu_percent is None and metrics.get("cpu_percent") is not None:
            rec.cpu_percent = float(metrics["cpu_percent"])
    return out


def rules(spec: SprintSpec, client) -> list[dict[str, Any]]:
    """Each configuration's own Slurm request (:mod:`gpuhpc.sprints.shapes`); the topology and
    the nodes are asked only when there is a multi-node configuration (pinned to its placement)."""
    from gpuhpc.sprints.shapes import resource_rules

    if not spec.request:
        return []
    configs = spec.configurations()
    kw: dict[str, Any] = {"gpu_type": spec.resources.get("gpu_type"), "partition": spec.resources.get("partition"),
                          "multi_node_template": spec.template_for(2) if spec.template == "single" else None}
    if any(c["nodes"] > 1 for c in configs):
        from gpuhpc.topology.placement import leaf_nodes

        kw["leaves"] = leaf_nodes(client.topology()) if any(c["placement"] != "one-nvlink" for c in configs) else {}
        try:
            kw["nodes"] = client.nodes()
        except GpuhpcError:
            kw["nodes"] = None
    return resource_rules(configs, spec.params_of, **kw)


# a shape's request that no node holds, as the sprint field that asked for it, and its fix
_AXIS_OF = {"gpus": ("axes.gpus_per_node", "smaller axes.gpus_per_node values, or a resources.partition with larger nodes"),
            "nodes": ("axes.nodes", "smaller axes.nodes values, or fewer GPUs per node"),
            "gpu_type": ("resources.gpu_type", None)}


def as_axis_error(exc: UserInputError) -> UserInputError:
    """The engine's check of a configuration's request (``gpus: 9 GPUs per node requested ...``)
    naming the sprint's field instead of the job field it became."""
    if exc.field not in _AXIS_OF:
        return exc
    field, hint = _AXIS_OF[exc.field]
    return UserInputError(exc.message.removeprefix(f"{exc.field}: "), field=field, hint=hint or exc.hint)


def sprint(spec: SprintSpec | Mapping[str, Any] | str, *, timeout: float | None = 3600, poll: float = 2.0,
           client=None, url: str | None = None, utilisation: bool = True) -> SprintResult:
    """Run the sprint (a spec, its mapping, or a sprint file's path), wait for every trial and
    return its :class:`SprintResult` (table rows, recommendation, bottlenecks)."""
    from gpuhpc.sweeps import submission
    from gpuhpc.sweeps.api import Sweep
    from gpuhpc.sweeps.spec import SweepSpec

    if isinstance(spec, str):
        spec = load_file(spec)
    elif not isinstance(spec, SprintSpec):
        spec = from_mapping(dict(spec))
    rate, note = price(spec)
    check_cost(spec, rate)
    if client is None:
        from gpuhpc.slurm.client import SlurmClient

        client = SlurmClient()
    shapes = rules(spec, client)
    sweep_spec = SweepSpec.from_mapping(spec.sweep_mapping(shapes))
    try:            # every shape is checked against the nodes before anything is written or submitted
        sid = submission.create(sweep_spec, client=client, url=url)
    except UserInputError as exc:
        raise as_axis_error(exc) from None
    handle = Sweep(sid, client=client, url=url)
    handle.wait(timeout=timeout, poll=poll)
    res = collect(spec, sid, rate, client=client, url=url, utilisation=utilisation)
    res.notes.insert(0, note)
    for rule in shapes:         # what each shape asked Slurm for
        when = ", ".join(f"{k}={v}" for k, v in rule["when"].items()) or "every trial"
        asked = ", ".join(f"{k}={v}" for k, v in rule["resources"].items())
        res.notes.append(f"{when}: {asked}" + (f" (template {rule['template']})" if rule.get("template") else ""))
    return res


def collect(spec: SprintSpec, sweep_id: int, rate: Decimal | None, *, client=None, url: str | None = None,
            utilisation: bool = True) -> SprintResult:
    from gpuhpc.sweeps import store

    recs = records(spec, store.trial_rows(sweep_id, url=url), rate, client=client, utilisation=utilisation,
                   directory=store.sweep_info(sweep_id, url=url)["directory"])
    res = analyse(spec.name, spec.metric, recs, goal_of(spec))
    res.sweep_id = sweep_id
    base = ", ".join(f"{k}={v}" for k, v in spec.resources.items())
    if spec.request:
        res.notes.append(f"each configuration ran as its own Slurm request (GPUs per node, nodes, placement) on "
                         f"top of the sprint's resources ({base}); cost is the configuration's GPUs x price / throughput")
    else:
        res.notes.append(f"request: false: the axes reach only the command; every trial ran with the sprint's "
                         f"resources ({base}); cost is the configuration's GPUs x price / throughput")
    return res
