#!/usr/bin/env python3
"""A stand-in for torchrun (no torch on the test cluster), selected with GPUHPC_TORCHRUN.

Parses the launcher line the torchrun template writes, proves the rendezvous endpoint
works (node 0 listens on MASTER_ADDR:MASTER_PORT, the other nodes connect to it), then
starts --nproc_per_node workers with the environment torchrun's static rendezvous gives:
RANK = node_rank * nproc + local_rank, WORLD_SIZE = nnodes * nproc, LOCAL_RANK, ..."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--nproc_per_node", type=int, required=True)
    ap.add_argument("--node_rank", type=int, required=True)
    ap.add_argument("--rdzv_id", required=True)
    ap.add_argument("--rdzv_backend", required=True, choices=["static"])
    ap.add_argument("--rdzv_endpoint", required=True)
    ap.add_argument("--max_restarts", type=int, default=0)
    ap.add_argument("--no-python", "--no_python", dest="no_python", action="store_true")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    addr, port = a.rdzv_endpoint.rsplit(":", 1)
    port = int(port)
    if a.node_rank == 0:
        srv = socket.create_server((addr, port))
        srv.settimeout(60)
        for _ in range(a.nnodes - 1):
            conn, _peer = srv.accept()
            conn.close()
        srv.close()
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((addr, port), timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    procs = []
    for local in range(a.nproc_per_node):
        env = dict(os.environ, RANK=str(a.node_rank * a.nproc_per_node + local), LOCAL_RANK=str(local),
                   WORLD_SIZE=str(a.nnodes * a.nproc_per_node), LOCAL_WORLD_SIZE=str(a.nproc_per_node),
                   GROUP_RANK=str(a.node_rank), MASTER_ADDR=addr, MASTER_PORT=str(port),
                   TORCHELASTIC_RUN_ID=a.rdzv_id)
        argv = [a.script, *a.args] if a.no_python else [sys.executable, a.script, *a.args]
        procs.append(subprocess.Popen(argv, env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
