"""Per-job GPU efficiency from Prometheus (what the GPU exporter recorded), priced in the
ledger's price book: ``gpuhpc report efficiency JOBID`` and the idle-GPU ranking of an
account (``--account A --period week``).

Idle means under the site's threshold (``--idle-threshold``, ``$GPUHPC_IDLE_THRESHOLD``, 5 %
by default, the same number as the waste alert in ``prometheus/rules.yml``). Idle GPU-hours
count every sample a device held by the job was idle; their cost is those hours times the
job's effective rate (GPU type × partition × QOS multipliers at the job's start).

The records, the Prometheus client and the pure :func:`~.usage.summarize` are :mod:`.usage`;
:func:`advise` is pure; the rest asks Prometheus, Slurm (SlurmClient) and the ledger's price book.
"""
from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.monitoring.usage import (UTIL, Device, JobEfficiency, Prometheus, RankRow, fetch_series, idle_threshold,
                                     job_series)

PERIODS = {"day": 1, "week": 7, "month": 30}
# MIG profiles a single-GPU job could move to, smallest first: (profile, memory GB)
MIG_FITS = (("1g.10gb", 10), ("2g.20gb", 20), ("3g.40gb", 40))


# ------------------------------------------------------------------ pure summaries
def _ranges(nums: list[int]) -> str:
    """[4, 5, 6, 7, 9] -> '4–7, 9'."""
    out, i = [], 0
    nums = sorted(nums)
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(f"{nums[i]}–{nums[j]}" if j > i + 1 else ", ".join(map(str, nums[i:j + 1])))
        i = j + 1
    return ", ".join(out)


def advise(rep: JobEfficiency) -> list[str]:
    """Plain-words advice from a summarized report."""
    from gpuhpc.slurm.durations import format_duration

    out = []
    devs = rep.devices
    if not devs:
        out.append("no GPU metrics for this job in Prometheus (no GPUs, or the Prolog's job map was not written)")
    idle = [d for d in devs if d.idle]
    busy = len(devs) - len(idle)
    if devs and idle and busy == 0:
        out.append(f"no GPU was busy (all under {rep.threshold:g} %): check that the job uses the GPU at all")
    elif idle:
        nodes = sorted({d.node for d in idle})
        for node in nodes:
            on = [d for d in idle if d.node == node]
            nums = [int(d.gpu) for d in on if d.gpu.isdigit()]
            label = "MIG instances" if any(d.mig for d in on) else "GPUs"
            where = f" on {node}" if len({d.node for d in devs}) > 1 else ""
            out.append(f"{label} {_ranges(nums)}{where} were idle: ask for {busy}")
    if devs and len(devs) - len(idle) == 1 and not any(d.mig for d in devs):
        peak = max(d.peak_mem_bytes for d in devs if not d.idle) / 1e9
        for profile, gb in MIG_FITS:
            if 0 < peak <= gb * 0.9:
                out.append(f"peak GPU memory {peak:.0f} GB: a {profile} MIG slice would do")
                break
    eff = rep.cpu_efficiency
    if eff is not None and rep.cpus >= 4 and eff < 0.25 and rep.elapsed_s >= 600:
        out.append(f"CPUs: {eff:.0%} of {rep.cpus} cores busy on average: ask for fewer (--cpus-per-gpu)")
    used = rep.time_limit_used
    if used is not None and used < 0.5 and rep.state not in ("RUNNING", "PENDING") and rep.elapsed_s > 0:
        suggest = max(300, math.ceil(rep.elapsed_s * 1.5 / 300) * 300)
        out.append(f"used {used:.0%} of its {format_duration(rep.time_limit_s)} time limit: "
                   f"--time={format_duration(suggest)} would schedule sooner")
    if not out:
        out.append("GPUs were busy: nothing to change")
    return out


# ------------------------------------------------------------------ Slurm, ledger, Prometheus
def sacct_time(text: str) -> dt.datetime | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return dt.datetime.fromisoformat(text).astimezone()     # sacct prints the host's local time
    except ValueError:
        return None


def price_book():
    """The ledger's price book (empty when the ledger has no prices or does not exist)."""
    from gpuhpc.ledger import quota
    from gpuhpc.ledger.paths import db_url
    from gpuhpc.ledger.pricing import PriceBook

    try:
        with quota.transaction(db_url()) as tx:
            return quota.load_price_book(tx)
    except GpuhpcError:
        return PriceBook()


def gpu_rate(book, gpu_type: str, partition: str, qos: str, at: dt.datetime | None) -> Decimal | None:
    from gpuhpc.ledger.pricing import to_decimal

    if book is None or not gpu_type:
        return None
    r = book.effective_rate(gpu_type, partition or None, qos or None, at or dt.datetime.now(dt.timezone.utc))
    return to_decimal(r) if r is not None else None


def job_report(job_id: str, *, client=None, prom: Prometheus | None = None, threshold: float | None = None,
               book=None, now: dt.datetime | None = None, series: bool = False,
               ledger_url: str | None = None) -> JobEfficiency:
    """One job's efficiency: its runs' metadata from sacct; the GPU figures from the run's
    summary in the ledger when it was settled (:mod:`.summaries`), else from Prometheus.
    ``series``: also the time series (for the charts) from Prometheus while it has them."""
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.slurm.durations import reported_seconds

    if not str(job_id).replace("_", "").isdigit():
        raise UserInputError(f"not a job id: {job_id!r}", field="JOBID")
    client = client or SlurmClient()
    prom = prom or Prometheus()
    rows = [r for r in client.accounting(job_ids=[str(job_id)]) if r.job_id == str(job_id)]
    if not rows:
        raise GpuhpcError(f"JOBID: Slurm has no job {job_id}")       # well-formed, missing: exit 1
    row = rows[-1]
    now = now or dt.datetime.now(dt.timezone.utc)
    start = sacct_time(row.start)
    end = sacct_time(row.end)
    gpus = row.gpus
    gpu_type = next((t for t in gpus if t != "gpu"), next(iter(gpus), ""))
    cpus = str(row.alloc_tres.get("cpu", ""))
    rep = JobEfficiency(job_id=str(job_id), user=row.user, account=row.account, partition=row.partition,
                        qos=row.qos, state=row.state.raw.split()[0] if row.state.raw else "", gpu_type=gpu_type,
                        gpus=sum(gpus.values()), start=start, end=end, elapsed_s=row.elapsed_s,
                        time_limit_s=reported_seconds(row.time_limit), threshold=idle_threshold(threshold),
                        cpus=int(cpus) if cpus.isdigit() else 0)
    stored = None
    if start is not None:
        from gpuhpc.monitoring import summaries

        stored = summaries.load_run(str(job_id), url=ledger_url)
    if stored is not None:
        summaries.apply(rep, stored)
        recent = end is not None and now - end < summaries.MAX_AGE
        if series and recent:               # the time series, while Prometheus still has them
            try:
                fetched = JobEfficiency(job_id=rep.job_id, threshold=rep.threshold)
                fetch_series(fetched, prom, start, end, now, label=stored.slurm_job_id)
                attach_series(rep, fetched)
            except GpuhpcError as exc:
                rep.notes.append(f"no time series: {exc.one_line()}")
    elif start is not None:
        fetch_series(rep, prom, start, end, now)
    if rep.rate is None:
        rep.rate = gpu_rate(book if book is not None else price_book(), gpu_type, row.partition, row.qos, start)
    rep.advice = advise(rep)
    return rep


def attach_series(rep: JobEfficiency, fetched: JobEfficiency) -> None:
    """Give the stored summary's devices the samples Prometheus still has (for the charts);
    the numbers stay the stored ones."""
    by_key = {(d.node, d.gpu, d.mig): d for d in fetched.devices}
    for d in rep.devices:
        f = by_key.get((d.node, d.gpu, d.mig))
        if f is not None:
            d.times, d.util, d.mem_times, d.mem = f.times, f.util, f.mem_times, f.mem
    if fetched.cpu_used:
        rep.cpu_times, rep.cpu_used, rep.rss = fetched.cpu_times, fetched.cpu_used, fetched.rss or rep.rss


MAX_SAMPLES = 50_000_000                       # Prometheus' default --query.max-samples
RECORDED_IDLE = "gpuhpc:job_idle_gpu_samples:sum5m"
GPU_INFO = "gpuhpc_gpu_info"


def long_range_samples(devices: float, window_s: int, step_s: int) -> float:
    """Samples the ranking's per-GPU query loads: the utilisation and job-info series of every
    device, at every step of the window."""
    return 2 * devices * window_s / max(step_s, 1)


def evaluation_interval(prom) -> float:
    """Prometheus' global rule evaluation interval (its running config; Prometheus' default 1m)."""
    import yaml

    from gpuhpc.slurm.durations import parse_duration

    try:
        text = (yaml.safe_load(prom.config()) or {}).get("global", {}).get("evaluation_interval") or "1m"
        return float(parse_duration(str(text), shorthand=True) or 60)
    except (GpuhpcError, UserInputError, yaml.YAMLError, AttributeError):
        return 60.0


def rank(account: str, period: str = "week", *, client=None, prom: Prometheus | None = None,
         threshold: float | None = None, book=None, now: dt.datetime | None = None, step_s: int = 15,
         ledger_url: str | None = None, notes: list[str] | None = None) -> list[RankRow]:
    """Jobs of ``account`` that ran in the last day/week/month, by idle GPU-hours (most first).
    Settled runs come from their summaries in the ledger (priced at their charge's rate); the
    rest (running, or not ingested yet) from one Prometheus query that counts every job's idle
    samples, with sacct saying whose jobs they are. Prometheus unreachable: the ledger's rows
    alone, and a line in ``notes``."""
    from gpuhpc.monitoring import summaries
    from gpuhpc.slurm.client import SlurmClient

    if period not in PERIODS:
        raise UserInputError(f"unknown period {period!r}", field="--period", hint=", ".join(PERIODS))
    prom = prom or Prometheus()
    th = idle_threshold(threshold)
    now = now or dt.datetime.now(dt.timezone.utc)
    since = now - dt.timedelta(days=PERIODS[period])
    out: dict[str, RankRow] = {}
    for r in summaries.idle_by_job(account, since, now, url=ledger_url):
        out[r.job_id] = r
    window = int((now - since).total_seconds())
    expr = f"sum by (job_id) (count_over_time(({job_series(f'({UTIL} < {th:g})')})[{window}s:{step_s}s]))"
    try:
        sample_s = step_s
        devices = prom.query(f"count({GPU_INFO})", at=now)
        n = float(devices[0]["value"][1]) if devices else 0.0
        if long_range_samples(n, window, step_s) > MAX_SAMPLES // 2:
            # the per-GPU series over this range would pass Prometheus' sample limit: the
            # recording rule's per-job 5-minute sums instead (the rules' idle threshold)
            expr = f"sum by (job_id) (sum_over_time({RECORDED_IDLE}[{window}s]))"
            sample_s = evaluation_interval(prom)
            if notes is not None:
                notes.append(f"idle GPU-hours of unsettled jobs from the recording rule {RECORDED_IDLE} "
                             f"({n:.0f} GPUs over {window // 86400} days: the rules' idle threshold)")
        idle = {r["metric"]["job_id"]: float(r["value"][1]) * sample_s / 3600 for r in prom.query(expr, at=now)}
    except GpuhpcError as exc:
        if not out:
            raise
        if notes is not None:
            notes.append(f"from the ledger's run summaries only (jobs not settled yet are missing): "
                         f"{exc.one_line()}")
        idle = {}
    settled = {r.slurm_job_id for r in out.values()}
    idle = {k: v for k, v in idle.items() if k not in settled and k not in out}
    rows = [r for r in (SlurmClient() if client is None else client).job_runs(since, now, job_ids=list(idle))
            if r.account == account] if idle else []
    book = book if book is not None else (price_book() if rows else None)
    for r in rows:
        key = r.job_id
        raw = r.job_id_raw or key
        hours = idle.get(raw, idle.get(key))
        if hours is None or key in out:
            continue
        gpus = r.gpus
        gtype = next((t for t in gpus if t != "gpu"), next(iter(gpus), ""))
        out[key] = RankRow(key, r.user, r.account, gtype, sum(gpus.values()), hours,
                           gpu_rate(book, gtype, r.partition, r.qos, sacct_time(r.start)))
    return sorted(out.values(), key=lambda x: (-x.idle_gpu_hours, x.job_id))


# ------------------------------------------------------------------ HTML
def _e(text) -> str:
    import html

    return html.escape(str(text), quote=True)


def render_html(rep: JobEfficiency, *, generated: dt.datetime | None = None) -> str:
    """A self-contained page: utilisation and memory over time per GPU/MIG instance (matplotlib
    SVG, no scripts), the table, the advice."""
    from gpuhpc.reports import charts
    from gpuhpc.slurm.durations import format_duration

    generated = generated or dt.datetime.now(dt.timezone.utc)
    t0 = min((d.times[0] for d in rep.devices if d.times), default=0.0)
    svg_util = svg_mem = "<p>No GPU samples.</p>"
    if rep.devices and any(d.times for d in rep.devices):
        longest = max(rep.devices, key=lambda d: len(d.times))
        x = [(t - t0) / 60 for t in longest.times]

        def aligned(d: Device, values: list[float], times: list[float]) -> list[float]:
            by_t = dict(zip(times, values))
            return [by_t.get(t, float("nan")) for t in longest.times]

        svg_util = charts.lines(x, {d.name: aligned(d, d.util, d.times) for d in rep.devices},
                                xlabel="minutes since start", ylabel="GPU utilisation %", from_zero=True,
                                title=f"job {rep.job_id}: GPU utilisation")
        svg_mem = charts.lines(x, {d.name: [v / 1e9 for v in aligned(d, d.mem, d.mem_times)] for d in rep.devices},
                               xlabel="minutes since start", ylabel="GPU memory used, GB", from_zero=True,
                               title=f"job {rep.job_id}: GPU memory")
    svg_cpu = ""
    if len(rep.cpu_used) >= 2:
        t0c = t0 or rep.cpu_times[0]
        pts = list(zip(rep.cpu_times, rep.cpu_used))
        xs = [(b[0] - t0c) / 60 for b in pts[1:]]
        busy = [max(0.0, (b[1] - a[1]) / (b[0] - a[0])) if b[0] > a[0] else 0.0 for a, b in zip(pts, pts[1:])]
        series = {"CPU cores busy": busy}
        if rep.cpus:
            series[f"allocated ({rep.cpus})"] = [float(rep.cpus)] * len(xs)
        svg_cpu = "<h2>CPU</h2>\n<figure class=\"chart\">" + charts.lines(
            xs, series, xlabel="minutes since start", ylabel="cores", from_zero=True,
            title=f"job {rep.job_id}: CPU (sstat samples)") + "</figure>"
    cpu_line = ""
    if rep.cpu_efficiency is not None:
        cpu_line = (f"<p>CPU: {rep.cpu_used_seconds:,.0f} core-seconds used of {rep.cpus} cores × "
                    f"{_e(format_duration(rep.elapsed_s))} ({rep.cpu_efficiency:.0%})"
                    + (f"; peak memory (RSS) {rep.peak_rss_bytes / 1e9:.2f} GB" if rep.peak_rss_bytes else "")
                    + ".</p>")
    rows = "".join(
        f"<tr><td>{_e(d.name)}</td><td>{d.mean_util:.1f}</td><td>{d.peak_mem_bytes / 1e9:.1f}</td>"
        f"<td>{d.idle_hours:.3f}</td><td>{'idle' if d.idle else 'busy'}</td></tr>" for d in rep.devices)
    used = rep.time_limit_used
    cost = f"{rep.idle_cost:,.2f}" if rep.idle_cost is not None else "no price in the ledger"
    advice = "".join(f"<li>{_e(a)}</li>" for a in rep.advice)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>gpuhpc efficiency: job {_e(rep.job_id)}</title>
<style>
body{{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222}}
table{{border-collapse:collapse;margin-top:1em}}th,td{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
th{{background:#f4f4f4}}td:first-child{{text-align:left}}.meta{{color:#666;font-size:90%}}
</style></head><body>
<h1>Job {_e(rep.job_id)}: GPU efficiency</h1>
<p class="meta">{_e(rep.user)} / {_e(rep.account)} on {_e(rep.partition)}; {rep.gpus} × {_e(rep.gpu_type or "GPU")};
{_e(rep.state)}; elapsed {_e(format_duration(rep.elapsed_s))} of {_e(format_duration(rep.time_limit_s))}
{f"({used:.0%} of the time limit)" if used is not None else ""}; idle under {rep.threshold:g} %;
generated {_e(generated.strftime("%Y-%m-%d %H:%M UTC"))}.</p>
<h2>Advice</h2><ul class="advice">{advice}</ul>
<p>Idle GPU-hours: <b>{rep.idle_gpu_hours:.3f}</b>; their cost: <b>{_e(cost)}</b>.</p>
{cpu_line}
<h2>Utilisation</h2>
<figure class="chart">{svg_util}</figure>
<h2>Memory</h2>
<figure class="chart">{svg_mem}</figure>
{svg_cpu}
<h2>Per GPU / MIG instance</h2>
<table><thead><tr><th>device</th><th>mean util %</th><th>peak memory GB</th><th>idle GPU-hours</th><th></th></tr></thead>
<tbody>{rows}</tbody></table>
</body></html>
"""
