#!/usr/bin/env python3
"""dataloader_train.py with real torch (run by torch_compat.TORCH_PYTHON): a training loop over a
``torch.utils.data.DataLoader(num_workers=2)``. Its workers are started with "spawn" (as on macOS,
or where CUDA rules out fork): they inherit no Python signal handler, so a SIGUSR2 sent to the
program's process group kills them (torch then raises "DataLoader worker ... is killed by signal").
At the warning (SIGUSR2 to the leader, or the job script's stop request) the program takes one
more batch from each worker while it saves (a save that reads loader state), saves its step
(torch.save, save_atomic), shuts its loader down and exits; it resumes from
$GPUHPC_LATEST_CHECKPOINT. Progress lines: "start <restart> <step>", "saved <step> <workers that
answered>", "worker died <error>", "done"."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

import torch_compat


class Batches(Dataset):
    """Item i: (i, the id of the worker that loaded it)."""

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int):
        return torch.tensor([i, get_worker_info().id])


def main() -> int:
    torch_compat.add_checkout_to_path()
    from gpuhpc.jobs import checkpoint as ckpt

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
        step = int(torch.load(latest)["step"])
    progress = open(args.progress, "a", buffering=1)
    progress.write(f"start {ckpt.restart_count()} {step}\n")
    step_s = args.step_seconds if ckpt.restart_count() < args.slow_runs else 0.0
    loader = DataLoader(Batches(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    batches = iter(loader)

    try:
        rc = train(args, ckpt, progress, batches, step, step_s)
        del batches                      # the loader's shutdown (its iterator's): its workers end
        return rc
    except RuntimeError as exc:   # "DataLoader worker (pid N) is killed by signal: ...", raised where
        progress.write(f"worker died {str(exc).splitlines()[0]}\n")      # torch's SIGCHLD handler ran
        return 1


def take(batches, n: int) -> set[int]:
    """``n`` batches: the ids of the workers that loaded them."""
    return {int(next(batches)[0][1]) for _ in range(n)}


def train(args, ckpt, progress, batches, step: int, step_s: float) -> int:
    while step < args.steps:
        take(batches, 1)
        step += 1
        time.sleep(step_s)
        if ckpt.stop_requested():
            time.sleep(1.0)              # the save takes a while; the loader's workers must live through it
            workers = take(batches, 2)   # the loader hands out batches from its workers in turn
            local = os.path.join(ckpt.scratch_dir(), f"step-{step:06d}.pt")
            torch.save({"step": step}, local)
            ckpt.save_atomic(local)
            progress.write(f"saved {step} {len(workers)}\n")
            return 0
    with open(args.result, "w") as fh:
        json.dump({"step": step}, fh)
    progress.write("done\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
