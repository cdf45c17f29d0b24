"""Elastic capacity on a private controller with the local provider (issue 24, acceptance 1-8; 7
is checked around every scenario by the ``elastic`` fixture): each scenario records the node and job states it sees, with times, and asserts the sequence.
The times are printed (pytest -s), never asserted: polling ends each wait as soon as it can."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpuhpc.elastic import journal
from gpuhpc.elastic.metrics import samples
from gpuhpc.elastic.resumefile import parse_resume_file
from gpuhpc.elastic.store import Store
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.ledger import db, instances
from elastic_helpers import RESTART_BUDGET, RESUME_TIMEOUT, SUSPEND_TIME, SUSPEND_TIMEOUT, UNRESOLVED
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]       # a private controller only


def _job_state(el, job_id):
    return el.job(job_id).get("JobState", "")


def test_scale_up_from_zero_and_down_after_idle(elastic, tmp_path):
    """Two cold nodes at once: el-spot1, and el-dns1 whose name no resolver knows (slurm.conf gives
    it no address; the provider sets NodeAddr when it launches). Slurm commands stay fast
    throughout (acceptance 7, checked by the fixture)."""
    el = elastic
    assert "POWERED_DOWN" in el.state("el-spot1") and "POWERED_DOWN" in el.state(UNRESOLVED)
    job = el.submit("spot", seconds=2)
    named = el.submit("dns", seconds=2)
    el.mark(f"jobs {job} (spot) and {named} (dns: {UNRESOLVED}, unresolvable) submitted; every cloud node powered down")
    wait_for(lambda: "POWERED_DOWN" not in el.state("el-spot1"), 30, "el-spot1 to power up")
    el.mark(f"el-spot1 {el.state('el-spot1')}")
    wait_for(lambda: _job_state(el, job) in ("RUNNING", "COMPLETED"), 60, f"job {job} to run")
    t_run = el.mark(f"job {job} {_job_state(el, job)} on {el.job(job).get('NodeList')}")
    assert el.job(job).get("NodeList") == "el-spot1"
    assert "gpuhpc instance local-el-spot1" in el.node("el-spot1").comment
    # Slurm 22.05's SLURM_RESUME_FILE named the job (its key "nodes"; gpuhpc.elastic.resumefile):
    # the launch was the job's, recorded with its id
    given = (el.base / "log" / "resume-files.log").read_text().splitlines()
    el.mark(f"SLURM_RESUME_FILE: {' | '.join(given)}")
    assert (job, ("el-spot1",)) in [j for line in given for j in parse_resume_file(line)], given
    assert Store(el.config.state_dir).read().nodes["el-spot1"].job_id == job
    wait_for(lambda: _job_state(el, named) in ("RUNNING", "COMPLETED"), 60, f"job {named} to run")
    el.mark(f"job {named} {_job_state(el, named)} on {UNRESOLVED} (NodeAddr {el.node_addr(UNRESOLVED)})")
    assert el.node_addr(UNRESOLVED) == "127.0.0.1"
    el.reconcile()                                # the timer's pass journals submit -> running (monitoring)
    started = {e["job"]: e for e in journal.read(el.config.state_dir) if e["event"] == "job_start"}
    assert {job, named} <= set(started), started
    el.mark(f"reconciler: submit -> running {started[job]['start_at'] - started[job]['submit_at']:.0f}s (Slurm's "
            f"whole seconds) for job {job}")
    assert sorted(i.node for i in el.provider.instances()) == ["el-dns1", "el-spot1"]
    wait_for(lambda: _job_state(el, job) == "COMPLETED", 60, f"job {job} to complete")
    el.mark(f"job {job} COMPLETED; el-spot1 {el.state('el-spot1')}")
    wait_for(lambda: "POWERED_DOWN" in el.state("el-spot1") and "POWERED_DOWN" in el.state(UNRESOLVED)
             and not el.provider.instances(), SUSPEND_TIME + SUSPEND_TIMEOUT + 40, "both nodes to power down after idle")
    t_down = el.mark(f"el-spot1 {el.state('el-spot1')}, {UNRESOLVED} {el.state(UNRESOLVED)}, no instance left")
    print(f"submit->running {t_run:.1f}s; running->powered down {t_down - t_run:.1f}s "
          f"(SuspendTime {SUSPEND_TIME}s + SuspendTimeout {SUSPEND_TIMEOUT}s + the job's 2 s)")
    # the ledger: el-spot1's instance-hours from the journal, its parts adding up to its life
    events = journal.read(el.config.state_dir)
    launched = next(e for e in events if e["event"] == "launch" and e["node"] == "el-spot1")
    ev = {e["event"]: e for e in events if e.get("id") == launched["id"]}
    assert ev["end"]["reason"] == "suspend" and ev["end"]["registered_at"] >= ev["launch"]["at"] - 1  # whole seconds
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    db.upgrade(url)
    instances.ingest(journal.read(el.config.state_dir), url)
    (row,) = [r for r in instances.instance_report(url=url).rows if r.market == "spot"]
    life = ev["end"]["at"] - ev["launch"]["at"]
    el.mark("instance-hours of el-spot1: " + ", ".join(f"{k} {float(v):.1f}s" for k, v in row.seconds.items()))
    assert abs(float(sum(row.seconds.values())) - life) < 0.01 and row.seconds["idle"] > 0


def test_a_capacity_error_sets_the_node_down_at_once_and_the_job_runs_in_the_next_tier(elastic):
    el = elastic
    el.faults({"spot": {"mode": "capacity", "code": "InsufficientInstanceCapacity"}})
    job = el.submit("spot,od", seconds=30)
    el.mark(f"job {job} submitted to spot,od; the spot pool has no capacity")
    wait_for(lambda: "DOWN" in el.state("el-spot1").replace("POWERED_DOWN", ""), 30, "el-spot1 DOWN")
    t_down = el.mark(f"el-spot1 {el.state('el-spot1')}: {el.node('el-spot1').reason}")
    # DOWN came from the capacity error, not from ResumeTimeout: the reason the first DOWN carries
    # is the resume program's (Slurm's own reads "ResumeTimeout reached"), and no instance was launched
    reason = el.node("el-spot1").reason
    assert "InsufficientInstanceCapacity" in reason and "ResumeTimeout" not in reason, reason
    assert not [i for i in el.provider.instances() if i.node == "el-spot1"], el.provider.instances()
    assert ("gpuhpc_elastic_resume_failures_total", ("spot", "InsufficientInstanceCapacity")) in [
        (n, labels) for n, labels, _ in samples(el.config, journal.read(el.config.state_dir), Store(el.config.state_dir).read(),
                                                time.time())]
    wait_for(lambda: "DOWN" in el.state("el-spot2").replace("POWERED_DOWN", ""), 10, "the spot pool to cool down")
    el.mark(f"el-spot2 {el.state('el-spot2')} (pool cooling down)")
    wait_for(lambda: _job_state(el, job) == "RUNNING", 90, f"job {job} to run in the next tier")
    t_run = el.mark(f"job {job} RUNNING on {el.job(job).get('NodeList')} (partition {el.job(job).get('Partition')})")
    assert el.job(job).get("Partition") == "od" and el.job(job).get("NodeList", "").startswith("el-od")
    print(f"capacity error -> DOWN {t_down:.1f}s after submit (ResumeTimeout {RESUME_TIMEOUT}s); "
          f"running in the next tier {t_run:.1f}s after submit")
    el.client.run(["scancel", job], check=False)
    # the cooldown ends (the clock moved on): once Slurm has given up on el-spot1's launch
    # (ResumeTimeout), the reconciler returns the pool's nodes
    wait_for(lambda: ("end_cooldown", "spot") in [(a.kind, a.target) for a in el.reconcile(now=time.time() + 10**6)],
             RESUME_TIMEOUT + 30, "the reconciler to end the spot cooldown")
    el.mark("reconciler ended the spot cooldown")
    wait_for(lambda: all("DOWN" not in el.state(n).replace("POWERED_DOWN", "") for n in ("el-spot1", "el-spot2")),
             30, f"the spot nodes back in the pool after the cooldown ({[(el.state(n), el.node(n).reason) for n in ('el-spot1', 'el-spot2')]})")
    el.mark(f"cooldown over: el-spot1 {el.state('el-spot1')}, el-spot2 {el.state('el-spot2')}")


def test_a_pool_that_never_boots_sends_the_job_to_the_next_tier_and_is_protected(elastic):
    el = elastic
    el.faults({"spot": {"mode": "never_boot"}})
    job = el.submit("spot,od", seconds=30)
    el.mark(f"job {job} submitted to spot,od; spot instances never boot")
    wait_for(lambda: "POWERING_UP" in el.state("el-spot1"), 30, "el-spot1 powering up")
    el.mark(f"el-spot1 {el.state('el-spot1')}")
    seen: list[tuple[str, str, str]] = []          # (el-spot1's state, the job's state, its partition) per poll

    def in_od() -> bool:
        node = el.state("el-spot1")                 # read first: a job seen in od after it was DOWN is in order
        rec = el.job(job)
        seen.append((node, rec.get("JobState", ""), rec.get("Partition", "")))
        return seen[-1][1:] == ("RUNNING", "od")
    wait_for(in_od, RESUME_TIMEOUT + 90, lambda: f"job {job} to run in the od tier (last seen {seen[-3:]})")
    t_run = el.mark(f"job {job} RUNNING on {el.job(job).get('NodeList')} (partition od)")
    # the sequence: the job went to od only once spot's launch had failed (ResumeTimeout: el-spot1
    # DOWN), never while el-spot1 was still powering up for it
    first_od = next(i for i, (_, _, part) in enumerate(seen) if part == "od")
    assert any("DOWN" in n.replace("POWERED_DOWN", "") for n, _, _ in seen[:first_od + 1]), seen
    assert "DOWN" in el.state("el-spot1").replace("POWERED_DOWN", "")
    # ... by ResumeTimeout: Slurm ran ResumeFailProgram, which journalled el-spot1's instance as a boot failure
    events = journal.read(el.config.state_dir)
    launched = {e["id"] for e in events if e["event"] == "launch" and e["node"] == "el-spot1"}
    assert [e for e in events if e["event"] == "end" and e["id"] in launched and e["reason"] == "boot-failed"], events
    assert not [i for i in el.provider.instances() if i.node == "el-spot1"], "resume-fail ended the instance"
    el.mark(f"el-spot1 {el.state('el-spot1')}: {el.node('el-spot1').reason}")
    el.client.run(["scancel", job], check=False)
    # protect_after 1 here: the pool is protected; the end of its cooldown does not return it
    assert all(el.node(n).reason.startswith("gpuhpc protected pool spot") for n in ("el-spot1", "el-spot2")), \
        [el.node(n).reason for n in ("el-spot1", "el-spot2")]
    wait_for(lambda: "POWERING_UP" not in el.state("el-spot1"), 30, "el-spot1 to leave POWERING_UP")
    assert "end_cooldown" not in [a.kind for a in el.reconcile(now=time.time() + 10**6)]
    assert el.node("el-spot2").reason.startswith("gpuhpc protected")
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "power", "unprotect", "spot"], capture_output=True, text=True,
                         timeout=60, env={**os.environ, **el.env, "GPUHPC_ELASTIC_CONFIG": str(el.base / "elastic.json")})
    assert res.returncode == 0 and "pool spot unprotected" in res.stderr, res.stderr
    wait_for(lambda: all("DOWN" not in el.state(n).replace("POWERED_DOWN", "") for n in ("el-spot1", "el-spot2")),
             30, "the spot nodes back after gpuhpc power unprotect")
    el.mark(f"gpuhpc power unprotect spot: el-spot1 {el.state('el-spot1')}, el-spot2 {el.state('el-spot2')}")


def test_an_orphan_instance_is_terminated_after_its_grace_never_before(elastic):
    el = elastic
    el.faults({"od": {"mode": "never_boot"}})
    pool = el.config.pool("od")
    orphan = el.provider.launch(pool, ["el-od2"], "orphan-token-1")[0]   # launched, never recorded
    el.mark(f"instance {orphan.id} launched, no node record names it (grace {el.config.orphan_grace}s)")
    born = orphan.launched_at
    for dt in (0, el.config.orphan_grace / 2, el.config.orphan_grace - 1):
        acts = el.reconcile(now=born + dt)
        assert ("terminate", orphan.id) not in [(a.kind, a.target) for a in acts]
        assert orphan.id in [i.id for i in el.provider.instances()]
        el.mark(f"reconcile at +{dt:.0f}s: kept")
    acts = el.reconcile(now=born + el.config.orphan_grace)
    assert ("terminate", orphan.id) in [(a.kind, a.target) for a in acts]
    assert orphan.id not in [i.id for i in el.provider.instances()]
    el.mark(f"reconcile at +{el.config.orphan_grace}s: terminated")


def test_static_capacity_before_cloud_and_the_cheaper_tier_before_the_dearer(elastic):
    el = elastic
    first = el.submit("od,spot,static", seconds=20)
    wait_for(lambda: _job_state(el, first) == "RUNNING", 30, f"job {first} to run")
    el.mark(f"job {first} RUNNING on {el.job(first).get('NodeList')}")
    assert el.job(first).get("NodeList") == "el-static1"
    assert all("POWERED_DOWN" in el.state(n) for n in ("el-spot1", "el-od1")), "no cloud node was resumed"
    second = el.submit("od,spot,static", seconds=2)                  # static is busy now
    wait_for(lambda: _job_state(el, second) in ("RUNNING", "COMPLETED"), 60, f"job {second} to run")
    el.mark(f"job {second} {_job_state(el, second)} on {el.job(second).get('NodeList')}")
    assert el.job(second).get("NodeList") == "el-spot1" and "POWERED_DOWN" in el.state("el-od1")
    el.client.run(["scancel", first], check=False)


CHECKPOINT_EVERY = 5          # the job saves its counter every 5 steps of 1 s


def test_a_spot_reclaim_requeues_the_job_which_resumes_from_its_checkpoint_until_its_restart_budget(elastic, tmp_path):
    """Acceptance 4 and 8. A real reclaim: the interruption notice (drain, USR2: the job
    checkpoints), then the machine is gone (its slurmstepd and job killed first, then slurmd). The
    reconciler finds the instance gone: DOWN (the job requeues at once), POWER_DOWN. The job resumes
    from its checkpoint, having lost at most one interval, and runs again within cred_expire + 35 s
    of the kill. A second reclaim, with no notice, spends its restart budget (1): held, the reason
    in its AdminComment, not looped. The job is gpuhpc's rendered sbatch (a JobSpec on the spot
    partition that asks for nothing about requeueing): checkpoint-requeue is the default on spot."""
    el = elastic
    ckpt, log, progress = tmp_path / "ckpt", tmp_path / "log", tmp_path / "progress"
    program = f"""#!/bin/bash
n=$(cat {ckpt} 2>/dev/null || echo 0)
echo "start $n restart ${{GPUHPC_RESTART_COUNT:-unset}} on $SLURMD_NODENAME" >> {log}
trap 'echo $n > {ckpt}; echo "usr2 $n" >> {log}' USR2
while [ $n -lt 60 ]; do
  n=$((n + 1)); echo $n > {progress}; [ $((n % {CHECKPOINT_EVERY})) -eq 0 ] && echo $n > {ckpt}; sleep 1
done
echo "done $n" >> {log}
"""
    (tmp_path / "program.sh").write_text(program)
    spec = JobSpec(command=("bash", str(tmp_path / "program.sh")), name="gpuhpc-test-elastic-reclaim",
                   resources=Resources(partition="spot", time="10m"), log_dir=str(tmp_path),
                   checkpoint_dir=str(tmp_path / "gpuhpc-ckpt"))
    job = el.client.submit_script(render(spec))
    el.mark(f"job {job} submitted to spot (checkpoint every {CHECKPOINT_EVERY} steps)")
    assert el.job(job).get("Requeue") == "1"         # requeueable by default: nobody asked for it
    wait_for(lambda: log.exists() and "start" in log.read_text(), 90, f"job {job} to start")
    node = el.job(job).get("NodeList")
    el.mark(f"job {job} running on {node}")
    wait_for(lambda: ckpt.exists() and int(ckpt.read_text() or 0) >= CHECKPOINT_EVERY, 30, "a first checkpoint")
    inst = next(i for i in el.provider.instances() if i.node == node)
    el.provider.interrupt(inst.id)
    el.mark(f"spot interruption notice for {inst.id}")
    first = el.reconcile()
    assert [a.kind for a in first if a.target in (node, job)] == ["drain", "signal", "note_interrupt"], first
    wait_for(lambda: "usr2" in log.read_text(), 20, "the job to checkpoint on USR2")
    saved = int(log.read_text().split("usr2 ")[-1].split()[0])
    el.mark(f"{node} {el.state(node)}; job checkpointed at step {saved}")
    killed = el.provider.reclaim(inst.id)                   # the machine is gone: slurmstepd first
    at_kill = int(progress.read_text())
    t_kill = el.mark(f"instance {inst.id} reclaimed at step {at_kill}: {len(killed)} processes killed "
                     "(slurmstepd and the job first, then slurmd)")
    acts = wait_for(lambda: [(a.kind, a.target) for a in el.reconcile() if a.target == node], 20,
                    "the reconciler to find the instance gone")
    assert acts == [("down", node), ("power_down", node), ("forget", node)], acts
    el.mark(f"reconciler: {node} DOWN (requeue), POWER_DOWN: {el.job(job).get('JobState')}")
    starts = lambda: [line for line in log.read_text().splitlines() if line.startswith("start ")]  # noqa: E731
    bound = el.cred_expire + 35
    wait_for(lambda: len(starts()) >= 2, bound, f"job {job} to run again within cred_expire + 35 s of the kill")
    t_back = el.mark(f"job {job} running again: {starts()[-1]}")
    restart_at = int(starts()[-1].split()[1])
    assert at_kill - CHECKPOINT_EVERY <= restart_at <= at_kill and restart_at >= saved, log.read_text()
    assert starts()[-1].split()[3] == "1", log.read_text()       # the template's resume path: GPUHPC_RESTART_COUNT
    print(f"reclaim (kill) -> running again {t_back - t_kill:.1f}s (bound cred_expire {el.cred_expire} + 35 s); "
          f"lost {at_kill - restart_at} steps (checkpoint interval {CHECKPOINT_EVERY})")

    node = el.job(job).get("NodeList")
    inst = next(i for i in el.provider.instances() if i.node == node)
    el.provider.reclaim(inst.id)                            # no notice this time
    el.mark(f"instance {inst.id} on {node} reclaimed with no notice (restart budget {RESTART_BUDGET} spent)")
    acts = wait_for(lambda: [(a.kind, a.target) for a in el.reconcile() if a.target in (node, job)], 20,
                    "the reconciler to find the second instance gone")
    assert acts == [("down", node), ("power_down", node), ("forget", node), ("hold", job)], acts
    rec = wait_for(lambda: (r := el.job(job)).get("Reason") == "JobHeldAdmin" and r, 10, f"job {job} held")
    el.mark(f"job {job} {rec.get('JobState')} ({rec.get('Reason')}): {rec.get('AdminComment')}")
    assert rec.get("JobState") == "PENDING" and f"restart budget {RESTART_BUDGET} spent" in rec.get("AdminComment", "")
    el.client.run(["scancel", job], check=False)
    # monitoring: the exporter's collector over this cluster's journal counts both reclaims
    got = {(n, labels): v for n, labels, v in samples(el.config, journal.read(el.config.state_dir),
                                                      Store(el.config.state_dir).read(), time.time())}
    assert got[("gpuhpc_elastic_reclaims_total", ("spot",))] >= 2, got
