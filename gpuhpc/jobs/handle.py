"""The :class:`Job` handle: a submitted job's state, result, logs and cancellation.

Every way to submit (:func:`gpuhpc.jobs.api.submit`, script mode in
:mod:`gpuhpc.jobs.script_mode`, Python mode and arrays in :mod:`gpuhpc.jobs.python_mode`)
hands back a :class:`Job`. It asks Slurm through its :class:`~gpuhpc.slurm.client.SlurmClient`:
``scontrol show job``/``squeue`` while slurmctld knows the job, ``sacct`` after.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from typing import Any

from gpuhpc.errors import GpuhpcError, JobFailed, UserInputError
from gpuhpc.jobs.spec import default_log_dir
from gpuhpc.slurm.state import JobState, SlurmState

_JOB_ID = re.compile(r"^\d+(_\d+)?$")


def check_job_id(job_id: Any) -> str:
    text = str(job_id).strip()
    if not _JOB_ID.match(text):
        raise UserInputError(f"{text!r} is not a Slurm job id", field="job_id", hint="e.g. 1234 or 1234_5")
    return text


def slurm_client(client=None):
    """``client``, else a :class:`~gpuhpc.slurm.client.SlurmClient` on the default runner."""
    if client is not None:
        return client
    from gpuhpc.slurm.client import SlurmClient

    return SlurmClient()


def _short_time(text: str) -> str:
    """scontrol's ``00:01:02`` as squeue prints it (``1:02``; ``1:01:02``, ``1-01:01:02`` kept)."""
    if "-" in text or text.count(":") != 2:
        return text
    if text.startswith("00:"):
        text = text[3:]
    return text[1:] if len(text) > 4 and text[0] == "0" and text[2] == ":" else text


class Job:
    """A submitted job. ``state`` is a :class:`JobState`; ``slurm_state`` keeps the raw
    string Slurm printed. PREEMPTED, REQUEUED and NODE_FAIL are never "finished": a
    requeueable job comes back."""

    def __init__(self, job_id: str, *, client=None, name: str | None = None,
                 submitit_job: Any = None, log_path: str | None = None) -> None:
        self.job_id = check_job_id(job_id)
        self._client = client
        self.name = name
        self.submitit_job = submitit_job
        self._log_path = log_path
        self.snapshot = None            # where the code snapshot is (gpuhpc.jobs.snapshot.Uploaded)
        self.remote_call = None         # Python mode over SSH: where its files are (gpuhpc.jobs.remote)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, name={self.name!r})"

    @property
    def client(self):
        if self._client is None:
            self._client = slurm_client()
        return self._client

    # ------------------------------------------------------------ state
    def info(self) -> dict[str, Any]:
        """State and accounting facts: from squeue while the job is known there, else sacct."""
        rows = [r for r in self.client.queue(job_ids=[self.job_id]) if r.job_id == self.job_id]
        if rows:
            r = rows[0]
            return {"job_id": self.job_id, "name": r.name, "state": r.state.state.value,
                    "raw_state": r.state.raw, "reason": r.reason, "elapsed": r.elapsed,
                    "time_limit": r.time_limit, "nodes": r.nodes, "nodelist": r.nodelist,
                    "partition": r.partition, "account": r.account, "user": r.user,
                    "tres_per_node": r.tres_per_node, "source": "squeue"}
        acct = [a for a in self.client.accounting(job_ids=[self.job_id]) if a.job_id == self.job_id]
        if acct:
            a = acct[-1]
            return {"job_id": self.job_id, "name": a.name, "state": a.state.state.value,
                    "raw_state": a.state.raw, "reason": "", "elapsed_s": a.elapsed_s,
                    "time_limit": a.time_limit, "nodelist": a.nodelist, "partition": a.partition,
                    "account": a.account, "user": a.user, "exit_code": a.exit_code,
                    "gpus": a.gpus, "source": "sacct"}
        return {"job_id": self.job_id, "state": JobState.UNKNOWN.value, "raw_state": "", "source": "none"}

    def status(self) -> dict[str, Any]:
        """:meth:`info` plus ``restarts``, ``finished`` and ``log`` (what ``gpuhpc status``
        prints), asking Slurm one question: slurmctld (``scontrol show job``) while it knows the
        job, else slurmdbd (one ``sacct --duplicates``: state and restarts from the same rows).
        Raises GpuhpcError when neither knows the job."""
        client = self.client
        rec = client.show_job(self.job_id)
        if rec:
            info = self._info_from_record(rec)
            info["restarts"] = self.restarts(rec)
            info["finished"] = self._done(JobState(info["state"]), rec)
            info["log"] = self.log_path(rec)
        else:
            runs = [a for a in client.accounting(job_ids=[self.job_id], duplicates=True) if a.job_id == self.job_id]
            if not runs:
                raise GpuhpcError(f"job {self.job_id} not found in squeue or sacct")
            a = runs[-1]
            info = {"job_id": self.job_id, "name": a.name, "state": a.state.state.value,
                    "raw_state": a.state.raw, "reason": "", "elapsed_s": a.elapsed_s,
                    "time_limit": a.time_limit, "nodelist": a.nodelist, "partition": a.partition,
                    "account": a.account, "user": a.user, "exit_code": a.exit_code,
                    "gpus": a.gpus, "source": "sacct"}
            info["restarts"] = len(runs) - 1
            # slurmctld has forgotten it: no requeue can bring it back
            info["finished"] = a.state.state.is_finished or a.state.state in (JobState.PREEMPTED, JobState.NODE_FAIL)
            info["log"] = self._known_log_path()
        if rec and "Minutes" in (rec.get("Reason") or ""):      # held by a budget: in words
            from gpuhpc.ledger import budget

            try:
                limit = int(rec.get("TimeLimit_s") or 0) or None
            except ValueError:
                limit = None
            if limit is None:
                from gpuhpc.slurm.durations import reported_seconds

                try:
                    limit = reported_seconds(rec.get("TimeLimit", "")) or None
                except GpuhpcError:
                    limit = None
            text = budget.explain_reason(rec.get("Reason"), account=rec.get("Account"),
                                         user=(rec.get("UserId") or "").split("(", 1)[0] or None,
                                         partition=rec.get("Partition"), tres_per_node=rec.get("TresPerNode"),
                                         nodes=int(rec.get("NumNodes", "1").split("-")[0] or 1),
                                         time_limit_s=limit)
            if text:
                info["budget"] = text
        return info

    def _info_from_record(self, rec: dict[str, str]) -> dict[str, Any]:
        """:meth:`info`'s fields from the job's ``scontrol show job`` record (times as squeue
        prints them)."""
        st = SlurmState.parse(rec.get("JobState", ""))
        nodes = (rec.get("NumNodes") or "1").split("-")[0]
        nodelist = rec.get("NodeList", "")
        return {"job_id": self.job_id, "name": rec.get("JobName", ""), "state": st.state.value, "raw_state": st.raw,
                "reason": rec.get("Reason", ""), "elapsed": _short_time(rec.get("RunTime", "")),
                "time_limit": _short_time(rec.get("TimeLimit", "")), "nodes": int(nodes) if nodes.isdigit() else 1,
                "nodelist": "" if nodelist == "(null)" else nodelist, "partition": rec.get("Partition", ""),
                "account": rec.get("Account", ""), "user": (rec.get("UserId") or "").split("(", 1)[0],
                "tres_per_node": rec.get("TresPerNode", "N/A"), "source": "slurmctld"}

    @property
    def slurm_state(self) -> SlurmState:
        info = self.info()
        return SlurmState(JobState(info["state"]), info.get("raw_state", ""))

    @property
    def state(self) -> JobState:
        return self.slurm_state.state

    def restarts(self, rec: dict[str, str] | None = None) -> int:
        """How many times the job was requeued (``rec``: its ``scontrol show job`` record, when
        the caller has it)."""
        if rec and rec.get("Restarts", "").isdigit():
            return int(rec["Restarts"])
        return self.client.restarts(self.job_id)

    def done(self) -> bool:
        return self._done(self.state)

    def _done(self, st: JobState, rec: dict[str, str] | None = None) -> bool:
        if st.is_finished:
            return True
        if st in (JobState.PREEMPTED, JobState.NODE_FAIL):
            rec = rec or self.client.show_job(self.job_id)      # not requeueable (cap reached)
            return bool(rec) and rec.get("Requeue") == "0"
        return False

    def wait(self, timeout: float | None = None, poll: float = 2.0, max_poll: float = 30.0) -> JobState:
        """Block until the job is finished; returns the final state. Every wait in the process on
        one cluster shares one watcher (:func:`gpuhpc.jobs.watch.wait`): one ``squeue`` per round
        for all the jobs waited on (``sacct`` for those slurmctld has forgotten), rounds ``poll``
        seconds apart at first, further apart (up to ``max_poll``) while nothing changes.
        TimeoutError after ``timeout`` seconds."""
        from gpuhpc.jobs import watch

        return watch.wait(self, timeout=timeout, poll=poll, max_poll=max_poll)

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then return the callable's result (Python mode) or None (script mode).
        Raises :class:`JobFailed` when the job did not complete."""
        final = self.wait(timeout)
        if self.submitit_job is not None:
            return self.submitit_job.result()
        if self.remote_call is not None:
            from gpuhpc.jobs.remote import load_result

            return load_result(self.client.runner, self.remote_call, self.job_id)
        if final is not JobState.COMPLETED:
            raise JobFailed(f"job {self.job_id} ended {final.value}", hint=f"gpuhpc logs {self.job_id}")
        return None

    def cancel(self) -> None:
        self.client.cancel(self.job_id)

    # ------------------------------------------------------------ logs
    def log_path(self, rec: dict[str, str] | None = None) -> str | None:
        """StdOut= from ``scontrol show job`` (``rec``, when the caller has it) while Slurm knows
        the job, else the path recorded at submission, else a ``*-<id>.out`` file in the default
        log dir."""
        rec = rec or self.client.show_job(self.job_id)
        if rec and rec.get("StdOut"):
            return rec["StdOut"]
        return self._known_log_path()

    def _known_log_path(self) -> str | None:
        """:meth:`log_path` without asking Slurm: the path recorded at submission, else a
        ``*-<id>.out`` file in the default log dir."""
        if self._log_path:
            return self._log_path
        d = default_log_dir()
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(f"-{self.job_id}.out"))
        except FileNotFoundError:
            names = []
        if names:
            return os.path.join(d, names[0])
        sub = os.path.join(d, "submitit", self.job_id, f"{self.job_id}_0_log.out")
        return sub if os.path.exists(sub) else None

    def logs(self) -> str:
        """The job's output; a separate stderr file (submitit jobs) is appended."""
        rec = self.client.show_job(self.job_id)
        paths = [self.log_path(rec)]
        if rec and rec.get("StdErr") and rec.get("StdErr") != rec.get("StdOut"):
            paths.append(rec["StdErr"])
        elif self.submitit_job is not None:
            paths.append(str(self.submitit_job.paths.stderr))
        return "".join(self.read_text(p) for p in paths if p)

    def follow_log(self, poll: float = 0.5, check_every: float = 3.0) -> Iterator[bytes]:
        """The job's output as it grows, until the job is finished: each poll reads only the
        bytes after the last read (locally, or over SSH through the job's runner)."""
        path, offset, last_check = None, 0, 0.0
        while True:
            path = path or self.log_path()
            if path:
                chunk = self.client.runner.read_from(path, offset)
                if chunk:
                    offset += len(chunk)
                    yield chunk
            now = time.monotonic()
            if now - last_check > check_every:
                last_check = now
                if self.done():
                    if path:                        # what was written before the end
                        chunk = self.client.runner.read_from(path, offset)
                        if chunk:
                            yield chunk
                    return
            time.sleep(poll)

    def read_text(self, path: str) -> str:
        """Read a log file where the job's Slurm client runs (locally, or over SSH when
        GPUHPC_SSH_HOST is set); a file that does not exist yet reads as empty."""
        from gpuhpc.errors import TransportError

        try:
            return self.client.runner.read_file(path)
        except TransportError:
            return ""
