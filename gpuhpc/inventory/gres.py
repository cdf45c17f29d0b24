"""Node inventory from nvidia-smi captures: gres.conf lines and a node-sizing report.

Sources and what each gives:

* ``-q -x`` (or ``-q`` text): GPUs, product name, minor number (``/dev/nvidiaN``), MIG
  devices with GPU/compute instance ids (no profile names).
* ``-L``: GPUs and MIG devices with profile names (legacy UUIDs also carry GI/CI ids).
* ``mig -lgi``: GPU instance ids per profile, to give ``-L`` devices their GI ids.
* ``topo -m``: CPU/NUMA affinity (``Cores=``), the NVLink matrix (``Links=``), and which NICs
  share a PCIe switch with which GPUs (PIX/PXB: GPUDirect RDMA pairs).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import compress_ranges, expand_ranges
from gpuhpc.inventory.smi import Gpu, GpuInstance, GpuInstanceProfile, MigDevice, SmiQuery, Topo

VCPU_PER_GPU_MIN = 2
VCPU_PER_GPU_MAX = 8

# SMs of one MIG slice -> compute slices, per architecture (profile names are "<g>g.<mem>gb")
_SM_SLICES = {
    14: 1, 28: 2, 42: 3, 56: 4, 98: 7,              # A100 / A30
    16: 1, 26: 1, 32: 2, 60: 3, 64: 4, 132: 7,      # H100 / H200 / GH200
}


def short_type(product: str | None) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; ``A100-SXM4-40GB`` -> ``a100``."""
    if not product:
        return "gpu"
    words = [w for w in product.lower().split() if w not in ("nvidia", "tesla", "geforce", "quadro")]
    if not words:
        return "gpu"
    first = words[0].split("-")[0]
    if first == "rtx" and len(words) > 1:
        first = f"rtx{words[1].split('-')[0]}"
    return re.sub(r"[^a-z0-9._]", "", first) or "gpu"


def slurm_type(product: str | None) -> str:
    """Slurm AutoDetect=nvml's type string: ``nvidia_h100_80gb_hbm3``."""
    return re.sub(r"\s+", "_", (product or "gpu").strip().lower())


def mig_caps_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """/proc/driver/nvidia-caps/mig-minors numbering: ``gpuN/giI/access`` =
    3 + N*135 + I*9, ``gpuN/giI/ciC/access`` = that + 1 + C (15 GIs x (1 + 8 CIs) per GPU)."""
    base = 3 + gpu_minor * 135 + gi * 9
    return base if ci is None else base + 1 + ci


@dataclass
class GpuEntry:
    index: int
    product: str | None
    type: str
    minor: int
    uuid: str | None = None
    bus_id: str | None = None
    cpus: str = ""
    cores: str = ""
    numa: str = ""
    links: list[int] | None = None
    nics: list[str] = field(default_factory=list)      # PIX/PXB NICs
    mig: list[MigDevice] = field(default_factory=list)
    clique: str | None = None


@dataclass
class Inventory:
    gpus: list[GpuEntry]
    gres_lines: list[str]
    node_gres: str                      # slurm.conf Gres= value
    report: dict
    warnings: list[str]
    notes: list[str]
    profiles: list[GpuInstanceProfile] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "gpus": [{**{k: v for k, v in asdict(g).items() if k != "mig"},
                      "mig": [asdict(m) for m in g.mig]} for g in self.gpus],
            "gres_conf": self.gres_lines,
            "slurm_conf_gres": self.node_gres,
            "report": self.report,
            "mig_profiles": [asdict(p) for p in self.profiles],
            "warnings": self.warnings,
            "notes": self.notes,
        }


def _profile_from_sms(dev: MigDevice) -> str | None:
    if dev.sms is None or dev.memory_mib is None:
        return None
    g = _SM_SLICES.get(dev.sms) or max(1, round(dev.sms / 16))
    return f"{g}g.{math.ceil(dev.memory_mib / 1024)}gb"


def build(*, query: SmiQuery | None = None, listing: list[Gpu] | None = None, topo: Topo | None = None,
          lgi: list[GpuInstance] | None = None, lgip: list[GpuInstanceProfile] | None = None,
          node: str | None = None, cpus: int | None = None, type_style: str = "short",
          type_override: str | None = None) -> Inventory:
    warnings: list[str] = list(query.warnings if query else [])
    notes: list[str] = []
    if type_style not in ("short", "slurm"):
        raise UserInputError(f"unknown type style {type_style!r}", field="--type-style", hint="short or slurm")
    base: list[Gpu]
    if query and query.gpus:
        base = query.gpus
    elif listing:
        base = listing
    elif topo and topo.gpus:
        base = [Gpu(i) for i in range(len(topo.gpus))]
        if not type_override:
            warnings.append("only topo -m given: GPU model unknown (pass --smi-xml or --list, or --type)")
    else:
        raise UserInputError("no GPU information", hint="give --smi-xml/--list/--topo or run on a node with nvidia-smi")
    by_index_list = {g.index: g for g in (listing or [])}

    def tname(product: str | None) -> str:
        if type_override:
            return type_override
        return short_type(product) if type_style == "short" else slurm_type(product)

    entries: list[GpuEntry] = []
    for g in base:
        lg = by_index_list.get(g.index)
        product = g.name or (lg.name if lg else None)
        minor = g.minor if g.minor is not None else g.index
        e = GpuEntry(g.index, product, tname(product), minor, g.uuid or (lg.uuid if lg else None), g.bus_id,
                     clique=g.clique_id)
        # MIG: -L has profile names; XML has GI/CI; -lgi gives GI for -L devices
        devs: dict[int, MigDevice] = {}
        for d in g.mig:
            devs[d.device if d.device is not None else len(devs)] = MigDevice(**asdict(d))
        if lg and lg is not g:
            for d in lg.mig:
                key = d.device if d.device is not None else len(devs)
                cur = devs.get(key)
                if cur is None:
                    devs[key] = MigDevice(**asdict(d))
                else:
                    cur.profile = d.profile or cur.profile
                    cur.uuid = d.uuid or cur.uuid
                    cur.gi = cur.gi if cur.gi is not None else d.gi
                    cur.ci = cur.ci if cur.ci is not None else d.ci
        if lgi:
            mine = [x for x in lgi if x.gpu == g.index]
            for d in devs.values():
                if d.gi is None and d.profile:
                    cand = next((x for x in mine if x.profile == d.profile), None)
                    if cand:
                        d.gi = cand.gi
                        mine.remove(cand)
        for d in devs.values():
            if d.profile is None:
                d.profile = _profile_from_sms(d)
                if d.profile:
                    notes.append(f"GPU{g.index} MIG device {d.device}: profile {d.profile} derived from "
                                 f"{d.sms} SMs / {d.memory_mib} MiB (pass -L output to be sure)")
        e.mig = [devs[k] for k in sorted(devs)]
        entries.append(e)
    if topo:
        _apply_topo(entries, topo, warnings, cpus)
    lines, node_gres = _gres_lines(entries, node, type_style, type_override, warnings)
    report = _report(entries, topo, cpus, warnings, notes)
    return Inventory(entries, lines, node_gres, report, warnings, notes, list(lgip or []))


def _apply_topo(entries: list[GpuEntry], topo: Topo, warnings: list[str], cpus: int | None) -> None:
    if len(topo.gpus) != len(entries):
        warnings.append(f"topo -m lists {len(topo.gpus)} GPUs, the GPU list has {len(entries)}: matched by index")
    sets = [expand_ranges(r.cpus) for r in topo.gpus]
    seen = max((max(s) for s in sets if s), default=-1) + 1
    total = max(cpus or 0, seen) or None
    if cpus and seen > cpus:
        warnings.append(f"--cpus {cpus} but topo -m names CPU ids up to {seen - 1}: using {seen}")
    # SMT: thread siblings numbered N/2 apart (48-63,176-191 with 256 CPUs). Cores= wants cores.
    half = total // 2 if total else 0
    def contiguous(xs: list[int]) -> bool:
        return not xs or max(xs) - min(xs) + 1 == len(set(xs))

    smt = bool(half) and not all(contiguous(x) for x in sets) and all(
        not s or ({c for c in s if c >= half} == {c + half for c in s if c < half} and any(c < half for c in s))
        for s in sets) and any(sets)
    names = [r.name for r in topo.gpus]
    for i, (e, row) in enumerate(zip(entries, topo.gpus)):
        e.cpus = row.cpus
        e.numa = row.numa if row.numa not in ("N/A",) else ""
        s = sets[i]
        e.cores = compress_ranges([c for c in s if c < half]) if smt else compress_ranges(s)
        if not s:
            warnings.append(f"GPU{e.index}: topo -m gives no CPU affinity (GB200 and some VMs do): Cores= left out; "
                            f"use the cores of NUMA node {row.numa or '?'} from lscpu")
        links = []
        for other in names:
            if other == row.name:
                links.append(-1)
                continue
            rel = row.links.get(other, "")
            m = re.fullmatch(r"NV(\d+)", rel)
            links.append(int(m.group(1)) if m else 0)
        e.links = links if any(x > 0 for x in links) else None
        e.nics = [n.name for n in topo.nics if row.links.get(n.name) in ("PIX", "PXB")]


def _gres_lines(entries: list[GpuEntry], node: str | None, type_style: str, type_override: str | None,
                warnings: list[str]) -> tuple[list[str], str]:
    prefix = f"NodeName={node} " if node else ""
    lines: list[str] = []
    counts: Counter[str] = Counter()
    missing_gi = False
    nofile: dict[tuple[str, str], int] = {}
    for e in entries:
        extra = (f" Cores={e.cores}" if e.cores else "")
        if e.mig:
            for d in e.mig:
                prof = d.profile or "mig"
                t = type_override or (prof if type_style == "short" else f"{e.type}_{prof}")
                counts[t] += 1
                if d.gi is not None:
                    files = [f"/dev/nvidia{e.minor}", f"/dev/nvidia-caps/nvidia-cap{mig_caps_minor(e.minor, d.gi)}"]
                    if d.ci is not None:
                        files.append(f"/dev/nvidia-caps/nvidia-cap{mig_caps_minor(e.minor, d.gi, d.ci)}")
                    lines.append(f"{prefix}Name=gpu Type={t} MultipleFiles={','.join(files)}{extra}")
                else:
                    missing_gi = True
                    nofile[(t, extra)] = nofile.get((t, extra), 0) + 1
            for (t, ex), n in nofile.items():
                lines.append(f"{prefix}Name=gpu Type={t} Count={n}{ex}  # GPU{e.index}, no device files known")
            nofile.clear()
            continue
        counts[e.type] += 1
        links = f" Links={','.join(str(x) for x in e.links)}" if e.links else ""
        lines.append(f"{prefix}Name=gpu Type={e.type} File=/dev/nvidia{e.minor}{extra}{links}")
    if missing_gi:
        warnings.append("MIG GPU-instance ids unknown for some devices (pass --mig-lgi or --smi-xml): their lines "
                        "have Count= and no device files; or use AutoDetect=nvml")
    node_gres = ",".join(f"gpu:{t}:{n}" for t, n in counts.items())
    return lines, node_gres


def _report(entries: list[GpuEntry], topo: Topo | None, cpus: int | None, warnings: list[str],
            notes: list[str]) -> dict:
    ngpu = len(entries)
    vcpus = cpus
    inferred = False
    if vcpus is None and topo and all(r.cpus for r in topo.gpus):
        ids = [c for r in topo.gpus for c in expand_ranges(r.cpus)]
        if ids:
            vcpus = max(ids) + 1
            inferred = True
    per_gpu = round(vcpus / ngpu, 2) if vcpus and ngpu else None
    if vcpus is None:
        notes.append("vCPU count unknown (pass --cpus N): vCPUs per GPU not checked")
    if per_gpu is not None:
        src = "inferred from topo -m affinity" if inferred else "given"
        if per_gpu < VCPU_PER_GPU_MIN:
            warnings.append(f"{vcpus} vCPUs for {ngpu} GPUs = {per_gpu} per GPU ({src}): below the "
                            f"{VCPU_PER_GPU_MIN}-{VCPU_PER_GPU_MAX} per GPU that training data loaders need")
        elif per_gpu > VCPU_PER_GPU_MAX:
            notes.append(f"{per_gpu} vCPUs per GPU ({src}), above the {VCPU_PER_GPU_MIN}-{VCPU_PER_GPU_MAX} guidance: "
                         f"set DefCpuPerGPU so GPU jobs leave cores for others")
    per_numa = Counter(e.numa for e in entries if e.numa)
    pairs: dict[str, list[str]] = {}
    if topo and topo.nics:
        for e in entries:
            pairs[f"GPU{e.index}"] = e.nics
            if not e.nics:
                rels = sorted({topo.rel(f"GPU{e.index}", n.name) for n in topo.nics} - {""})
                warnings.append(f"GPU{e.index} has no NIC under its PCIe switch (PIX/PXB; here {'/'.join(rels)}): "
                                "GPUDirect RDMA traffic crosses the CPU")
        gd_nics = {n for e in entries for n in e.nics}
        need = math.ceil(ngpu / 2)
        if gd_nics and len(gd_nics) < need:
            warnings.append(f"{len(gd_nics)} GPUDirect NIC(s) for {ngpu} GPUs: guidance is one NIC per GPU pair "
                            f"under the same PCIe switch ({need})")
        unused = [n.name for n in topo.nics if n.name not in gd_nics]
        if unused:
            notes.append(f"NICs not next to any GPU (storage/management?): {', '.join(unused)}")
    elif topo:
        notes.append("topo -m lists no NICs: GPUDirect pairing not checked")
    return {
        "gpus": ngpu,
        "vcpus": vcpus,
        "vcpus_inferred": inferred,
        "vcpus_per_gpu": per_gpu,
        "gpus_per_numa": dict(sorted(per_numa.items())),
        "gpudirect_nics": pairs,
        "mig_instances": sum(len(e.mig) for e in entries),
    }
