"""gpuhpc.hostlist means what Slurm means: every expression of the unit tables, and the
compressions gpuhpc writes, expanded by ``scontrol show hostnames`` on the local cluster;
Slurm's own ``scontrol show hostlist`` read back by :func:`gpuhpc.hostlist.expand`.

Needs only the Slurm client tools and a reachable slurm.conf (nothing is submitted)."""
from __future__ import annotations

import subprocess

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import compress, expand
from hostlist_cases import COMPRESS, EXPAND, INVALID

pytestmark = [pytest.mark.integration, pytest.mark.isolated]   # scontrol show hostnames/hostlist: parsing only, no RPC

EXTRA = ["n[1-3,5,7-9]", "x[001-003,010]", "a[1-2]b[3-4]", "gpu-node[1-2],mig-node1,cpu-node1",
         "n[10-12],n[1-2]", "rack[1-2]-n[01-02],login", "n[1-2]-[3-4]"]


def _scontrol(*args: str) -> str:
    proc = subprocess.run(["scontrol", "show", *args], capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout


def _hostnames(expr: str) -> list[str]:
    return _scontrol("hostnames", expr).split()


@pytest.mark.parametrize("expr", [e for e, _ in EXPAND if e] + EXTRA)
def test_expand_matches_scontrol_hostnames(expr):
    assert expand(expr) == _hostnames(expr)


@pytest.mark.parametrize("expr", INVALID)
def test_invalid_for_both(expr):
    with pytest.raises(UserInputError):
        expand(expr)
    proc = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True, timeout=30)
    assert not proc.stdout.strip() and "Invalid hostlist" in proc.stderr


# scontrol reads a hostlist starting with "/" as a file name: the gres File= case stays unit-tested
@pytest.mark.parametrize("names", [n for n, _ in COMPRESS if not n[0].startswith("/")] + [expand(e) for e in EXTRA])
def test_compress_is_what_slurm_expands(names):
    ours = compress(names)
    # Slurm reads our compression back to the same names (its own is worded differently:
    # it brackets only the last number, `rack1-n[1-2],rack2-n[1-2]`, and does not sort)
    assert sorted(_hostnames(ours)) == sorted(set(names))
    theirs = _scontrol("hostlist", ",".join(names)).strip()
    assert sorted(set(expand(theirs))) == sorted(set(names))
