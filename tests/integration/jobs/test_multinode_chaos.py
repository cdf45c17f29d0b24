"""A 2-node x 4-GPU torchrun job (examples/train.py: 8 ranks, a real all-reduce over TCP, one
shard per rank, launched by fake_torchrun.py) under chaos on the real cluster: preempted 3
times, force-requeued once, time-limited once. Every time all ranks stop after the same step,
`latest` only ever names a complete checkpoint, the job resumes from it, and the result
equals an uninterrupted run. A rank killed during a save leaves `latest` where it was."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from jobs_helpers import HERE, gpuhpc, interrupt, job_state, preempt
from polling import wait_for

pytestmark = pytest.mark.integration

EXAMPLE = HERE.parents[2] / "examples" / "train.py"
sys.path.insert(0, str(EXAMPLE.parent))
from train import reference  # noqa: E402

NODES, GPUS = 2, 4
WORLD = NODES * GPUS
STEPS, EVERY, STEP_S = 1200, 20, 0.05
PREEMPT_NODE = "gpu-node2"


def _submit(name: str, progress: Path, result: Path, *extra: str, steps: int = STEPS, opts=()) -> str:
    res = gpuhpc("submit", "--template", "torchrun", "--nodes", str(NODES), "--gpus", str(GPUS),
                 "--gpu-type", "h100", "--partition", "gpu", "--nodelist", "gpu-node[1-2]", "--time", "15m",
                 "--name", name, "--json", *opts, "--",
                 sys.executable, "-u", str(EXAMPLE), "--steps", str(steps), "--ckpt-every", str(EVERY),
                 "--step-seconds", str(STEP_S), "--backend", "tcp", "--progress", str(progress),
                 "--result", str(result), *extra,
                 env={"GPUHPC_TORCHRUN": str(HERE / "fake_torchrun.py")})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["job_id"]


def _runs(progress: Path) -> list[list[dict]]:
    """Per rank, per run: {restart, resume, last, stop, saved}."""
    out = []
    for r in range(WORLD):
        runs: list[dict] = []
        path = Path(f"{progress}.{r}")
        for line in (path.read_text().splitlines() if path.exists() else []):
            word, *rest = line.split()
            if word == "start":
                runs.append({"restart": int(rest[0]), "resume": int(rest[1]), "last": int(rest[1]),
                             "stop": None, "saved": []})
            elif word == "step" and runs:
                runs[-1]["last"] = int(rest[0])
            elif word == "stop" and runs:
                runs[-1]["stop"] = int(rest[0])
            elif word == "saved" and runs:
                runs[-1]["saved"].append(int(rest[0]))
        out.append(runs)
    return out


def _preemptor_gres(slurm) -> str:
    """Our GPUs on PREEMPT_NODE plus its free ones: preemption then takes only our job."""
    rec = slurm.run(["scontrol", "--oneliner", "show", "node", PREEMPT_NODE]).stdout
    alloc = next((w for w in rec.split() if w.startswith("AllocTRES=")), "AllocTRES=")
    used = [int(kv.split("=")[1]) for kv in alloc.split("=", 1)[1].split(",") if kv.startswith("gres/gpu=")]
    return f"gpu:h100:{min(8, GPUS + 8 - (used[0] if used else 0))}"


class LatestWatcher(threading.Thread):
    """Checks every checkpoint that `latest` names, while the job runs."""

    def __init__(self, directory: Path) -> None:
        super().__init__(daemon=True)
        self.directory, self.seen, self.bad = directory, [], []
        self.done = threading.Event()

    def run(self) -> None:
        link = self.directory / "latest"
        while not self.done.wait(0.1):
            try:
                target = link.resolve(strict=True)
            except OSError:
                continue
            if not self.seen or self.seen[-1] != target.name:
                self.seen.append(target.name)
                if not ckpt.is_complete(target, verify=True):
                    self.bad.append(target.name)


def test_two_nodes_survive_preemption_requeue_and_time_limit(jobs_env, tmp_path, slurm, track):
    progress, result = tmp_path / "progress", tmp_path / "result.json"
    job_id = _submit("gpuhpc-test-multinode", progress, result, opts=("--grace", "60", "--max-requeues", "8"))
    track(job_id)
    ck_dir = jobs_env / "checkpoints" / job_id
    watcher = LatestWatcher(ck_dir)
    watcher.start()

    def running_and_progressed(run: int):
        def check():
            if job_state(slurm, job_id) != "RUNNING":
                return False
            runs = _runs(progress)
            return all(len(r) == run and r[-1]["last"] - r[-1]["resume"] >= 2 * EVERY for r in runs)
        return check

    actions = ["preempt", "preempt", "requeue", "preempt", "time_limit"]
    for i, action in enumerate(actions):
        wait_for(running_and_progressed(i + 1), 150, f"job {job_id} running again before {action} #{i}")
        interrupt(slurm, job_id, action, node=PREEMPT_NODE, gres=_preemptor_gres(slurm), track=track)

    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 300,
             f"job {job_id} to end")
    watcher.done.set()
    watcher.join()
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-3000:]
    assert json.loads(result.read_text()) == reference(WORLD, STEPS)

    runs = _runs(progress)
    for i, run in enumerate(zip(*runs)):          # shown with pytest -s
        print(f"run {i}: resume {sorted({r['resume'] for r in run})} last {sorted({r['last'] for r in run})} "
              f"stop {sorted({str(r['stop']) for r in run})}")
    print("latest:", watcher.seen)
    assert len({len(r) for r in runs}) == 1 and len(runs[0]) == len(actions) + 1, [len(r) for r in runs]
    for i, action in enumerate(actions):
        per_rank = [r[i] for r in runs]
        nxt = [r[i + 1] for r in runs]
        resume = {n["resume"] for n in nxt}
        assert len(resume) == 1, (action, nxt)                        # every rank resumed from one step
        if action == "requeue":         # SIGTERM, then srun's SIGKILL: back to the last periodic save
            assert all(0 <= p["last"] - nxt[0]["resume"] <= EVERY + 1 for p in per_rank), (action, per_rank, nxt)
        else:                           # SIGUSR2: all ranks stopped after one step and resumed from it
            stops = {p["stop"] for p in per_rank}
            assert len(stops) == 1 and None not in stops, (action, per_rank)
            assert resume == stops and all(p["last"] == p["stop"] for p in per_rank), (action, per_rank, nxt)
    assert watcher.seen and not watcher.bad, (watcher.seen, watcher.bad)
    latest = ckpt.latest_checkpoint(ck_dir)
    assert latest is not None and ckpt.read_manifest(latest)["world_size"] == WORLD
    assert "deadline" in log and "requeueing job" in log


def test_a_rank_killed_during_a_save_leaves_latest_on_the_previous_checkpoint(jobs_env, tmp_path, slurm, track):
    progress, result = tmp_path / "progress", tmp_path / "result.json"
    job_id = _submit("gpuhpc-test-killed-save", progress, result, "--fail-rank", "5", "--fail-at", str(2 * EVERY),
                     steps=4 * EVERY, opts=("--no-requeue", "--env", "GPUHPC_SHARD_TIMEOUT=10"))
    track(job_id)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 240,
             f"job {job_id} to end")
    assert job_state(slurm, job_id) == "FAILED"
    ck_dir = jobs_env / "checkpoints" / job_id
    first, second = ck_dir / ckpt.step_dir_name(EVERY), ck_dir / ckpt.step_dir_name(2 * EVERY)
    assert (ck_dir / "latest").resolve() == first.resolve()
    assert ckpt.is_complete(first, verify=True)
    assert second.is_dir() and not ckpt.is_complete(second) and not (second / "MANIFEST.json").exists()
    assert ckpt.latest_checkpoint(ck_dir) == first.resolve()
    assert not result.exists()


def test_a_save_longer_than_grace_runs_to_the_partitions_grace_time(jobs_env, tmp_path, slurm, track):
    """--grace 20 once meant a requeue 10 s after the warning; the gpu partition's GraceTime is 30 s.
    A 14 s save after a preemption now finishes, and the job resumes from it."""
    progress, result = tmp_path / "progress", tmp_path / "result.json"
    job_id = _submit("gpuhpc-test-long-save", progress, result, "--stop-save-seconds", "14", steps=6 * EVERY,
                     opts=("--grace", "20", "--max-requeues", "2"))
    track(job_id)

    def progressed():
        runs = _runs(progress)
        return job_state(slurm, job_id) == "RUNNING" and all(len(r) == 1 and r[0]["last"] >= EVERY for r in runs)

    wait_for(progressed, 150, f"job {job_id} to run")
    preempt(slurm, PREEMPT_NODE, _preemptor_gres(slurm), track)
    wait_for(lambda: job_state(slurm, job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 300,
             f"job {job_id} to end")
    from gpuhpc.jobs.api import Job

    log = Job(job_id, client=slurm).logs()
    assert job_state(slurm, job_id) == "COMPLETED", log[-3000:]
    runs = _runs(progress)
    first, second = [r[0] for r in runs], [r[1] for r in runs]
    stops = {r["stop"] for r in first}
    assert len(stops) == 1 and None not in stops, first
    assert {r["resume"] for r in second} == stops                 # the slow save was committed and used
    assert "did not exit by the deadline" not in log and "program exited (0) after SIGUSR2" in log
    assert json.loads(result.read_text()) == reference(WORLD, 6 * EVERY)
