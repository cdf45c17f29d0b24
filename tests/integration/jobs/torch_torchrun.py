#!/usr/bin/python3
"""torchrun from Debian's torch (torch_compat.TORCH_PYTHON; ``python3 -m torch.distributed.run``
with torch_compat's 3.11 fix) for the torchrun template, as ``GPUHPC_TORCHRUN``: the real
launcher where fake_torchrun.py stands in for it elsewhere. Its workers run the script with this
interpreter."""
import runpy
import sys

import torch_compat

torch_compat.install()
sys.argv[0] = "torchrun"
runpy.run_module("torch.distributed.run", run_name="__main__", alter_sys=True)
