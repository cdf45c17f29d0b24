#!/usr/bin/env python3
"""A training loop with data-loading worker processes, as torch's DataLoader(num_workers=2)
has them (torch is not installed here): two workers forked by the program with multiprocessing,
in its process group, with no SIGUSR2 handler of their own (default action: die). Each step
takes a batch from each worker. At the warning (SIGUSR2, or the job script's stop request) the
program takes one more batch from every worker while it saves, as a save that reads loader state
does (a dead worker fails it, as a DataLoader raises "worker killed by signal"), then saves its
step with save_atomic, stops its workers (as a DataLoader shuts its workers down) and exits; it
resumes from $GPUHPC_LATEST_CHECKPOINT. The workers also end when the program does (as a
DataLoader's watch their parent): a parent killed at the deadline leaves none behind. Progress
lines: "start <restart> <step>", "saved <step> <live workers>", "worker died <index>", "done"."""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time

from gpuhpc.jobs import checkpoint as ckpt


def worker(conn, index: int, parent: int) -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)        # no handler of its own: SIGUSR2 kills it
    # the leader's SIGTERM handler (inherited through fork) only sets a flag: a worker must die
    # of SIGTERM, as multiprocessing's exit (terminate(), then join) expects
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    n = 0
    while True:
        while not conn.poll(0.5):        # a DataLoader worker's watchdog: end with the parent
            if os.getppid() != parent:
                return
        if conn.recv() == "stop":
            return
        n += 1
        conn.send((index, os.getpid(), n))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--slow-runs", type=int, default=1)
    ap.add_argument("--progress", required=True)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    ckpt.install_signal_handler(signal.SIGUSR2, signal.SIGTERM)
    step = 0
    latest = ckpt.latest_checkpoint()
    if latest is not None:
        step = json.loads(latest.read_text())["step"]
    progress = open(args.progress, "a", buffering=1)
    progress.write(f"start {ckpt.restart_count()} {step}\n")
    step_s = args.step_seconds if ckpt.restart_count() < args.slow_runs else 0.0
    ctx = mp.get_context("fork")
    pipes = []
    for i in range(2):
        parent, child = ctx.Pipe()
        ctx.Process(target=worker, args=(child, i, os.getpid()), daemon=True).start()
        pipes.append(parent)

    def stop_workers() -> None:
        for p in pipes:
            p.send("stop")

    def batches() -> list:
        out = []
        for i, p in enumerate(pipes):
            try:
                p.send("batch")
                out.append(p.recv())
            except (EOFError, OSError):
                progress.write(f"worker died {i}\n")
                raise SystemExit(1)
        return out

    while step < args.steps:
        batches()
        step += 1
        time.sleep(step_s)
        if ckpt.stop_requested():
            time.sleep(1.0)              # the save takes a while; the loader's workers must live through it
            live = batches()
            local = os.path.join(ckpt.scratch_dir(), f"step-{step:06d}.json")
            with open(local, "w") as fh:
                json.dump({"step": step}, fh)
            ckpt.save_atomic(local)
            progress.write(f"saved {step} {len(live)}\n")
            stop_workers()
            return 0
    stop_workers()
    with open(args.result, "w") as fh:
        json.dump({"step": step}, fh)
    progress.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
