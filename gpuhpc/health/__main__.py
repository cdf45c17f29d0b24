"""``python -m gpuhpc.health``: the entry point Slurm runs.

- HealthCheckProgram: ``python -m gpuhpc.health --apply`` (full checks; drains on failure,
  resumes a node gpuhpc drained once it passes, except a hardware drain, ``gpuhpc:hw:``, which
  only an admin or a passing deep run returns, and a perf drain younger than ``perf.min_drain_s``).
  The node is ``$SLURMD_NODENAME``.
- Prolog: ``python -m gpuhpc.health --mode prolog --apply``: the fast subset; on failure the
  node is drained with gpuhpc's reason and the exit status is 1 (Slurm then requeues the job).
  An error of gpuhpc's own (slurmctld unreachable, a bad spec, a bug) exits 0: the prolog fails
  open, so only a fault a check found can keep jobs off a node.
- Epilog: ``python -m gpuhpc.health --apply`` (the full set, after the job).
- Deep checks on a schedule (a timer or cron entry on the controller, once per GPU node, not a
  daemon): ``python -m gpuhpc.health --mode deep --apply --node N --slots /var/lib/gpuhpc/deep-slots
  --cap 2``: DCGM diagnostics and nccl all-reduce bandwidth (:mod:`gpuhpc.health.deep`) as an
  exclusive Slurm job holding the node, only on a node that runs no job now (or that gpuhpc
  drained), and only while one of ``--cap`` slots (``flock`` in ``--slots``) is free: otherwise
  it exits 0 and waits for its next turn. The baseline is in the ledger database
  (``GPUHPC_DB_URL``): the controller has it, the nodes do not.
- The deep-check job itself (what the job above runs on the node; no drain, no ledger):
  ``python -m gpuhpc.health --mode deep-job --node N [--baseline GBPS] [--mig]`` prints its
  results as one line of JSON.

Options: ``--node N`` (default ``$SLURMD_NODENAME``, else the host name), ``--spec FILE``
(default ``$GPUHPC_HEALTH_SPEC``), ``--json``. Exit 0 healthy, 1 a check failed, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from gpuhpc.config import getenv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuhpc.health", description=__doc__.splitlines()[0])
    p.add_argument("--node", default=None)
    p.add_argument("--mode", choices=("prolog", "full", "deep", "deep-job"), default="full")
    p.add_argument("--baseline", type=float, default=None, help="deep-job: the node's all-reduce baseline, GB/s")
    p.add_argument("--mig", action="store_true", help="deep-job: the checks that fit a MIG node")
    p.add_argument("--slots", default=None, help="deep: directory of the lock files that cap concurrent nodes")
    p.add_argument("--cap", type=int, default=1, help="deep: at most this many nodes test at once")
    p.add_argument("--apply", action="store_true", help="drain/resume through scontrol")
    p.add_argument("--spec", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from gpuhpc.errors import GpuhpcError
    from gpuhpc.health import check_node
    from gpuhpc.health.spec import HealthSpec, load

    node = args.node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        path = args.spec or getenv("GPUHPC_HEALTH_SPEC")
        spec = HealthSpec()
        if path:
            with open(path, encoding="utf-8") as fh:
                spec = load(fh.read(), path)
        if args.mode == "deep":
            return _deep(node, spec, args, path)
        if args.mode == "deep-job":
            return _deep_job(node, spec, args)
        out = check_node(node, spec=spec, mode=args.mode, apply=args.apply)
    except Exception as exc:  # noqa: BLE001 - the prolog fails open, whatever went wrong
        msg = exc.one_line() if isinstance(exc, GpuhpcError) else f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"gpuhpc health: error: {msg}\n")
        if args.mode == "prolog":
            # a prolog that fails makes Slurm drain the node and requeue the job: only a check
            # that *found* a fault may do that, never gpuhpc's own trouble (a slow slurmctld, a bug)
            return 0
        return getattr(exc, "exit_code", 1)
    _print(node, out, args.json)
    return 0 if out.report.healthy else 1


def _deep_job(node: str, spec, args) -> int:
    """The checks inside the deep-check job: measure, print the JSON line, exit 0 (the verdict
    is in the JSON; gpuhpc decides where it collects it)."""
    from gpuhpc.health.deep import job_result, run_deep_checks
    from gpuhpc.transport.local import LocalRunner

    report, measured = run_deep_checks(node, LocalRunner(), spec, baseline=args.baseline, mig=args.mig)
    sys.stdout.write(job_result(node, os.environ.get("SLURM_JOB_ID", ""), report, measured) + "\n")
    return 0


def _deep(node: str, spec, args, spec_path: str | None = None) -> int:
    """The scheduled deep run: a free slot, an idle node, then the checks."""
    from gpuhpc.health import check_node
    from gpuhpc.health.deep import Baselines, Slot, node_busy
    from gpuhpc.ledger.hooks import ledger_in_use

    slot = Slot(args.slots, max(1, args.cap)) if args.slots else None
    try:
        got = slot is None or slot.acquire()
    except PermissionError as exc:      # a slot directory a user made or can write
        sys.stderr.write(f"gpuhpc health: {node}: {exc}\n")
        return 1
    if not got:
        sys.stderr.write(f"gpuhpc health: {node}: all {args.cap} deep-check slots busy; next time\n")
        return 0
    try:
        busy = node_busy(node)
        if busy:
            sys.stderr.write(f"gpuhpc health: {node}: {busy}: deep checks skipped\n")
            return 0
        url = ledger_in_use()
        out = check_node(node, spec=spec, mode="deep", apply=args.apply,
                         baselines=Baselines(url) if url else None, spec_path=spec_path)
    finally:
        if slot is not None:
            slot.release()
    _print(node, out, args.json)
    return 0 if out.report.healthy else 1


def _print(node: str, out, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(out.to_dict()) + "\n")
        return
    for r in out.report.results:
        sys.stdout.write(f"{node} {r.status.value:4} {r.check}: {r.message}\n")
    if out.decision:
        sys.stdout.write(f"{node} {out.decision.action.value}{' (done)' if out.applied else ''}: "
                         f"{out.decision.reason or out.decision.why}\n")


if __name__ == "__main__":
    sys.exit(main())
