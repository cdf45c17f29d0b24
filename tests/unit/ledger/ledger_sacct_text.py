"""Build sacct --parsable2 text (0x1f-delimited, SACCT_RUN_FIELDS) for tests."""
from __future__ import annotations

from gpuhpc.slurm.commands import SACCT_RUN_FIELDS as SACCT_FIELDS
from gpuhpc.slurm.commands import SEP
from gpuhpc.slurm.parsers import parse_sacct


def row(job_id: str, state: str, start: str, end: str, elapsed: int, *, gpus: int = 8, gpu_type: str = "h100",
        partition: str = "gpu", account: str = "research", user: str = "alice", qos: str = "normal",
        submit: str | None = None, cluster: str = "local", name: str = "train") -> str:
    tres = f"billing=1,cpu=1,gres/gpu:{gpu_type}={gpus},gres/gpu={gpus},mem=1000M,node=1" if gpus else "cpu=1,node=1"
    d = {"JobID": job_id, "JobIDRaw": job_id.split("_")[0], "JobName": name, "State": state, "Elapsed": "",
         "ElapsedRaw": str(elapsed), "Submit": submit or start, "Start": start, "End": end, "AllocTRES": tres,
         "ReqTRES": tres, "Partition": partition, "Account": account, "User": user, "QOS": qos,
         "Cluster": cluster, "Timelimit": "01:00:00"}
    return SEP.join(d[f] for f in SACCT_FIELDS)


def rows(*lines: str):
    return parse_sacct("\n".join(lines), fields=SACCT_FIELDS)
