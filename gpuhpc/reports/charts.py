"""Charts as inline SVG, drawn by matplotlib (offline, no display: a login node is enough).

One helper per kind of chart, each returning an ``<svg>`` element's text to put straight into
an HTML page: :func:`stacked_bars` (cost over time by key), :func:`hbars` (a total per key),
:func:`lines` (metrics over steps or time; ``scatter=True`` for points only). Value axes start
at 0 where that makes sense and end on a round tick at or above the largest value
(:func:`nice_ticks`).

matplotlib is imported inside the functions (it costs ~0.3 s, never on a CLI's hot path), with
its object-oriented API (no pyplot, no global backend switch). ``MPLCONFIGDIR`` is pointed at
a private temporary directory when it is unset and ``~/.config/matplotlib`` cannot be written
(a login node with a read-only home).
"""
from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping, Sequence

PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]
OTHER = "#999999"


def _ensure_config_dir() -> None:
    cur = os.environ.get("MPLCONFIGDIR")
    home_cfg = os.path.join(os.path.expanduser("~"), ".config", "matplotlib")
    for d in ([cur] if cur else [home_cfg, os.path.dirname(home_cfg)]):
        if os.path.isdir(d) and os.access(d, os.W_OK):
            return
        if not cur and not os.path.exists(d) and os.access(os.path.dirname(d) or "/", os.W_OK):
            return          # matplotlib can create it
    os.environ["MPLCONFIGDIR"] = tempfile.mkdtemp(prefix="gpuhpc-mpl-")


def figure(width_in: float, height_in: float):
    """A matplotlib Figure and its one Axes (no pyplot, no display), for a chart of your own;
    :func:`svg` renders it."""
    _ensure_config_dir()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), dpi=96, layout="constrained")
    return fig, fig.add_subplot()


def svg(fig) -> str:
    """The figure as inline SVG text (the same chart is the same bytes)."""
    import matplotlib

    buf = io.StringIO()
    # text stays text (searchable, smaller); no timestamp, so the same chart is the same bytes
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "gpuhpc", "font.size": 9}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    start, end = text.find("<metadata>"), text.find("</metadata>")
    if start != -1 and end != -1:        # RDF/Dublin Core boilerplate (external URLs) is not needed inline
        text = text[:start] + text[end + len("</metadata>"):]
    return text


def nice_ticks(vmax: float, n: int = 5) -> list[float]:
    """Round ticks from 0 to the first tick at or above ``vmax`` (steps of 1, 2, 2.5 or 5 × 10^k)."""
    from matplotlib.ticker import MaxNLocator

    vmax = float(vmax) if vmax and vmax > 0 else 1.0
    ticks = [float(f"{t:.12g}") for t in MaxNLocator(nbins=n, steps=[1, 2, 2.5, 5, 10]).tick_values(0, vmax)
             if t >= 0]
    while ticks[-1] < vmax:                   # never the case for MaxNLocator; kept as a guarantee
        ticks.append(float(f"{ticks[-1] + (ticks[1] - ticks[0]):.12g}"))
    return ticks[:next(i for i, t in enumerate(ticks) if t >= vmax) + 1]


def _value_axis(ax, vmax: float, *, horizontal: bool = False, label: str = "") -> None:
    ticks = nice_ticks(vmax)
    if horizontal:
        ax.set_xlim(0, ticks[-1])
        ax.set_xticks(ticks)
        ax.xaxis.grid(True, color="#dddddd")
        ax.set_xlabel(label)
    else:
        ax.set_ylim(0, ticks[-1])
        ax.set_yticks(ticks)
        ax.yaxis.grid(True, color="#dddddd")
        ax.set_ylabel(label)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _colors(keys: Sequence[str], colors: Mapping[str, str] | None) -> list[str]:
    colors = colors or {}
    return [colors.get(k) or (OTHER if k == "other" else PALETTE[i % len(PALETTE)]) for i, k in enumerate(keys)]


def stacked_bars(categories: Sequence[str], series: Mapping[str, Sequence[float]], *, ylabel: str = "",
                 title: str = "", colors: Mapping[str, str] | None = None, width_in: float = 7.8,
                 height_in: float = 3.2) -> str:
    """Bars per category (e.g. a period), stacked by series (e.g. an account), legend on the right."""
    fig, ax = figure(width_in, height_in)
    x = list(range(len(categories)))
    bottoms = [0.0] * len(categories)
    for (name, values), color in zip(series.items(), _colors(list(series), colors)):
        vals = [float(v) for v in values]
        ax.bar(x, vals, 0.8, bottom=bottoms, color=color, label=name)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    _value_axis(ax, max(bottoms, default=0), label=ylabel)
    step = max(1, len(categories) // 16)
    ax.set_xticks(x[::step], [str(c) for c in categories][::step], rotation=30 if len(categories) > 6 else 0,
                  ha="right" if len(categories) > 6 else "center")
    if series:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    if title:
        ax.set_title(title)
    return svg(fig)


def hbars(values: Mapping[str, float], *, xlabel: str = "", title: str = "", width_in: float = 7.8) -> str:
    """One horizontal bar per key (in the order given, top to bottom), value printed at its end."""
    fig, ax = figure(width_in, 0.8 + 0.32 * max(len(values), 1))
    keys = list(values)
    vals = [float(v) for v in values.values()]
    ax.barh(range(len(keys)), vals, 0.7, color=_colors(keys, None))
    ax.set_yticks(range(len(keys)), keys)
    ax.invert_yaxis()
    _value_axis(ax, max(vals, default=0), horizontal=True, label=xlabel)
    for i, v in enumerate(vals):
        ax.annotate(f"{v:,.2f}", (v, i), xytext=(4, 0), textcoords="offset points", va="center")
    if title:
        ax.set_title(title)
    return svg(fig)


def lines(x: Sequence, series: Mapping[str, Sequence[float]], *, xlabel: str = "", ylabel: str = "",
          title: str = "", scatter: bool = False, logy: bool = False, from_zero: bool = False,
          width_in: float = 7.8, height_in: float = 3.2) -> str:
    """One line (or, with ``scatter``, one set of points) per series over a shared x."""
    fig, ax = figure(width_in, height_in)
    for (name, values), color in zip(series.items(), _colors(list(series), None)):
        if scatter:
            ax.scatter(x, values, s=12, color=color, label=name)
        else:
            ax.plot(x, values, color=color, label=name, linewidth=1.5)
    if logy:
        ax.set_yscale("log")
    elif from_zero:
        _value_axis(ax, max((float(v) for vs in series.values() for v in vs), default=0), label=ylabel)
    ax.set_xlabel(xlabel)
    if not from_zero or logy:
        ax.set_ylabel(ylabel)
        ax.grid(True, color="#dddddd")
    if len(series) > 1:
        ax.legend(frameon=False)
    if title:
        ax.set_title(title)
    return svg(fig)
