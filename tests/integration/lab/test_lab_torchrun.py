"""Issue 15 "across hosts": gpuhpc's torchrun job on two lab hosts (see conftest.py), so that name
resolution and the rendezvous are real. The multi-rank stand-in of tests/integration/jobs
(examples/train.py with its TCP all-reduce, launched by fake_torchrun.py, one shard per rank) runs on
c1 and c2, rendered here by gpuhpc and submitted with sbatch on the login host; it checkpoints, is
requeued once with `scontrol requeue`, resumes from its newest complete checkpoint and ends with the
result of an uninterrupted run."""
from __future__ import annotations

import ipaddress
import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from polling import wait_for

from .conftest import REPO, SHARED, Lab

sys.path.insert(0, str(REPO / "examples"))
from train import reference  # noqa: E402

pytestmark = pytest.mark.integration

FAKE_TORCHRUN = REPO / "tests" / "integration" / "jobs" / "fake_torchrun.py"
WORLD, STEPS, EVERY, STEP_S = 2, 240, 20, 0.1
LAB_NET = ipaddress.ip_network("10.213.0.0/24")


def _deploy_code() -> None:
    """The job's code on the lab's shared filesystem (/shared/src on every host): the gpuhpc
    package (its checkpoint and coordination modules are all a rank imports), the example, the
    torchrun stand-in."""
    src = SHARED / "src"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "gpuhpc", src / "gpuhpc", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO / "examples" / "train.py", src / "train.py")
    shutil.copy2(FAKE_TORCHRUN, src / "fake_torchrun.py")


def _runs(progress: Path) -> list[list[dict]]:
    """Per rank, per run: {restart, resume, last} from examples/train.py's --progress lines."""
    out = []
    for r in range(WORLD):
        path = Path(f"{progress}.{r}")
        runs: list[dict] = []
        for line in path.read_text().splitlines() if path.exists() else []:
            word, *rest = line.split()
            if word == "start":
                runs.append({"restart": int(rest[0]), "resume": int(rest[1]), "last": int(rest[1])})
            elif word == "step" and runs:
                runs[-1]["last"] = int(rest[0])
        out.append(runs)
    return out


def test_torchrun_job_spans_two_hosts_survives_a_requeue_and_matches_an_uninterrupted_run(lab: Lab):
    _deploy_code()
    work = SHARED / "torchrun"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    progress, result = work / "progress", work / "result.json"
    spec = JobSpec(
        command=("python3", "-u", "/shared/src/train.py", "--steps", str(STEPS), "--ckpt-every", str(EVERY),
                 "--step-seconds", str(STEP_S), "--backend", "tcp", "--progress", "/shared/torchrun/progress",
                 "--result", "/shared/torchrun/result.json"),
        template="torchrun", name="lab-torchrun", resources=Resources(nodes=2, nodelist="c[1-2]", time="10m"),
        env={"GPUHPC_TORCHRUN": "/shared/src/fake_torchrun.py", "PYTHONPATH": "/shared/src"},
        log_dir="/shared/torchrun", checkpoint_dir="/shared/torchrun/ck/%j", grace=30, max_requeues=3)
    job_id = lab.sbatch(render(spec))
    ck_dir = work / "ck" / job_id
    log = work / f"lab-torchrun-{job_id}.out"

    def progressed(run: int):
        def check():
            runs = _runs(progress)
            return all(len(r) == run and r[-1]["last"] - r[-1]["resume"] >= 2 * EVERY for r in runs)
        return check

    try:
        wait_for(progressed(1), 120, f"job {job_id}'s {WORLD} ranks to take {2 * EVERY} steps")
        # the rendezvous: rank 0 listens at the first node's address, resolved from its name on every host
        addr, port = re.search(r"rendezvous=(\S+):(\d+)", log.read_text()).groups()
        assert addr == "c1"
        assert lab.ssh("c2", "getent hosts c1").split()[0] == "10.213.0.13"
        # ... and the ranks' all-reduce connections to it come over the lab network, one from c2
        peers = [line.split()[-1].rsplit(":", 1)[0] for line in
                 lab.ssh("c1", f"ss -Htn state established '( sport = :{port} )'").splitlines()]
        assert peers and all(ipaddress.ip_address(p) in LAB_NET for p in peers), peers
        assert "10.213.0.14" in peers, peers
        before = ckpt.latest_checkpoint(ck_dir)
        assert before is not None and ckpt.is_complete(before, verify=True)
        assert ckpt.read_manifest(before)["world_size"] == WORLD

        lab.ssh("ctl", f"scontrol requeue {job_id}")
        wait_for(progressed(2), 240, f"job {job_id} to run again after the requeue")
        wait_for(lambda: lab.job_state(job_id) in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), 180,
                 f"job {job_id} to end")
    finally:
        lab.ssh("ctl", f"scancel {job_id}", check=False)
    text = log.read_text()
    assert lab.job_state(job_id) == "COMPLETED", text[-3000:]
    # each line carries its srun task's label (the template's `srun --label`; under torchrun a task is a
    # node, and with one process per node its rank): `gpuhpc logs --rank` picks them out
    labelled = re.findall(r"^(\d+): rank (\d+)/2 host=(\S+)", text, re.M)
    assert {host for _, _, host in labelled} == {"c1", "c2"}, text[-3000:]
    assert all(task == rank for task, rank, _ in labelled), labelled
    runs = _runs(progress)
    first, second = [r[0] for r in runs], [r[1] for r in runs]
    resume = {r["resume"] for r in second}
    assert len(resume) == 1 and {r["restart"] for r in second} == {1}, runs
    # every rank resumed from one complete checkpoint: the step all stopped after at the requeue's
    # SIGTERM, or at worst the last periodic save before it
    step = resume.pop()
    assert all(0 <= r["last"] - step <= EVERY + 1 for r in first) and step >= EVERY, runs
    assert ckpt.is_complete(ck_dir / ckpt.step_dir_name(step), verify=True)
    assert json.loads(result.read_text()) == reference(WORLD, STEPS)
    final = ckpt.latest_checkpoint(ck_dir)
    assert final is not None and ckpt.is_complete(final, verify=True) and ckpt.read_manifest(final)["world_size"] == WORLD
