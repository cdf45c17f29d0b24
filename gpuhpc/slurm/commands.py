"""Pure argv builders for Slurm's command-line tools. Nothing here runs anything.

A job name can hold any byte but NUL (plain ``sbatch -J`` passes newlines, 0x1f, U+2028), so
no output that holds one is read line by line: ``squeue`` rows start with a per-call random tag
given through ``SQUEUE_FORMAT`` (the environment, not the argv other users can read) and end
with the name; ``sacct`` fields are separated by a per-call random delimiter with the name last;
billing reads its fields from a query with no free text at all. See :mod:`gpuhpc.slurm.parsers`.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

SEP = "\x1f"

SQUEUE_FIELDS: tuple[tuple[str, str], ...] = (
    ("job_id", "%i"), ("job_id_raw", "%A"), ("array_job_id", "%F"), ("array_task_id", "%K"),
    ("state", "%T"), ("elapsed", "%M"), ("time_limit", "%l"),
    ("nodes", "%D"), ("tres_per_node", "%b"), ("partition", "%P"), ("user", "%u"),
    ("account", "%a"), ("nodelist", "%N"), ("reason", "%r"), ("qos", "%q"),
    ("name", "%j"),      # free text: last, read with maxsplit
)

SACCT_FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "State", "Elapsed", "ElapsedRaw", "Submit", "Start", "End",
    "AllocTRES", "ReqTRES", "Partition", "Account", "User", "NodeList", "ExitCode",
    "Timelimit", "QOS", "Cluster", "JobName",      # free text last (parsers.parse_sacct)
)
# Slurm 22.05's sacct has no "Restarts" field: each requeued run of a job shows up as its own
# row with ``--duplicates`` (state REQUEUED/PREEMPTED/NODE_FAIL), and ``scontrol show job``
# carries ``Restarts=``. See SlurmClient.restarts().


def sinfo_version() -> list[str]:
    return ["sinfo", "--version"]


def scontrol_show(kind: str, name: str | None = None) -> list[str]:
    """``scontrol show node|partition|job|topology [NAME] --oneliner``."""
    argv = ["scontrol", "--oneliner", "show", kind]
    if name is not None:
        argv.append(str(name))
    return argv


def sbatch(script_path: str | None = None, *, extra: Sequence[str] = (), parsable: bool = True) -> list[str]:
    """sbatch reading the script from ``script_path`` (or stdin when None)."""
    argv = ["sbatch"]
    if parsable:
        argv.append("--parsable")
    argv.extend(extra)
    if script_path is not None:
        argv.append(script_path)
    return argv


def squeue_format(row_tag: str) -> str:
    """The ``SQUEUE_FORMAT`` for :func:`squeue`: every row starts with ``row_tag`` (random per
    call, so a job name cannot forge a row) and ends with the job name."""
    return row_tag + SEP.join(code for _, code in SQUEUE_FIELDS)


def env_from_stdin(name: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run with the environment variable ``name`` set to the first line of stdin: a
    value (a per-call tag) kept out of every command line ``ps`` shows, on any host."""
    return ["sh", "-c", f'IFS= read -r {name} && export {name} && exec "$@"', "sh", *argv]


def squeue(*, user: str | None = None, job_ids: Iterable[str] = (), all_partitions: bool = True,
           states: str | None = "all", row_tag: str | None = None) -> list[str]:
    """squeue, one row per job (array task). With ``row_tag`` the format is left to the caller's
    ``SQUEUE_FORMAT=squeue_format(row_tag)`` (the tag stays out of the argv that ``ps`` shows)."""
    argv = ["squeue", "--noheader", "--array"]
    if row_tag is None:
        argv.append(f"--format={SEP.join(code for _, code in SQUEUE_FIELDS)}")
    if all_partitions:
        argv.append("--all")
    if states:
        argv.append(f"--states={states}")
    if user:
        argv.append(f"--user={user}")
    ids = [str(j) for j in job_ids]
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    return argv


def sacct(*, job_ids: Iterable[str] = (), user: str | None = None, all_users: bool = False,
          since: str | None = None, until: str | None = None, allocations: bool = True,
          duplicates: bool = False, fields: Sequence[str] = SACCT_FIELDS,
          cluster: str | None = None, delimiter: str = SEP) -> list[str]:
    """sacct in parsable form (``delimiter`` between fields: with a free-text field, pass a
    random one per call, see :func:`gpuhpc.slurm.parsers.parse_sacct`). ``duplicates=True``
    lists every requeued run of a job (``--duplicates``), which is what billing needs."""
    argv = ["sacct", "--noheader", "--parsable2", f"--delimiter={delimiter}",
            f"--format={','.join(fields)}"]
    if allocations:
        argv.append("--allocations")
    argv += _sacct_selection(job_ids, user, all_users, since, until, duplicates)
    if cluster:
        argv.append(f"--clusters={cluster}")
    return argv


def _sacct_selection(job_ids: Iterable[str], user: str | None, all_users: bool, since: str | None,
                     until: str | None, duplicates: bool) -> list[str]:
    """The jobs sacct reports: :func:`sacct`'s and :func:`sacct_json`'s selection options."""
    argv = ["--duplicates"] if duplicates else []
    ids = [str(j) for j in job_ids]
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    if all_users:
        argv.append("--allusers")
    elif user:
        argv.append(f"--user={user}")
    if since:
        argv.append(f"--starttime={since}")
    if until:
        argv.append(f"--endtime={until}")
    return argv


def scancel(job_id: str, *, signal: str | None = None, full: bool = False) -> list[str]:
    argv = ["scancel"]
    if signal:
        argv.append(f"--signal={signal}")
    if full:
        argv.append("--full")
    argv.append(str(job_id))
    return argv


def scontrol_requeue(job_id: str, *, hold: bool = False) -> list[str]:
    return ["scontrol", "requeuehold" if hold else "requeue", str(job_id)]


def scontrol_update_job(job_id: str, **fields: str) -> list[str]:
    return ["scontrol", "update", f"JobId={job_id}", *(f"{k}={v}" for k, v in fields.items())]


def sacctmgr(*words: str, immediate: bool = True) -> list[str]:
    """``sacctmgr -i <words>``; for ``list``/``show`` queries use :func:`sacctmgr_list`."""
    argv = ["sacctmgr"]
    if immediate:
        argv.append("-i")
    argv.extend(words)
    return argv


def sacctmgr_list(entity: str, *filters: str, fields: Sequence[str]) -> list[str]:
    return ["sacctmgr", "--noheader", "--parsable2", "list", entity, *filters,
            f"format={','.join(fields)}"]


def scontrol_show_config() -> list[str]:
    """``scontrol show config``: the running configuration as ``Key = Value`` lines."""
    return ["scontrol", "show", "config"]


def squeue_records() -> list[str]:
    """One short line per job record slurmctld holds (every array task, finished ones too):
    what counts against MaxJobCount."""
    return ["squeue", "--noheader", "--array", "--all", "--states=all", "--format=%A"]


def scontrol_show_assoc_mgr(user: str, flags: str = "assoc,qos") -> list[str]:
    """``scontrol show assoc_mgr``: slurmctld's cached association and QOS limits with their
    current usage (``MaxSubmitJobs=LIMIT(CURRENT)``, ``N`` = no limit); no slurmdbd round trip."""
    return ["scontrol", "show", "assoc_mgr", f"users={user}", f"flags={flags}"]


def scontrol_reconfigure() -> list[str]:
    """``scontrol reconfigure``: slurmctld re-reads slurm.conf, topology.conf, gres.conf ..."""
    return ["scontrol", "reconfigure"]


# sacct fields for billing (``SlurmClient.job_runs``): every run of every job, no steps.
# No "Restarts" (Slurm 22.05's sacct has no such field) and no NodeList (long, unused there).
SACCT_RUN_FIELDS: tuple[str, ...] = (
    "JobID", "JobIDRaw", "State", "Elapsed", "ElapsedRaw", "Submit", "Start", "End",
    "AllocTRES", "ReqTRES", "Partition", "Account", "User", "QOS", "Cluster", "Timelimit", "JobName",
)


def sacctmgr_add(entity: str, name: str, settings: Sequence[tuple[str, str]] = ()) -> list[str]:
    """``sacctmgr -i add <entity> <name> Key=Value ...`` (settings in the order given)."""
    return sacctmgr("add", entity, name, *(f"{k}={v}" for k, v in settings))


def sacctmgr_modify(entity: str, where: Sequence[tuple[str, str]], settings: Sequence[tuple[str, str]]) -> list[str]:
    """``sacctmgr -i modify <entity> where k=v ... set Key=Value ...``."""
    return sacctmgr("modify", entity, "where", *(f"{k}={v}" for k, v in where), "set",
                    *(f"{k}={v}" for k, v in settings))


def sacctmgr_delete(entity: str, where: Sequence[tuple[str, str]]) -> list[str]:
    """``sacctmgr -i delete <entity> where k=v ...``."""
    return sacctmgr("delete", entity, "where", *(f"{k}={v}" for k, v in where))


# ---------------------------------------------------------------- node state (health gate)
def scontrol_update_node(nodes: str, state: str, reason: str | None = None) -> list[str]:
    """``scontrol update NodeName=<nodes> State=<state> [Reason=<reason>]`` (drain, resume, ...).
    The reason is one argv element: no shell sees it, spaces are fine."""
    argv = ["scontrol", "update", f"NodeName={nodes}", f"State={state}"]
    if reason is not None:
        argv.append(f"Reason={reason}")
    return argv


def scontrol_show_job_detail(job_id: str) -> list[str]:
    """``scontrol --oneliner -d show job ID``: adds per-node ``Nodes=... GRES=gpu:h100:2(IDX:4-5)``."""
    return ["scontrol", "--oneliner", "-d", "show", "job", str(job_id)]


def scontrol_show_assoc_mgr_accounts(accounts: Sequence[str]) -> list[str]:
    """``scontrol show assoc_mgr accounts=A,B flags=assoc``: the accounts' associations (the
    account's own and its users') with ``GrpTRESMins=LIMIT(USED minutes)`` (budgets, gpuhpc ledger)."""
    return ["scontrol", "show", "assoc_mgr", f"accounts={','.join(accounts)}", "flags=assoc"]


def scontrol_show_assoc_mgr_qos(names: Sequence[str]) -> list[str]:
    """``scontrol show assoc_mgr qos=A,B flags=qos``: these QOS with ``UsageRaw`` and
    ``GrpTRESMins=LIMIT(USED minutes)`` (the ledger's qos mode: a budget QOS per account)."""
    return ["scontrol", "show", "assoc_mgr", f"qos={','.join(names)}", "flags=qos"]


# ---------------------------------------------------------------- containers (node image cache)
def srun_per_node(nodes: str, count: int, argv: Sequence[str], *, partition: str | None = None,
                  within_job: bool = False, time_limit: str = "30") -> list[str]:
    """``srun`` of ``argv`` once on each of ``nodes`` (a hostlist of ``count`` nodes): a new
    allocation of those nodes (``gpuhpc image prefetch``), or a step of the current job
    (``within_job``: the job's own nodes)."""
    out = ["srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1", f"--nodelist={nodes}"]
    if not within_job:
        out += [f"--time={time_limit}", "--job-name=gpuhpc-image-prefetch"]
        if partition:
            out.append(f"--partition={partition}")
    return [*out, "--", *argv]


def srun_step(options: Sequence[str], argv: Sequence[str]) -> list[str]:
    """``srun`` of ``argv`` as one task on this node, a step of the current job (a sweep trial
    in its image: pyxis' ``--container-*`` options in ``options``)."""
    return ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=0", *options, "--", *argv]


# ---------------------------------------------------------------- controllers (elastic HA)
def scontrol_ping() -> list[str]:
    """``scontrol ping``: one line per SlurmctldHost, in slurm.conf's order (parsers.parse_ping)."""
    return ["scontrol", "ping"]


# ---------------------------------------------------------------- month end (ledger periods, docs/ledger.md)
WINDOW_FIELDS: tuple[str, ...] = ("JobIDRaw", "JobID", "Account", "User", "AllocTRES", "Start", "End", "State")


def sacct_truncated(since: str, until: str, *, job_ids: Iterable[str] = ()) -> list[str]:
    """Every user's runs (allocations, each requeued run: ``--duplicates``) overlapping
    ``[since, until]`` (local times), their Start and End cut to the window (``--truncate``):
    what sreport counts of each run in that window, at any second."""
    return [*sacct(job_ids=job_ids, all_users=True, since=since, until=until, duplicates=True, fields=WINDOW_FIELDS),
            "--truncate"]


def sreport_account_user(since: str, until: str, *, tres: str = "gres/gpu") -> list[str]:
    """``sreport cluster AccountUtilizationByUser`` for ``[since, until)`` (local times; sreport
    reads slurmdbd's hourly rollups, so whole hours that are rolled up) in seconds of ``tres``:
    one row per account (its subtree's total) and per user in it."""
    return ["sreport", "--noheader", "--parsable2", "-t", "seconds", f"--tres={tres}", "cluster",
            "AccountUtilizationByUser", f"start={since}", f"end={until}"]


# ---------------------------------------------------------------- structured output (Slurm >= 23.02)
def squeue_json(*, user: str | None = None, job_ids: Iterable[str] = ()) -> list[str]:
    """``squeue --json``: every job record (array tasks pending as one record, see
    :func:`gpuhpc.slurm.parsers.parse_squeue_json`), filtered by ``user``/``job_ids`` (honoured
    from 23.02; 22.05's ``--json`` ignored them and is never used)."""
    argv = ["squeue", "--json", "--all", "--states=all"]
    if user:
        argv.append(f"--user={user}")
    ids = [str(j) for j in job_ids]
    if ids:
        argv.append(f"--jobs={','.join(ids)}")
    return argv


def sacct_json(*, job_ids: Iterable[str] = (), user: str | None = None, all_users: bool = False,
               since: str | None = None, until: str | None = None, allocations: bool = True,
               duplicates: bool = False) -> list[str]:
    """``sacct --json`` with :func:`sacct`'s selection (a job record carries its steps;
    ``allocations`` is applied by the parser)."""
    return ["sacct", "--json", *_sacct_selection(job_ids, user, all_users, since, until, duplicates)]
