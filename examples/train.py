#!/usr/bin/env python3
"""A multi-rank "training" job that follows gpuhpc's checkpoint contract (torch optional).

Each rank keeps its own state; every step the ranks all-reduce (sum) one number each and
update their state with the total, so a rank that resumed from a different step than its
peers gives a different result. The all-reduce uses torch.distributed when torch is installed
(gloo, or NCCL on GPUs), else a small TCP all-reduce through rank 0 at MASTER_ADDR:MASTER_PORT.

The contract (docs/jobs.md):
- ``gpuhpc.should_stop(step)`` is called on every rank after every step; it turns True on
  all ranks at the same step once SIGUSR2 (preemption, time limit) reached any of them;
- every ``--ckpt-every`` steps, and at that stop step, every rank saves its shard with
  ``gpuhpc.save_shard``; rank 0 commits the checkpoint (manifest, then ``latest``);
- on restart every rank loads its own shard of the newest complete checkpoint.

Usage:
  gpuhpc submit --template torchrun --nodes 2 --gpus 4 -- python -u examples/train.py --steps 2000
  gpuhpc submit --gpus 1 -- python3 examples/train.py --steps 300 --ckpt-every 20 --step-seconds 0.1
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

import gpuhpc
from gpuhpc.jobs import checkpoint as ckpt
from gpuhpc.jobs import coord

M = 1 << 61


def advance(step: int, value: int) -> int:
    return (value * 6364136223846793005 + 1442695040888963407 + step) % M


def reference(world: int, steps: int) -> dict:
    """What an uninterrupted run of ``world`` ranks ends with."""
    local = [r + 1 for r in range(world)]
    for n in range(1, steps + 1):
        total = sum(local) % M
        local = [advance(n, (v + total) % M) for v in local]
    return {"step": steps, "world_size": world, "checksum": sum(local) % M}


class TcpAllReduce:
    """Sum of one integer per rank, through rank 0 (a star: fine for a stand-in)."""

    def __init__(self, rank: int, world: int, addr: str, port: int) -> None:
        self.rank, self.world = rank, world
        self.peers: dict[int, tuple[socket.socket, object]] = {}
        if world == 1:
            return
        if rank == 0:
            srv = socket.create_server(("", port), backlog=world)
            srv.settimeout(120)
            for _ in range(world - 1):
                conn, _ = srv.accept()
                fh = conn.makefile("rw")
                self.peers[int(fh.readline())] = (conn, fh)
            srv.close()
        else:
            deadline = time.monotonic() + 120
            while True:
                try:
                    conn = socket.create_connection((addr, port), timeout=120)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            fh = conn.makefile("rw")
            fh.write(f"{rank}\n")
            fh.flush()
            self.peers[0] = (conn, fh)

    def __call__(self, step: int, value: int) -> int:
        if self.world == 1:
            return value % M
        if self.rank != 0:
            fh = self.peers[0][1]
            fh.write(f"{step} {value}\n")
            fh.flush()
            line = fh.readline()
            if not line:
                raise ConnectionError("rank 0 is gone")
            return int(line)
        total = value
        for r in range(1, self.world):
            line = self.peers[r][1].readline()
            if not line:
                raise ConnectionError(f"rank {r} is gone")
            their_step, v = map(int, line.split())
            if their_step != step:
                raise RuntimeError(f"rank {r} is at step {their_step}, rank 0 at {step}")
            total += v
        total %= M
        for r in range(1, self.world):
            self.peers[r][1].write(f"{total}\n")
            self.peers[r][1].flush()
        return total


class TorchAllReduce:
    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group(backend, timeout=coord.collective_timeout())   # the run's (600 s); the stop handshake has its own
        self.device = torch.device("cuda") if backend == "nccl" else torch.device("cpu")

    def __call__(self, step: int, value: int) -> int:  # noqa: ARG002
        # an exact sum of 61-bit values: two 31-bit halves, each summed in int64
        t = self.torch.tensor([value >> 31, value & ((1 << 31) - 1)], dtype=self.torch.int64, device=self.device)
        self.dist.all_reduce(t)
        return ((int(t[0]) << 31) + int(t[1])) % M


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--backend", choices=["auto", "torch", "tcp"], default="auto")
    ap.add_argument("--progress", help="append per-rank progress lines to PROGRESS.<rank>")
    ap.add_argument("--result", help="rank 0 writes the final result (JSON) here")
    ap.add_argument("--fail-rank", type=int, default=-1, help="(tests) this rank dies in the save of --fail-at")
    ap.add_argument("--fail-at", type=int, default=-1)
    ap.add_argument("--stop-save-seconds", type=float, default=0, help="(tests) a slow save when stopping")
    ap.add_argument("--slow-runs", type=int, default=0,
                    help="(tests) only runs restarted fewer times than this wait --step-seconds (0: every run)")
    args = ap.parse_args()

    coord.coordinator().install()                   # SIGUSR2/SIGTERM -> a stop request
    rank, world = coord.rank(), coord.world_size()
    state = {"step": 0, "local": rank + 1}
    latest = ckpt.latest_checkpoint()
    if latest is not None:
        with open(ckpt.shard_path(latest, rank)) as fh:
            state = json.load(fh)
    progress = open(f"{args.progress}.{rank}", "a", buffering=1) if args.progress else None

    def note(text: str) -> None:
        if progress:
            progress.write(text + "\n")

    note(f"start {ckpt.restart_count()} {state['step']}")
    print(f"rank {rank}/{world} host={socket.gethostname()} job={os.environ.get('SLURM_JOB_ID')} "
          f"restart={ckpt.restart_count()} gpus={os.environ.get('CUDA_VISIBLE_DEVICES', '')} "
          f"resume_step={state['step']}", flush=True)
    use_torch = args.backend == "torch" or (args.backend == "auto" and world > 1 and _has_torch())
    allreduce = TorchAllReduce() if use_torch else TcpAllReduce(
        rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "29500")))

    def save(stopping: bool = False) -> None:
        n = state["step"]
        if rank == args.fail_rank and n == args.fail_at:
            os.kill(os.getpid(), signal.SIGKILL)    # killed in the middle of a save
        if stopping and args.stop_save_seconds:
            note(f"slow-save {n} {time.time():.3f}")
            time.sleep(args.stop_save_seconds)      # a big model takes a while to write
        ckpt.save_shard(json.dumps(state).encode(), n)
        note(f"saved {n} {time.time():.3f}")

    step_seconds = args.step_seconds if not args.slow_runs or ckpt.restart_count() < args.slow_runs else 0.0
    while state["step"] < args.steps:
        time.sleep(step_seconds)                    # the "forward/backward pass"
        n = state["step"] + 1
        total = allreduce(n, state["local"])
        state = {"step": n, "local": advance(n, (state["local"] + total) % M)}
        note(f"step {n}")
        stop = gpuhpc.should_stop(n)                # the same answer on every rank
        if n % args.ckpt_every == 0 or stop:
            save(stopping=stop)
        if stop:
            note(f"stop {n}")
            print(f"rank {rank}: stopping after step {n} (a stop was requested); checkpoint saved", flush=True)
            return 0
    if state["step"] % args.ckpt_every:
        save()
    checksum = allreduce(state["step"] + 1, state["local"])
    if rank == 0 and args.result:
        with open(args.result + ".tmp", "w") as fh:
            json.dump({"step": state["step"], "world_size": world, "checksum": checksum}, fh)
        os.replace(args.result + ".tmp", args.result)
    note("done")
    print(f"rank {rank}: done step={state['step']} checksum={checksum}", flush=True)
    return 0


def _has_torch() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


if __name__ == "__main__":
    sys.exit(main())
