"""Writes (and prints) the distributed environment of this worker: print_dist_env.py OUTDIR [args]."""
import json
import os
import socket
import sys

keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "GROUP_RANK", "SLURM_NODEID", "SLURMD_NODENAME", "GPUHPC_SCRATCH", "CUDA_VISIBLE_DEVICES"]
env = {k: os.environ.get(k) for k in keys}
env["hostname"] = socket.gethostname()
env["argv"] = sys.argv[2:]
out = sys.argv[1]                      # a directory: one file per rank (stdout lines may interleave)
with open(os.path.join(out, f"rank-{env['RANK']}.json"), "w") as fh:
    json.dump(env, fh)
print("DIST_ENV " + json.dumps(env), flush=True)
