#!/usr/bin/env python3
"""A stand-in for training: a deterministic "loss" from its arguments, reported with
gpuhpc.report (the sweep reads it back). Checkpoints every step into $GPUHPC_CHECKPOINT_DIR, the
trial's own directory, so a preempted trial resumes where it stopped."""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import time

import gpuhpc
from gpuhpc.jobs import checkpoint as ckpt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", type=int, default=0)
    ap.add_argument("--y", default="a")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--opt", default="adam")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    print(f"params: {json.loads(os.environ.get('GPUHPC_PARAMS_JSON', '{}'))}", flush=True)

    ckpt.install_signal_handler(signal.SIGUSR2, signal.SIGTERM)
    step = 0
    latest = ckpt.latest_checkpoint()
    if latest is not None:
        step = int(latest.read_text())
    loss = 0.0
    while step < args.steps:
        time.sleep(0.1)
        step += 1
        loss = ((args.x - 3) ** 2 + (0 if args.y == "b" else 1)
                + abs(math.log10(args.lr) + 3) + abs(args.layers - 6) / 10 + (0.5 if args.opt != "adam" else 0))
        gpuhpc.report(step=step, loss=loss)
        ckpt.save_atomic(str(step).encode(), f"step-{step}")
        if ckpt.stop_requested():
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
