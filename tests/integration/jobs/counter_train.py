#!/usr/bin/env python3
"""Deterministic stand-in for a training job (no torch): counts to --steps, evolving a
value with a fixed recurrence; checkpoints every --every steps (and on SIGUSR2/SIGTERM)
through gpuhpc.jobs.checkpoint.save_atomic, via $GPUHPC_SCRATCH; resumes from
$GPUHPC_LATEST_CHECKPOINT. Appends "start <restart> <resume step>" and "step <n>" lines
to --progress so tests can count recomputed steps. Writes --result at the end."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from gpuhpc.jobs import checkpoint as ckpt
from jobs_counter_lib import advance, uninterrupted  # noqa: F401  (same recurrence as the Python-API test)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, required=True)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--slow-runs", type=int, default=0,
                    help="only runs with a restart count below this wait --step-seconds per step (0: every run); "
                         "the run after a test's last interruption then ends at once")
    ap.add_argument("--progress", required=True)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()

    ckpt.install_signal_handler(signal.SIGUSR2, signal.SIGTERM)
    state = {"step": 0, "value": 1}
    latest = ckpt.latest_checkpoint()
    if latest is not None:
        with open(latest) as fh:
            state = json.load(fh)
    progress = open(args.progress, "a", buffering=1)
    progress.write(f"start {ckpt.restart_count()} {state['step']} {os.environ.get('GPUHPC_RUN_ID', '-')}\n")
    step_seconds = args.step_seconds if not args.slow_runs or ckpt.restart_count() < args.slow_runs else 0.0

    def save() -> None:
        local = os.path.join(ckpt.scratch_dir(), f"step-{state['step']:06d}.json")
        with open(local, "w") as fh:
            json.dump(state, fh)
        ckpt.save_atomic(local)

    while state["step"] < args.steps:
        time.sleep(step_seconds)
        n = state["step"] + 1
        state = {"step": n, "value": advance(n, state["value"])}
        progress.write(f"step {n}\n")
        if n % args.every == 0:
            save()
        if ckpt.stop_requested():
            save()
            progress.write(f"signal {n}\n")
            return 0
    with open(args.result + ".tmp", "w") as fh:
        json.dump(state, fh)
    os.replace(args.result + ".tmp", args.result)
    progress.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
