"""gpuhpc.should_stop with real torch.distributed (Debian's torch 1.13, gloo, CPU): two ranks
that all-reduce every step, SIGUSR2 to rank 0 only, stop after the same step, the very step of
the signal (should_stop's all-reduce of the ranks' flags; the file protocol it falls back to
without torch.distributed decides a later step). torch_stop_agree.py; no Slurm (it touches no
cluster: isolated, beside the shared-cluster stream)."""
from __future__ import annotations

import subprocess

import pytest

from jobs_helpers import HERE
from torch_compat import TORCH_PYTHON, require_torch

pytestmark = [pytest.mark.integration, pytest.mark.isolated]


def test_ranks_agree_on_the_stop_step_through_torch_all_reduce(tmp_path, monkeypatch):
    require_torch()
    monkeypatch.setenv("GPUHPC_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.delenv("GPUHPC_STOP_DIR", raising=False)
    res = subprocess.run([TORCH_PYTHON, str(HERE / "torch_stop_agree.py")], capture_output=True, text=True,
                         timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.splitlines() == ["rank 0 stopped 7 signalled 1", "rank 1 stopped 7 signalled 0"], \
        (res.stdout, res.stderr[-2000:])
