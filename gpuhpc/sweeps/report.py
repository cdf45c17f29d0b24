"""``gpuhpc sweep report ID --html FILE``: the objective by trial and each parameter against the
objective, as inline SVG charts (:mod:`gpuhpc.reports.charts`, matplotlib, offline)."""
from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

from gpuhpc.sweeps.state import TrialState


def html_report(info: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    from gpuhpc.reports import charts
    from gpuhpc.sweeps.store import best

    spec = info["spec"]
    metric = spec.metric.name
    done = [r for r in rows if r["objective"] is not None and r["state"] == TrialState.COMPLETED.value]
    pruned = [r for r in rows if r["state"] == TrialState.PRUNED.value]
    marks = {r["trial"]: pruned_mark(info["directory"], r["trial"]) for r in pruned}
    parts = [f"<h1>Sweep {info['sweep_id']}: {html.escape(info['name'])}</h1>",
             f"<p>{len(rows)} trials, {len(done)} with {html.escape(metric)} ({spec.metric.goal}), "
             f"{len(pruned)} pruned; status {html.escape(info['status'])}"
             + (f" ({html.escape(info['message'])})" if info.get("message") else "") + "</p>"]
    b = best(rows, spec.metric.goal)
    if b is not None:
        parts.append(f"<p>Best: trial {b['trial']}, {html.escape(metric)} = {b['objective']:.6g}, "
                     f"params <code>{html.escape(json.dumps(b['params'], sort_keys=True))}</code></p>")
    if done:
        shown = [r for r in pruned if r["objective"] is not None]
        if shown:           # pruned trials apart: their last report, never a result
            fig, ax = charts.figure(5.5, 3.0)
            ax.scatter([r["trial"] for r in done], [r["objective"] for r in done], s=12, color=charts.PALETTE[0],
                       label="completed")
            ax.scatter([r["trial"] for r in shown], [r["objective"] for r in shown], s=12, marker="x",
                       color="#999999", label="pruned (last report)")
            ax.set_xlabel("trial")
            ax.set_ylabel(metric)
            ax.grid(True, color="#dddddd")
            ax.legend(loc="best", fontsize=8)
            ax.set_title(f"{metric} by trial")
            parts.append(charts.svg(fig))
        else:
            parts.append(charts.lines([r["trial"] for r in done], {metric: [r["objective"] for r in done]},
                                      xlabel="trial", ylabel=metric, title=f"{metric} by trial", scatter=True))
        for name in spec.parameters:
            xs = [r["params"].get(name) for r in done]
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs):
                log = spec.parameters[name].kind == "loguniform"
                svg = _scatter(xs, [r["objective"] for r in done], name, metric, log)
            else:                           # categorical: one x position per value
                cats = sorted({str(x) for x in xs})
                pos = [cats.index(str(x)) for x in xs]
                svg = _scatter(pos, [r["objective"] for r in done], name, metric, False, cats)
            parts.append(svg)
    else:
        parts.append("<p>No trial has finished with the metric yet.</p>")
    if pruned:
        parts.append(f"<h2>Pruned trials ({len(pruned)})</h2><table border=1 cellspacing=0 cellpadding=3><tr>"
                     f"<th>trial</th><th>pruned at step</th><th>last {html.escape(metric)}</th><th>why</th></tr>")
        for r in pruned:
            m = marks.get(r["trial"]) or {}
            parts.append(f"<tr><td>{r['trial']}</td><td>{'' if m.get('step') is None else m['step']}</td>"
                         f"<td>{'' if r['objective'] is None else r['objective']}</td>"
                         f"<td>{html.escape(str(m.get('why') or ''))}</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Trials</h2><table border=1 cellspacing=0 cellpadding=3><tr><th>trial</th><th>state</th>"
                 f"<th>{html.escape(metric)}</th><th>params</th><th>job</th><th>restarts</th><th>GPU-h</th></tr>")
    for r in rows:
        style = " style='color:#999999'" if r["state"] == TrialState.PRUNED.value else ""
        parts.append(f"<tr{style}><td>{r['trial']}</td><td>{r['state']}</td><td>{'' if r['objective'] is None else r['objective']}"
                     f"</td><td><code>{html.escape(json.dumps(r['params'], sort_keys=True))}</code></td>"
                     f"<td>{html.escape(r['job_id'] or '')}</td><td>{r['restarts']}</td><td>{r['gpu_hours']}</td></tr>")
    parts.append("</table>")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>sweep "
            f"{info['sweep_id']}</title></head><body style='font-family:sans-serif'>" + "\n".join(parts)
            + "</body></html>\n")


def pruned_mark(directory: str, trial: int) -> dict[str, Any] | None:
    """The pruner's record of a pruned trial (step, why, time), or None."""
    from gpuhpc.sweeps.trial import PRUNED

    try:
        data = json.loads(open(f"{directory}/trials/{trial}/{PRUNED}", encoding="utf-8").read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _scatter(xs, ys, xname: str, yname: str, logx: bool, cats: list[str] | None = None) -> str:
    from gpuhpc.reports import charts

    fig, ax = charts.figure(5.5, 3.0)
    ax.scatter(xs, ys, s=12, color=charts.PALETTE[0])
    if logx:
        ax.set_xscale("log")
    if cats is not None:
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats)
    ax.set_xlabel(xname)
    ax.set_ylabel(yname)
    ax.grid(True, color="#dddddd")
    ax.set_title(f"{yname} vs {xname}")
    return charts.svg(fig)
