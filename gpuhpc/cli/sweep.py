"""``gpuhpc sweep``: hyper-parameter sweeps as job arrays that fit the cluster (docs/sweeps.md).

Plain click (``gpuhpc sweep run`` is measured against raw ``sbatch`` of the same chunks,
bench/sweep_submit.py); rich is imported by ``status`` only. With ``--cluster`` the group runs on
the cluster (:class:`gpuhpc.cli._oncluster.OnClusterGroup`).
"""
from __future__ import annotations

import sys

import click

from gpuhpc.cli._console import print_json
from gpuhpc.cli._oncluster import OnClusterGroup
from gpuhpc.cli.main import help_for


def _echo(text: str, err: bool = False) -> None:
    (sys.stderr if err else sys.stdout).write(text + "\n")

_STATE_STYLE = {"completed": "green", "pruned": "blue", "failed": "red", "cancelled": "yellow", "running": "cyan",
                "pending": "white", "requeued": "magenta", "waiting": "dim"}
_FINISHED = ("completed", "pruned", "failed", "cancelled")


def _sweep(sweep_id: str):
    """The sweep ``sweep_id``: a malformed id is bad input (exit 2), a well-formed one that no
    sweep has is a missing thing (exit 1)."""
    from gpuhpc.errors import GpuhpcError, UserInputError
    from gpuhpc.sweeps.api import Sweep

    if not sweep_id.isdigit():
        raise UserInputError(f"{sweep_id!r} is not a sweep id", field="ID")
    try:
        return Sweep.load(sweep_id)
    except UserInputError as exc:           # "no sweep N"
        raise GpuhpcError(exc.message) from None


def _row_out(r: dict) -> dict:
    return {k: r[k] for k in ("trial", "params", "state", "metrics", "job_id", "restarts", "gpu_hours")}


def run(file: str, as_json: bool, after: str | None = None) -> int:
    """Validate FILE, submit the trials the cluster allows now (the driver job submits the rest)
    and return at once with the sweep id. ``after``: job ids (``--after``, replacing the file's
    ``after:``) that must end COMPLETED before the first arrays and the driver start."""
    from gpuhpc.sweeps import submission
    from gpuhpc.sweeps.spec import load_file

    spec = load_file(file)
    if after is not None:
        import dataclasses

        from gpuhpc.jobs.spec import after_ids

        spec = dataclasses.replace(spec, after=after_ids(after, "--after"))
    sid = submission.create(spec)
    if as_json:
        print_json({"sweep_id": sid})
    else:
        _echo(f"sweep {sid}: {spec.n_trials} trials of {spec.name} submitted (gpuhpc sweep status {sid})")
    return 0


def _tail(path: str | None, n: int = 5) -> str:
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 4096))
            lines = fh.read().decode(errors="replace").splitlines()[-n:]
    except OSError:
        return ""
    return "\n".join(lines)


def _status_renderable(sw, rows: list[dict], info: dict):
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    from gpuhpc.sweeps import store

    counts: dict[str, int] = {}
    for r in rows:
        counts[r["state"]] = counts.get(r["state"], 0) + 1
    total = info["n_trials"]
    finished = sum(counts.get(s, 0) for s in _FINISHED)
    spec = info["spec"]
    head = Text(f"sweep {sw.id} {info['name']}: {info['status']}"
                + (f" ({info['message']})" if info.get("message") else "")
                + f" - {finished}/{total} finished")
    bar = Table.grid(padding=(0, 1))
    bar.add_row(ProgressBar(total=max(total, 1), completed=finished, width=50), f"{100 * finished // max(total, 1)}%")
    parts = [head, bar]
    t = Text("  ".join(f"{s} {counts[s]}" for s in _STATE_STYLE if counts.get(s)))
    for s, style in _STATE_STYLE.items():
        t.highlight_words([s], style=style)
    parts.append(t)
    b = store.best(rows, spec.metric.goal)
    if b is not None:
        parts.append(Text(f"best: trial {b['trial']} {spec.metric.name}={b['objective']:.6g} params {b['params']}"))
    failed = [r for r in rows if r["state"] == "failed"]
    if failed:
        tab = Table(title=f"failed trials ({len(failed)})", show_lines=False)
        for col in ("trial", "job", "state", "log tail"):
            tab.add_column(col)
        for r in failed[:5]:
            log = None
            raw = r.get("job_id_raw")
            try:            # the job that ran the trial last (the trial records it)
                with open(f"{info['directory']}/trials/{r['trial']}/jobs") as fh:
                    raw = fh.read().split()[-1]
            except (OSError, IndexError):
                pass
            if raw:
                import glob

                found = glob.glob(f"{info['directory']}/logs/*-{raw}.out")
                log = found[0] if found else None
            tab.add_row(str(r["trial"]), r["job_id"] or "", r["raw_state"] or r["state"], _tail(log))
        parts.append(tab)
    return Group(*parts)


def _stopped(info: dict, rows: list[dict]) -> bool:
    """A sweep that will not go on by itself (cancelled, blocked, failed by fail_fast) once
    nothing of it is queued or running: its waiting trials wait for `sweep resume`."""
    return info["status"] in ("cancelled", "blocked", "failed") and \
        not any(r["state"] in ("pending", "running", "requeued") for r in rows)


def status(sweep_id: str, watch: bool, interval: float, as_json: bool) -> int:
    """Progress, counts per state, the best trial so far, failed trials with their log tails."""
    import time

    from gpuhpc.cli._console import console
    from gpuhpc.sweeps import store

    from gpuhpc.sweeps.api import retrying

    sw = retrying(lambda: _sweep(sweep_id), f"sweep {sweep_id}")

    def snapshot():
        return retrying(_snapshot, f"sweep {sw.id}")

    def _snapshot():
        from gpuhpc.sweeps.api import DriverGone

        try:                # what the driver wrote while it runs; a refresh when there is none
            sw.follow()
        except DriverGone as exc:
            _echo(f"warning: {exc.one_line()}", err=True)
        info = sw.info()
        rows = store.trial_rows(sw.id)
        raws = {t.number: t.job_id_raw for t in store.trial_records(sw.id)}
        for r in rows:
            r["job_id_raw"] = raws.get(r["trial"])
        return info, rows

    info, rows = snapshot()
    if as_json:
        counts: dict[str, int] = {}
        for r in rows:
            counts[r["state"]] = counts.get(r["state"], 0) + 1
        b = store.best(rows, info["spec"].metric.goal)
        print_json({"sweep_id": sw.id, "name": info["name"], "status": info["status"], "message": info["message"],
                    "n_trials": info["n_trials"], "counts": counts, "pruned": counts.get("pruned", 0),
                    "failed": counts.get("failed", 0), "driver_job_id": info["driver_job_id"],
                    "chunks": info["chunks"], "best": _row_out(b) if b else None})
        return 0
    if not watch:
        console().print(_status_renderable(sw, rows, info))
        return 0
    from rich.live import Live

    with Live(_status_renderable(sw, rows, info), console=console(), refresh_per_second=2) as live:
        while (not all(r["state"] in _FINISHED for r in rows) or len(rows) < info["n_trials"]) \
                and not _stopped(info, rows):
            time.sleep(interval)
            info, rows = snapshot()
            live.update(_status_renderable(sw, rows, info))
    return 0


def wait(sweep_id: str, timeout: float | None, poll: float) -> int:
    """Wait for every trial to finish: exit 0 when all completed, 1 when any failed for good."""
    from gpuhpc.sweeps.api import retrying

    sw = retrying(lambda: _sweep(sweep_id), f"sweep {sweep_id}")
    try:
        ok = sw.wait(timeout=timeout, poll=poll)
    except TimeoutError as exc:
        _echo(f"error: {exc}", err=True)
        return 124
    if not ok:
        msg = sw.info().get("message")
        _echo(f"sweep {sw.id}: {msg or 'some trials failed or were cancelled'} (gpuhpc sweep status {sw.id})",
              err=True)
    return 0 if ok else 1


def results(sweep_id: str, as_json: bool, as_csv: bool) -> int:
    """One row per trial: trial, params, state, metrics, job_id, restarts, gpu_hours."""
    import csv
    import json

    rows = [_row_out(r) for r in _sweep(sweep_id).rows()]
    if as_json:
        print_json(rows)
        return 0
    params = sorted({k for r in rows for k in r["params"]})
    metrics = sorted({k for r in rows for k in r["metrics"]})
    w = csv.writer(sys.stdout)
    w.writerow(["trial", *(f"param.{p}" for p in params), "state", *(f"metric.{m}" for m in metrics),
                "job_id", "restarts", "gpu_hours"])
    for r in rows:
        w.writerow([r["trial"], *(json.dumps(r["params"].get(p)) if not isinstance(r["params"].get(p), str)
                                  else r["params"][p] for p in params),
                    r["state"], *(r["metrics"].get(m, "") for m in metrics), r["job_id"] or "", r["restarts"],
                    r["gpu_hours"]])
    return 0


def best(sweep_id: str, as_json: bool) -> int:
    """The best finished trial (by the sweep's metric and goal)."""
    sw = _sweep(sweep_id)
    b = sw.best()
    if b is None:
        _echo(f"sweep {sw.id}: no finished trial has reported the metric yet", err=True)
        return 1
    if as_json:
        print_json(_row_out(b))
    else:
        _echo(f"trial {b['trial']}: {b['objective']!r} params {b['params']} (job {b['job_id']})")
    return 0


def resume(sweep_id: str, as_json: bool) -> int:
    """Resubmit the trials that failed, were cancelled or never started (never a finished one)."""
    sw = _sweep(sweep_id)
    numbers = sw.resume()
    if as_json:
        print_json({"sweep_id": sw.id, "resubmitted": numbers})
    else:
        _echo(f"sweep {sw.id}: {len(numbers)} trial(s) resubmitted")
    return 0


def cancel(sweep_id: str) -> int:
    """Cancel the sweep's driver and every array it submitted."""
    sw = _sweep(sweep_id)
    ids = sw.cancel()
    _echo(f"sweep {sw.id}: cancelled ({len(ids)} job(s): {' '.join(ids) or 'none active'})")
    return 0


def report(sweep_id: str, html: str) -> int:
    """An HTML page: the objective by trial, and each parameter against the objective."""
    from gpuhpc.sweeps.report import html_report

    sw = _sweep(sweep_id)
    text = html_report(sw.info(), sw.rows())
    from gpuhpc.fsutil import write_atomic

    write_atomic(html, text)
    _echo(f"wrote {html}", err=True)
    return 0


@click.group("sweep", cls=OnClusterGroup, no_args_is_help=True, short_help=help_for("sweep"),
             help="Hyper-parameter sweeps: job arrays that split to fit the cluster, run detached, resume "
                  "(docs/sweeps.md).")
def sweep() -> None:
    pass


_id = click.argument("sweep_id", metavar="ID")


@sweep.command("run", short_help="submit a sweep file; returns at once with the sweep id")
@click.argument("file", metavar="FILE")
@click.option("--json", "as_json", is_flag=True, help='print {"sweep_id": ...}')
@click.option("--after", metavar="JOB[,JOB]", help="start the sweep once these jobs ended COMPLETED (afterok)")
def _run_cmd(file: str, as_json: bool, after: str | None) -> int:
    """Submit a sweep file (YAML); returns at once with the sweep id."""
    return run(file, as_json, after)


@sweep.command("status", short_help="progress, counts per state, best so far, failed trials with log tails")
@_id
@click.option("--watch", "-w", is_flag=True, help="refresh until every trial has finished")
@click.option("--interval", type=float, default=5.0, show_default=True, help="seconds between refreshes with --watch")
@click.option("--json", "as_json", is_flag=True)
def _status_cmd(sweep_id: str, watch: bool, interval: float, as_json: bool) -> int:
    """Progress, counts per state, the best trial so far, failed trials with their log tails."""
    return status(sweep_id, watch, interval, as_json)


@sweep.command("wait", short_help="wait for every trial: exit 0 all completed, 1 some failed for good")
@_id
@click.option("--timeout", type=float, metavar="S", help="give up after S seconds (exit 124)")
@click.option("--poll", type=click.FloatRange(min=1.0), default=3.0, show_default=True,
              help="seconds between checks (at least 1: each check asks slurmctld)")
def _wait_cmd(sweep_id: str, timeout: float | None, poll: float) -> int:
    """Wait for every trial to finish: exit 0 when all completed, 1 when any failed for good."""
    return wait(sweep_id, timeout, poll)


@sweep.command("results", short_help="one row per trial: trial, params, state, metrics, job_id, restarts, gpu_hours")
@_id
@click.option("--json", "as_json", is_flag=True)
@click.option("--csv", "as_csv", is_flag=True)
def _results_cmd(sweep_id: str, as_json: bool, as_csv: bool) -> int:
    """One row per trial (--json or --csv): trial, params, state, metrics, job_id, restarts, gpu_hours."""
    if as_json == as_csv:
        raise click.UsageError("give one of --json or --csv", ctx=click.get_current_context())
    return results(sweep_id, as_json, as_csv)


@sweep.command("best", short_help="the best finished trial")
@_id
@click.option("--json", "as_json", is_flag=True)
def _best_cmd(sweep_id: str, as_json: bool) -> int:
    """The best finished trial (by the sweep's metric and goal)."""
    return best(sweep_id, as_json)


@sweep.command("resume", short_help="resubmit failed, cancelled and never-started trials (never a finished one)")
@_id
@click.option("--json", "as_json", is_flag=True)
def _resume_cmd(sweep_id: str, as_json: bool) -> int:
    """Resubmit the trials that failed, were cancelled or never started (never a finished one)."""
    return resume(sweep_id, as_json)


@sweep.command("cancel", short_help="cancel the sweep's driver and every array it submitted")
@_id
def _cancel_cmd(sweep_id: str) -> int:
    """Cancel the sweep's driver and every array it submitted."""
    return cancel(sweep_id)


@sweep.command("report", short_help="an HTML page: objective by trial, each parameter vs the objective")
@_id
@click.option("--html", required=True, metavar="FILE")
def _report_cmd(sweep_id: str, html: str) -> int:
    """An HTML page: the objective by trial, and each parameter against the objective."""
    return report(sweep_id, html)
