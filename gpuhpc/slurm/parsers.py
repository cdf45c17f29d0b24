"""Pure parsers for Slurm command output. Unit tests feed them recorded output."""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field, replace as _replace

from gpuhpc.errors import SlurmError
from gpuhpc.slurm.commands import SACCT_FIELDS, SEP, SQUEUE_FIELDS
from gpuhpc.slurm.state import SlurmState

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- scontrol --oneliner
_KV = re.compile(r"(\S+?)=(.*?)(?=\s+\S+?=|\Z)", re.S)


def parse_oneliner_records(text: str) -> list[dict[str, str]]:
    """``scontrol --oneliner show node|partition|job``: one record a line, ``Key=Value``
    pairs separated by spaces (values may contain spaces, e.g. ``Reason=Not responding``).

    A record starts a line with the first record's first key (``JobId=``, ``NodeName=``): a
    newline inside a value (a job name or path from plain ``sbatch``) does not cut a record in
    two. When a key repeats, the later one wins: Slurm's own fields follow the job name, so a
    name holding ``Key=Value`` text cannot override them."""
    text = text.strip()
    if not text:
        return []
    first = text.split("=", 1)[0]
    lines = re.split(r"\n(?=" + re.escape(first) + "=)", text) if first and not any(c.isspace() for c in first) \
        else text.split("\n")
    records = []
    for line in lines:
        line = line.strip()
        if not line or "=" not in line:
            continue
        records.append({k: v.strip() for k, v in _KV.findall(line)})
    return records


def parse_tres(text: str) -> dict[str, str]:
    """``cpu=4,mem=8G,node=1,billing=4,gres/gpu=2,gres/gpu:h100=2`` -> dict."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def parse_gres(text: str) -> dict[str, int]:
    """``gpu:h100:8(S:0-1),gpu:1g.10gb:7`` -> {"h100": 8, "1g.10gb": 7}; untyped -> key "gpu"."""
    out: dict[str, int] = {}
    if not text or text in ("(null)", "N/A"):
        return out
    for item in re.split(r",(?![^()]*\))", text):
        item = re.sub(r"\(.*?\)", "", item).strip()
        if not item.startswith("gpu"):
            continue
        parts = item.split(":")
        if len(parts) == 3:
            name, count = parts[1], parts[2]
        elif len(parts) == 2:
            name, count = ("gpu", parts[1]) if parts[1].isdigit() else (parts[1], "1")
        else:
            name, count = "gpu", "1"
        try:
            out[name] = out.get(name, 0) + int(count)
        except ValueError:
            continue
    return out


def gpus_from_tres(tres: dict[str, str]) -> dict[str, int]:
    """Typed GPU counts from a TRES dict (``gres/gpu:h100=2``); untyped total under "gpu"."""
    out: dict[str, int] = {}
    for key, value in tres.items():
        if key.startswith("gres/gpu:"):
            try:
                out[key.split(":", 1)[1]] = int(value)
            except ValueError:
                pass
    if not out and "gres/gpu" in tres:
        try:
            out["gpu"] = int(tres["gres/gpu"])
        except ValueError:
            pass
    return out


# every record class has a docstring: without one, @dataclass formats an inspect.signature()
# for __doc__ at import, a cost every CLI start-up would pay
@dataclass(frozen=True)
class NodeInfo:
    """One node from ``scontrol show node``."""

    name: str
    state: str
    cpus: int
    cpus_alloc: int
    real_memory_mb: int
    alloc_memory_mb: int
    partitions: tuple[str, ...]
    gpus_total: dict[str, int] = field(default_factory=dict)
    gpus_alloc: dict[str, int] = field(default_factory=dict)
    features: tuple[str, ...] = ()
    reason: str = ""

    @property
    def gpus_free(self) -> dict[str, int]:
        return {t: n - self.gpus_alloc.get(t, 0) for t, n in self.gpus_total.items()}


def _int(v: str | None, default: int = 0) -> int:
    try:
        return int(v) if v not in (None, "", "N/A", "(null)") else default
    except ValueError:
        return default


def parse_nodes(text: str) -> list[NodeInfo]:
    nodes = []
    for rec in parse_oneliner_records(text):
        if "NodeName" not in rec:
            continue
        alloc = gpus_from_tres(parse_tres(rec.get("AllocTRES", "")))
        total = parse_gres(rec.get("Gres", ""))
        parts = rec.get("Partitions", "")
        feats = rec.get("AvailableFeatures", rec.get("Features", ""))
        nodes.append(NodeInfo(
            name=rec["NodeName"], state=rec.get("State", "UNKNOWN"),
            cpus=_int(rec.get("CPUTot")), cpus_alloc=_int(rec.get("CPUAlloc")),
            real_memory_mb=_int(rec.get("RealMemory")), alloc_memory_mb=_int(rec.get("AllocMem")),
            partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
            gpus_total=total, gpus_alloc=alloc,
            features=tuple(f for f in feats.split(",") if f and f != "(null)"),
            reason=rec.get("Reason", ""),
        ))
    return nodes


@dataclass(frozen=True)
class PartitionInfo:
    """One partition from ``scontrol show partition``."""

    name: str
    state: str
    nodes: str
    total_nodes: int
    total_cpus: int
    priority_tier: int
    preempt_mode: str
    max_time: str
    default: bool
    grace_time: int
    qos: str
    allow_accounts: str


def parse_partitions(text: str) -> list[PartitionInfo]:
    out = []
    for rec in parse_oneliner_records(text):
        if "PartitionName" not in rec:
            continue
        out.append(PartitionInfo(
            name=rec["PartitionName"], state=rec.get("State", ""), nodes=rec.get("Nodes", ""),
            total_nodes=_int(rec.get("TotalNodes")), total_cpus=_int(rec.get("TotalCPUs")),
            priority_tier=_int(rec.get("PriorityTier")), preempt_mode=rec.get("PreemptMode", ""),
            max_time=rec.get("MaxTime", ""), default=rec.get("Default", "NO") == "YES",
            grace_time=_int(rec.get("GraceTime")), qos=rec.get("QoS", "N/A"),
            allow_accounts=rec.get("AllowAccounts", "ALL"),
        ))
    return out


# ---------------------------------------------------------------- sbatch
def parse_sbatch_parsable(stdout: str) -> str:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job_id = line.split(";", 1)[0].strip()
    if not job_id.isdigit():
        raise SlurmError(f"could not parse a job id from sbatch output {stdout!r}")
    return job_id


# ---------------------------------------------------------------- squeue / sacct rows
@dataclass(frozen=True)
class QueueRow:
    """One job (array task) from ``squeue``."""

    job_id: str
    job_id_raw: str
    array_job_id: str
    array_task_id: str
    name: str
    state: SlurmState
    elapsed: str
    time_limit: str
    nodes: int
    tres_per_node: str
    partition: str
    user: str
    account: str
    nodelist: str
    reason: str
    qos: str


def _skip(what: str, row: str) -> None:
    log.warning("skipped a malformed %s row: %.200r", what, row)


def parse_squeue(text: str, row_tag: str | None = None) -> list[QueueRow]:
    """``squeue`` rows (:data:`~gpuhpc.slurm.commands.SQUEUE_FIELDS`, the name last).

    With ``row_tag`` (what :func:`~gpuhpc.slurm.commands.squeue_format` put first in every row)
    rows are split on newline + tag, never on a bare newline: a name holding newlines, 0x1f or
    U+2028 stays one name and cannot add a row. Without it (recorded output) rows are split on
    newlines. The name is the last field (``maxsplit``); a malformed row is skipped and logged."""
    rows = []
    names = [n for n, _ in SQUEUE_FIELDS]
    if row_tag:
        if text.endswith("\n"):
            text = text[:-1]
        chunks = text.split("\n" + row_tag)
        if chunks and chunks[0].startswith(row_tag):
            chunks[0] = chunks[0][len(row_tag):]
        elif chunks and chunks[0]:
            _skip("squeue", chunks[0])
            chunks = chunks[1:]
        else:
            chunks = chunks[1:]
    else:
        chunks = text.split("\n")
    for line in chunks:
        if not line.strip():
            continue
        parts = line.split(SEP, len(names) - 1)
        if len(parts) != len(names) or not parts[1].strip().isdigit():
            _skip("squeue", line)
            continue
        d = dict(zip(names, parts))
        rows.append(QueueRow(
            job_id=d["job_id"], job_id_raw=d["job_id_raw"], array_job_id=d["array_job_id"],
            array_task_id=d["array_task_id"], name=d["name"], state=SlurmState.parse(d["state"]),
            elapsed=d["elapsed"], time_limit=d["time_limit"], nodes=_int(d["nodes"]),
            tres_per_node=d["tres_per_node"], partition=d["partition"], user=d["user"],
            account=d["account"], nodelist=d["nodelist"], reason=d["reason"], qos=d["qos"],
        ))
    return rows


@dataclass(frozen=True)
class AcctRow:
    """One job (allocation) from ``sacct``."""

    job_id: str           # "123", "123_4" (array task), "123+0" (het)
    job_id_raw: str
    name: str
    state: SlurmState
    elapsed_s: int
    submit: str
    start: str
    end: str
    alloc_tres: dict[str, str]
    req_tres: dict[str, str]
    partition: str
    account: str
    user: str
    nodelist: str
    exit_code: str
    restarts: int         # always 0 from 22.05's sacct (no such field); see SlurmClient.restarts()
    time_limit: str
    qos: str
    cluster: str

    @property
    def array_job_id(self) -> str:
        return self.job_id.split("_", 1)[0]

    @property
    def array_task_id(self) -> str | None:
        if "_" in self.job_id:
            task = self.job_id.split("_", 1)[1]
            return task if task.isdigit() else None
        return None

    @property
    def gpus(self) -> dict[str, int]:
        return gpus_from_tres(self.alloc_tres)


_FREE_TEXT = "JobName"


def _sacct_records(text: str, n: int, sep: str, name_last: bool) -> list[list[str]]:
    """Split ``sacct --parsable2`` output into rows of ``n`` fields. With the free-text field
    last the output is cut on ``sep`` alone: the token at a row's end is ``name\\nNEXTJOBID``
    (a job id holds no newline), so a newline in a name never starts a row; only ``sep`` could,
    and the caller makes it random per call."""
    if not name_last:
        out = []
        for line in text.split("\n"):
            if line.strip():
                parts = line.split(sep)
                if len(parts) == n:
                    out.append(parts)
                else:
                    _skip("sacct", line)
        return out
    if text.endswith("\n"):
        text = text[:-1]
    if not text.strip():
        return []
    tokens = text.split(sep)
    out, cur = [], [tokens[0]]
    for i, tok in enumerate(tokens[1:], 1):
        if len(cur) == n - 1:
            if i < len(tokens) - 1 and "\n" in tok:
                name, nxt = tok.rsplit("\n", 1)
            else:
                name, nxt = tok, None
            cur.append(name)
            out.append(cur)
            cur = [nxt] if nxt is not None else []
        else:
            cur.append(tok)
    if cur:
        _skip("sacct", sep.join(cur))
    return out


def parse_sacct(text: str, fields: tuple[str, ...] = SACCT_FIELDS, sep: str = SEP) -> list[AcctRow]:
    """``sacct --parsable2 --delimiter=SEP`` rows. With ``JobName`` the last field and a random
    ``sep`` (:func:`~gpuhpc.slurm.commands.sacct`'s ``delimiter``) a job name cannot forge a
    row; a malformed row (its JobIDRaw not a number) is skipped and logged."""
    rows = []
    for parts in _sacct_records(text, len(fields), sep, bool(fields) and fields[-1] == _FREE_TEXT):
        d = dict(zip(fields, parts))
        if "JobIDRaw" in d and not d["JobIDRaw"].split(".", 1)[0].split("+", 1)[0].isdigit():
            _skip("sacct", sep.join(parts))
            continue
        rows.append(AcctRow(
            job_id=d.get("JobID", ""), job_id_raw=d.get("JobIDRaw", ""), name=d.get("JobName", ""),
            state=SlurmState.parse(d.get("State", "")), elapsed_s=_int(d.get("ElapsedRaw")),
            submit=d.get("Submit", ""), start=d.get("Start", ""), end=d.get("End", ""),
            alloc_tres=parse_tres(d.get("AllocTRES", "")), req_tres=parse_tres(d.get("ReqTRES", "")),
            partition=d.get("Partition", ""), account=d.get("Account", ""), user=d.get("User", ""),
            nodelist=d.get("NodeList", ""), exit_code=d.get("ExitCode", ""),
            restarts=_int(d.get("Restarts")), time_limit=d.get("Timelimit", ""), qos=d.get("QOS", ""),
            cluster=d.get("Cluster", ""),
        ))
    return rows


def parse_sacct_names(text: str, sep: str) -> dict[str, str]:
    """``sacct --format=JobIDRaw,JobName --delimiter=SEP`` -> {job id: name} (the first row of
    an id wins; a malformed row is skipped and logged)."""
    out: dict[str, str] = {}
    for job, name in _sacct_records(text, 2, sep, True):
        if job.isdigit():
            out.setdefault(job, name)
        else:
            _skip("sacct", job)
    return out


def parse_parsable2(text: str, fields: list[str] | tuple[str, ...], sep: str = "|") -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.strip():
            out.append(dict(zip(fields, line.split(sep))))
    return out


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` -> {key: value} (its ``Key = Value`` lines; headers skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if " = " in line:
            k, v = line.split(" = ", 1)
            out[k.strip()] = v.strip()
    return out


def slurm_conf_value(text: str, key: str) -> str | None:
    """The value of ``key`` (case-insensitive, as slurmctld reads it) in slurm.conf text; None
    when it is not set there *or* the file has ``Include`` lines (it may be set in one)."""
    found = None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.split(None, 1)[0].lower() == "include":
            return None
        k, sep, v = line.partition("=")
        if sep and k.strip().lower() == key.lower():
            found = v.strip().split(None, 1)[0] if v.strip() else ""
    return found


def parse_version(text: str) -> tuple[int, int, int]:
    """``slurm 22.05.8`` or ``slurm-wlm 22.05.8`` -> (22, 5, 8)."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise SlurmError(f"cannot parse Slurm version from {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


# ---------------------------------------------------------------- submission limits
@dataclass(frozen=True)
class SubmitLimits:
    """What bounds a job array and how many jobs one user may have queued.

    ``max_array_size``: an array *index* must be below it (``--array=0-(k-1)`` needs
    ``k <= max_array_size``); ``max_job_count``: slurmctld's job records (all users);
    ``max_submit_jobs``: the user's limit from the association or QOS (None: unlimited or
    unknown)."""

    max_array_size: int
    max_job_count: int
    max_submit_jobs: int | None = None
    submitted: int = 0          # the user's jobs counted against MaxSubmitJobs now


def parse_submit_limits(config: dict[str, str], assoc_mgr: str = "", *, user: str | None = None,
                        account: str | None = None, qos: str | None = None) -> SubmitLimits:
    """Limits from ``scontrol show config`` (``MaxArraySize``, ``MaxJobCount``) and
    ``scontrol show assoc_mgr`` (:func:`~gpuhpc.slurm.commands.scontrol_show_assoc_mgr`): the
    user's association's ``MaxSubmitJobs``/``GrpSubmitJobs`` (in ``account`` when given) and
    the QOS's ``MaxSubmitJobsPU`` (``qos``, else ``normal``); the smallest set value wins.
    ``submitted`` is the user's current count from the same records."""
    limits: list[int] = []
    current = 0
    section, rec_ok, qos_ok = "", False, False
    want_qos = qos or "normal"
    for raw in assoc_mgr.splitlines():
        line = raw.strip()
        if line.startswith("Association Records"):
            section = "assoc"
        elif line.startswith("QOS Records"):
            section = "qos"
        if line.startswith("ClusterName="):
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            uname = f.get("UserName", "").split("(", 1)[0]
            rec_ok = section == "assoc" and bool(uname) and (user is None or uname == user) and \
                (account is None or f.get("Account") == account)
            continue
        if line.startswith("QOS="):
            qos_ok = line[4:].split("(", 1)[0] == want_qos
            continue
        for m in re.finditer(r"\b(MaxSubmitJobs|GrpSubmitJobs|MaxSubmitJobsPU)=([0-9N]+)\((\d+)\)?", line):
            key, lim, cur = m.group(1), m.group(2), int(m.group(3) or 0)
            if key == "MaxSubmitJobsPU" and not qos_ok:
                continue
            if key != "MaxSubmitJobsPU" and not rec_ok:
                continue
            if lim.isdigit():
                limits.append(int(lim))
            current = max(current, cur)
        m2 = re.search(r"\bMaxSubmitJobs=(\d+)(?=\s|$)", line)     # a limit printed without usage
        if m2 and rec_ok:
            limits.append(int(m2.group(1)))
    return SubmitLimits(max_array_size=_int(config.get("MaxArraySize"), 1001),
                        max_job_count=_int(config.get("MaxJobCount"), 10000),
                        max_submit_jobs=min(limits) if limits else None, submitted=current)


# ---------------------------------------------------------------- scontrol -d show job
_IDX = re.compile(r"\(IDX:([^)]*)\)")


def parse_job_gpu_indexes(text: str) -> dict[str, list[int]]:
    """``scontrol --oneliner -d show job`` -> {node: GRES indexes the job holds there} (the
    ``Nodes=<hostlist> ... GRES=gpu:h100:2(IDX:4-5)`` groups; a node without GPUs maps to [])."""
    from gpuhpc.hostlist import expand, expand_ranges

    out: dict[str, list[int]] = {}
    nodes: list[str] = []
    for token in text.split():
        if token.startswith("Nodes="):
            nodes = expand(token[len("Nodes="):])
            for n in nodes:
                out.setdefault(n, [])
        elif token.startswith("GRES=") and nodes:
            idx: list[int] = []
            for m in _IDX.finditer(token):
                idx += expand_ranges(m.group(1).replace("N/A", ""))
            for n in nodes:
                out[n] = sorted(set(out[n]) | set(idx))
            nodes = []
    return out


# ---------------------------------------------------------------- association budgets
@dataclass(frozen=True)
class AssocBudget:
    """One association's ``GrpTRESMins``: limit (None: unlimited) and usage, in TRES-minutes."""

    account: str
    user: str                 # "" for the account's own association
    limits: dict[str, int | None]
    used: dict[str, int]


def parse_assoc_tres_mins(text: str) -> list[AssocBudget]:
    """``scontrol show assoc_mgr ... flags=assoc`` -> each association's ``GrpTRESMins``
    (``gres/gpu=3(1)``: limit 3, used 1 minute; ``N`` = no limit)."""
    out: list[AssocBudget] = []
    acct = user = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ClusterName="):
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            acct, user = f.get("Account", ""), f.get("UserName", "").split("(", 1)[0]
            continue
        if acct is not None and line.startswith("GrpTRESMins="):
            limits: dict[str, int | None] = {}
            used: dict[str, int] = {}
            for m in re.finditer(r"([\w/:.]+)=(\d+|N)\((\d+)\)", line[len("GrpTRESMins="):]):
                limits[m.group(1)] = None if m.group(2) == "N" else int(m.group(2))
                used[m.group(1)] = int(m.group(3))
            out.append(AssocBudget(acct, user or "", limits, used))
    return out


# ---------------------------------------------------------------- scontrol ping (elastic HA)
@dataclass(frozen=True)
class ControllerPing:
    """One line of ``scontrol ping``: ``role`` is ``primary``, ``backup`` or ``backupN`` (the
    SlurmctldHost order), ``host`` the SlurmctldHost name (``localhost`` is printed as the host's
    short name), ``up`` whether it answered the ping (a standby backup answers too)."""

    role: str
    host: str
    up: bool


_PING = re.compile(r"^Slurmctld\((primary|backup\d*)\) at (\S+) is (UP|DOWN)\s*$")


def parse_ping(text: str) -> list[ControllerPing]:
    """``scontrol ping`` (22.05: ``Slurmctld(primary) at vm is UP``, then ``Slurmctld(backup) at
    host2 is UP`` with one backup, ``backup2``... with more); other lines (the banner printed when
    one is DOWN) are skipped."""
    out = []
    for line in text.splitlines():
        m = _PING.match(line.strip())
        if m:
            out.append(ControllerPing(m.group(1), m.group(2), m.group(3) == "UP"))
    return out


# ---------------------------------------------------------------- ledger check (issue 34)
def parse_partition_billing_weights(text: str) -> dict[str, str | None]:
    """``scontrol --oneliner show partition`` -> each partition's ``TRESBillingWeights`` as the
    running slurmctld has it (None: the partition has none, so Slurm bills its CPUs)."""
    out: dict[str, str | None] = {}
    for rec in parse_oneliner_records(text):
        if "PartitionName" in rec:
            w = rec.get("TRESBillingWeights", "")
            out[rec["PartitionName"]] = w if w and w != "(null)" else None
    return out


@dataclass(frozen=True)
class AssocUsage:
    """One association in slurmctld's cache: ``GrpTRESMins`` limit (None: unlimited) and usage,
    and ``GrpTRESRunMins`` (the running jobs' minutes still to come), in TRES-minutes."""

    account: str
    user: str                 # "" for the account's own association
    limits: dict[str, int | None]
    used: dict[str, int]
    running: dict[str, int]


_TRES_MINS = re.compile(r"([\w/:.]+)=(\d+|N)\((\d+)\)")


def parse_assoc_usage(text: str) -> list[AssocUsage]:
    """``scontrol show assoc_mgr accounts=... flags=assoc`` -> each association's budget
    minutes: ``GrpTRESMins=gres/gpu=3(1)`` (limit 3, used 1) and ``GrpTRESRunMins=gres/gpu=N(4)``
    (running jobs hold 4 more)."""
    out: list[AssocUsage] = []
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("ClusterName="):
            if cur is not None:
                out.append(AssocUsage(**cur))
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            cur = {"account": f.get("Account", ""), "user": f.get("UserName", "").split("(", 1)[0],
                   "limits": {}, "used": {}, "running": {}}
            continue
        if cur is None:
            continue
        for key, what in (("GrpTRESMins=", "mins"), ("GrpTRESRunMins=", "run")):
            if line.startswith(key):
                for m in _TRES_MINS.finditer(line[len(key):]):
                    if what == "mins":
                        cur["limits"][m.group(1)] = None if m.group(2) == "N" else int(m.group(2))
                        cur["used"][m.group(1)] = int(m.group(3))
                    else:
                        cur["running"][m.group(1)] = int(m.group(3))
    if cur is not None:
        out.append(AssocUsage(**cur))
    return out


@dataclass(frozen=True)
class QosUsage:
    """One QOS in slurmctld's cache: ``GrpTRESMins`` limit (None: unlimited) and usage and
    ``GrpTRESRunMins`` (the running jobs' minutes still to come), in TRES-minutes."""

    name: str
    limits: dict[str, int | None]
    used: dict[str, int]
    running: dict[str, int]


def parse_qos_usage(text: str) -> list[QosUsage]:
    """``scontrol show assoc_mgr qos=... flags=qos`` -> each QOS's budget minutes (the QOS's own
    lines, before its ``User Limits``/``Account Limits``): ``QOS=name(id)``, then
    ``GrpTRESMins=gres/gpu=3(1)`` and ``GrpTRESRunMins=gres/gpu=N(4)``."""
    out: list[QosUsage] = []
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"QOS=(.*)\(\d+\)$", line)
        if m:
            if cur is not None:
                out.append(QosUsage(**cur))
            cur = {"name": m.group(1), "limits": {}, "used": {}, "running": {}}
            continue
        if cur is None:
            continue
        for key, what in (("GrpTRESMins=", "mins"), ("GrpTRESRunMins=", "run")):
            if line.startswith(key) and not (cur["used"] if what == "mins" else cur["running"]):
                for t in _TRES_MINS.finditer(line[len(key):]):
                    if what == "mins":
                        cur["limits"][t.group(1)] = None if t.group(2) == "N" else int(t.group(2))
                        cur["used"][t.group(1)] = int(t.group(3))
                    else:
                        cur["running"][t.group(1)] = int(t.group(3))
    if cur is not None:
        out.append(QosUsage(**cur))
    return out


# ---------------------------------------------------------------- month end (ledger periods, docs/ledger.md)
@dataclass(frozen=True)
class Utilization:
    """One row of ``sreport -P -t seconds cluster AccountUtilizationByUser``: an account's
    subtree total (``user`` empty) or one user's usage in the account."""

    cluster: str
    account: str
    user: str
    tres: str
    seconds: int


def parse_sreport_account_user(text: str) -> list[Utilization]:
    """``Cluster|Account|Login|Proper Name|TRES Name|Used`` rows; a malformed one is skipped
    and logged."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 6 or not parts[5].strip().isdigit():
            _skip("sreport", line)
            continue
        cluster, account, login, _proper, tres, used = parts
        out.append(Utilization(cluster, account, login, tres, int(used)))
    return out


# ---------------------------------------------------------------- squeue/sacct --json (Slurm >= 23.02)
# Slurm's data_parser output: numbers that may be unset or infinite are {"set", "infinite",
# "number"}; times are epoch seconds (0: none); a job's state is a list of flags, the base state
# first. JSON carries any name as it is (newlines, 0x1f, U+2028), so nothing here frames rows.
def _num(value, default: int | None = 0) -> int | None:
    """A data_parser number: a plain int, or {"set", "infinite", "number"} (None when infinite)."""
    if isinstance(value, dict):
        if value.get("infinite"):
            return None
        if not value.get("set", True):
            return default
        value = value.get("number", default)
    if isinstance(value, bool) or value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _state(value) -> SlurmState:
    if isinstance(value, dict):                        # sacct: {"current": [...], "reason": ...}
        value = value.get("current", [])
    if isinstance(value, list):
        value = " ".join(str(v) for v in value)
    return SlurmState.parse(str(value or ""))


def squeue_clock(seconds: int) -> str:
    """Seconds as squeue's %M prints them: ``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``."""
    d, rem = divmod(max(seconds, 0), 86400)
    h, rem = divmod(rem, 3600)
    m, s = divmod(rem, 60)
    if d:
        return f"{d}-{h:02d}:{m:02d}:{s:02d}"
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _limit(minutes, unlimited: str = "UNLIMITED") -> str:
    """A time limit in minutes (data_parser number) as squeue's %l / sacct's Timelimit print it."""
    value = _num(minutes, default=-1)
    if value is None:
        return unlimited
    if value < 0:
        return "Partition_Limit"
    return squeue_clock(value * 60)


def _acct_limit(minutes) -> str:
    """A time limit in minutes (data_parser number) as sacct's Timelimit prints it (``00:01:00``,
    ``1-00:00:00``)."""
    from gpuhpc.slurm.durations import format_duration

    value = _num(minutes, default=-1)
    if value is None:
        return "UNLIMITED"
    return "Partition_Limit" if value < 0 else format_duration(value * 60)


def _epoch(value) -> int:
    return _num(value, default=0) or 0


def _iso(value) -> str:
    """An epoch (data_parser number) as sacct prints it with SLURM_TIME_FORMAT=standard (local
    time, ``2026-12-01T10:00:00``); ``Unknown`` for none."""
    import datetime as dt

    t = _epoch(value)
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S") if t > 0 else "Unknown"


def array_task_ids(spec: str) -> list[str]:
    """An array's task string (``0-3``, ``1,5-9:2``, ``0-99%4``) -> each task id."""
    out: list[str] = []
    for part in (spec or "").split("%", 1)[0].split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not m:
            continue
        lo, hi, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
        out.extend(str(i) for i in range(lo, hi + 1, max(step, 1)))
    return out


def _json_doc(text: str, what: str) -> dict:
    import json

    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"{what} --json printed no JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise SlurmError(f"{what} --json printed {type(doc).__name__}, not an object")
    for err in doc.get("errors") or []:
        if isinstance(err, dict) and err.get("error_number") not in (0, None):
            raise SlurmError(f"{what} --json: {err.get('description') or err.get('error')}")
    return doc


def parse_squeue_json(text: str, *, user: str | None = None, job_ids=()) -> list[QueueRow]:
    """``squeue --json`` -> :class:`QueueRow` s, one per job and per array task, as
    ``squeue --array`` rows (a pending array's tasks, one record there, each get a row). Rows of
    another ``user`` or outside ``job_ids`` (a job id, an array's id, or ``ID_TASK``) are
    dropped here as well, whatever squeue's filters did."""
    import time

    now = int(time.time())
    wanted = {str(j) for j in job_ids}
    rows = []
    for job in _json_doc(text, "squeue").get("jobs") or []:
        if not isinstance(job, dict) or not isinstance(job.get("job_id"), int):
            _skip("squeue --json", str(job))
            continue
        raw = str(job["job_id"])
        array_id = _num(job.get("array_job_id"), 0) or 0
        task = _num(job.get("array_task_id"), None) if (job.get("array_task_id") or {}).get("set", True) else None
        task_string = job.get("array_task_string") or ""
        state = _state(job.get("job_state"))
        start, end = _epoch(job.get("start_time")), _epoch(job.get("end_time"))
        if state.state.value in ("RUNNING", "SUSPENDED", "COMPLETING") or state.state.is_finished:
            elapsed = max((min(end, now) if end and state.state.is_finished else now) - start, 0) if start else 0
        else:
            elapsed = 0
        common = dict(
            name=str(job.get("name") or ""), state=state, elapsed=squeue_clock(elapsed),
            time_limit=_limit(job.get("time_limit")), nodes=_num(job.get("node_count"), 0) or 0,
            tres_per_node=str(job.get("tres_per_node") or "N/A"), partition=str(job.get("partition") or ""),
            user=str(job.get("user_name") or ""), account=str(job.get("account") or ""),
            nodelist=str(job.get("nodes") or ""), reason=str(job.get("state_reason") or "None"),
            qos=str(job.get("qos") or ""),
        )
        rows += queue_rows(raw, array_id, task, task_string, common, user=user, wanted=wanted)
    return rows


def queue_rows(raw: str, array_id, task, waiting: str, common: dict, *, user: str | None,
               wanted: set[str]) -> list[QueueRow]:
    """One structured job record (``squeue --json``'s, pyslurm's) as ``squeue --array`` rows: a
    pending array's waiting tasks (one record, ``waiting`` their range) a row each, an array task
    its ``ARRAY_TASK`` row, a plain job one row; rows of another ``user`` or outside ``wanted``
    (job ids, array ids, ``ID_TASK``) left out. ``common``: the QueueRow fields all rows share."""
    if array_id and task is None and waiting:
        keys = [(f"{array_id}_{t}", raw, str(array_id), t) for t in array_task_ids(waiting)]
    elif array_id:
        keys = [(f"{array_id}_{task}", raw, str(array_id), str(task))]
    else:
        keys = [(raw, raw, raw, "N/A")]
    if user and common["user"] != user:
        return []
    return [QueueRow(job_id=job_id, job_id_raw=job_id_raw, array_job_id=array_job_id, array_task_id=array_task_id,
                     **common)
            for job_id, job_id_raw, array_job_id, array_task_id in keys
            if not wanted or wanted & {job_id, job_id_raw, array_job_id}]


def _tres_list(items) -> dict[str, str]:
    """data_parser TRES [{"type": "gres", "name": "gpu:h100", "count": 2}, ...] -> sacct's
    ``AllocTRES`` dict ({"gres/gpu:h100": "2", "mem": "500M", ...})."""
    out: dict[str, str] = {}
    for t in items or []:
        if not isinstance(t, dict) or "type" not in t:
            continue
        key = f"{t['type']}/{t['name']}" if t.get("name") else str(t["type"])
        count = _num(t.get("count"), 0) or 0
        if count <= 0:                  # sacct's text leaves out what is unset (energy: -2) or none
            continue
        out[key] = tres_mem(count) if key == "mem" else str(count)
    return out


def tres_mem(mb: int) -> str:
    """Megabytes as sacct's TRES strings print them: in the largest unit that divides exactly."""
    units = "MGTP"
    i = 0
    while mb >= 1024 and mb % 1024 == 0 and i < len(units) - 1:
        mb //= 1024
        i += 1
    return f"{mb}{units[i]}"


def parse_sacct_json(text: str, *, allocations: bool = True) -> list[AcctRow]:
    """``sacct --json`` -> :class:`AcctRow` s, one per job (allocation), the fields sacct's
    text prints (times local ISO, ``Unknown`` when unset); with ``allocations=False`` each
    step follows its job as ``ID.STEP``."""
    rows = []
    for job in _json_doc(text, "sacct").get("jobs") or []:
        if not isinstance(job, dict) or not isinstance(job.get("job_id"), int):
            _skip("sacct --json", str(job))
            continue
        raw = str(job["job_id"])
        array = job.get("array") or {}
        het = job.get("het") or {}
        array_id = _num(array.get("job_id"), 0) or 0
        task = _num(array.get("task_id"), None)
        het_offset = _num(het.get("job_offset"), None)
        if array_id and task is not None:
            job_id = f"{array_id}_{task}"
        elif array_id and array.get("task"):
            job_id = f"{array_id}_[{array['task']}]"
        elif het_offset is not None and _num(het.get("job_id"), 0):
            job_id = f"{_num(het.get('job_id'))}+{het_offset}"
        else:
            job_id = raw
        t = job.get("time") or {}
        exit_code = job.get("exit_code") or {}
        rc = _num(exit_code.get("return_code"), 0) or 0
        sig = _num((exit_code.get("signal") or {}).get("id"), 0) or 0
        tres = job.get("tres") or {}
        row = AcctRow(
            job_id=job_id, job_id_raw=raw, name=str(job.get("name") or ""), state=_state(job.get("state")),
            elapsed_s=_num(t.get("elapsed"), 0) or 0, submit=_iso(t.get("submission")), start=_iso(t.get("start")),
            end=_iso(t.get("end")), alloc_tres=_tres_list(tres.get("allocated")),
            req_tres=_tres_list(tres.get("requested")), partition=str(job.get("partition") or ""),
            account=str(job.get("account") or ""), user=str(job.get("user") or ""),
            nodelist=str(job.get("nodes") or ""), exit_code=f"{rc}:{sig}",
            restarts=_num(job.get("restart_cnt"), 0) or 0, time_limit=_acct_limit(t.get("limit")),
            qos=str(job.get("qos") or ""), cluster=str(job.get("cluster") or ""),
        )
        rows.append(row)
        if not allocations:
            for step in job.get("steps") or []:
                sid = (step.get("step") or {}).get("id")
                name = sid if isinstance(sid, str) else f"{raw}.{(step.get('step') or {}).get('name', '')}"
                st = step.get("time") or {}
                rows.append(_replace(row, job_id=name, job_id_raw=name,
                                                name=str((step.get("step") or {}).get("name") or ""),
                                                state=_state(step.get("state")),
                                                elapsed_s=_num(st.get("elapsed"), 0) or 0,
                                                start=_iso(st.get("start")), end=_iso(st.get("end")),
                                                alloc_tres=_tres_list((step.get("tres") or {}).get("allocated"))))
    return rows


def slurm_timestamp(text: str | None) -> float | None:
    """Epoch seconds of a Slurm time (``2026-12-01T15:09:53``, the controller's local time), None
    for ``None``/``Unknown``/``(null)``/0."""
    if not text or text in ("None", "Unknown", "(null)", "0"):
        return None
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None
