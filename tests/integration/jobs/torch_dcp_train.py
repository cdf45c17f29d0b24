#!/usr/bin/env python3
"""Real torch DCP saves (torch_compat.TORCH_PYTHON: torch 1.13's torch.distributed._shard.checkpoint,
or torch.distributed.checkpoint on 2.x) by two ranks over gloo, one cut off at the deadline.

Run 0: two rank processes (gloo on 127.0.0.1, CPU) save checkpoint ``step-10`` with DCP into
gpuhpc's checkpoint directory: a tensor both ranks hold and a ShardedTensor split between them (so each rank
writes its own ``__<rank>_<n>.distcp``); the coordinator writes ``.metadata`` last. At the warning
(the job script's stop request) they save ``step-20`` the same way, but the deadline comes while
the coordinator finishes: every rank has written its ``.distcp`` file, ``.metadata`` never is
(the writer's ``finish`` raises instead, as a kill at that moment would leave it). With
``--stale`` the cut-off save goes over ``step-10`` itself instead, after it was complete (its
``.distcp`` files newer than its ``.metadata``), and a complete ``step-05`` is saved first.
Run 1 (requeued): loads ``$GPUHPC_LATEST_CHECKPOINT`` with DCP in one process (world size 1, not
the 2 that saved it) and checks every tensor. Progress lines: "start <restart> <latest>",
"saved <dir>", "cut <dir> <files>", "loaded <dir> <step> ok" or "loaded <dir> <step> wrong"."""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import time

import torch_compat

WORLD = 2


def state(step: int) -> dict:
    """The whole state as plain tensors (what a load on any world size asks for)."""
    import torch

    return {"model.weight": torch.arange(16, dtype=torch.float32) + step,
            "model.sharded": torch.arange(64, dtype=torch.float32) * 100 + step}


def rank_state(step: int, rank: int) -> dict:
    """This rank's view: ``model.weight`` replicated (the coordinator writes it), ``model.sharded``
    a ShardedTensor split in two along dim 0 (each rank writes its own half)."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    full = state(step)
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(WORLD)])
    st = sharded_tensor.zeros(spec, 64)
    for shard in st.local_shards():
        start, n = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
        shard.tensor.copy_(full["model.sharded"][start:start + n])
    return {"model.weight": full["model.weight"], "model.sharded": st}


def rank_main(rank: int, port: int, path: str, step: int, cut: bool) -> None:
    import torch.distributed as dist

    dcp = torch_compat.dcp()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    own = rank_state(step, rank)

    class CutOff(dcp.FileSystemWriter):
        def finish(self, metadata, results):          # the coordinator's last step: .metadata
            raise RuntimeError("deadline: killed before .metadata was written")

    writer = (CutOff if cut else dcp.FileSystemWriter)(path)
    try:
        dcp.save_state_dict(own, writer)
    except dcp.CheckpointException:                    # on every rank (a BaseException in 1.13)
        if not cut:
            raise
    dist.barrier()
    dist.destroy_process_group()


def save(path: str, step: int, cut: bool) -> None:
    os.makedirs(path, exist_ok=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")       # the ranks are on this host
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, port, path, step, cut)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise SystemExit(f"a rank failed saving {path}: {[p.exitcode for p in procs]}")


def main() -> int:
    torch_compat.add_checkout_to_path()
    from gpuhpc.jobs import checkpoint as ck

    progress = open(sys.argv[1], "a", buffering=1)
    stale = "--stale" in sys.argv[2:]
    ck.install_signal_handler()
    latest = os.environ.get("GPUHPC_LATEST_CHECKPOINT", "")
    progress.write(f"start {ck.restart_count()} {latest}\n")
    base = ck.checkpoint_dir()
    if ck.restart_count() == 0:
        if stale:
            save(str(base / "step-05"), 5, cut=False)
            progress.write(f"saved {base / 'step-05'}\n")
            time.sleep(1.1)                   # step-10 newer (mtime) than step-05
        save(str(base / "step-10"), 10, cut=False)
        progress.write(f"saved {base / 'step-10'}\n")
        while not ck.stop_requested():
            time.sleep(0.1)
        target = base / ("step-10" if stale else "step-20")
        time.sleep(1.1)                       # the cut-off save's files: newer than step-10's .metadata
        save(str(target), 20, cut=True)
        progress.write(f"cut {target} {' '.join(sorted(os.listdir(target)))}\n")
        return 0
    import torch

    dcp = torch_compat.dcp()
    step = int(os.path.basename(latest).split("-")[1])
    want = state(step)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load_state_dict(got, dcp.FileSystemReader(latest), no_dist=True)
    ok = all(torch.equal(got[k], want[k]) for k in want)
    progress.write(f"loaded {latest} {step} {'ok' if ok else 'wrong'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
