"""Slurm's side of elastic capacity (gpuhpc.elastic, docs/elastic.md): the node updates the power
programs and the reconciler make, the node and job views they read, and the local provider's
``slurmd -b -N NAME`` daemons. Pure argv builders first, then :class:`PowerSlurm`, which runs them
through a :class:`~gpuhpc.slurm.client.SlurmClient`."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.slurm.commands import scontrol_ping
from gpuhpc.slurm.parsers import ControllerPing, parse_oneliner_records, parse_ping, slurm_timestamp


# ---------------------------------------------------------------- builders (pure)
def update_node(nodes: str, **fields: str) -> list[str]:
    """``scontrol update NodeName=<nodes> Key=Value ...`` (State, Reason, Comment, NodeAddr ...);
    each pair is one argv element, so no shell sees a reason's spaces."""
    return ["scontrol", "update", f"NodeName={nodes}", *(f"{k}={v}" for k, v in fields.items())]


def show_nodes(nodes: str | None = None) -> list[str]:
    """``scontrol --oneliner show node [NODES]``."""
    return ["scontrol", "--oneliner", "show", "node"] + ([nodes] if nodes else [])


def jobs_on_nodes(nodes: str) -> list[str]:
    """``squeue -h -w NODES -o %i|%N``: the jobs running (or completing) on these nodes."""
    return ["squeue", "--noheader", f"--nodelist={nodes}", "--states=R,CG,CF", "--format=%i|%N"]


def hold_job(job_id: str, note: str) -> list[str]:
    """``scontrol update JobId=JOB Priority=0 AdminComment=NOTE``: an admin hold with the reason."""
    return ["scontrol", "update", f"JobId={job_id}", "Priority=0", f"AdminComment={note}"]


def slurmd_argv(name: str, conf: str | None = None, slurmd: str | None = None) -> list[str]:
    """``slurmd -D -b -N NAME [-f CONF]``: one node's daemon in the foreground (its parent keeps
    the pid), ``-b`` reporting a fresh boot so slurmctld takes the registration at once."""
    exe = slurmd or shutil.which("slurmd") or "/usr/sbin/slurmd"
    return [exe, "-D", "-b", "-N", name] + (["-f", conf] if conf else [])


@dataclass(frozen=True)
class PowerNode:
    """A node as the power programs see it: ``state`` is Slurm's word list (``IDLE+CLOUD+POWERED_DOWN``)."""
    name: str
    state: str
    reason: str = ""
    comment: str = ""
    slurmd_start: float | None = None     # SlurmdStartTime: when its slurmd registered (epoch s)
    last_busy: float | None = None        # LastBusyTime: when it last went idle

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state.upper().replace("+", " ").split())


def parse_power_nodes(text: str) -> list[PowerNode]:
    out = []
    for rec in parse_oneliner_records(text):
        if "NodeName" in rec:
            comment, reason = rec.get("Comment", ""), rec.get("Reason", "")
            out.append(PowerNode(rec["NodeName"], rec.get("State", "UNKNOWN"), "" if reason == "(null)" else reason,
                                 "" if comment == "(null)" else comment, slurm_timestamp(rec.get("SlurmdStartTime")),
                                 slurm_timestamp(rec.get("LastBusyTime"))))
    return out


def parse_jobs_on_nodes(text: str) -> list[tuple[str, str]]:
    """(job id, nodelist) rows of :func:`jobs_on_nodes`."""
    rows = []
    for line in text.splitlines():
        job, sep, nodes = line.strip().partition("|")
        if sep and job:
            rows.append((job, nodes))
    return rows


JOB_BRIEF_FIELDS = ("JobID", "RestartCnt", "State", "SubmitTime", "StartTime")
JOB_BRIEF_CHUNK = 500         # job ids per squeue call (the argv stays far under ARG_MAX)


@dataclass(frozen=True)
class JobBrief:
    """What the reconciler needs of a job: its requeue count, state, submit and start times."""
    job_id: str
    restarts: int
    state: str
    submit: float | None
    start: float | None


def job_briefs_argv(job_ids: list[str]) -> list[str]:
    """``squeue --noheader --states=all --jobs=A,B -O JobID:48,RestartCnt:12,...``: fields with no
    free text in them (no name, comment or reason), so a row is whitespace-split safely."""
    fmt = ",".join(f"{f}:{48 if f == 'JobID' else 24}" for f in JOB_BRIEF_FIELDS)
    return ["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}", f"--Format={fmt}"]


def parse_job_briefs(text: str) -> dict[str, JobBrief]:
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != len(JOB_BRIEF_FIELDS) or not parts[1].isdigit():
            continue                       # malformed: skipped, never fatal
        job, restarts, state, submit, start = parts
        out[job] = JobBrief(job, int(restarts), state, slurm_timestamp(submit), slurm_timestamp(start))
    return out


# ---------------------------------------------------------------- runner
class PowerSlurm:
    """The node updates of gpuhpc.elastic over one SlurmClient (its runner and ``SLURM_CONF``)."""

    def __init__(self, client: SlurmClient | None = None) -> None:
        self.client = client or SlurmClient(timeout=10.0)

    def nodes(self, names: str | None = None) -> list[PowerNode]:
        res = self.client.run(show_nodes(names), check=False)
        return parse_power_nodes(res.stdout) if res.ok else []

    def update(self, nodes: str, **fields: str) -> bool:
        return self.client.run(update_node(nodes, **fields), check=False).ok

    def down(self, nodes: str, reason: str) -> bool:
        return self.update(nodes, State="DOWN", Reason=reason)

    def drain(self, nodes: str, reason: str) -> bool:
        return self.update(nodes, State="DRAIN", Reason=reason)

    def power_down(self, nodes: str, *, force: bool = True) -> bool:
        return self.update(nodes, State="POWER_DOWN_FORCE" if force else "POWER_DOWN")

    def resume(self, nodes: str) -> bool:
        return self.update(nodes, State="RESUME")

    def jobs_on(self, nodes: str) -> list[tuple[str, str]]:
        res = self.client.run(jobs_on_nodes(nodes), check=False)
        return parse_jobs_on_nodes(res.stdout) if res.ok else []

    def restarts(self, job_id: str) -> int:
        """``Restarts=`` of a job slurmctld knows (0 when it does not)."""
        rec = self.client.show_job(job_id) or {}
        return int(rec["Restarts"]) if rec.get("Restarts", "").isdigit() else 0

    def job_briefs(self, job_ids) -> dict[str, "JobBrief"]:
        """Requeue count, state, submit and start of many jobs: one ``squeue`` per
        :data:`JOB_BRIEF_CHUNK` ids (not one ``scontrol show job`` each); a job squeue no longer
        knows is absent."""
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        out: dict[str, JobBrief] = {}
        for i in range(0, len(ids), JOB_BRIEF_CHUNK):
            res = self.client.run(job_briefs_argv(ids[i:i + JOB_BRIEF_CHUNK]), check=False)
            out.update(parse_job_briefs(res.stdout))
        return out

    def hold_job(self, job_id: str, note: str) -> bool:
        """Hold a (requeued) job, ``Priority=0`` (Reason ``JobHeldAdmin``), with ``note`` as its
        AdminComment, which users cannot change."""
        return self.client.run(hold_job(job_id, note), check=False).ok

    def signal_job(self, job_id: str, signal: str) -> bool:
        """``scancel --signal=SIG --full JOB``: the batch shell too, not only the job's steps."""
        return self.client.run(["scancel", f"--signal={signal}", "--full", str(job_id)], check=False).ok

    def signal_jobs(self, job_ids, signal: str) -> bool:
        """:meth:`signal_job` for many jobs: one ``scancel`` per :data:`JOB_BRIEF_CHUNK` ids."""
        ids = list(dict.fromkeys(str(j) for j in job_ids))
        ok = True
        for i in range(0, len(ids), JOB_BRIEF_CHUNK):
            ok &= self.client.run(["scancel", f"--signal={signal}", "--full", *ids[i:i + JOB_BRIEF_CHUNK]],
                                  check=False).ok
        return ok

    def controllers(self) -> list[ControllerPing]:
        """``scontrol ping``: every SlurmctldHost in order and whether it answers ([] when the
        command gave nothing; it exits 1 when one is DOWN, its lines still parse)."""
        return parse_ping(self.client.run(scontrol_ping(), check=False).stdout)


def spawn_slurmd(name: str, *, conf: str | None = None, log: str = os.devnull) -> int:
    """Start ``slurmd -D -b -N NAME`` detached from the caller (its own session, no inherited
    pipes, so a power program returns at once); returns its pid."""
    conf = conf or os.environ.get("SLURM_CONF")
    env = {**os.environ, **({"SLURM_CONF": conf} if conf else {})}
    env.pop("SLURM_RESUME_FILE", None)
    with open(log, "ab") as out:
        proc = subprocess.Popen(slurmd_argv(name, conf), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True, env=env)
    return proc.pid


def stepd_pids(node: str, proc: str = "/proc") -> list[int]:
    """The slurmstepd processes of node ``node`` on this host (the local provider's reclaim): each
    listens on ``<SlurmdSpoolDir>/<node>_<job>.<step>``, found in ``/proc/net/unix`` and matched to
    the process holding that socket. slurmstepd leads its own session, away from its slurmd."""
    inodes = set()
    try:
        for line in open(f"{proc}/net/unix").read().splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 8 and os.path.basename(parts[7]).startswith(f"{node}_"):
                inodes.add(f"socket:[{parts[6]}]")
    except OSError:
        return []
    pids = []
    for d in os.listdir(proc):
        if not d.isdigit():
            continue
        try:
            if not open(f"{proc}/{d}/comm").read().startswith("slurmstepd"):
                continue
            if any(os.readlink(f"{proc}/{d}/fd/{fd}") in inodes for fd in os.listdir(f"{proc}/{d}/fd")):
                pids.append(int(d))
        except OSError:
            continue
    return pids


