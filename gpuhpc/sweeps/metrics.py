"""Reading the trials' metrics files (``<sweep dir>/trials/<n>/metrics.jsonl``, the lines
:func:`gpuhpc.report` appends): the last value of each metric (:func:`read_metrics`), a metric's
history for the pruners (:func:`read_history`). A long-lived reader (the driver) reads each file
on from where it stopped."""
from __future__ import annotations

import json
from pathlib import Path


def finished_by_files(trial_dir: Path, metric: str) -> bool:
    """Does a trial's directory say it finished: its metrics file holds the sweep's metric, or
    (a Python sweep) its result was kept?"""
    m = read_metrics(trial_dir / "metrics.jsonl")
    return (m is not None and metric in m) or (trial_dir / "result.pkl").exists()
_metric_cache: dict[str, tuple[int, dict[str, float]]] = {}


def read_metrics(path: Path) -> dict[str, float] | None:
    """The last value of each metric in a trial's metrics file (None when there is none). A
    long-lived reader (the driver) reads each file from where it stopped (its offset), so a
    running trial's file is not read again from the start on every poll."""
    key = str(path)
    offset, out = _metric_cache.get(key, (0, {}))
    out = dict(out)
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) < offset:          # replaced or truncated: start again
                offset, out = 0, {}
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return None
    end = data.rfind(b"\n") + 1                # a torn last line is read again next time
    for line in data[:end].decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:                      # a torn line in the middle: a trial killed mid-write
            continue
        if not isinstance(rec, dict):
            continue
        for k, v in (rec.get("metrics") or {}).items():
            out[k] = v
        if rec.get("step") is not None:
            out["step"] = rec["step"]
    _metric_cache[key] = (offset + end, out)
    return out or None


_history_cache: dict[str, tuple[int, int, list[tuple[int, float, float]]]] = {}


def read_history(path: Path, metric: str) -> list[tuple[int, float, float]]:
    """A trial's reports of ``metric`` from its metrics file, in the order written: [(step,
    value, time)]; a report without a step counts as the next step after the last. A long-lived
    reader (the driver) reads each file on from where it stopped, as :func:`read_metrics`."""
    key = f"{path}\0{metric}"
    offset, count, out = _history_cache.get(key, (0, 0, []))
    out = list(out)
    try:
        with open(path, "rb") as fh:
            if fh.seek(0, 2) < offset:
                offset, count, out = 0, 0, []
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return []
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        v = (rec.get("metrics") or {}).get(metric)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        step = rec.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            step = out[-1][0] + 1 if out else count
        ts = rec.get("ts")
        out.append((step, float(v), float(ts) if isinstance(ts, (int, float)) else float(offset + len(out))))
        count += 1
    _history_cache[key] = (offset + end, count, out)
    return out
