"""The cluster spec: one YAML file describes a whole Slurm cluster.

Frozen pydantic v2 models check shapes and single-field formats; cross-field rules (MIG fit,
unknown nodes in partitions, duplicate names, memory above physical, ...) live in
:mod:`gpuhpc.conf.validate`. :func:`load_spec` turns a pydantic ``ValidationError`` into a
one-line :class:`~gpuhpc.errors.SpecError` that names the field path of the first error.

Everything that ends up in a Slurm config file comes from here, including the paths and ports
of the daemons (``runtime``, per node group ``addr``/``port``), so that ``gpuhpc conf render``
and the Ansible roles render the very same files.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpuhpc.errors import SpecError, UserInputError
from gpuhpc.slurm.durations import UNLIMITED_WORDS, parse_duration

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_CTRL_RE = re.compile(r"[\x00-\x1f\x7f]")
PREEMPT_MODES = ("OFF", "CANCEL", "REQUEUE", "SUSPEND")


def _name(v: str) -> str:
    if not _NAME_RE.match(v):
        raise ValueError(f"{v!r} is not a valid name (letters, digits, '.', '_', '-'; must start with a letter or digit)")
    return v


def _path(v: str) -> str:
    if not v.startswith("/") or _CTRL_RE.search(v) or " " in v:
        raise ValueError(f"{v!r} must be an absolute path without spaces or control characters")
    return v


_WORD_RE = re.compile(r"^[A-Za-z0-9_.,=:/+@%\[\]-]+$")


def _word(v: str) -> str:
    """One token of a Slurm config line: no spaces, quotes, '#' or control characters."""
    if not _WORD_RE.match(v):
        raise ValueError(f"{v!r} may only contain letters, digits and _ . , = : / + @ % [ ] -")
    return v


def _text(v: str) -> str:
    if _CTRL_RE.search(v):
        raise ValueError("control characters are not allowed")
    return v


def slurm_time(v: str | int) -> str:
    """Validate a Slurm time string (``INFINITE``, ``90``, ``1:30:00``, ``2-00:00:00``): Slurm's
    formats (:mod:`gpuhpc.slurm.durations`), with fields after the first in range (Slurm would
    carry ``1:75:00`` over to 2:15:00; in a config file that is more likely a typo)."""
    s = str(v).strip()
    try:
        parse_duration(s, strict=True)
    except UserInputError as exc:
        raise ValueError(exc.one_line()) from None
    return s.upper() if s.upper() in UNLIMITED_WORDS else s


def _cluster_name(v: str) -> str:
    _name(v)
    if v != v.lower() or len(v) > 40:
        raise ValueError(f"{v!r}: Slurm cluster names are lowercase, at most 40 characters")
    return v


def _preempt_mode(v: str) -> str:
    s = v.strip().upper()
    if s not in PREEMPT_MODES:
        raise ValueError(f"{v!r} is not a PreemptMode (one of {', '.join(PREEMPT_MODES)})")
    return s


Name = Annotated[str, AfterValidator(_name)]
AbsPath = Annotated[str, AfterValidator(_path)]
Text = Annotated[str, AfterValidator(_text)]
Word = Annotated[str, AfterValidator(_word)]
SlurmTime = Annotated[str, AfterValidator(slurm_time)]
PreemptMode = Annotated[str, AfterValidator(_preempt_mode)]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Runtime(_Model):
    """Where the daemons keep state, logs and pids, which ports they use, and scheduler knobs.

    The defaults suit real hosts under systemd; ``examples/clusters/local.yaml`` overrides what a
    single-machine test cluster needs.
    """

    slurm_user: Name = "slurm"
    slurmd_user: Name = "root"
    slurmctld_port: Port = 6817
    slurmd_port: Port = 6818
    conf_dir: AbsPath = "/etc/slurm"
    state_save_location: AbsPath = "/var/spool/slurmctld"
    slurmd_spool_dir: AbsPath = "/var/spool/slurmd"
    log_dir: AbsPath = "/var/log/slurm"
    run_dir: AbsPath = "/run/slurm"
    munge_socket: AbsPath = "/run/munge/munge.socket.2"
    cred_expire: int | None = Field(default=None, ge=5)
    multiple_slurmd: bool = False
    proctrack: Literal["cgroup", "linuxproc"] = "cgroup"
    task_plugins: list[Literal["affinity", "cgroup", "none"]] = ["affinity", "cgroup"]
    select_type_parameters: Literal["CR_Core_Memory", "CR_CPU_Memory", "CR_Core", "CR_CPU"] = "CR_Core_Memory"
    def_mem_per_cpu: int | None = Field(default=None, ge=1)
    scheduler_parameters: list[Word] = []
    slurmctld_parameters: list[Word] = []
    slurmd_parameters: list[Word] = []
    return_to_service: Literal[0, 1, 2] = 1
    min_job_age: int | None = Field(default=None, ge=2)
    max_array_size: int | None = Field(default=None, ge=1, le=4000001)   # MaxArraySize (Slurm: 1001)
    max_job_count: int | None = Field(default=None, ge=1)   # MaxJobCount (Slurm: 10000 job records, finished ones until MinJobAge)
    kill_wait: int | None = Field(default=None, ge=0)
    job_requeue: bool = True
    gres_autodetect: Literal["off", "nvml"] = "off"
    jobcomp: Literal["none", "filetxt"] = "none"
    debug: Literal["quiet", "fatal", "error", "info", "verbose", "debug"] = "info"
    cgroup_constrain: list[Literal["cores", "devices", "ram", "swap"]] = ["cores", "devices", "ram"]
    # job_container/tmpfs (+ PrologFlags=Contain): every job gets a private /tmp (and the
    # gpuhpc_nvme_scratch role's scratch dir) on the node's local disk, removed when it ends
    job_container: Literal["none", "tmpfs"] = "none"
    # GPUs without proctrack/cgroup + task/cgroup + cgroup_constrain "devices" leave every
    # /dev/nvidia* of a node open to any job on it (a job asking for 0 GPUs included): validation
    # refuses that unless this says why the site accepts it (a test machine without cgroups)
    unconstrained_gpus_reason: Text | None = None
    # EnforcePartLimits: ALL refuses at submission a job that breaks a partition's limits (its
    # AllowAccounts/AllowQos included); NO queues it for ever
    enforce_part_limits: Literal["NO", "ANY", "ALL"] = "ALL"
    # RebootProgram: what slurmd runs for `scontrol reboot` (`gpuhpc node reboot`); null: none (Slurm
    # then refuses reboots). Left out where several slurmd share one host (multiple_slurmd): one
    # node's reboot would take every other node of the host with it.
    reboot_program: AbsPath | None = "/usr/sbin/reboot"
    # ResumeTimeout, when no cloud group sets it (power saving): how long a rebooted node may take to
    # register again before slurmctld marks it DOWN (Slurm's default, 60 s, is shorter than a
    # server's firmware POST)
    reboot_timeout: int = Field(default=600, ge=60)
    # MpiDefault: the PMI a step gets without --mpi. pmix where Slurm's mpi/pmix plugin and the PMIx
    # library are on every node (`srun --mpi=list` names pmix): MPI programs, in images too (enroot's
    # 50-slurm-pmi hook), start under plain srun; a node without it fails every such step
    mpi_default: Literal["none", "pmi2", "pmix"] = "none"


class Controller(_Model):
    """The slurmctld hosts: the first is the primary, the others backups (``SlurmctldHost`` lines in
    this order). With backups, ``runtime.state_save_location`` must be one directory every
    controller mounts (NFS): gpuhpc_slurm_controller checks that they see the same files."""
    hosts: list[Name] = Field(min_length=1)
    addr: Word | None = None   # SlurmctldHost=<host>(<addr>) for the first host
    # SlurmctldTimeout: seconds a backup waits for an unresponsive primary before it takes control
    # (Slurm's default: 120)
    timeout: int | None = Field(default=None, ge=3)


# Purge*After: Slurm's slurmdb_parse_purge takes digits, then nothing (months) or a case-insensitive
# prefix of "months", "days" or "hours"; the count is kept in 16 bits beside the unit flags
_PURGE_RE = re.compile(r"^([0-9]+)([A-Za-z]*)$")
_PURGE_UNITS = (("months", "month"), ("days", "days"), ("hours", "hours"))
_PURGE_FIX = "write a count and a unit, e.g. 12month, 90days or 720hours"


def purge_after(v: str | int) -> str:
    """A ``Purge*After`` value of slurmdbd.conf, written the one way Slurm documents it
    (``12month``, ``90days``, ``720hours``). A bare number is months, as in Slurm; ``m`` alone is
    refused (months to Slurm, minutes to a reader)."""
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ValueError(f"{v!r} is not a purge age; {_PURGE_FIX}")
    s = str(v).strip()
    m = _PURGE_RE.match(s)
    if not m:
        raise ValueError(f"{s!r} is not a purge age (no spaces or signs); {_PURGE_FIX}")
    count, unit = int(m.group(1)), m.group(2).lower()
    if not 1 <= count <= 0xFFFF:
        raise ValueError(f"{s!r}: the count must be 1 to 65535 (leave the setting out to keep records for ever); {_PURGE_FIX}")
    if unit == "m":
        raise ValueError(f"{s!r} is ambiguous (Slurm reads months, not minutes); write {count}month")
    for full, written in _PURGE_UNITS:
        if unit == "" and full == "months" or unit and full.startswith(unit):
            return f"{count}{written}"
    raise ValueError(f"{s!r}: unknown unit {m.group(2)!r} (Slurm knows months, days and hours); {_PURGE_FIX}")


PurgeAfter = Annotated[str, BeforeValidator(purge_after)]

# what each Archive* flag archives, and the Purge*After that decides when (slurmdbd.conf(5))
ARCHIVE_PURGE = {"events": "event", "jobs": "job", "resvs": "resv", "steps": "step", "suspend": "suspend",
                 "txn": "txn", "usage": "usage"}


class Slurmdbd(_Model):
    """slurmdbd and its database. ``purge_*_after`` age out old records (``Purge*After``; unset, as by
    default: Slurm keeps everything for ever and the database only grows); ``archive_*`` writes what
    a purge removes to files in ``archive_dir`` first (``Archive*``), or hands it to ``archive_script``."""
    host: Name
    port: Port = 6819
    storage_host: Word = "127.0.0.1"
    storage_port: Port = 3306
    storage_user: Name = "slurm"
    storage_db: Name = "slurm_acct_db"
    enforce: list[Literal["associations", "limits", "qos", "safe", "wckeys", "nojobs", "nosteps"]] = [
        "associations", "limits", "qos"]
    track_gpu_types: bool = True   # AccountingStorageTRES gets gres/gpu:<type> for every type
    purge_event_after: PurgeAfter | None = None     # node down/drain events
    purge_job_after: PurgeAfter | None = None       # job records (sacct); usage stays until purge_usage_after
    purge_resv_after: PurgeAfter | None = None      # reservations
    purge_step_after: PurgeAfter | None = None      # job steps (the largest table on a busy cluster)
    purge_suspend_after: PurgeAfter | None = None   # suspend/resume records
    purge_txn_after: PurgeAfter | None = None       # sacctmgr's transaction log
    purge_usage_after: PurgeAfter | None = None     # rolled-up usage (sreport; fair-share history)
    archive_dir: AbsPath | None = None              # ArchiveDir (Slurm's default /tmp is not kept)
    archive_script: AbsPath | None = None           # ArchiveScript: used instead of slurmdbd's own archive files
    archive_events: bool = False
    archive_jobs: bool = False
    archive_resvs: bool = False
    archive_steps: bool = False
    archive_suspend: bool = False
    archive_txn: bool = False
    archive_usage: bool = False

    @model_validator(mode="after")
    def _archive_needs_purge(self) -> "Slurmdbd":
        for what, purge in ARCHIVE_PURGE.items():
            if getattr(self, f"archive_{what}") and getattr(self, f"purge_{purge}_after") is None:
                raise ValueError(f"archive_{what}: Slurm archives {what} only when it purges them; "
                                 f"set purge_{purge}_after too (e.g. 12month), or drop archive_{what}")
        archives = [w for w in ARCHIVE_PURGE if getattr(self, f"archive_{w}")]
        if archives and self.archive_dir is None and self.archive_script is None:
            raise ValueError(f"archive_{archives[0]}: set archive_dir (a directory kept for good; Slurm's default "
                             "is /tmp) or archive_script")
        if (self.archive_dir or self.archive_script) and not archives:
            raise ValueError("archive_dir/archive_script: nothing is archived; set archive_jobs (etc.) as well, "
                             "or drop them")
        return self


class Priority(_Model):
    """The priority plugin and how usage decays (``PriorityType``, ``PriorityDecayHalfLife``,
    ``PriorityUsageResetPeriod``). Budgets that Slurm enforces (``GrpTRESMins`` on an account,
    written by ``gpuhpc ledger sync-slurm``) accumulate usage only under ``multifactor``; with
    ``decay_half_life: "0"`` and ``usage_reset_period: NONE`` that usage never decays, and the
    ledger resets it at each quota period (docs/ledger.md). The ledger's qos mode (``gpuhpc ledger
    policy set slurm_enforcement qos``) puts each budget on a ``NoDecay`` QOS instead: then
    ``decay_half_life`` may be anything and fair-share keeps decaying (docs/ledger.md, "Budget
    enforcement modes"; needs ``job_submit_lua``)."""
    type: Literal["basic", "multifactor"] = "basic"
    decay_half_life: SlurmTime | None = None       # "0": no decay (hard budgets)
    usage_reset_period: Literal["NONE", "NOW", "DAILY", "WEEKLY", "MONTHLY", "QUARTERLY", "YEARLY"] | None = None
    calc_period_min: int | None = Field(default=None, ge=1)   # PriorityCalcPeriod: how often usage is added up


HEALTH_NODE_STATES = ("ANY", "IDLE", "ALLOC", "MIXED", "NONDRAINED_IDLE", "CYCLE")


class Health(_Model):
    """Slurm runs gpuhpc's node health gate (docs/health.md): ``HealthCheckProgram`` every
    ``interval`` seconds, the fast checks in the ``Prolog`` and the full ones in the ``Epilog``.
    The hooks come from the gpuhpc package on the nodes (``hooks_dir``); they read
    ``/etc/gpuhpc/hooks.env``, which the gpuhpc_slurm_common role writes from the rest."""
    interval: int = Field(default=300, ge=10, le=86400)       # HealthCheckInterval, seconds
    # HealthCheckNodeState: ANY runs on drained nodes too, which is how a node gpuhpc drained returns
    node_state: list[Literal[HEALTH_NODE_STATES]] = Field(default=["ANY"], min_length=1)
    prolog: bool = True                        # Prolog: the job map, then the fast checks (< 1 s)
    epilog: bool = True                        # Epilog: the job map cleared, then the full checks
    hooks_dir: AbsPath = "/usr/local/sbin"     # gpuhpc-healthcheck, gpuhpc-prolog, gpuhpc-epilog
    program: AbsPath | None = None             # HealthCheckProgram; default: hooks_dir/gpuhpc-healthcheck
    python: AbsPath = "/opt/gpuhpc/venv/bin/python"   # the gpuhpc install on the nodes (GPUHPC_PYTHON)
    spec_file: AbsPath | None = None           # the health spec on the nodes (GPUHPC_HEALTH_SPEC)
    jobmap_dir: AbsPath = "/run/gpuhpc/jobmap"   # the GPU-to-job map the GPU exporter reads

    @model_validator(mode="after")
    def _node_state(self) -> "Health":
        states = [s for s in self.node_state if s != "CYCLE"]
        if not states:
            raise ValueError("node_state: CYCLE needs a state to run in as well (e.g. [ANY, CYCLE])")
        if "ANY" in states and len(states) > 1:
            raise ValueError("node_state: ANY already covers every state; list ANY alone (plus CYCLE)")
        if len(set(self.node_state)) != len(self.node_state):
            raise ValueError("node_state: a state is listed twice")
        return self


def _mount_option(v: str) -> str:
    _word(v)
    if "," in v:
        raise ValueError(f"{v!r}: one mount option per list entry")
    return v


MountOption = Annotated[str, AfterValidator(_mount_option)]


class Scratch(_Model):
    """Node-local scratch: ``path`` is the mount point (``TmpDisk`` from ``size_gb``). With
    ``devices`` the gpuhpc_nvme_scratch role assembles them (RAID 0 for several, the disk itself
    for one), formats XFS and mounts it on ``path`` with ``mount_options``."""
    path: AbsPath
    size_gb: int | None = Field(default=None, ge=1)
    devices: list[AbsPath] = []
    mount_options: list[MountOption] = ["defaults", "noatime"]


class Gpus(_Model):
    type: Annotated[str, AfterValidator(lambda v: _name(v.lower()))]
    count: int = Field(ge=1, le=64)
    # one core list per GPU ("0-27"): gres.conf Cores=
    cpu_affinity: list[Word] | None = None
    # one MIG layout per GPU; [] leaves that GPU whole
    mig: list[list[Word]] | None = None
    device: AbsPath = "/dev/nvidia{index}"
    mig_device: AbsPath = "/dev/nvidia-caps/nvidia-cap{index}"

    @field_validator("device", "mig_device")
    @classmethod
    def _device_pattern(cls, v: str) -> str:
        if "{index}" not in v:
            raise ValueError(f"{v!r} must contain '{{index}}' (and may contain '{{node}}')")
        try:
            v.format(index=0, node="n")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{v!r}: only {{index}} and {{node}} may be used ({exc})") from None
        return v


class NodeGroup(_Model):
    name: Name
    hostname: Text                      # pattern: "gpu-node{n}", "dgx{n:03d}"
    count: int = Field(default=1, ge=1, le=100000)
    start: int = Field(default=1, ge=0)
    sockets: int = Field(ge=1)
    cores_per_socket: int = Field(ge=1)
    threads_per_core: int = Field(default=1, ge=1, le=8)
    memory_mb: int = Field(ge=1)        # physical RAM
    real_memory_mb: int | None = Field(default=None, ge=1)   # what Slurm may schedule
    scratch: Scratch | None = None
    ib_hcas: list[Name] = []
    features: list[Name] = []
    weight: int | None = Field(default=None, ge=0)
    gpus: Gpus | None = None
    addr: Word | None = None            # NodeAddr=
    node_hostname: Name | None = None   # NodeHostname=
    port: Port | None = None            # first node's Port=; the group's nodes count up from it
    # configless slurmd (docs/admin.md, "Configless compute nodes"): the group's hosts get no
    # slurm.conf, gres.conf, topology.conf or cgroup.conf; slurmd starts with --conf-server (the
    # controllers) and fetches them from slurmctld (SlurmctldParameters=enable_configless), so a
    # change reaches them with `scontrol reconfigure` alone. Cloud nodes always start this way.
    configless: bool = False
    # NVLink domains (GB200 NVL72 and the like), for Slurm's topology/block
    # (`gpuhpc topology from-ibnetdiscover --format block --block-by nvlink --spec`). At most one of:
    nvlink_domain: Name | None = None           # the whole group is one domain, with this name
    nvlink_domain_size: int | None = Field(default=None, ge=1)   # consecutive chunks of this many nodes
    nvlink_domains: list[Word] | None = None    # one hostlist per domain (nodes of this group)
    # elastic capacity (docs/elastic.md): "cloud" nodes are State=CLOUD, powered up by Slurm's
    # ResumeProgram (`gpuhpc power resume`) when jobs wait and down after idle_timeout
    capacity: Literal["static", "cloud"] = "static"
    market: Literal["on_demand", "spot"] = "on_demand"
    instance_types: list[Word] = []             # in order of preference (the provider falls back along it)
    max_nodes: int | None = Field(default=None, ge=1)        # at most this many up at once (default: count)
    boot_timeout: int | None = Field(default=None, ge=1)     # seconds a node takes to boot and register
    idle_timeout: int | None = Field(default=None, ge=1)     # seconds idle before it is powered down
    capacity_cooldown: int = Field(default=300, ge=0)        # seconds a pool rests after a capacity error
    provider: Literal["local", "aws"] | None = None
    price_tier: int = Field(default=0, ge=0, le=1000)        # lower is cheaper; one partition per tier
    # multi-node jobs on aws (docs/elastic.md): one availability zone per multi-node launch; a
    # placement group ("cluster": the pool's own, made if missing; else an existing group's name);
    # an On-Demand Capacity Reservation, or a Capacity Block for ML (capacity_type capacity-block)
    single_zone: bool = True
    placement_group: Word | None = None
    capacity_reservation_id: Word | None = None
    capacity_type: Literal["capacity-block"] | None = None

    @model_validator(mode="after")
    def _cloud_fields(self) -> "NodeGroup":
        if self.capacity == "static":
            given = [k for k in ("instance_types", "max_nodes", "boot_timeout", "idle_timeout", "provider",
                                 "placement_group", "capacity_reservation_id", "capacity_type")
                     if getattr(self, k) not in (None, [])] + ([] if self.single_zone else ["single_zone"])
            if given:
                raise ValueError(f"{', '.join(given)}: only for capacity: cloud")
        elif self.provider is None:
            raise ValueError("a cloud group needs a provider (local or aws)")
        if self.capacity_type == "capacity-block" and (self.market != "on_demand" or not self.capacity_reservation_id):
            raise ValueError("capacity_type capacity-block needs market on_demand and the block's capacity_reservation_id")
        if self.max_nodes is not None and self.max_nodes > self.count:
            raise ValueError(f"max_nodes {self.max_nodes} is above count {self.count}")
        return self

    @model_validator(mode="after")
    def _one_nvlink_form(self) -> "NodeGroup":
        given = [k for k in ("nvlink_domain", "nvlink_domain_size", "nvlink_domains") if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of nvlink_domain, nvlink_domain_size, nvlink_domains (not {' and '.join(given)})")
        return self

    def nvlink_domain_of(self) -> dict[str, str]:
        """node name -> NVLink domain name: ``nvlink_domain`` as given; ``nvlink_domain_size`` and
        ``nvlink_domains`` as ``<group>-nvl1``, ``<group>-nvl2`` ... in node order. Empty when the
        group declares none. Hostlists are expanded as given (conf validate checks the names)."""
        names = self.node_names()
        if self.nvlink_domain is not None:
            return {n: self.nvlink_domain for n in names}
        if self.nvlink_domain_size is not None:
            return {n: f"{self.name}-nvl{i // self.nvlink_domain_size + 1}" for i, n in enumerate(names)}
        out: dict[str, str] = {}
        for j, expr in enumerate(self.nvlink_domains or []):
            from gpuhpc.hostlist import expand

            for n in expand(expr):
                out.setdefault(n, f"{self.name}-nvl{j + 1}")
        return out

    @field_validator("hostname")
    @classmethod
    def _hostname_pattern(cls, v: str) -> str:
        try:
            sample = v.format(n=1)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{v!r}: only the field {{n}} may be used, e.g. 'gpu-node{{n}}' or 'dgx{{n:03d}}' ({exc})") from None
        _name(sample)
        return v

    def node_names(self) -> list[str]:
        return [self.hostname.format(n=i) for i in range(self.start, self.start + self.count)]

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core


class Power(_Model):
    """Slurm's power saving for the ``capacity: cloud`` groups (docs/elastic.md): the programs
    Slurm runs (wrappers around ``gpuhpc power resume|suspend|resume-fail``), its timeouts, and
    where ``gpuhpc power`` keeps its launch records."""
    programs_dir: AbsPath = "/usr/local/sbin"   # gpuhpc-power-resume, -suspend, -resume-fail
    resume_timeout: int | None = Field(default=None, ge=1)    # default: the slowest boot_timeout + 30
    suspend_timeout: int = Field(default=300, ge=1)  # slurm-gcp's: a cloud instance's end can take minutes
    state_dir: AbsPath = "/var/lib/gpuhpc/elastic"
    cloud_dns: bool = False                    # the cloud nodes' names resolve (else NodeAddr is rendered)
    orphan_grace: int = Field(default=600, ge=0)   # seconds before the reconciler ends an untracked instance


class Partition(_Model):
    name: Name
    nodes: list[Word] = Field(min_length=1)   # node names, hostlist expressions, node-group names, or ALL
    default: bool = False
    priority_tier: int = Field(default=1, ge=0, le=65533)
    preempt_mode: PreemptMode | None = None
    max_time: SlurmTime = "INFINITE"
    default_time: SlurmTime | None = None
    grace_time: int | None = Field(default=None, ge=0)     # seconds
    allow_accounts: list[Name] | None = None
    allow_qos: list[Name] | None = None
    qos: Name | None = None
    oversubscribe: Literal["NO", "YES", "EXCLUSIVE", "FORCE"] | None = None
    state: Literal["UP", "DOWN", "DRAIN", "INACTIVE"] = "UP"
    # a GPU job that asks for no CPUs/memory gets this much per GPU; default (a partition of
    # GPU nodes only): the node sizing, CPUs and RealMemory over GPUs, on its smallest node
    def_cpu_per_gpu: int | None = Field(default=None, ge=1)
    def_mem_per_gpu_mb: int | None = Field(default=None, ge=1)


class Qos(_Model):
    name: Name
    description: Text | None = None
    priority: int = Field(default=0, ge=0)
    preempt: list[Name] = []
    preempt_mode: PreemptMode | None = None
    grace_time: int | None = Field(default=None, ge=0)
    max_wall: SlurmTime | None = None
    # MaxSubmitJobsPerUser: pending + running jobs (each array task counts) one user may have
    # under this QOS; None: no limit (validation warns when no QOS sets one)
    max_submit_jobs_per_user: int | None = Field(default=None, ge=1)


class Account(_Model):
    name: Name
    description: Text | None = None
    organization: Name | None = None
    users: list[Name] = []
    qos: list[Name] = []
    default_qos: Name | None = None


class Switch(_Model):
    name: Name
    nodes: list[Word] = []       # node names or hostlist expressions
    switches: list[Name] = []
    link_speed: int | None = Field(default=None, ge=1)


class Topology(_Model):
    # block: topology/block, one BlockName= per NVLink domain of the node groups (Slurm 23.11+ only;
    # every release gets the domains as node features nvl-<domain>, docs/sprints.md)
    plugin: Literal["tree", "block", "none"] = "tree"
    switches: list[Switch] = []


class Preemption(_Model):
    """Cluster-wide ``PreemptType``/``PreemptMode``. Slurm refuses ``OFF`` with a preempt plugin and
    any other mode without one (read_config.c), so the default is no preemption at all."""
    type: Literal["partition_prio", "qos", "none"] = "none"
    mode: PreemptMode = "OFF"     # cluster-wide PreemptMode
    gang: bool = False


_NCCL_KEY_RE = re.compile(r"^(NCCL|TORCH_NCCL|UCX|GLOO)_[A-Z0-9_]+$")
_NCCL_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,=:/+@%^-]+$")


class Nccl(_Model):
    """NCCL/IB defaults that job scripts source (``/etc/gpuhpc/nccl.env``, one per node group,
    :func:`gpuhpc.conf.render.render_nccl_profiles`); a value already in a job's environment
    wins. The HCAs are each node group's ``ib_hcas``, in the order given: list them in rail
    order (the HCA of GPU 0's rail first)."""
    ib_gid_index: int | None = Field(default=None, ge=0, le=255)   # RoCE v2: usually 3
    socket_ifname: str | None = None      # NCCL_SOCKET_IFNAME: "=bond0", "^lo,docker"
    env: dict[str, str] = {}              # further NCCL_* / TORCH_NCCL_* / UCX_* settings

    @field_validator("socket_ifname")
    @classmethod
    def _ifname(cls, v: str | None) -> str | None:
        if v is not None and not _NCCL_VALUE_RE.match(v):
            raise ValueError(f"{v!r} may only contain letters, digits and _ . , = : / + @ % ^ -")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not _NCCL_KEY_RE.match(key):
                raise ValueError(f"{key!r}: only NCCL_*, TORCH_NCCL_*, UCX_* and GLOO_* variables")
            if not _NCCL_VALUE_RE.match(str(value)):
                raise ValueError(f"{key}={value!r}: letters, digits and _ . , = : / + @ % ^ - only")
        return {k: str(val) for k, val in v.items()}


def _cidr(v: str) -> str:
    import ipaddress

    try:
        return str(ipaddress.ip_network(v, strict=True))
    except ValueError as exc:
        raise ValueError(f"{v!r} is not a network in CIDR form, e.g. 10.10.0.0/16 ({exc})") from None


_LNET_NET_RE = re.compile(r"^(o2ib|tcp)\d*$")
_NID_RE = re.compile(r"^[A-Za-z0-9.:-]+@(o2ib|tcp)\d*$")
_FSNAME_RE = re.compile(r"^[A-Za-z0-9_]{1,8}$")
_VAR_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LnetNetwork(_Model):
    """One LNet network of the clients (lnet.conf ``net:``): ``o2ib`` (InfiniBand/RoCE) or ``tcp``,
    over these interfaces."""
    net: str
    interfaces: list[Name] = Field(min_length=1)

    @field_validator("net")
    @classmethod
    def _net(cls, v: str) -> str:
        if not _LNET_NET_RE.match(v):
            raise ValueError(f"{v!r} is not an LNet network (o2ib, o2ib1, tcp, tcp0, ...)")
        return v


class LustreMount(_Model):
    fsname: str
    mgs_nids: list[str] = Field(min_length=1)   # one per MGS (failover pair: two), e.g. 10.20.0.1@o2ib
    mountpoint: AbsPath
    options: list[MountOption] = ["flock", "_netdev"]

    @field_validator("fsname")
    @classmethod
    def _fsname(cls, v: str) -> str:
        if not _FSNAME_RE.match(v):
            raise ValueError(f"{v!r} is not a Lustre fsname (1-8 letters, digits or _)")
        return v

    @field_validator("mgs_nids")
    @classmethod
    def _nids(cls, v: list[str]) -> list[str]:
        for nid in v:
            if not _NID_RE.match(nid):
                raise ValueError(f"{nid!r} is not a Lustre NID (address@o2ib or address@tcp)")
        return v

    def source(self) -> str:
        """The mount source: ``nid1:nid2:/fsname`` (failover MGS nodes separated by ':')."""
        return ":".join(self.mgs_nids) + ":/" + self.fsname


class Lustre(_Model):
    """Lustre clients (the gpuhpc_lustre_client role): the LNet networks of every client and the
    filesystems they mount."""
    lnet: list[LnetNetwork] = Field(min_length=1)
    mounts: list[LustreMount] = Field(min_length=1)


class BeegfsMount(_Model):
    """One BeeGFS filesystem a client mounts (the gpuhpc_beegfs_client role): its own
    beegfs-client.conf, connInterfaces file and RDMA setting. ``connauth_secret`` names the
    Ansible (vault) variable that holds the connection-auth secret; the secret itself never
    appears in the spec."""
    name: Name
    mgmtd_host: Word
    mgmtd_port: Port = 8008
    client_port: Port | None = None         # connClientPortUDP; several mounts need distinct ports
    helperd_port: Port | None = None        # connHelperdPortTCP (BeeGFS 7)
    mountpoint: AbsPath
    conn_interfaces: list[Name] = []        # connInterfacesFile: the interfaces, in preference order
    rdma: bool = True                       # connUseRDMA
    connauth_secret: str | None = None      # variable name, e.g. vault_beegfs_scratch_connauth

    @field_validator("connauth_secret")
    @classmethod
    def _secret_name(cls, v: str | None) -> str | None:
        if v is not None and not _VAR_RE.match(v):
            raise ValueError(f"{v!r} must be the name of the variable that holds the secret (letters, digits, _), "
                             "not the secret itself")
        return v


class Filesystems(_Model):
    lustre: Lustre | None = None
    beegfs: list[BeegfsMount] = []


class ClusterSpec(_Model):
    name: Annotated[str, AfterValidator(_cluster_name)]
    controller: Controller
    slurmdbd: Slurmdbd | None = None
    runtime: Runtime = Runtime()
    preemption: Preemption = Preemption()
    priority: Priority | None = None          # None: Slurm's default (priority/basic), nothing rendered
    # JobSubmitPlugins=lua with gpuhpc's job_submit.lua (refuses a job that cannot fit its account's
    # published budget, slurm-conf/job_submit.lua); the roles install the script next to slurm.conf
    job_submit_lua: bool = False
    health: Health | None = None              # None: Slurm runs no health checks, no Prolog/Epilog
    power: Power = Power()                    # power saving; rendered only with a capacity: cloud group
    node_groups: list[NodeGroup] = Field(min_length=1)
    partitions: list[Partition] = Field(min_length=1)
    qos: list[Qos] = []
    accounts: list[Account] = []
    topology: Topology = Topology()
    nccl: Nccl = Nccl()
    # only these networks (CIDRs) reach slurmctld, slurmd and slurmdbd (gpuhpc_hardening's nftables)
    management_networks: list[Annotated[str, AfterValidator(_cidr)]] = []
    filesystems: Filesystems = Filesystems()   # parallel filesystems the compute and login hosts mount

    def nodes(self) -> list[tuple[NodeGroup, str]]:
        return [(g, n) for g in self.node_groups for n in g.node_names()]

    def nvlink_domains(self) -> dict[str, str]:
        """node name -> NVLink domain, for the node groups that declare one."""
        return {n: d for g in self.node_groups for n, d in g.nvlink_domain_of().items()}

    def ib_hcas(self) -> set[str]:
        """The compute HCA names the node groups list (``ib_hcas``; storage HCAs left out)."""
        return {h for g in self.node_groups for h in g.ib_hcas}


def format_loc(loc: tuple[int | str, ...]) -> str:
    """``('partitions', 1, 'nodes')`` -> ``'partitions[1].nodes'``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def spec_from_data(data: object, *, source: str = "spec") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source} must be a YAML mapping", hint="see examples/clusters/local.yaml")
    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(msg, field=format_loc(tuple(err["loc"])) or None,
                        hint=f"{len(exc.errors()) - 1} more error(s)" if len(exc.errors()) > 1 else None) from None


def load_spec(path: str | Path) -> ClusterSpec:
    """Read and parse a cluster spec YAML (shape only; see :func:`gpuhpc.conf.validate.validate`)."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"cannot read {p}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise SpecError(f"{p} is not valid YAML{where}") from None
    return spec_from_data(data, source=str(p))
