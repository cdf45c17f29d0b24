"""examples/train.py with 4 local ranks (TCP all-reduce, no Slurm): a SIGUSR2 to one rank
stops all four after the same step with a complete sharded checkpoint; the restarted ranks
resume from it and end where an uninterrupted run ends."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from gpuhpc.jobs import checkpoint as ckpt
from polling import wait_for

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train.py"
sys.path.insert(0, str(EXAMPLE.parent))
from train import reference  # noqa: E402

WORLD, STEPS = 4, 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path, restart: int) -> list[subprocess.Popen]:
    port = _free_port()
    base = dict(os.environ, WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                GPUHPC_CHECKPOINT_DIR=str(tmp_path / "ck"), GPUHPC_JOB_ID="5", GPUHPC_RESTART_COUNT=str(restart),
                GPUHPC_SHARD_TIMEOUT="30")
    base.pop("GPUHPC_LATEST_CHECKPOINT", None)
    base.pop("GPUHPC_STOP_DIR", None)
    return [subprocess.Popen([sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--ckpt-every", "25",
                              "--step-seconds", "0.02", "--backend", "tcp", "--progress", str(tmp_path / "p"),
                              "--result", str(tmp_path / "result.json")],
                             env={**base, "RANK": str(r)}, stdout=subprocess.DEVNULL)
            for r in range(WORLD)]


def _lines(tmp_path: Path, rank: int, word: str) -> list[int]:
    return [int(line.split()[1]) for line in (tmp_path / f"p.{rank}").read_text().splitlines()
            if line.startswith(word + " ")]


def test_example_stops_together_and_resumes_to_the_uninterrupted_result(tmp_path):
    procs = _start(tmp_path, 0)
    wait_for(lambda: (tmp_path / "p.2").exists() and len(_lines(tmp_path, 2, "step")) >= 30, 60,
             "rank 2 to take 30 steps", interval=0.05,
             abort=lambda: [p.returncode for p in procs if p.poll() is not None] and "a rank exited early")
    procs[2].send_signal(signal.SIGUSR2)                 # one rank hears the warning
    assert [p.wait(timeout=60) for p in procs] == [0] * WORLD
    stops = {r: _lines(tmp_path, r, "stop") for r in range(WORLD)}
    assert len({tuple(s) for s in stops.values()}) == 1 and len(stops[0]) == 1, stops
    latest = ckpt.latest_checkpoint(tmp_path / "ck")
    assert latest is not None and ckpt.is_complete(latest, verify=True)
    assert ckpt.read_manifest(latest)["step"] == stops[0][0]

    procs = _start(tmp_path, 1)
    assert [p.wait(timeout=120) for p in procs] == [0] * WORLD
    starts = {r: _lines(tmp_path, r, "start") for r in range(WORLD)}
    assert all(s == [0, 1] for s in starts.values())       # "start <restart> <resume>"
    resumes = {r: [int(line.split()[2]) for line in (tmp_path / f"p.{r}").read_text().splitlines()
                   if line.startswith("start 1 ")] for r in range(WORLD)}
    assert set(map(tuple, resumes.values())) == {(stops[0][0],)}   # every rank resumed at the stop step
    assert json.loads((tmp_path / "result.json").read_text()) == reference(WORLD, STEPS)
