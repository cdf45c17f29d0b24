"""The 2-node x 4-GPU torchrun job of the multi-node tests (examples/train.py: 8 ranks, a real
all-reduce over TCP, one shard per rank, launched by fake_torchrun.py), its per-rank progress
log, and the preemptor's GPU request."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from gpuhpc.jobs import checkpoint as ckpt
from jobs_helpers import HERE, gpuhpc

EXAMPLE = HERE.parents[2] / "examples" / "train.py"
sys.path.insert(0, str(EXAMPLE.parent))
from train import reference  # noqa: E402,F401  (re-exported for the tests)

NODES, GPUS = 2, 4
WORLD = NODES * GPUS
# the chaos test's five interruptions use 220-340 steps before the time limit; the time limit's
# signal comes at slurmctld's next periodic check (up to ~30 s: 600 steps; 448 seen): 1000 leaves
# room for both, the rest is the last run's work (at once: submit's slow_runs)
STEPS, EVERY, STEP_S = 1000, 20, 0.05
PREEMPT_NODE = "gpu-node2"


def submit(name: str, progress: Path, result: Path, *extra: str, steps: int = STEPS, opts=(),
           partition: str = "gpu", slow_runs: int = 0, nodelist: str = "gpu-node[1-2]") -> str:
    """``slow_runs``: only runs restarted fewer times than this wait STEP_S per step (0: every run),
    so the run after a test's last interruption counts its remaining steps at once. ``nodelist``:
    the two GPU nodes (a private cluster's, say)."""
    res = gpuhpc("submit", "--template", "torchrun", "--nodes", str(NODES), "--gpus", str(GPUS),
                 "--gpu-type", "h100", "--partition", partition, "--nodelist", nodelist, "--time", "15m",
                 "--name", name, "--json", *opts, "--",
                 sys.executable, "-u", str(EXAMPLE), "--steps", str(steps), "--ckpt-every", str(EVERY),
                 "--step-seconds", str(STEP_S), "--backend", "tcp", "--progress", str(progress),
                 "--result", str(result), "--slow-runs", str(slow_runs), *extra,
                 env={"GPUHPC_TORCHRUN": str(HERE / "fake_torchrun.py")})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def runs(progress: Path, world: int = WORLD) -> list[list[dict]]:
    """Per rank, per run: {restart, resume, last, stop, saved, slow_save_at, saved_at, done} from
    ``PROGRESS.<rank>`` (the times are the epoch seconds train.py wrote on its ``slow-save`` and
    ``saved`` lines; ``done`` is True, or the value a ``done VALUE`` line gives)."""
    out = []
    for r in range(world):
        per_run: list[dict] = []
        path = Path(f"{progress}.{r}")
        for line in (path.read_text().splitlines() if path.exists() else []):
            word, *rest = line.split()
            if word == "start":
                per_run.append({"restart": int(rest[0]), "resume": int(rest[1]), "last": int(rest[1]),
                                "stop": None, "saved": [], "slow_save_at": None, "saved_at": [], "done": None})
            elif word == "step" and per_run:
                per_run[-1]["last"] = int(rest[0])
            elif word == "stop" and per_run:
                per_run[-1]["stop"] = int(rest[0])
            elif word == "saved" and per_run:
                per_run[-1]["saved"].append(int(rest[0]))
                per_run[-1]["saved_at"].append(float(rest[1]))
            elif word == "slow-save" and per_run:
                per_run[-1]["slow_save_at"] = float(rest[1])
            elif word == "done" and per_run:
                per_run[-1]["done"] = int(rest[0]) if rest else True
        out.append(per_run)
    return out


def preemptor_gres(slurm, ours: int = GPUS, node: str = PREEMPT_NODE) -> str:
    """Our ``ours`` GPUs on ``node`` plus its free ones: preemption then takes only our job."""
    rec = slurm.run(["scontrol", "--oneliner", "show", "node", node]).stdout
    alloc = next((w for w in rec.split() if w.startswith("AllocTRES=")), "AllocTRES=")
    used = [int(kv.split("=")[1]) for kv in alloc.split("=", 1)[1].split(",") if kv.startswith("gres/gpu=")]
    return f"gpu:h100:{min(8, ours + 8 - (used[0] if used else 0))}"


class LatestWatcher(threading.Thread):
    """Checks every checkpoint that `latest` names, while the job runs."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory, self.seen, self.bad = directory, [], []
        self.done = threading.Event()

    def run(self) -> None:
        link = self.directory / ckpt.POINTER
        while not self.done.wait(0.1):
            try:
                target = link.resolve(strict=True)
            except OSError:
                continue
            if not self.seen or self.seen[-1] != target.name:
                self.seen.append(target.name)
                if not ckpt.is_complete(target, verify=True):
                    self.bad.append(target.name)
