"""SlurmClient: the one object through which gpuhpc talks to Slurm.

It combines the pure builders (:mod:`gpuhpc.slurm.commands`), the pure parsers
(:mod:`gpuhpc.slurm.parsers`) and a :class:`~gpuhpc.transport.Runner` (local subprocess or
SSH). Jobs, nodes, partitions and accounting are read through one of three transports, chosen
once per client (:attr:`SlurmClient.transport`):

- ``pyslurm``: Slurm's C API in-process (:mod:`gpuhpc.slurm.pyslurm_reads`), on a local runner
  where an importable pyslurm has the running Slurm's major.minor (PyPI has pyslurm 25.11 only);
- ``json``: ``squeue/sacct --json`` on Slurm >= 23.02;
- ``cli``: the framed text parsers (Slurm 22.05, whose ``--json`` drops rows).

``GPUHPC_SLURM_TRANSPORT`` (auto | pyslurm | json | cli) forces one; :attr:`SlurmClient.calls`
counts which transport served each read.
"""
from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import functools
import os
import posixpath
from collections.abc import Iterable, Sequence

from typing import TYPE_CHECKING

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError, SlurmError, TransportError, UserInputError
from gpuhpc.slurm import commands as cmd
from gpuhpc.transport import CommandResult, Runner, default_runner

JOB_STARTERS = frozenset({"sbatch", "srun", "salloc"})   # their environment becomes the job's
TRANSPORTS = ("pyslurm", "json", "cli")
TRANSPORT_ENV = "GPUHPC_SLURM_TRANSPORT"
JSON_SINCE = (23, 2)          # the first Slurm whose squeue/sacct --json keep every row and filter

if TYPE_CHECKING:
    from gpuhpc.slurm import parsers


def _row_tag() -> str:
    """A random string per Slurm call that frames rows/fields of its output (a job name cannot
    hold it: it is unknown when the name is set)."""
    import secrets

    return "\x1e" + secrets.token_hex(12)


def _dotted(version: tuple[int, int, int]) -> str:
    return f"{version[0]}.{version[1]:02d}.{version[2]}"


def _parsers():
    # imported on first use: `gpuhpc submit` needs only parse_sbatch_parsable, and building the
    # parsers' dataclasses costs milliseconds of CLI start-up
    from gpuhpc.slurm import parsers

    return parsers


class SlurmClient:
    def __init__(self, runner: Runner | None = None, *, timeout: float = 60.0,
                 transport: str | None = None) -> None:
        self.runner = runner or default_runner()
        self.timeout = timeout
        if transport is not None and transport not in (*TRANSPORTS, "auto"):
            raise UserInputError(f"transport: unknown {transport!r}; use one of auto, {', '.join(TRANSPORTS)}")
        self._transport_choice = transport
        #: {(read, transport): count}: which transport served each read ("queue", "nodes",
        #: "partitions", "accounting"), e.g. calls[("queue", "pyslurm")]
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

    # ------------------------------------------------------------ plumbing
    def run(self, argv: list[str], *, input: str | None = None, check: bool = True,
            timeout: float | None = None, env: dict[str, str] | None = None) -> CommandResult:
        # times in the one format the parsers read (ISO 8601), whatever the user's SLURM_TIME_FORMAT;
        # not for a command that starts a job, which would hand the pin on to the job's environment
        if not JOB_STARTERS.intersection(posixpath.basename(a) for a in argv[:4]):
            env = {"SLURM_TIME_FORMAT": "standard", **(env or {})}
        res = self.runner.run(argv, input=input, timeout=timeout or self.timeout, env=env)
        if check and not res.ok:
            raise SlurmError(f"{argv[0]} failed (exit {res.returncode})", argv=argv,
                             stderr=res.stderr or res.stdout, returncode=res.returncode)
        return res

    @functools.cached_property
    def version(self) -> tuple[int, int, int]:
        """The Slurm tools' version (``sinfo --version``); on a local runner remembered per
        ``sinfo`` binary (path, size, mtime) in the user's cache, so a CLI start-up pays no
        subprocess for it."""
        from gpuhpc.slurm import versions

        if self.runner.is_local:
            getenv = getattr(self.runner, "getenv", os.environ.get)
            return versions.local_version(getenv("PATH"),
                                          lambda: self.run(cmd.sinfo_version()).stdout)
        return _parsers().parse_version(self.run(cmd.sinfo_version()).stdout)

    # ------------------------------------------------------------ transports
    @functools.cached_property
    def transport(self) -> str:
        """Which transport this client reads jobs, nodes, partitions and accounting through:
        ``pyslurm`` (a local runner, pyslurm importable with the running Slurm's major.minor and
        this process's ``SLURM_CONF``), else ``json`` (Slurm >= 23.02), else ``cli``. Forced by the
        constructor's ``transport`` or ``GPUHPC_SLURM_TRANSPORT``; a forced one that cannot work
        is refused (UserInputError)."""
        choice = self._transport_choice or getenv(TRANSPORT_ENV)
        field = "transport" if self._transport_choice else TRANSPORT_ENV
        if choice not in (*TRANSPORTS, "auto"):
            raise UserInputError(f"{field}: unknown {choice!r}; use one of auto, {', '.join(TRANSPORTS)}")
        if choice == "cli":
            return "cli"
        if choice in ("auto", "pyslurm"):
            why = self._pyslurm_unusable()
            if why is None:
                return "pyslurm"
            if choice == "pyslurm":
                raise UserInputError(f"{field}: pyslurm cannot be used here: {why}; unset it or choose cli")
        try:
            version = self.version
        except GpuhpcError:             # no sinfo to ask: the text parsers, which need no version
            if choice == "json":
                raise
            return "cli"
        if version[:2] >= JSON_SINCE:
            return "json"
        if choice == "json":
            raise UserInputError(f"{field}: json needs Slurm >= 23.02 (this is {_dotted(version)}); use cli")
        return "cli"

    def _pyslurm_unusable(self) -> str | None:
        """None when pyslurm can serve this client's reads, else why not (one phrase)."""
        from gpuhpc.slurm import pyslurm_reads

        if not self.runner.is_local:
            return "the runner is not local"
        getenv = getattr(self.runner, "getenv", os.environ.get)
        if (getenv("SLURM_CONF") or None) != (os.environ.get("SLURM_CONF") or None):
            return "this client's SLURM_CONF is not the process's (pyslurm reads the process's)"
        found = pyslurm_reads.available_version()
        if found is None:
            return "it is not installed (or does not import)"
        try:
            version = self.version
        except GpuhpcError as exc:
            return f"the running Slurm's version is unknown ({exc})"
        if found[:2] != version[:2]:
            return f"pyslurm {_dotted(found)} does not match Slurm {_dotted(version)}"
        return None

    def _served(self, read: str) -> str:
        transport = self.transport
        self.calls[(read, transport)] += 1
        return transport

    # ------------------------------------------------------------ cluster
    def nodes(self) -> list[parsers.NodeInfo]:
        if self._served("nodes") == "pyslurm":
            from gpuhpc.slurm import pyslurm_reads

            return pyslurm_reads.nodes()
        return _parsers().parse_nodes(self.run(cmd.scontrol_show("node")).stdout)

    def partitions(self) -> list[parsers.PartitionInfo]:
        if self._served("partitions") == "pyslurm":
            from gpuhpc.slurm import pyslurm_reads

            return pyslurm_reads.partitions()
        return _parsers().parse_partitions(self.run(cmd.scontrol_show("partition")).stdout)

    def topology(self) -> list[dict[str, str]]:
        return _parsers().parse_oneliner_records(self.run(cmd.scontrol_show("topology")).stdout)

    def config(self) -> dict[str, str]:
        """``scontrol show config`` as a dict (``Key = Value`` lines)."""
        return _parsers().parse_show_config(self.run(cmd.scontrol_show_config()).stdout)

    def cluster_name(self) -> str:
        """The cluster's name as Slurm's accounting records it (lower-cased ClusterName), or
        "" when unset. Read from the local slurm.conf when this client runs commands locally
        (a file read instead of a ~7 ms ``scontrol show config`` on every submit), else, and
        when the file is absent (configless) or uses Include, from ``scontrol``."""
        if self.runner.is_local:
            try:
                text = self.runner.read_file(self.runner.getenv("SLURM_CONF") or "/etc/slurm/slurm.conf")
            except TransportError:
                text = None
            value = _parsers().slurm_conf_value(text, "ClusterName") if text is not None else None
            if value is not None:
                return value.lower()
        return self.config().get("ClusterName", "")

    def node(self, name: str) -> parsers.NodeInfo | None:
        """One node (``scontrol show node NAME``); None when Slurm does not know it."""
        res = self.run(cmd.scontrol_show("node", name), check=False)
        if not res.ok:
            if "not found" in (res.stderr + res.stdout).lower():
                return None
            raise SlurmError("scontrol show node failed", argv=list(res.argv), stderr=res.stderr)
        nodes = _parsers().parse_nodes(res.stdout)
        return nodes[0] if nodes else None

    def drain_node(self, name: str, reason: str) -> None:
        """Drain ``name`` (running jobs finish, no new ones start) with ``reason``."""
        self.run(cmd.scontrol_update_node(name, "DRAIN", reason))

    def resume_node(self, name: str) -> None:
        """Undo a drain (``State=RESUME``)."""
        self.run(cmd.scontrol_update_node(name, "RESUME"))

    # ------------------------------------------------------------ jobs
    def submit_script(self, script: str, *, extra: Sequence[str] = (), workdir: str | None = None,
                      script_dir: str | None = None) -> str:
        """Submit a batch script's text; returns the job id.

        With ``script_dir`` the script is first written there (kept for provenance and
        re-submission); otherwise it is passed on stdin.
        """
        if script_dir:
            import uuid

            path = posixpath.join(script_dir, f"gpuhpc-{uuid.uuid4().hex[:12]}.sbatch")
            self.runner.write_file(path, script, 0o755)
            argv = cmd.sbatch(path, extra=[*(["--chdir", workdir] if workdir else []), *extra])
            return _parsers().parse_sbatch_parsable(self.run(argv).stdout)
        argv = cmd.sbatch(None, extra=[*(["--chdir", workdir] if workdir else []), *extra])
        return _parsers().parse_sbatch_parsable(self.run(argv, input=script).stdout)

    def queue(self, *, user: str | None = None, job_ids: Iterable[str] = ()) -> list[parsers.QueueRow]:
        ids = [str(j) for j in job_ids]
        served = self._served("queue")
        if served == "pyslurm":
            from gpuhpc.slurm import pyslurm_reads

            return pyslurm_reads.queue(user=user, job_ids=ids)
        if served == "json":
            res = self.run(cmd.squeue_json(user=user, job_ids=ids), check=False)
            if not res.ok:
                if ids and "Invalid job id" in (res.stderr + res.stdout):
                    return []
                raise SlurmError("squeue failed", argv=list(res.argv), stderr=res.stderr, returncode=res.returncode)
            return _parsers().parse_squeue_json(res.stdout, user=user, job_ids=ids)
        tag = _row_tag()
        argv, fmt = cmd.squeue(user=user, job_ids=ids, row_tag=tag), cmd.squeue_format(tag)
        if self.runner.is_local:      # the environment of a local process: readable by its user only
            res = self.run(argv, check=False, env={"SQUEUE_FORMAT": fmt})
        else:                         # over SSH an environment is a command line: send it on stdin
            res = self.run(cmd.env_from_stdin("SQUEUE_FORMAT", argv), check=False, input=fmt + "\n")
        if not res.ok:
            # squeue exits 1 with "Invalid job id specified" once a job has left the queue
            if ids and "Invalid job id" in (res.stderr + res.stdout):
                return []
            raise SlurmError("squeue failed", argv=list(res.argv), stderr=res.stderr, returncode=res.returncode)
        return _parsers().parse_squeue(res.stdout, row_tag=tag)

    def accounting(self, *, job_ids: Iterable[str] = (), user: str | None = None,
                   all_users: bool = False, since: str | None = None, until: str | None = None,
                   duplicates: bool = False, allocations: bool = True) -> list[parsers.AcctRow]:
        served = self.transport
        if served == "pyslurm" and (duplicates or not allocations):
            # pyslurm.db has no --duplicates and gpuhpc reads steps nowhere through it: the next transport
            served = "json" if self.version[:2] >= JSON_SINCE else "cli"
        self.calls[("accounting", served)] += 1
        if served == "pyslurm":
            from gpuhpc.slurm import pyslurm_reads

            return pyslurm_reads.accounting(job_ids=[str(j) for j in job_ids], user=user, all_users=all_users,
                                            since=since, until=until)
        if served == "json":
            argv = cmd.sacct_json(job_ids=job_ids, user=user, all_users=all_users, since=since, until=until,
                                  duplicates=duplicates, allocations=allocations)
            return _parsers().parse_sacct_json(self.run(argv).stdout, allocations=allocations)
        sep = cmd.SEP + _row_tag()
        argv = cmd.sacct(job_ids=job_ids, user=user, all_users=all_users, since=since, until=until,
                         duplicates=duplicates, allocations=allocations, delimiter=sep)
        return _parsers().parse_sacct(self.run(argv).stdout, sep=sep)

    def show_job(self, job_id: str) -> dict[str, str] | None:
        res = self.run(cmd.scontrol_show("job", job_id), check=False)
        if not res.ok:
            if "Invalid job id" in (res.stderr + res.stdout):
                return None
            raise SlurmError("scontrol show job failed", argv=list(res.argv), stderr=res.stderr)
        recs = _parsers().parse_oneliner_records(res.stdout)
        return recs[0] if recs else None

    def job_gpu_indexes(self, job_id: str) -> dict[str, list[int]]:
        """{node: GRES indexes} a running job holds (``scontrol -d show job``; {} when unknown)."""
        res = self.run(cmd.scontrol_show_job_detail(job_id), check=False)
        if not res.ok:
            if "Invalid job id" in (res.stderr + res.stdout):
                return {}
            raise SlurmError("scontrol show job failed", argv=list(res.argv), stderr=res.stderr)
        return _parsers().parse_job_gpu_indexes(res.stdout)

    def restarts(self, job_id: str) -> int:
        """How many times a job was requeued: ``Restarts=`` from scontrol while the job is
        known to slurmctld, else the number of earlier runs ``sacct --duplicates`` lists."""
        rec = self.show_job(job_id)
        if rec and rec.get("Restarts", "").isdigit():
            return int(rec["Restarts"])
        rows = [r for r in self.accounting(job_ids=[job_id], duplicates=True) if r.job_id == str(job_id)]
        return max(0, len(rows) - 1)

    def cancel(self, job_id: str, *, signal: str | None = None, full: bool = False) -> None:
        self.run(cmd.scancel(job_id, signal=signal, full=full))

    def requeue(self, job_id: str, *, hold: bool = False) -> None:
        self.run(cmd.scontrol_requeue(job_id, hold=hold))

    def update_job(self, job_id: str, **fields: str) -> None:
        self.run(cmd.scontrol_update_job(job_id, **fields))

    def job_records(self) -> int:
        """How many job records slurmctld holds now (what MaxJobCount bounds)."""
        return sum(1 for line in self.run(cmd.squeue_records()).stdout.splitlines() if line.strip())

    def submit_limits(self, user: str | None = None, account: str | None = None,
                      qos: str | None = None) -> parsers.SubmitLimits:
        """MaxArraySize and MaxJobCount from the controller; MaxSubmitJobs (and the user's
        current count) from slurmctld's association manager for ``user`` (in ``account``, with
        ``qos``), when accounting enforces limits. Two ``scontrol`` calls, no slurmdbd query."""
        p = _parsers()
        config = self.config()
        text = ""
        if user:
            res = self.run(cmd.scontrol_show_assoc_mgr(user), check=False)
            text = res.stdout if res.ok else ""
        return p.parse_submit_limits(config, text, user=user, account=account, qos=qos)

    def assoc_budgets(self, accounts: Iterable[str]) -> list[parsers.AssocBudget]:
        """``GrpTRESMins`` limits and usage of these accounts' associations (slurmctld's cache)."""
        names = sorted(set(accounts))
        if not names:
            return []
        res = self.run(cmd.scontrol_show_assoc_mgr_accounts(names), check=False)
        return _parsers().parse_assoc_tres_mins(res.stdout if res.ok else "")

    # ------------------------------------------------------------ accounting admin
    def sacctmgr(self, *words: str, check: bool = True) -> CommandResult:
        return self.run(cmd.sacctmgr(*words), check=check)

    def sacctmgr_list(self, entity: str, *filters: str, fields: Sequence[str]) -> list[dict[str, str]]:
        out = self.run(cmd.sacctmgr_list(entity, *filters, fields=fields)).stdout
        return _parsers().parse_parsable2(out, list(fields))

    def sacctmgr_add(self, entity: str, name: str, settings: Sequence[tuple[str, str]] = (), *,
                     dry_run: bool = False) -> list[str]:
        """``sacctmgr -i add``; returns the command line it ran (or, with ``dry_run``, would run)."""
        argv = cmd.sacctmgr_add(entity, name, settings)
        if not dry_run:
            self.run(argv)
        return argv

    def sacctmgr_modify(self, entity: str, where: Sequence[tuple[str, str]], settings: Sequence[tuple[str, str]],
                        *, dry_run: bool = False) -> list[str]:
        """``sacctmgr -i modify ... where ... set ...``; returns the command line."""
        argv = cmd.sacctmgr_modify(entity, where, settings)
        if not dry_run:
            self.run(argv)
        return argv

    def sacctmgr_delete(self, entity: str, where: Sequence[tuple[str, str]], *, check: bool = True) -> CommandResult:
        return self.run(cmd.sacctmgr_delete(entity, where), check=check)

    # ------------------------------------------------------------ accounting for billing
    def job_runs(self, since: dt.datetime, until: dt.datetime | None = None,
                 job_ids: Iterable[str] = (), clusters: Sequence[str] = ()) -> list[parsers.AcctRow]:
        """Every run of every user's jobs (``sacct --allusers --allocations --duplicates``:
        a requeued job's runs each have their own row) that overlaps ``[since, until)``.
        What is billed comes from a query without any free-text field (nothing a user names can
        add, drop or change a row); names come from a second query by job id, the name last with
        a per-call delimiter. (22.05's ``sacct --json`` silently drops every job after one it
        cannot serialise, e.g. one whose QOS was deleted: not for billing.)

        ``job_ids`` are also asked for by id: the time-window query lists a job only once
        slurmdbd has its eligible time, and never lists a job that was cancelled before it
        became eligible.

        ``clusters``: these clusters' jobs (``sacct --clusters``, one slurmdbd serving them all;
        each row names its cluster); empty: the cluster this client's slurm.conf names."""
        p = _parsers()
        fields = cmd.SACCT_RUN_FIELDS
        on = ",".join(clusters) or None

        def local(t: dt.datetime) -> str:       # sacct reads times in the host's local zone
            return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

        def runs(**query) -> list[parsers.AcctRow]:
            billed = tuple(f for f in fields if f != "JobName")
            rows = p.parse_sacct(self.run(cmd.sacct(fields=billed, all_users=True, allocations=True,
                                                    duplicates=True, cluster=on, **query)).stdout, fields=billed)
            if "JobName" in fields and rows:
                sep = cmd.SEP + _row_tag()
                named = {}
                for c in clusters or (None,):       # per cluster: job ids repeat across clusters
                    named[c] = p.parse_sacct_names(self.run(cmd.sacct(
                        fields=("JobIDRaw", "JobName"), delimiter=sep, all_users=True, allocations=True,
                        duplicates=True, cluster=c, **query)).stdout, sep=sep)
                rows = [dataclasses.replace(r, name=named.get(r.cluster if clusters else None, {}).get(r.job_id_raw, ""))
                        for r in rows]
            return rows

        rows = runs(since=local(since), until=local(until) if until else None)
        seen = {r.array_job_id for r in rows}
        missing = sorted({str(j) for j in job_ids} - seen)
        for i in range(0, len(missing), 200):
            rows += runs(job_ids=missing[i:i + 200])
        return rows

    def active_job_ids(self, job_ids: Iterable[str]) -> set[str] | None:
        """Which of ``job_ids`` (array job ids) squeue still shows unfinished; None when
        squeue could not say."""
        ids = sorted({str(j) for j in job_ids})
        if not ids:
            return set()
        try:
            rows = self.queue(job_ids=ids)
        except GpuhpcError:
            return None
        return {(r.array_job_id or r.job_id_raw or r.job_id).split("_")[0] for r in rows
                if not r.state.state.is_finished}

    # ------------------------------------------------------------ sweeps (gpuhpc.sweeps.submission, refresh)
    def set_array_throttle(self, job_id: str, limit: int) -> bool:
        """``scontrol update JobId=ARRAY ArrayTaskThrottle=N``: how many of the array's tasks
        may run at once. True when slurmctld took it for the tasks still pending (it reports
        the finished ones separately, with a non-zero exit)."""
        res = self.run(cmd.scontrol_update_job(str(job_id), ArrayTaskThrottle=str(int(limit))), check=False)
        return res.ok or "No error" in (res.stdout + res.stderr)

    def jobs_by_name(self, name: str, since: dt.datetime, user: str | None = None) -> list[str]:
        """The (array) job ids of ``user``'s jobs called ``name`` that squeue or, once they left
        the queue, sacct (submitted since ``since``) knows; raises SlurmError when either
        cannot say."""
        ids = {(r.array_job_id or r.job_id).split("_")[0] for r in self.queue(user=user) if r.name == name}
        if not ids:
            local = since.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
            ids = {(r.array_job_id or r.job_id).split("_")[0] for r in self.accounting(user=user, since=local)
                   if r.name == name}
        return sorted(i for i in ids if i)

    def node_addresses(self, partition: str | None = None) -> list[str]:
        """The ``NodeAddr`` of every node (of ``partition``): where a job there would run."""
        argv = ["sinfo", "--noheader", "--Node", "--format=%o", *([f"--partition={partition}"] if partition else [])]
        return sorted({line.strip() for line in self.run(argv).stdout.splitlines() if line.strip()})

    # ------------------------------------------------------------ ledger check (issue 34)
    def partition_billing_weights(self) -> dict[str, str | None]:
        """Each partition's ``TRESBillingWeights`` in the running slurmctld (None: none set)."""
        return _parsers().parse_partition_billing_weights(self.run(cmd.scontrol_show("partition")).stdout)

    def assoc_usage(self, accounts: Iterable[str]) -> list[parsers.AssocUsage]:
        """These accounts' associations in slurmctld's cache: ``GrpTRESMins`` limits and usage and
        the running jobs' ``GrpTRESRunMins`` (an account slurmctld does not know has no rows)."""
        names = sorted(set(accounts))
        if not names:
            return []
        res = self.run(cmd.scontrol_show_assoc_mgr_accounts(names), check=False)
        return _parsers().parse_assoc_usage(res.stdout if res.ok else "")

    def qos_usage(self, names: Iterable[str]) -> list[parsers.QosUsage]:
        """These QOS in slurmctld's cache: ``GrpTRESMins`` limits and usage and the running jobs'
        ``GrpTRESRunMins`` (the ledger's qos mode; a QOS slurmctld does not know has no row)."""
        names = sorted(set(names))
        if not names:
            return []
        res = self.run(cmd.scontrol_show_assoc_mgr_qos(names), check=False)
        return _parsers().parse_qos_usage(res.stdout if res.ok else "")

    # ------------------------------------------------------------ month end (ledger periods, docs/ledger.md)
    def window_gpu_seconds(self, since: dt.datetime, until: dt.datetime,
                           job_ids: Iterable[str] = ()) -> dict[str, int]:
        """GPU-seconds per account that ran in ``[since, until)``: ``sacct --truncate`` (each
        run's Start and End cut to the window, as sreport counts runs, but to the second
        rather than on hourly rollups), × the run's allocated GPUs, summed per account. A run
        still running ends at ``until``."""
        def local(t: dt.datetime) -> str:       # sacct reads times in the host's local zone
            return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

        out: dict[str, int] = {}
        argv = cmd.sacct_truncated(local(since), local(until), job_ids=[str(j) for j in job_ids])
        for r in _parsers().parse_sacct(self.run(argv).stdout, fields=cmd.WINDOW_FIELDS):
            try:
                start = dt.datetime.fromisoformat(r.start).astimezone()
            except ValueError:                  # never started
                continue
            try:
                end = min(dt.datetime.fromisoformat(r.end).astimezone(), until)
            except ValueError:                  # Unknown: still running
                end = until
            gpus = sum(r.gpus.values())
            seconds = max(int((end - max(start, since)).total_seconds()), 0)
            out[r.account] = out.get(r.account, 0) + gpus * seconds
        return out

    def sreport_gpu_seconds(self, since: dt.datetime, until: dt.datetime) -> dict[str, int]:
        """GPU-seconds per account in ``[since, until)`` by ``sreport cluster
        AccountUtilizationByUser`` (slurmdbd's hourly rollups: whole hours already rolled up),
        each account's own usage (the sum of its user rows; its own row is its subtree's)."""
        def local(t: dt.datetime) -> str:
            return t.astimezone().strftime("%Y-%m-%dT%H:%M:%S")

        out: dict[str, int] = {}
        for u in _parsers().parse_sreport_account_user(self.run(cmd.sreport_account_user(local(since),
                                                                                         local(until))).stdout):
            if u.user:
                out[u.account] = out.get(u.account, 0) + u.seconds
        return out
