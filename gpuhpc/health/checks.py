"""Node health checks: each one a pure function from command output (text) to a :class:`Result`.

Meta GCM's shape: a check returns a status and a message, never raises on what it reads and
never runs anything itself; :mod:`gpuhpc.health.collect` fetches the text through a runner.
A failing check names its drain category, from which :mod:`gpuhpc.health.gate` builds the drain
reason (``gpuhpc:hw: gpu count 7/8``):

- :data:`HW`: a hardware fault (a lost GPU, a double-bit ECC error, a failed row remap, XID
  48/74/79/94/95/119/140). Such a drain is *sticky*: a later clean regular run does not return
  the node, only an admin (``scontrol update ... State=RESUME``) or a passing deep check does.
- :data:`DEV`: device or link state that can clear by itself (an IB port down, a MIG layout that
  differs from gres.conf, a GPU reset pending, the other critical XIDs): the node returns once
  the checks pass.
- :data:`SW`: software (munge, mounts, scratch); :data:`PERF`: performance (clock throttling;
  drained only when several recent samples fail, :class:`Hysteresis`).

Messages never contain ``=`` (``scontrol show node`` prints the reason among ``Key=Value`` pairs).
"""
from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

HW, DEV, SW, PERF = "hw", "dev", "sw", "perf"
CATEGORIES = (HW, DEV, SW, PERF)         # the order of seriousness (the drain reason names the first)


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"           # worth a look; never drains
    FAIL = "fail"           # drains the node
    SKIP = "skip"           # nothing to check here (no such hardware, not in the spec)


@dataclass(frozen=True)
class Result:
    """One check's verdict."""

    check: str
    status: Status
    message: str = ""
    category: str = HW

    def to_dict(self) -> dict:
        return {"check": self.check, "status": self.status.value, "category": self.category,
                "message": self.message}


def ok(check: str, message: str = "", category: str = HW) -> Result:
    return Result(check, Status.OK, message, category)


def fail(check: str, message: str, category: str = HW) -> Result:
    return Result(check, Status.FAIL, message.replace("=", ":"), category)


def skip(check: str, message: str, category: str = HW) -> Result:
    return Result(check, Status.SKIP, message, category)


def warn(check: str, message: str, category: str = HW) -> Result:
    return Result(check, Status.WARN, message, category)


# ------------------------------------------------------------------ gres.conf
@dataclass(frozen=True)
class GresLine:
    """One ``Name=gpu`` line of gres.conf that applies to a node."""

    type: str
    files: tuple[str, ...] = ()
    count: int | None = None

    @property
    def n(self) -> int:
        return len(self.files) if self.files else (self.count or 0)


def _kv(line: str) -> dict[str, str]:
    out = {}
    for word in line.split():
        if "=" in word:
            k, v = word.split("=", 1)
            out[k.lower()] = v
    return out


def parse_gres_conf(text: str, node: str) -> list[GresLine]:
    """The ``Name=gpu`` lines of gres.conf that apply to ``node`` (``NodeName=`` hostlists
    expanded; a line without ``NodeName=`` applies to every node), ``File=`` ranges expanded."""
    from gpuhpc.hostlist import expand

    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kv = _kv(line)
        if kv.get("name") != "gpu":
            continue
        if "nodename" in kv and node not in expand(kv["nodename"], field="gres.conf NodeName"):
            continue
        files = tuple(expand(kv["file"], field="gres.conf File")) if "file" in kv else ()
        count = int(kv["count"]) if kv.get("count", "").isdigit() else None
        out.append(GresLine(kv.get("type", "gpu"), files, count))
    return out


def expected_counts(lines: Iterable[GresLine]) -> Counter:
    c: Counter = Counter()
    for g in lines:
        c[g.type] += g.n
    return c


# ------------------------------------------------------------------ GPU device files
def parse_stat(text: str) -> dict[str, str]:
    """``stat -c '%F|%n' FILES...`` -> {path: file type} (missing files print nothing on stdout)."""
    out = {}
    for line in text.splitlines():
        if "|" in line:
            kind, path = line.split("|", 1)
            out[path] = kind
    return out


def check_gpu_devices(expected: Sequence[GresLine], present: Mapping[str, str]) -> Result:
    """Every gres.conf ``File=`` of the node is a character device: the GPU (or MIG) count a
    job can be given. ``present``: :func:`parse_stat` of those files."""
    name = "gpu-devices"
    if not expected:
        return skip(name, "no GPUs in gres.conf for this node")
    if not any(g.files for g in expected):
        return skip(name, "gres.conf names no File= for this node's GPUs")
    want: Counter = Counter()
    have: Counter = Counter()
    missing = []
    for g in expected:
        for f in g.files:
            want[g.type] += 1
            if present.get(f) == "character special file":
                have[g.type] += 1
            else:
                missing.append(f)
    if not missing:
        return ok(name, f"{sum(have.values())} GPU devices: " + ", ".join(f"{t} {n}" for t, n in sorted(have.items())))
    total_w, total_h = sum(want.values()), sum(have.values())
    per = ", ".join(f"{t} {have[t]}/{want[t]}" for t in sorted(want) if have[t] != want[t])
    return fail(name, f"gpu count {total_h}/{total_w} ({per}; missing {', '.join(missing[:3])}"
                      f"{' ...' if len(missing) > 3 else ''})")


_MIG_PROFILE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb")      # 1g.10gb, 3g.40gb, 1c.3g.40gb, 1g.10gb+me


def check_gpu_listing(expected: Mapping[str, int], listing_text: str) -> Result:
    """``nvidia-smi -L``: the GPUs the driver sees, by type, and the MIG layout (MIG devices by
    profile), against gres.conf's typed counts."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.inventory.gres import short_type
    from gpuhpc.inventory.smi import parse_list

    name = "gpu-listing"
    if not expected:
        return skip(name, "no GPUs in gres.conf for this node")
    try:
        gpus = parse_list(listing_text)
    except UserInputError as exc:
        return fail(name, f"nvidia-smi -L unreadable: {exc.message[:80]}", DEV)
    seen: Counter = Counter()
    for g in gpus:
        if g.mig:
            for m in g.mig:
                seen[m.profile or "mig"] += 1
        else:
            seen[short_type(g.name)] += 1
    # an untyped gres.conf line counts any GPU
    want = Counter(expected)
    if set(want) == {"gpu"}:
        seen = Counter({"gpu": sum(seen.values())})
    if seen == want:
        return ok(name, ", ".join(f"{t} {n}" for t, n in sorted(seen.items())))
    # MIG on either side (the driver lists MIG devices, or gres.conf wants MIG profiles: a node whose
    # instances were lost, as after a reboot, lists whole GPUs)
    mig = any(g.mig for g in gpus) or any(_MIG_PROFILE.match(t) for t in want)
    diff = ", ".join(f"{t} {seen.get(t, 0)}/{want.get(t, 0)}" for t in sorted(set(want) | set(seen))
                     if seen.get(t, 0) != want.get(t, 0))
    # a GPU the driver lost is a hardware fault (sticky); a MIG layout other than gres.conf's is
    # state an admin or the MIG role changes back (DEV: the node returns once it matches)
    return fail(name, f"{'mig layout' if mig else 'gpu count'} {sum(seen.values())}/{sum(want.values())} ({diff})",
                DEV if mig else HW)


# ------------------------------------------------------------------ XID errors
_XID = re.compile(r"^\[\s*([\d.]+)\]\s+NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
# XIDs that mean the GPU needs attention (NVIDIA's XID catalogue: "reset GPU"/"contact support");
# application errors (13, 31, 43, 45 ...) are the job's own and do not drain a node.
CRITICAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 121, 140})
# of those, the hardware faults whose drain sticks (category HW): double-bit ECC (48), NVLink (74),
# fallen off the bus (79), contained/uncontained ECC (94, 95), GSP timeout (119), unrecovered ECC
# (140). The others drain as DEV and return with the next clean run.
STICKY_XIDS = frozenset({48, 74, 79, 94, 95, 119, 140})


def parse_xids(dmesg_text: str) -> list[tuple[float, str, int]]:
    """``dmesg`` (raw timestamps) -> [(seconds since boot, PCI bus id, xid)]."""
    out = []
    for line in dmesg_text.splitlines():
        m = _XID.match(line.strip())
        if m:
            out.append((float(m.group(1)), m.group(2), int(m.group(3))))
    return out


def xid_since(mark_text: str | None, boot_id: str) -> float | None:
    """The previous run's XID high-water mark for this boot, from the mark file's text
    (``"<boot id> <seconds since boot>"``): None (every XID is new) when there is none or it was
    written in another boot (dmesg's clock restarts at 0 with every boot). A mark without a boot
    id (written before marks had one) counts as this boot's."""
    words = (mark_text or "").split()
    if not words:
        return None
    if len(words) == 1:
        boot, value = boot_id, words[0]
    else:
        boot, value = words[0], words[1]
    if boot != boot_id:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def xid_mark_text(boot_id: str, mark: float) -> str:
    """The mark file's text for :func:`xid_since`."""
    return f"{boot_id} {mark}\n" if boot_id else f"{mark}\n"


def check_xid(dmesg_text: str, since: float | None) -> tuple[Result, float | None]:
    """Critical XIDs logged after ``since`` (the newest timestamp the previous run saw in this
    boot, :func:`xid_since`; None: all). Returns the result and the new high-water mark to store
    for the next run. A :data:`STICKY_XIDS` one fails as HW (the drain sticks), another critical
    one as DEV."""
    name = "xid"
    xids = parse_xids(dmesg_text)
    mark = max((t for t, _, _ in xids), default=since)
    new = [(t, bus, x) for t, bus, x in xids if since is None or t > since]
    bad = [(bus, x) for _, bus, x in new if x in CRITICAL_XIDS]
    if bad:
        sticky = [(bus, x) for bus, x in bad if x in STICKY_XIDS]
        bus, x = (sticky or bad)[-1]
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        return fail(name, f"xid {x} on {bus}{more}", HW if sticky else DEV), mark
    if new:
        return warn(name, f"{len(new)} non-critical xid(s): {sorted({x for _, _, x in new})}"), mark
    return ok(name, "no new XID"), mark


# ------------------------------------------------------------------ ECC, row remapping, clocks
COUNTER_FIELDS = ("index", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
                  "remapped_rows.failure", "remapped_rows.pending", "clocks_throttle_reasons.active",
                  "clocks.sm", "clocks.max.sm")

# clocks_throttle_reasons bits (NVML's nvmlClocksThrottleReason*) that mean the hardware, not the
# workload, slows the GPU. The others are benign and never count: GpuIdle 0x1,
# ApplicationsClocksSetting 0x2, SwPowerCap 0x4 (the workload at its power limit),
# DisplayClockSetting 0x100, and any bit NVML adds later.
BAD_THROTTLE = {0x8: "hw slowdown", 0x10: "sync boost", 0x20: "sw thermal", 0x40: "hw thermal",
                0x80: "hw power brake"}


@dataclass(frozen=True)
class Thresholds:
    """When counters drain a node."""

    ecc_uncorrected: int = 0          # more than this many volatile uncorrected ECC errors
    retired_pages_pending: bool = True
    row_remap_failure: bool = True
    row_remap_pending: bool = True    # a reset is needed before the remap takes effect
    min_sm_clock_ratio: float = 0.0   # < this of max SM clock with a bad throttle reason: perf


@dataclass(frozen=True)
class Hysteresis:
    """When a perf check's failures drain a node, and how long such a drain lasts at least
    (spec ``perf:``): drain once ``fail_samples`` of the last ``window`` samples (runs of the
    full checks on the node) failed; resume on a clean sample once ``min_drain_s`` have passed
    since the drain. After a resume the count starts again from zero."""

    fail_samples: int = 3
    window: int = 5
    min_drain_s: float = 600.0


def _num(v: str) -> int | None:
    v = v.strip()
    try:
        return int(v, 16) if v.lower().startswith("0x") else int(float(v))
    except ValueError:
        return None             # "[N/A]", "N/A", "[Not Supported]"


def check_gpu_counters(csv_text: str, th: Thresholds = Thresholds()) -> list[Result]:
    """``nvidia-smi --query-gpu=<COUNTER_FIELDS> --format=csv,noheader,nounits`` -> an ECC
    result and a clocks result (perf). The ECC result is HW (sticky) for uncorrected errors and
    failed row remaps, DEV when only a reset is pending (retired pages, row remap)."""
    hw_bad, dev_bad, perf_bad = [], [], []
    rows = 0
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(COUNTER_FIELDS):
            continue
        rows += 1
        r = dict(zip(COUNTER_FIELDS, cells))
        i = r["index"]
        ecc = _num(r["ecc.errors.uncorrected.volatile.total"])
        if ecc is not None and ecc > th.ecc_uncorrected:
            hw_bad.append(f"gpu{i} ecc uncorrected {ecc}")
        if th.retired_pages_pending and r["retired_pages.pending"].lower() == "yes":
            dev_bad.append(f"gpu{i} retired pages pending")
        if th.row_remap_failure and (_num(r["remapped_rows.failure"]) or r["remapped_rows.failure"].lower() == "yes"):
            hw_bad.append(f"gpu{i} row remap failure")
        if th.row_remap_pending and (_num(r["remapped_rows.pending"]) or r["remapped_rows.pending"].lower() == "yes"):
            dev_bad.append(f"gpu{i} row remap pending")
        reasons = _num(r["clocks_throttle_reasons.active"]) or 0
        bad = [txt for bit, txt in BAD_THROTTLE.items() if reasons & bit]
        sm, smax = _num(r["clocks.sm"]), _num(r["clocks.max.sm"])
        if bad and (not th.min_sm_clock_ratio or (sm and smax and sm / smax < th.min_sm_clock_ratio)):
            perf_bad.append(f"gpu{i} throttled ({', '.join(bad)}" + (f", sm {sm}/{smax} MHz)" if sm and smax else ")"))
    if not rows:
        return [skip("gpu-ecc", "no nvidia-smi counters"), skip("gpu-clocks", "no nvidia-smi counters", PERF)]
    if hw_bad or dev_bad:
        ecc = fail("gpu-ecc", "; ".join(hw_bad + dev_bad), HW if hw_bad else DEV)
    else:
        ecc = ok("gpu-ecc", f"{rows} GPUs clean")
    return [ecc,
            fail("gpu-clocks", "; ".join(perf_bad), PERF) if perf_bad else ok("gpu-clocks", "no hw throttling", PERF)]


# ------------------------------------------------------------------ InfiniBand
@dataclass(frozen=True)
class IbPort:
    ca: str
    port: int
    state: str
    physical: str
    rate: int | None
    link_layer: str


def parse_ibstat(text: str) -> list[IbPort]:
    """``ibstat`` -> one :class:`IbPort` per CA port."""
    ports: list[IbPort] = []
    ca = None
    cur: dict | None = None

    def flush():
        if cur is not None and ca is not None:
            ports.append(IbPort(ca, cur["port"], cur.get("state", ""), cur.get("physical state", ""),
                                _num(cur.get("rate", "")), cur.get("link layer", "")))

    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            flush()
            ca, cur = m.group(1), None
            continue
        m = re.match(r"^Port (\d+):$", line)
        if m:
            flush()
            cur = {"port": int(m.group(1))}
            continue
        if cur is not None and ":" in line:
            k, v = line.split(":", 1)
            cur[k.strip().lower()] = v.strip()
    flush()
    return ports


def check_ib(text: str | None, *, min_rate: int | None, ports: int | None = None,
             link_layer: str = "InfiniBand") -> Result:
    """Active IB ports at ``min_rate`` Gb/s or more; ``ports``: how many the node must have.
    Skipped when the spec asks for no IB (``min_rate`` and ``ports`` None)."""
    name = "ib"
    if min_rate is None and ports is None:
        return skip(name, "no IB in the spec", DEV)
    if text is None:
        return fail(name, "ibstat missing", DEV)
    found = [p for p in parse_ibstat(text) if not link_layer or p.link_layer == link_layer]
    bad = [f"{p.ca}/{p.port} {p.state.lower() or '?'}" for p in found if p.state != "Active"]
    bad += [f"{p.ca}/{p.port} rate {p.rate}<{min_rate}" for p in found
            if p.state == "Active" and min_rate is not None and (p.rate or 0) < min_rate]
    if ports is not None and len(found) < ports:
        bad.insert(0, f"ib ports {len(found)}/{ports}")
    if bad:
        return fail(name, "ib " + "; ".join(bad) if not bad[0].startswith("ib ") else "; ".join(bad), DEV)
    return ok(name, f"{len(found)} ports active", DEV)


# ------------------------------------------------------------------ filesystems, munge
def parse_mounts(text: str) -> dict[str, str]:
    """``/proc/mounts`` -> {mount point: fs type}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3:
            out[parts[1].replace("\\040", " ")] = parts[2]
    return out


def check_mounts(mounts_text: str, required: Sequence[str]) -> Result:
    name = "mounts"
    if not required:
        return skip(name, "no required mounts in the spec", SW)
    have = parse_mounts(mounts_text)
    missing = [m for m in required if m not in have]
    if missing:
        return fail(name, f"not mounted: {', '.join(missing)}", SW)
    return ok(name, f"{len(required)} mounted", SW)


def parse_df(text: str) -> dict[str, tuple[int, int]]:
    """``df -P -k PATH...`` -> {mount point: (size KiB, available KiB)}."""
    out = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 6 and parts[1].isdigit():
            out[" ".join(parts[5:])] = (int(parts[1]), int(parts[3]))
    return out


def check_scratch(path: str | None, df_text: str | None, mounts_text: str, *, min_free_gb: float,
                  must_be_mount: bool = True) -> Result:
    """The scratch directory is its own mount (when ``must_be_mount``) with ``min_free_gb`` free."""
    name = "scratch"
    if not path:
        return skip(name, "no scratch in the spec", SW)
    if must_be_mount and path.rstrip("/") not in parse_mounts(mounts_text):
        return fail(name, f"scratch {path} not mounted", SW)
    usage = parse_df(df_text or "")
    if not usage:
        return fail(name, f"scratch {path} missing", SW)
    _, avail = next(iter(usage.values()))
    free_gb = avail / 1024 / 1024
    if free_gb < min_free_gb:
        return fail(name, f"scratch {path} {free_gb:.0f} GB free < {min_free_gb:g}", SW)
    return ok(name, f"{free_gb:.0f} GB free", SW)


def check_munge(encode_rc: int, decode_rc: int, decode_out: str) -> Result:
    """``munge -n | unmunge``: a credential this node made, decoded here."""
    name = "munge"
    if encode_rc != 0:
        return fail(name, "munge", SW)
    if decode_rc != 0 or "STATUS:" in decode_out and "Success" not in decode_out:
        return fail(name, "munge", SW)
    return ok(name, "credential round trip", SW)


# ------------------------------------------------------------------ GPU processes left after a job
def parse_compute_apps(text: str) -> list[tuple[str, str]]:
    """``nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader`` -> [(pid, name)]."""
    out = []
    for line in text.splitlines():
        pid, sep, pname = line.partition(",")
        if sep and pid.strip().isdigit():
            out.append((pid.strip(), pname.strip()))
    return out


# the GPU processes a node runs without a job: DCGM's host engine and diagnostics, the deep checks'
# nccl test, the exporters (spec ``gpu_processes: {ignore: [...]}`` replaces the list)
GPU_PROCESS_IGNORE = ("nv-hostengine", "nvvs", "dcgmi", "dcgm-exporter", "all_reduce_perf")


def check_gpu_processes(text: str, *, jobs_running: bool | None,
                        ignore: Sequence[str] = GPU_PROCESS_IGNORE) -> Result:
    """Compute processes on the GPUs while the node runs no job (a job's process that outlived it:
    stuck in the driver, or escaped its cgroup). ``jobs_running``: whether Slurm runs a job on the
    node (None: unknown, skipped). A process whose name (basename) is in ``ignore`` does not count.
    DEV: the node returns once the processes are gone."""
    name = "gpu-procs"
    if jobs_running is None:
        return skip(name, "the node's jobs are not known", DEV)
    if jobs_running:
        return ok(name, "jobs run here: their GPU processes are theirs", DEV)
    left = [(pid, pname) for pid, pname in parse_compute_apps(text)
            if pname.rsplit("/", 1)[-1] not in set(ignore)]
    if not left:
        return ok(name, "no GPU processes without a job", DEV)
    first = ", ".join(f"{pid} {pname.rsplit('/', 1)[-1] or '?'}" for pid, pname in left[:3])
    return fail(name, f"gpu processes left: {first}{f' (+{len(left) - 3} more)' if len(left) > 3 else ''}", DEV)


def jobs_running(state: str) -> bool:
    """Whether a Slurm node state (``scontrol show node``'s, ``MIXED+DRAIN``) says a job runs there:
    ALLOCATED or MIXED. A COMPLETING node whose base state is IDLE runs none (its Epilog does)."""
    base = state.upper().split("+", 1)[0]
    return base in ("ALLOCATED", "ALLOC", "MIXED")


# ------------------------------------------------------------------ host memory and CPUs
def parse_meminfo_total_kb(text: str) -> int | None:
    """``/proc/meminfo``'s ``MemTotal`` in KiB."""
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def check_host(meminfo_text: str | None, cpus_text: str | None, *, memory_mb: int | None,
               cpus: int | None) -> Result:
    """The host's memory (``/proc/meminfo`` MemTotal, MiB) is at least ``memory_mb`` (the node's
    RealMemory) and its online CPUs (``getconf _NPROCESSORS_ONLN``) at least ``cpus``: less means
    a DIMM or a CPU the kernel lost (HW, sticky). Skipped when the spec asks for neither."""
    name = "host"
    if memory_mb is None and cpus is None:
        return skip(name, "no host memory or cpus in the spec")
    bad, seen = [], []
    if memory_mb is not None:
        kb = parse_meminfo_total_kb(meminfo_text or "")
        if kb is None:
            bad.append("host memory unreadable")
        elif kb // 1024 < memory_mb:
            bad.append(f"host memory {kb // 1024}/{memory_mb} MB")
        else:
            seen.append(f"{kb // 1024} MB")
    if cpus is not None:
        n = _num(cpus_text or "")
        if n is None:
            bad.append("host cpus unreadable")
        elif n < cpus:
            bad.append(f"host cpus {n}/{cpus}")
        else:
            seen.append(f"{n} cpus")
    if bad:
        return fail(name, "; ".join(bad))
    return ok(name, ", ".join(seen))


# ------------------------------------------------------------------ filesystems mounted and writable
def parse_mount_options(text: str) -> dict[str, set[str]]:
    """``/proc/mounts`` -> {mount point: its options} (the last mount of a point wins, as the kernel shows it)."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4:
            out[parts[1].replace("\\040", " ")] = set(parts[3].split(","))
    return out


def check_filesystems(required: Sequence[str], mounts_text: str, probes: Mapping[str, str | None]) -> Result:
    """Each of ``required`` is a mount point, mounted read-write, and root could create and delete
    a file there. ``probes``: {path: None when the write and delete worked, else what failed} (a
    path that is not mounted is never written: the write would land on the directory below)."""
    name = "filesystems"
    if not required:
        return skip(name, "no filesystems in the spec", SW)
    opts = parse_mount_options(mounts_text)
    bad = []
    for path in required:
        p = path.rstrip("/") or "/"
        if p not in opts:
            bad.append(f"fs {p} not mounted")
        elif "ro" in opts[p]:
            bad.append(f"fs {p} read-only")
        elif p not in probes:
            bad.append(f"fs {p} not tested")
        elif probes[p] is not None:
            bad.append(f"fs {p} not writable ({probes[p]})")
    if bad:
        return fail(name, "; ".join(bad), SW)
    return ok(name, f"{len(required)} mounted and writable", SW)


# ------------------------------------------------------------------ PCIe link
PCIE_FIELDS = ("index", "pcie.link.gen.current", "pcie.link.width.current", "pcie.link.gen.max",
               "pcie.link.width.max")


def check_pcie(csv_text: str, *, width: int | None = None) -> Result:
    """``nvidia-smi --query-gpu=<PCIE_FIELDS> --format=csv,noheader``: each GPU's link width is its
    maximum (or ``width`` when the spec says): a narrower link (x8 of x16) is a bad riser, cable or
    slot (HW). The generation is not compared: GPUs lower it when idle (gen 1 of 5 at rest) and
    raise it under load, so a lower one proves nothing in a regular run."""
    name = "pcie"
    rows, bad, gens = 0, [], set()
    for line in csv_text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(PCIE_FIELDS):
            continue
        i, gen, cur, gmax, wmax = (_num(x) for x in cells)
        if i is None or cur is None:
            continue
        rows += 1
        want = width if width is not None else wmax
        if want is not None and cur < want:
            bad.append(f"pcie gpu{i} x{cur}/x{want}")
        if gen is not None:
            gens.add(f"{gen}/{gmax if gmax is not None else '?'}")
    if not rows:
        return skip(name, "no PCIe link figures from nvidia-smi")
    if bad:
        return fail(name, "; ".join(bad))
    return ok(name, f"{rows} GPUs at full width (gen {', '.join(sorted(gens))}: idle GPUs lower it)")


# ------------------------------------------------------------------ NVLink
_NVL_GPU = re.compile(r"^GPU (\d+):")
_NVL_LINK = re.compile(r"^Link (\d+):\s*(.*)$")


def parse_nvlink_status(text: str) -> dict[int, dict[int, float | None]]:
    """``nvidia-smi nvlink --status`` -> {gpu: {link: GB/s, None when inactive}}."""
    out: dict[int, dict[int, float | None]] = {}
    gpu = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _NVL_GPU.match(line)
        if m:
            gpu = int(m.group(1))
            out[gpu] = {}
            continue
        m = _NVL_LINK.match(line)
        if m and gpu is not None:
            speed = re.match(r"([\d.]+)\s*GB/s", m.group(2))
            out[gpu][int(m.group(1))] = float(speed.group(1)) if speed else None
    return out


def check_nvlink(text: str | None, *, links: int | None, min_gbps: float | None = None) -> Result:
    """Every GPU has ``links`` NVLinks up, each at ``min_gbps`` GB/s or more (spec ``nvlink:``).
    An inactive or slow link, or a GPU with fewer links, is HW (sticky): NCCL falls back to PCIe
    or hangs. Skipped when the spec asks for no NVLink."""
    name = "nvlink"
    if links is None:
        return skip(name, "no nvlink in the spec")
    if text is None:
        return fail(name, "nvlink state unreadable (nvidia-smi nvlink --status)")
    gpus = parse_nvlink_status(text)
    if not gpus:
        return fail(name, "nvlink no GPUs listed")
    bad = []
    for g, ls in sorted(gpus.items()):
        down = [str(k) for k, v in sorted(ls.items()) if not v]     # <inactive>, or 0 GB/s
        slow = [f"{k} {v:g}" for k, v in sorted(ls.items()) if v is not None and min_gbps and v < min_gbps]
        if down:
            bad.append(f"nvlink gpu{g} link {','.join(down)} inactive")
        if slow:
            bad.append(f"nvlink gpu{g} link {'; '.join(slow)} GB/s < {min_gbps:g}")
        if len(ls) < links:
            bad.append(f"nvlink gpu{g} links {len(ls)}/{links}")
    if bad:
        return fail(name, "; ".join(bad))
    return ok(name, f"{len(gpus)} GPUs x {links} links up")


# ------------------------------------------------------------------ InfiniBand error counters
# perfquery's names -> the keys kept in the state file
IB_COUNTERS = {"LinkDownedCounter": "link_downed", "SymbolErrorCounter": "symbol_error"}


def parse_perfquery(text: str) -> dict[str, int]:
    """``perfquery -C CA -P PORT`` (``SymbolErrorCounter:.......0`` lines) -> {"link_downed": N,
    "symbol_error": N} (the counters it printed)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in IB_COUNTERS and value.strip(". ").isdigit():
            out[IB_COUNTERS[key.strip()]] = int(value.strip(". "))
    return out


def ib_counters_state(text: str | None, boot_id: str) -> dict[str, dict[str, int]] | None:
    """The previous run's counters from the state file (``{"boot": ..., "counters": ...}``), None
    when there are none for this boot (the counters restart at 0 with a boot)."""
    import json

    try:
        data = json.loads(text) if text and text.strip() else None
        if not isinstance(data, dict) or data.get("boot") != boot_id:
            return None
        return {str(k): {str(c): int(n) for c, n in v.items()} for k, v in data["counters"].items()}
    except (ValueError, TypeError, AttributeError, KeyError):
        return None


def ib_counters_text(counters: Mapping[str, Mapping[str, int]], boot_id: str) -> str:
    import json

    return json.dumps({"boot": boot_id, "counters": counters}, sort_keys=True) + "\n"


def check_ib_counters(now: Mapping[str, Mapping[str, int]], prev: Mapping[str, Mapping[str, int]] | None, *,
                      max_link_downed: int = 0, max_symbol_errors: int = 0) -> Result:
    """Growth of each port's ``link_downed`` (a link flap: the port went down and retrained) and
    ``symbol_error`` (a bad cable or transceiver) since the previous run in this boot, against the
    allowed growth per run. ``now``, ``prev``: {"mlx5_0/1": :func:`parse_perfquery`'s counters}.
    DEV: the node returns on the next run without new errors. The first run of a boot (``prev``
    None) only records; a counter lower than before (cleared, ``perfquery -R``) counts from zero."""
    name = "ib-errors"
    if not now:
        return skip(name, "no IB error counters", DEV)
    if prev is None:
        return ok(name, f"{len(now)} ports: counters recorded", DEV)
    bad = []
    for port, cs in sorted(now.items()):
        before = prev.get(port, {})
        for counter, limit, label in (("link_downed", max_link_downed, "link downed"),
                                      ("symbol_error", max_symbol_errors, "symbol errors")):
            if counter not in cs or counter not in before:
                continue                 # a port or counter new since the last run: its baseline
            grew = cs[counter] - before[counter] if cs[counter] >= before[counter] else cs[counter]
            if grew > limit:
                bad.append(f"ib {port} {label} +{grew}")
    if bad:
        return fail(name, "; ".join(bad), DEV)
    return ok(name, f"{len(now)} ports: no new link flaps or symbol errors", DEV)


# ------------------------------------------------------------------ GPUDirect RDMA: nv_peermem
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def check_peermem(modules_text: str | None, *, required: bool) -> Result:
    """``/proc/modules`` lists ``nvidia_peermem`` (or the older ``nv_peer_mem``) where the spec
    says GPUDirect RDMA is used (``gpudirect: true``): without it NCCL silently copies through
    host memory. SW: ``modprobe nvidia_peermem`` fixes it."""
    name = "nv-peermem"
    if not required:
        return skip(name, "no gpudirect in the spec", SW)
    loaded = {line.split()[0] for line in (modules_text or "").splitlines() if line.split()}
    found = [m for m in PEERMEM_MODULES if m in loaded]
    if not found:
        return fail(name, "nv_peermem not loaded", SW)
    return ok(name, f"{found[0]} loaded", SW)


# ------------------------------------------------------------------ Fabric Manager (NVSwitch systems)
def parse_fabric(q_text: str) -> list[tuple[str, str, str]]:
    """``nvidia-smi -q`` -> [(GPU bus id, fabric State, fabric Status)] for GPUs with a Fabric
    section (driver 530 and newer)."""
    out, gpu, in_fabric, cur, fabric_indent = [], None, False, {}, 0
    for raw in q_text.splitlines():
        m = re.match(r"^GPU ([0-9A-Fa-f:.]+)\s*$", raw)
        if m:
            gpu, in_fabric = m.group(1), False
            continue
        line = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        if line == "Fabric" and gpu is not None:
            in_fabric, cur, fabric_indent = True, {}, indent
            continue
        if in_fabric:
            if indent <= fabric_indent or ":" not in line:
                in_fabric = False
                if cur:
                    out.append((gpu, cur.get("state", ""), cur.get("status", "")))
                continue
            k, v = (x.strip() for x in line.split(":", 1))
            cur[k.lower()] = v
    if in_fabric and cur:
        out.append((gpu, cur.get("state", ""), cur.get("status", "")))
    return out


def check_fabric_manager(q_text: str | None, service_state: str | None, *, required: bool) -> Result:
    """On an NVSwitch system (spec ``fabric_manager: true``) every GPU's fabric registration is
    done (``nvidia-smi -q``: Fabric State ``Completed``, Status ``Success``); where the driver shows
    no fabric state, the ``nvidia-fabricmanager`` service is active (``systemctl is-active``).
    Without it every CUDA init fails while ``nvidia-smi -L`` lists all GPUs. HW (sticky): the GPUs
    need a reset with the Fabric Manager restarted, an admin's work."""
    name = "fabric-manager"
    if not required:
        return skip(name, "no fabric_manager in the spec")
    gpus = [(bus, st, status) for bus, st, status in parse_fabric(q_text or "")
            if st and st.upper() not in ("N/A", "NOT SUPPORTED")]
    if gpus:
        bad = [(bus, st, status) for bus, st, status in gpus if st != "Completed" or status != "Success"]
        if bad:
            bus, st, status = bad[0]
            more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
            return fail(name, f"fabric manager gpu {bus} {st.lower()} {status.lower()}{more}".strip())
        return ok(name, f"{len(gpus)} GPUs registered with the fabric")
    if service_state is None:
        return fail(name, "fabric manager state unknown (no fabric state, no systemctl)")
    if service_state.strip() != "active":
        return fail(name, f"fabric manager {service_state.strip() or 'inactive'}")
    return ok(name, "nvidia-fabricmanager active")


@dataclass
class Report:
    """All results of one run on one node."""

    node: str
    results: list[Result] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status is Status.FAIL]

    @property
    def healthy(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict:
        return {"node": self.node, "healthy": self.healthy, "elapsed_s": round(self.elapsed_s, 4),
                "results": [r.to_dict() for r in self.results]}
