"""``profile: torch`` with real torch.profiler (Debian's torch 1.13 on CPU, torch_compat), beside
tests/unit/jobs/test_profile.py's run on the torch stand-in: each of two ranks records only the
step window and writes its own Chrome trace. (Debian's build has no kineto: its trace is the
legacy profiler's, a JSON list of events rather than {"traceEvents": [...]}; both are read.)
No Slurm (isolated, beside the shared-cluster stream)."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from gpuhpc.jobs import profile
from torch_compat import CHECKOUT, TORCH_PYTHON, require_torch

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

LOOP = """
from gpuhpc.jobs import profile
import torch
for i in range({steps}):
    profile.step(i)
    with torch.profiler.record_function(f"step {{i}}"):
        torch.ones(8).sum()
"""


@pytest.mark.parametrize("steps, recorded", [(6, [1, 2, 3]),     # the whole window 1-4: steps 1..3
                                             (3, [1, 2])])       # a program that ends inside it: at exit
def test_real_torch_profiler_writes_one_trace_per_rank_of_the_step_window(tmp_path, steps, recorded):
    require_torch()
    procs = []
    for rank in range(2):
        env = dict(os.environ, SLURM_JOB_ID="55", RANK=str(rank), PYTHONPATH=str(CHECKOUT))
        env.pop("SLURM_RESTART_COUNT", None)
        procs.append(subprocess.Popen([TORCH_PYTHON, "-m", "gpuhpc.jobs.profile", "--tool", "torch", "--steps", "1-4",
                                       "--dir", str(tmp_path), "--", TORCH_PYTHON, "-c", LOOP.format(steps=steps)],
                                      env=env, stderr=subprocess.PIPE, text=True))
    assert [(p.wait(timeout=120), p.stderr.read()) for p in procs] == [(0, ""), (0, "")]
    got = [p.name for p in profile.traces(str(tmp_path), "55")]
    assert got == ["55-r0-rank0.pt.trace.json", "55-r0-rank1.pt.trace.json"]
    for name in got:
        trace = json.loads((tmp_path / name).read_text())
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
        assert [e["name"] for e in events if e.get("name", "").startswith("step ")] == [f"step {i}" for i in recorded]
