#!/usr/bin/env python3
"""gpuhpc.should_stop on its torch.distributed path with real torch (torch_compat.TORCH_PYTHON):
two rank processes (gloo on 127.0.0.1, CPU, RANK/WORLD_SIZE as torchrun sets them) train in step
(an all-reduce every step, as a data-parallel loop has); rank 0 alone gets SIGUSR2 after step
``SIGNAL_AT``. should_stop's all-reduce of the ranks' flags must make both stop after the same
step. Prints one line per rank: "rank <r> stopped <step> signalled <0|1>"."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import sys

import torch_compat

WORLD, SIGNAL_AT, STEPS = 2, 7, 200


def rank_main(rank: int, port: int, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), GLOO_SOCKET_IFNAME="lo")
    torch_compat.add_checkout_to_path()
    import torch
    import torch.distributed as dist

    import gpuhpc

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    grad = torch.ones(4)
    signalled = 0
    for step in range(1, STEPS + 1):
        dist.all_reduce(grad)                        # the step's collective
        if rank == 0 and step == SIGNAL_AT:
            os.kill(os.getpid(), signal.SIGUSR2)     # the warning, on one rank only
            signalled = 1
        if gpuhpc.should_stop(step):
            break
    out.put(f"rank {rank} stopped {step} signalled {signalled}")
    dist.destroy_process_group()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, port, out)) for r in range(WORLD)]
    for p in procs:
        p.start()
    lines = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join()
    print("\n".join(lines))
    return max(p.exitcode for p in procs)


if __name__ == "__main__":
    sys.exit(main())
