"""A sprint's table (text) and HTML page (table, recommendation, bottlenecks, inline SVG charts)."""
from __future__ import annotations

import datetime as dt
import html

from gpuhpc.sprints.analysis import SprintResult

COLUMNS = [("trial", "#"), ("batch_size", "batch"), ("nodes", "nodes"), ("gpus_per_node", "gpus/node"),
           ("placement", "placement"), ("state", "state"), ("throughput", "samples/s"),
           ("usd_per_million", "$/M samples"), ("scaling_efficiency", "scaling eff."),
           ("gpu_util_percent", "GPU util %"), ("cpu_percent", "CPU %")]


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.4f}" if abs(v) < 1 else f"{v:,.1f}"
    return str(v)


def text_table(res: SprintResult) -> str:
    rows = [[h for _, h in COLUMNS]] + [[_cell(r.get(k)) for k, _ in COLUMNS] for r in res.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    if res.best:
        lines.append(f"recommended: trial {res.best['trial']} (batch {res.best.get('batch_size')}, "
                     f"{res.best.get('nodes')} node(s) x {res.best.get('gpus_per_node')} GPU(s), "
                     f"{res.best.get('placement')}): {res.reason}")
    else:
        lines.append(f"recommended: none: {res.reason}")
    for b in res.bottlenecks:
        lines.append(f"bottleneck: trial {b['trial']} ({b['config']}): {b['bottleneck']}: {b['why']}")
    return "\n".join(lines) + "\n"


def _label(r: dict) -> str:
    return f"#{r['trial']} bs{r.get('batch_size')} {r.get('nodes')}x{r.get('gpus_per_node')} {r.get('placement')}"


def charts(res: SprintResult) -> list[tuple[str, str]]:
    from gpuhpc.reports import charts as ch

    done = [r for r in res.rows if r["throughput"]]
    out = []
    if done:
        out.append(("Throughput per configuration",
                    ch.hbars({_label(r): r["throughput"] for r in done}, xlabel=f"{res.metric}")))
    priced = [r for r in done if r["usd_per_million"] is not None]
    if priced:
        out.append(("Cost per million samples",
                    ch.hbars({_label(r): r["usd_per_million"] for r in priced}, xlabel="$ per million samples")))
    batches = sorted({r.get("batch_size") for r in done})
    shapes = sorted({(r.get("nodes"), r.get("gpus_per_node"), r.get("placement")) for r in done})
    if len(batches) > 1:
        series = {}
        for n, g, p in shapes:
            by_b = {r.get("batch_size"): r["throughput"] for r in done
                    if (r.get("nodes"), r.get("gpus_per_node"), r.get("placement")) == (n, g, p)}
            series[f"{n}x{g} {p}"] = [by_b.get(b, float("nan")) for b in batches]
        out.append(("Throughput by batch size", ch.lines(batches, series, xlabel="batch size per GPU",
                                                          ylabel=res.metric, from_zero=True)))
    return out


def render_html(res: SprintResult, *, generated: dt.datetime | None = None) -> str:
    e = html.escape
    generated = generated or dt.datetime.now(dt.timezone.utc)
    head = "".join(f"<th>{e(h)}</th>" for _, h in COLUMNS)
    body = []
    for r in res.rows:
        cls = ' class="best"' if res.best and r["trial"] == res.best["trial"] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(_cell(r.get(k)))}</td>" for k, _ in COLUMNS) + "</tr>")
    rec = (f"<p id=\"recommended\"><b>Recommended:</b> trial {res.best['trial']} ({e(_label(res.best))}): "
           f"{e(res.reason)}</p>" if res.best else f"<p id=\"recommended\">No recommendation: {e(res.reason)}</p>")
    bn = "".join(f"<li>trial {b['trial']} ({e(b['config'])}): <b>{e(b['bottleneck'])}</b>: {e(b['why'])}</li>"
                 for b in res.bottlenecks)
    notes = "".join(f"<li>{e(n)}</li>" for n in res.notes)
    figs = "".join(f"<figure><figcaption>{e(t)}</figcaption>{svg}</figure>" for t, svg in charts(res))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuhpc sprint {e(res.name)}</title>
<style>body{{font-family:sans-serif;margin:1.5em;max-width:70em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:2px 6px;text-align:right}} tr.best td{{background:#e6f4ea;font-weight:bold}}
figure{{margin:1em 0}} figcaption{{font-weight:bold}}</style></head>
<body><h1>Sprint {e(res.name)}</h1>
<p>Generated {e(generated.strftime('%Y-%m-%d %H:%M UTC'))}{f', sweep {res.sweep_id}' if res.sweep_id else ''}.</p>
{rec}
<table id="sprint-table"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>
<h2>Bottlenecks</h2><ul id="bottlenecks">{bn or '<li>none found</li>'}</ul>
{f'<h2>Notes</h2><ul>{notes}</ul>' if notes else ''}
<h2>Charts</h2>{figs}
</body></html>
"""
