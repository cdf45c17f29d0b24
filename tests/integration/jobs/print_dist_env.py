"""Prints one JSON line with the distributed environment of this worker."""
import json
import os
import socket
import sys

keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "GROUP_RANK", "SLURM_NODEID", "SLURMD_NODENAME", "GPUHPC_SCRATCH"]
env = {k: os.environ.get(k) for k in keys}
env["hostname"] = socket.gethostname()
env["argv"] = sys.argv[1:]
print("DIST_ENV " + json.dumps(env), flush=True)
