"""``SLURM_RESUME_FILE``: the job-to-node map slurmctld writes for its ResumeProgram (slurm.conf(5),
ResumeProgram; doc/html/power_save.shtml), a file under /proc/<slurmctld>/fd/ that lives until the
program exits. Its keys changed in 23.02 (read from Slurm's src/slurmctld/power_save.c,
``_do_power_work``, at the tags slurm-22-05-8-1 and slurm-23-02-0-1):

22.05 (Debian 12's 22.05.8; checked on the elastic scenarios' private controller)::

    {"jobs": [{"job_id": 140814, "nodes": "cloud[1,3]"}], "all_nodes": "cloud[1,3,7-8]"}

23.02 and later::

    {"all_nodes_resume": "cloud[1-3,7-8]",
     "jobs": [{"job_id": 140814, "nodes_alloc": "cloud[1-4]", "nodes_resume": "cloud[1,3,4]",
               "features": "c1,c2", "partition": "cloud", "oversubscribe": "OK", "reservation": "r1",
               "extra": null}]}

A job is listed while it is CONFIGURING and some of its nodes are powered down: slurmctld adds it
at allocation (node_scheduler.c: ``JOB_POWER_UP_NODE``) and, after a restart, from every
configuring job; ``nodes``/``nodes_resume`` are the nodes this call resumes for it (an empty value:
none; a node two jobs share is listed under both). Nodes powered up with no job (``scontrol update
State=POWER_UP``) are only in ``all_nodes``. Unknown keys are ignored; a missing or unreadable
file means no job map: every node is then a launch of its own."""
from __future__ import annotations

import json
from dataclasses import dataclass

from gpuhpc import hostlist
from gpuhpc.errors import UserInputError


@dataclass(frozen=True)
class Launch:
    """Nodes that come up together (one job's nodes: all or nothing), or one node without a job."""
    nodes: tuple[str, ...]
    job_id: str | None = None


def parse_resume_file(text: str | None) -> list[tuple[str, tuple[str, ...]]]:
    """(job id, nodes to resume) per job of the file; [] for no file or one Slurm did not finish."""
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        return []
    jobs = data.get("jobs") if isinstance(data, dict) else None
    out = []
    for job in jobs if isinstance(jobs, list) else []:
        if not isinstance(job, dict):
            continue
        nodes = job.get("nodes_resume") if "nodes_resume" in job else job.get("nodes")   # 23.02+ / 22.05
        if job.get("job_id") is None or not nodes or not isinstance(nodes, str):
            continue
        try:
            out.append((str(job["job_id"]), tuple(hostlist.expand(nodes))))
        except UserInputError:            # not a hostlist: that job's nodes launch one by one
            continue
    return out


def plan_launches(nodes: list[str], resume_text: str | None) -> list[Launch]:
    """One launch per job (its nodes among ``nodes``), then one per node no job named. A node two
    jobs name (oversubscribed) goes with the first."""
    wanted = list(dict.fromkeys(nodes))
    taken: set[str] = set()
    out = []
    for job_id, job_nodes in parse_resume_file(resume_text):
        mine = tuple(n for n in job_nodes if n in wanted and n not in taken)
        if mine:
            taken.update(mine)
            out.append(Launch(mine, job_id))
    out.extend(Launch((n,)) for n in wanted if n not in taken)
    return out
