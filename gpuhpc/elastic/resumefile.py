"""``SLURM_RESUME_FILE``: the job-to-node map slurmctld 22.05 writes for its ResumeProgram
(slurm.conf(5), ResumeProgram; doc/html/power_save.shtml)::

    {"all_nodes_resume": "cloud[1-3,7-8]",
     "jobs": [{"job_id": 140814, "nodes_alloc": "cloud[1-4]", "nodes_resume": "cloud[1,3,4]",
               "features": "c1,c2", "partition": "cloud", "oversubscribe": "OK", "reservation": "r1"}]}

Unknown keys are ignored (later Slurm adds ``extra``); a missing or unreadable file means no job
map: every node is then a launch of its own."""
from __future__ import annotations

import json
from dataclasses import dataclass

from gpuhpc import hostlist


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
    out = []
    for job in data.get("jobs") or []:
        nodes = job.get("nodes_resume") or job.get("nodes_alloc")
        if job.get("job_id") is None or not nodes:
            continue
        out.append((str(job["job_id"]), tuple(hostlist.expand(nodes))))
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
