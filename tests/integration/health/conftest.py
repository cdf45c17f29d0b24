"""What the health gate's integration tests share: stand-in ``dcgmi`` / ``all_reduce_perf`` that
print the recorded outputs (``standins``), and a watcher of Slurm's own full health runs on a
node (``full_runs``), so a test that waits for a run which changes nothing visible ends when
such a run has ended, not after a fixed time."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from polling import wait_for

FIX = Path(__file__).resolve().parents[2] / "unit" / "health" / "fixtures"
STANDIN = """#!/bin/sh
# test stand-in: prints the recorded output the test put next to it, exits with its code
d=$(dirname "$0")
cat "$d/{name}.out"
exit "$(cat "$d/{name}.rc" 2>/dev/null || echo 0)"
"""


@pytest.fixture
def standins(tmp_path):
    """``(use, env)``: ``use(dcgm_fixture, nccl_fixture, dcgm_rc=0)`` sets what the stand-ins
    print; ``env`` has them first on PATH (the deep-check jobs inherit it), a fresh ledger database
    (the deep checks' baselines) and a results directory of the test's own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("dcgmi", "all_reduce_perf"):
        p = bin_dir / name
        p.write_text(STANDIN.format(name=name))
        p.chmod(0o755)

    def use(dcgm: str, nccl: str, dcgm_rc: int = 0) -> None:
        shutil.copy(FIX / dcgm, bin_dir / "dcgmi.out")
        (bin_dir / "dcgmi.rc").write_text(f"{dcgm_rc}\n")
        shutil.copy(FIX / nccl, bin_dir / "all_reduce_perf.out")

    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUHPC_DATA_DIR": str(tmp_path / "data"),
           # where the deep-check jobs write their results (the job and gpuhpc share it)
           "GPUHPC_DEEP_RESULTS": str(tmp_path / "deep-results")}
    env.pop("GPUHPC_DB_URL", None)
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "db", "upgrade"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return use, env


def boot_s() -> float:
    """Seconds since boot: the clock of /proc/PID/stat's start time."""
    with open("/proc/uptime") as fh:
        return float(fh.read().split()[0])


class FullRuns(threading.Thread):
    """Watches /proc for gpuhpc's full health runs on ``node`` started by Slurm (HealthCheckProgram,
    and the Epilog of a job there: ``python -m gpuhpc.health --apply`` with SLURMD_NODENAME=node)."""

    def __init__(self, node: str) -> None:
        super().__init__(daemon=True)
        self.node = node
        self.done = threading.Event()
        self.running: dict[int, float] = {}        # pid -> start (s since boot)
        self.ended: list[float] = []               # the starts of the runs that ended
        self._tick = os.sysconf("SC_CLK_TCK")

    def _full_runs(self) -> dict[int, float]:
        out = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
                if b"gpuhpc.health" not in argv or b"--apply" not in argv or b"--mode" in argv:
                    continue
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    if f"SLURMD_NODENAME={self.node}".encode() not in fh.read().split(b"\0"):
                        continue
                with open(f"/proc/{pid}/stat") as fh:
                    out[int(pid)] = int(fh.read().rsplit(")", 1)[1].split()[19]) / self._tick
            except (OSError, IndexError, ValueError):
                continue
        return out

    def run(self) -> None:
        while not self.done.wait(0.1):
            now = self._full_runs()
            self.ended += [start for pid, start in self.running.items() if pid not in now]
            self.running = now

    @staticmethod
    def now() -> float:
        """Seconds since boot, the clock of the runs' start times."""
        return boot_s()

    def wait_for_one_since(self, since: float, timeout: float) -> None:
        """Until a full run that started after ``since`` (s since boot) has ended."""
        wait_for(lambda: any(start > since for start in self.ended), timeout,
                 f"a full health run on {self.node} that started after the change to end", interval=0.1)


@pytest.fixture
def full_runs():
    """``watch(node)``: a started :class:`FullRuns` for ``node``, stopped after the test."""
    started: list[FullRuns] = []

    def watch(node: str) -> FullRuns:
        w = FullRuns(node)
        w.start()
        started.append(w)
        return w

    yield watch
    for w in started:
        w.done.set()
