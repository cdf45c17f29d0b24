#!/usr/bin/env python3
"""A sample "training" job that follows gpuhpc's checkpoint contract (no torch needed).

Contract (see docs/jobs.md):
- on SIGUSR2 (preemption or the time limit is near): write a checkpoint to
  $GPUHPC_CHECKPOINT_DIR and exit; gpuhpc requeues the job;
- on restart $GPUHPC_RESTART_COUNT is > 0 and $GPUHPC_LATEST_CHECKPOINT names the newest
  checkpoint, from which we resume.

Usage: python3 examples/train.py --steps 100 --ckpt-every 10 --step-seconds 0.1
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import time

stop = False


def _on_usr2(signum, frame):  # noqa: ARG001
    global stop
    stop = True


def save(ckpt_dir: str, state: dict) -> str:
    """Atomic: write a temp file in the target dir, fsync, then rename over the name."""
    os.makedirs(ckpt_dir, exist_ok=True)
    final = os.path.join(ckpt_dir, f"step-{state['step']:08d}.json")
    fd, tmp = tempfile.mkstemp(dir=ckpt_dir, prefix=".tmp-")
    with os.fdopen(fd, "w") as fh:
        json.dump(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return final


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    args = ap.parse_args()

    signal.signal(signal.SIGUSR2, _on_usr2)
    ckpt_dir = os.environ.get("GPUHPC_CHECKPOINT_DIR", os.path.join(os.getcwd(), "checkpoints"))
    latest = os.environ.get("GPUHPC_LATEST_CHECKPOINT", "")
    state = {"step": 0, "loss": 1.0}
    if latest and os.path.exists(latest):
        with open(latest) as fh:
            state = json.load(fh)
    print(f"host={socket.gethostname()} job={os.environ.get('SLURM_JOB_ID')} "
          f"restart={os.environ.get('GPUHPC_RESTART_COUNT', '0')} "
          f"gpus={os.environ.get('CUDA_VISIBLE_DEVICES', '')} resume_step={state['step']}", flush=True)

    while state["step"] < args.steps:
        time.sleep(args.step_seconds)           # the "forward/backward pass"
        state["step"] += 1
        state["loss"] = round(state["loss"] * 0.97, 10)
        if state["step"] % args.ckpt_every == 0:
            save(ckpt_dir, state)
        if stop:
            path = save(ckpt_dir, state)
            print(f"SIGUSR2: checkpointed step {state['step']} to {path}; exiting for requeue", flush=True)
            return 0
    save(ckpt_dir, state)
    print(f"done step={state['step']} loss={state['loss']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
