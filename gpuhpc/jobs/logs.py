"""One rank's output of a job: what ``gpuhpc logs JOB --rank N`` prints and follows.

Where each rank's lines are:
- script mode, the multi-rank templates (deepspeed, mpi, torchrun): one log per job, as for every
  job (``<log dir>/<name>-<id>.out``, appended by each run, so a requeued job's later runs land in
  the same file); the templates' ``srun --label`` starts every line a task prints with its task
  number (``"3: "``; padded, ``" 3: "``, when the job has ten tasks or more). In deepspeed and mpi a
  task is a rank (RANK is SLURM_PROCID); in torchrun a task is a node's torchrun with all of its
  workers (the node rank). gpuhpc's own lines (``gpuhpc[HH:MM:SS]: ...``: restarts, signals,
  requeues) and srun's (``srun: ...``) carry no label and are kept with every rank's;
- script mode, a one-task job (the single template): the whole log is rank 0's;
- Python mode (submitit): one file per task already (``<id>_<task>_log.out``), rank N's is read.

Job tasks come from slurmctld (``NumTasks``) while it knows the job, else from the labels the log
holds. A rank that is not a number, negative or past the tasks is a UserInputError naming --rank.
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

from gpuhpc.errors import UserInputError

_LABEL = re.compile(rb"^ *(\d+): ")
_KEPT = (b"gpuhpc[", b"srun: ")           # unlabelled lines every rank's output keeps
_SUBMITIT = re.compile(r"_(?:0|%t)_log\.(out|err)$")


def check_rank(value: Any, tasks: int | None = None, field: str = "--rank") -> int:
    """``value`` as a rank: a whole number >= 0 and below ``tasks`` (when known)."""
    text = str(value).strip()
    if not re.fullmatch(r"\d+", text):
        raise UserInputError(f"{text!r} is not a rank", field=field, hint="a task number: 0, 1, ...")
    rank = int(text)
    if tasks is not None and rank >= tasks:
        raise UserInputError(f"rank {rank} is past the job's {tasks} task(s)", field=field,
                             hint=f"0 to {tasks - 1}")
    return rank


def labels(data: bytes) -> set[int]:
    """The task numbers that label lines of ``data``."""
    out = set()
    for line in data.splitlines():
        m = _LABEL.match(line)
        if m:
            out.add(int(m.group(1)))
    return out


class RankLines:
    """Filters a labelled log to one rank's lines (label removed) and gpuhpc's and srun's own
    lines, chunk by chunk: a line cut between two chunks waits for its end."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._partial = b""

    def _line(self, line: bytes) -> bytes:
        m = _LABEL.match(line)
        if m:
            return line[m.end():] if int(m.group(1)) == self.rank else b""
        return line if line.startswith(_KEPT) else b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        return b"".join(self._line(x + b"\n") for x in lines)

    def flush(self) -> bytes:
        rest, self._partial = self._partial, b""
        return self._line(rest) if rest else b""


def filter_rank(data: bytes, rank: int) -> bytes:
    """``data`` (a whole labelled log) reduced to rank ``rank``'s lines."""
    f = RankLines(rank)
    return f.feed(data) + f.flush()


def submitit_rank_path(path: str | None, rank: int, job_id: str = "") -> str | None:
    """Python mode's log of task ``rank`` next to task 0's (``..._0_log.out``); None for a log
    that is not submitit's."""
    if not path or not _SUBMITIT.search(path):
        return None
    return _SUBMITIT.sub(lambda m: f"_{rank}_log.{m.group(1)}", path.replace("%j", job_id))


def slurm_tasks(rec: dict[str, str] | None) -> int | None:
    """``NumTasks`` of the job's ``scontrol show job`` record (None: not known)."""
    text = (rec or {}).get("NumTasks", "")
    text = text.split("-", 1)[0]
    return int(text) if text.isdigit() and int(text) > 0 else None


class RankLog:
    """Rank ``rank`` of ``job`` (a :class:`~gpuhpc.jobs.handle.Job`): checked against the job's
    tasks on creation (UserInputError naming --rank)."""

    def __init__(self, job: Any, rank: Any) -> None:
        self.job = job
        rank = check_rank(rank)
        rec = job.client.show_job(job.job_id)
        self.path = job.log_path(rec)
        self.own_file = submitit_rank_path(self.path, rank, job.job_id)
        tasks = slurm_tasks(rec)
        if self.own_file is None and tasks is None:      # slurmctld forgot the job: what the log says
            data = self._read(self.path, 0) if self.path else b""
            found = labels(data)
            tasks = max(found) + 1 if found else 1
        if self.own_file is not None and tasks is None and rank > 0 and not self._exists(self.own_file):
            tasks = 1
        self.tasks = tasks
        self.rank = check_rank(rank, tasks)
        self.labelled = self.own_file is None and (tasks or 1) > 1

    def _read(self, path: str, offset: int) -> bytes:
        return self.job.client.runner.read_from(path, offset)

    def _exists(self, path: str) -> bool:
        return bool(self._read(path, 0))

    @property
    def file(self) -> str | None:
        """The file this rank's lines are in."""
        return self.own_file or self.path

    def text(self) -> bytes:
        if not self.file:
            return b""
        data = self._read(self.file, 0)
        return filter_rank(data, self.rank) if self.labelled else data

    def follow(self, poll: float = 0.5, check_every: float = 3.0) -> Iterator[bytes]:
        """The rank's output as the job writes it, until the job is finished: through its
        requeues (each run appends to the same file), a poll reading only the new bytes."""
        lines = RankLines(self.rank) if self.labelled else None
        offset, last_check = 0, 0.0
        while True:
            finished = False
            now = time.monotonic()
            if now - last_check > check_every:
                last_check = now
                finished = self.job.done()          # decided before the last read: nothing is lost
            chunk = self._read(self.file, offset) if self.file else b""
            if chunk:
                offset += len(chunk)
                out = lines.feed(chunk) if lines else chunk
                if out:
                    yield out
            if finished:
                rest = lines.flush() if lines else b""
                if rest:
                    yield rest
                return
            time.sleep(poll)
