"""Pure parsers for nvidia-smi (and ``slurmd -G``) output. Unit tests feed them real captures.

Each parser takes the text and a ``source`` name; bad input raises
:class:`~gpuhpc.errors.UserInputError` with ``field="SOURCE:LINE"`` (exit 2).

Format variations handled (see the fixtures' SOURCES.md): ``-q -x`` driver 510 vs 535 tags,
``-q`` text form, ``topo -m`` with ``mlx5_N`` or ``NICn`` + NIC Legend columns, extra trailing
tabs, empty CPU affinity (GB200), ANSI escape codes; ``-L`` legacy ``MIG-GPU-<uuid>/<gi>/<ci>``
and ``MIG-<uuid>`` UUIDs, names with or without "NVIDIA "; ``mig -lgi``/``-lgip`` table widths
and two-line ``-lgip`` rows; ``slurmd -G`` records hard-wrapped onto several lines.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhpc.errors import UserInputError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _clean(text: str) -> list[str]:
    return _ANSI.sub("", text.replace("\r\n", "\n").replace("\r", "\n")).split("\n")


def _err(source: str, line: int, msg: str, hint: str | None = None) -> UserInputError:
    return UserInputError(msg, field=f"{source}:{line}", hint=hint)


# ------------------------------------------------------------------ data
@dataclass
class MigDevice:
    gpu: int
    profile: str | None = None      # "1g.10gb"
    device: int | None = None       # MIG device index on that GPU (-L "Device N", XML <index>)
    gi: int | None = None
    ci: int | None = None
    uuid: str | None = None
    sms: int | None = None
    memory_mib: int | None = None


@dataclass
class Gpu:
    index: int
    name: str | None = None          # product name as printed
    uuid: str | None = None
    minor: int | None = None
    bus_id: str | None = None
    mig_mode: str | None = None      # "Enabled" / "Disabled"
    clique_id: str | None = None     # NVLink domain (fabric clique), when the driver reports one
    cluster_uuid: str | None = None
    mig: list[MigDevice] = field(default_factory=list)


@dataclass
class SmiQuery:
    driver: str | None
    gpus: list[Gpu]
    attached: int | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class TopoRow:
    name: str                        # "GPU0" or the NIC's real name ("mlx5_0")
    links: dict[str, str]            # other device -> "NV12", "PXB", "SYS" ..
    cpus: str = ""                   # CPU affinity ("48-63,176-191", "" when none)
    numa: str = ""                   # NUMA affinity
    gpu_numa: str = ""               # GPU NUMA ID (newer drivers)


@dataclass
class Topo:
    gpus: list[TopoRow]
    nics: list[TopoRow]
    legend: dict[str, str] = field(default_factory=dict)   # NIC0 -> mlx5_0

    def rel(self, a: str, b: str) -> str:
        for row in self.gpus + self.nics:
            if row.name == a:
                return row.links.get(b, "")
        return ""


@dataclass
class GpuInstance:
    gpu: int
    profile: str
    profile_id: int
    gi: int
    placement: str = ""


@dataclass
class GpuInstanceProfile:
    gpu: int
    profile: str
    profile_id: int
    free: int
    total: int
    memory_gib: float
    sms: int | None = None


# ------------------------------------------------------------------ nvidia-smi -q -x
def _txt(el, path: str) -> str | None:
    found = el.find(path)
    if found is None or found.text is None:
        return None
    t = found.text.strip()
    return None if t in ("", "N/A") else t


def _int(v: str | None) -> int | None:
    if v is None:
        return None
    m = re.match(r"^\s*(\d+)", v)
    return int(m.group(1)) if m else None


def parse_query_xml(text: str, source: str = "nvidia-smi -q -x") -> SmiQuery:
    import xml.etree.ElementTree as ET

    try:
        root = ET.fromstring(text.lstrip("\ufeff"))
    except ET.ParseError as exc:
        line = exc.position[0] if getattr(exc, "position", None) else 1
        raise _err(source, line, f"not valid nvidia-smi XML ({exc})") from None
    if root.tag != "nvidia_smi_log":
        raise _err(source, 1, f"root element is <{root.tag}>, expected <nvidia_smi_log>")
    gpus = []
    for i, g in enumerate(root.findall("gpu")):
        gpu = Gpu(i, _txt(g, "product_name"), _txt(g, "uuid"), _int(_txt(g, "minor_number")),
                  _txt(g, "pci/pci_bus_id") or g.get("id"), _txt(g, "mig_mode/current_mig"))
        for fab in g.iter():
            tag = fab.tag.lower()
            if tag in ("cliqueid", "clique_id") and fab.text and fab.text.strip() not in ("", "N/A"):
                gpu.clique_id = fab.text.strip()
            if tag in ("clusteruuid", "cluster_uuid") and fab.text and fab.text.strip() not in ("", "N/A"):
                gpu.cluster_uuid = fab.text.strip()
        for md in g.findall("mig_devices/mig_device"):
            gpu.mig.append(MigDevice(i, None, _int(_txt(md, "index")), _int(_txt(md, "gpu_instance_id")),
                                     _int(_txt(md, "compute_instance_id")), None,
                                     _int(_txt(md, "device_attributes/shared/multiprocessor_count")),
                                     _int(_txt(md, "fb_memory_usage/total"))))
        gpus.append(gpu)
    q = SmiQuery(_txt(root, "driver_version"), gpus, _int(_txt(root, "attached_gpus")))
    if q.attached is not None and q.attached != len(gpus):
        q.warnings.append(f"{source}: attached_gpus says {q.attached} but the XML holds {len(gpus)} <gpu> element(s)")
    return q


# ------------------------------------------------------------------ nvidia-smi -q (text)
def parse_query_text(text: str, source: str = "nvidia-smi -q") -> SmiQuery:
    lines = _clean(text)
    if not any("NVSMI LOG" in l for l in lines[:5]):
        raise _err(source, 1, "not `nvidia-smi -q` output (no NVSMI LOG banner)")
    driver = None
    attached = None
    gpus: list[Gpu] = []
    cur: Gpu | None = None
    section: list[str] = []          # indentation stack of section names
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip() or raw.startswith("="):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        body = raw.strip()
        if indent == 0:
            if re.match(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]$", body):
                cur = Gpu(len(gpus), bus_id=body[4:].strip())
                gpus.append(cur)
                section = []
                continue
            key, _, val = body.partition(":")
            if key.strip() == "Driver Version":
                driver = val.strip()
            elif key.strip() == "Attached GPUs":
                attached = _int(val)
            continue
        key, sep, val = body.partition(":")
        key, val = key.strip(), val.strip()
        level = indent // 4
        section = section[: level - 1]
        if not sep:
            section.append(key)
            continue
        if cur is None:
            continue
        path = "/".join([*section, key])
        if path == "Product Name":
            cur.name = val
        elif path == "GPU UUID":
            cur.uuid = val
        elif path == "Minor Number":
            cur.minor = _int(val)
        elif path == "PCI/Bus Id":
            cur.bus_id = val
        elif path == "MIG Mode/Current":
            cur.mig_mode = val
        elif path.lower().endswith(("cliqueid", "clique id")) and val not in ("N/A", ""):
            cur.clique_id = val
        elif path.lower().endswith(("clusteruuid", "cluster uuid")) and val not in ("N/A", ""):
            cur.cluster_uuid = val
    if not gpus:
        raise _err(source, len(lines), "no GPU sections found")
    q = SmiQuery(driver, gpus, attached)
    if attached is not None and attached != len(gpus):
        q.warnings.append(f"{source}: Attached GPUs says {attached} but {len(gpus)} GPU section(s) follow")
    return q


# ------------------------------------------------------------------ nvidia-smi topo -m / -mp


def parse_topo(text: str, source: str = "nvidia-smi topo -m") -> Topo:
    lines = _clean(text)
    hdr_i = next((i for i, l in enumerate(lines) if "\t" in l and re.search(r"(^|\t)\s*GPU0\s*(\t|$)", l)), None)
    if hdr_i is None:
        raise _err(source, 1, "no header with GPU0 (is this `nvidia-smi topo -m` output?)")
    cols = [c.strip() for c in lines[hdr_i].split("\t")]
    cols = [c for c in cols if c]
    try:
        ndev = next(i for i, c in enumerate(cols) if c.lower().startswith(("cpu affinity", "numa affinity", "gpu numa")))
    except StopIteration:
        ndev = len(cols)
    devs = cols[:ndev]
    extra = [c.lower() for c in cols[ndev:]]
    rows: list[tuple[int, str, list[str]]] = []
    legend: dict[str, str] = {}
    in_legend = False
    for lineno, raw in enumerate(lines[hdr_i + 1:], hdr_i + 2):
        s = raw.strip()
        if not s:
            continue
        if s.startswith("Legend"):
            in_legend = False
            continue
        if s.startswith("NIC Legend"):
            in_legend = True
            continue
        if in_legend:
            m = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", s)
            if m:
                legend[m.group(1)] = m.group(2)
            continue
        if "\t" not in raw:
            continue            # legend text ("X = Self", "NV# = ...")
        fields = raw.split("\t")
        name = fields[0].strip()
        if name not in devs:
            raise _err(source, lineno, f"row {name!r} is not one of the header's devices")
        vals = [f.strip() for f in fields[1:]]
        if len(vals) < ndev:
            raise _err(source, lineno, f"row {name} has {len(vals)} columns, the header has {ndev} devices",
                       "truncated capture?")
        rows.append((lineno, name, vals))
    if not rows:
        raise _err(source, hdr_i + 1, "header but no device rows")
    real = {d: legend.get(d, d) for d in devs}
    gpus, nics = [], []
    for lineno, name, vals in rows:
        links = {real[d]: v for d, v in zip(devs, vals[:ndev]) if d != name}
        tail = vals[ndev:]
        row = TopoRow(real[name], links)
        if name.startswith("GPU"):
            row.cpus = tail[0] if len(tail) > 0 else ""
            row.numa = tail[1] if len(tail) > 1 else ""
            if any("gpu numa" in e for e in extra):
                rest = [t for t in tail[2:] if t]
                row.gpu_numa = rest[-1] if rest else ""
            if row.cpus and not re.fullmatch(r"[\d,\-]+", row.cpus):
                raise _err(source, lineno, f"{name}: CPU affinity {row.cpus!r} is not a CPU list")
            gpus.append(row)
        else:
            nics.append(row)
    return Topo(gpus, nics, legend)


# ------------------------------------------------------------------ nvidia-smi -L
_L_GPU = re.compile(r"^GPU\s+(\d+):\s+(.+?)\s+\(UUID:\s*(GPU-[0-9a-fA-F-]+)\)\s*$")
_L_MIG = re.compile(r"^MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)\s]+)\)\s*$")
_LEGACY = re.compile(r"^MIG-GPU-[0-9a-fA-F-]+/(\d+)/(\d+)$")


def parse_list(text: str, source: str = "nvidia-smi -L") -> list[Gpu]:
    gpus: list[Gpu] = []
    for lineno, raw in enumerate(_clean(text), 1):
        s = raw.strip()
        if not s:
            continue
        m = _L_GPU.match(s)
        if m:
            gpus.append(Gpu(int(m.group(1)), m.group(2), m.group(3)))
            continue
        m = _L_MIG.match(s)
        if m:
            if not gpus:
                raise _err(source, lineno, "MIG device before any GPU line")
            dev = MigDevice(gpus[-1].index, m.group(1), int(m.group(2)), uuid=m.group(3))
            lm = _LEGACY.match(m.group(3))
            if lm:
                dev.gi, dev.ci = int(lm.group(1)), int(lm.group(2))
            gpus[-1].mig.append(dev)
            gpus[-1].mig_mode = "Enabled"
            continue
        raise _err(source, lineno, f"not `nvidia-smi -L` output: {s[:60]!r}")
    if not gpus:
        raise _err(source, 1, "no 'GPU N: NAME (UUID: ...)' line")
    return gpus


# ------------------------------------------------------------------ nvidia-smi mig -lgi / -lgip
_LGI = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+:\d+)\s*\|$")
_LGIP1 = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s+([\d.]+)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$")
_LGIP2 = re.compile(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s*\|$")


def _table_lines(text: str, source: str, banner: str) -> list[tuple[int, str]]:
    lines = _clean(text)
    if not any(banner in l for l in lines):
        if any("No GPU instances found" in l or "No MIG-enabled devices found" in l for l in lines):
            return []
        raise _err(source, 1, f"not nvidia-smi mig output (no '{banner}' title)")
    out = []
    for lineno, raw in enumerate(lines, 1):
        s = raw.strip()
        if not s or s.startswith("+") or s.startswith("|="):
            continue
        out.append((lineno, s))
    return out


def parse_mig_lgi(text: str, source: str = "nvidia-smi mig -lgi") -> list[GpuInstance]:
    out = []
    for lineno, s in _table_lines(text, source, "GPU instances"):
        m = _LGI.match(s)
        if m:
            out.append(GpuInstance(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)), m.group(5)))
        elif re.match(r"^\|\s*\d", s):
            raise _err(source, lineno, f"unexpected GPU instance row {s[:70]!r}")
    return out


def parse_mig_lgip(text: str, source: str = "nvidia-smi mig -lgip") -> list[GpuInstanceProfile]:
    out: list[GpuInstanceProfile] = []
    expect_second = False
    for lineno, s in _table_lines(text, source, "GPU instance profiles"):
        m = _LGIP1.match(s)
        if m:
            out.append(GpuInstanceProfile(int(m.group(1)), m.group(2), int(m.group(3)), int(m.group(4)),
                                          int(m.group(5)), float(m.group(6)), int(m.group(8))))
            expect_second = True
            continue
        if expect_second and _LGIP2.match(s):
            expect_second = False
            continue
        if re.match(r"^\|\s*\d+\s+MIG", s):
            raise _err(source, lineno, f"unexpected profile row {s[:70]!r}")
    return out


# ------------------------------------------------------------------ slurmd -G
def parse_slurmd_gres(text: str, source: str = "slurmd -G") -> list[dict[str, str]]:
    """``slurmd -G`` (AutoDetect) records -> dicts (Name, Type, Count, Index, File, Links, ...).
    Records hard-wrapped onto continuation lines are joined first."""
    records: list[str] = []
    for lineno, raw in enumerate(_clean(text), 1):
        s = raw.strip()
        if not s:
            continue
        if "Gres Name=" in s or s.startswith("Name="):
            records.append(s[s.index("Name="):])
        elif records:
            records[-1] += s
        else:
            raise _err(source, lineno, f"not `slurmd -G` output: {s[:60]!r}")
    out = []
    for rec in records:
        out.append(dict(kv.split("=", 1) for kv in rec.split() if "=" in kv))
    return out


def sniff(text: str) -> str:
    """Which capture this is: xml | query | topo | list | lgi | lgip | slurmd | unknown."""
    head = _ANSI.sub("", text[:4000])
    if head.lstrip().startswith("<?xml") or "<nvidia_smi_log" in head:
        return "xml"
    if "NVSMI LOG" in head:
        return "query"
    if "GPU instance profiles" in head:
        return "lgip"
    if "GPU instances" in head:
        return "lgi"
    if "Gres Name=" in head:
        return "slurmd"
    if re.search(r"^GPU \d+: ", head, re.M):
        return "list"
    if re.search(r"\tGPU0(\t|\s*$)", head, re.M):
        return "topo"
    return "unknown"


def parse_any(text: str, source: str = "capture"):
    kind = sniff(text)
    parser = {"xml": parse_query_xml, "query": parse_query_text, "topo": parse_topo, "list": parse_list,
              "lgi": parse_mig_lgi, "lgip": parse_mig_lgip, "slurmd": parse_slurmd_gres}.get(kind)
    if parser is None:
        raise _err(source, 1, "not a known nvidia-smi capture")
    return kind, parser(text, source)
