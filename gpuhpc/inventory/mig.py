"""MIG layout planner: the cluster spec's layout per GPU against what ``nvidia-smi mig -lgi`` shows.

Pure: parsed listings in, ``nvidia-smi`` argv lists out. Instances that the spec still wants stay
(their jobs keep running); only the ones that differ are destroyed, and the missing ones are
created at explicit placements (``-cgi <profile>:<start>``), so the result does not depend on the
driver's choice of free slots. When the kept instances leave no room for the new ones, every
instance of that GPU is recreated. An unchanged layout plans no command at all.

Placements follow NVIDIA's rule for the A100/H100 family (and A30): an instance of ``m`` memory
slices starts at a multiple of ``m``, within the GPU's memory slices, and its compute slices must
fit in the GPU's compute slices from that start (``nvidia-smi mig -lgipp``: 1g at 0..6, 2g at 0/2/4,
1g.20gb at 0/2/4/6, 3g at 0/4, 4g and 7g at 0).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpuhpc.inventory.smi import GpuInstance
from gpuhpc.spec.gpus import GpuModel

SMI = "nvidia-smi"


def placements(model: GpuModel, profile: str) -> list[int]:
    """Valid start slices of ``profile`` on one GPU of ``model`` (empty for an unknown profile)."""
    p = model.mig_profiles.get(profile)
    if p is None:
        return []
    return [s for s in range(0, model.memory_slices, p.memory_slices)
            if s + p.memory_slices <= model.memory_slices and s + p.compute_slices <= model.compute_slices]


def _occupied(model: GpuModel, placed: list[tuple[str, int]]) -> set[int]:
    return {s + k for prof, s in placed for k in range(model.mig_profiles[prof].memory_slices)}


def fit(model: GpuModel, kept: list[tuple[str, int]], new: list[str]) -> list[tuple[str, int]] | None:
    """Starts for ``new`` profiles next to ``kept`` (profile, start) instances, or None when they do
    not fit. Largest first, each into the first free valid start (backtracking over the choices)."""
    order = sorted(new, key=lambda p: (-model.mig_profiles[p].memory_slices, -model.mig_profiles[p].compute_slices, p))

    def place(i: int, placed: list[tuple[str, int]]) -> list[tuple[str, int]] | None:
        if i == len(order):
            return placed[len(kept):]
        used = _occupied(model, placed)
        size = model.mig_profiles[order[i]].memory_slices
        for start in placements(model, order[i]):
            if used.isdisjoint(range(start, start + size)):
                found = place(i + 1, placed + [(order[i], start)])
                if found is not None:
                    return found
        return None

    return place(0, list(kept))


@dataclass
class GpuPlan:
    gpu: int
    destroy: list[GpuInstance] = field(default_factory=list)
    create: list[tuple[str, int]] = field(default_factory=list)      # (profile, start)
    mode: str | None = None                                            # "Enabled"/"Disabled" to switch to

    @property
    def changed(self) -> bool:
        return bool(self.destroy or self.create or self.mode)

    def summary(self) -> str:
        parts = []
        if self.mode:
            parts.append(f"MIG mode {self.mode.lower()}")
        if self.destroy:
            parts.append("destroy " + ", ".join(f"{g.profile} (GI {g.gi})" for g in self.destroy))
        if self.create:
            parts.append("create " + ", ".join(f"{p} at {s}" for p, s in self.create))
        return f"GPU {self.gpu}: " + ("; ".join(parts) or "unchanged")


@dataclass
class MigPlan:
    gpus: list[GpuPlan]

    @property
    def changed(self) -> bool:
        return any(g.changed for g in self.gpus)

    def commands(self) -> list[list[str]]:
        """nvidia-smi argv lists, in order: compute then GPU instances destroyed, MIG mode, creation."""
        out: list[list[str]] = []
        for g in self.gpus:
            i = str(g.gpu)
            if g.destroy:
                ids = ",".join(str(x.gi) for x in g.destroy)
                out.append([SMI, "mig", "-i", i, "-dci", "-gi", ids])
                out.append([SMI, "mig", "-i", i, "-dgi", "-gi", ids])
            if g.mode:
                out.append([SMI, "-i", i, "-mig", "1" if g.mode == "Enabled" else "0"])
            if g.create:
                out.append([SMI, "mig", "-i", i, "-cgi", ",".join(f"{p}:{s}" for p, s in g.create), "-C"])
        return out

    def to_dict(self) -> dict:
        return {"changed": self.changed, "commands": self.commands(),
                "summary": [g.summary() for g in self.gpus if g.changed]}


def _start(inst: GpuInstance) -> int | None:
    head = inst.placement.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def plan_gpu(model: GpuModel, gpu: int, want: list[str], current: list[GpuInstance], mig_enabled: bool) -> GpuPlan:
    """One GPU: keep the current instances the layout still wants, destroy the rest, create what is missing."""
    plan = GpuPlan(gpu)
    if not want:                               # the spec leaves this GPU whole
        plan.destroy = list(current)
        plan.mode = "Disabled" if mig_enabled else None
        return plan
    if not mig_enabled:
        plan.mode = "Enabled"
        current = []                           # a GPU without MIG mode has no instances
    need = Counter(want)
    kept: list[GpuInstance] = []
    for inst in sorted(current, key=lambda g: g.gi):
        if need[inst.profile] > 0 and _start(inst) is not None:
            need[inst.profile] -= 1
            kept.append(inst)
    missing = list(need.elements())
    created = fit(model, [(k.profile, _start(k)) for k in kept], missing)
    if created is None:                        # fragmented: recreate the whole GPU's layout
        kept = []
        created = fit(model, [], list(want))
        if created is None:
            raise ValueError(f"layout {want} does not fit one {model.name}")
    plan.destroy = [g for g in current if g not in kept]
    plan.create = created
    return plan


def plan(model: GpuModel, layouts: list[list[str]], instances: list[GpuInstance],
         mig_modes: dict[int, bool]) -> MigPlan:
    """The commands that turn ``instances`` (``nvidia-smi mig -lgi``) into ``layouts`` (one list of
    profiles per GPU, [] for a whole GPU). ``mig_modes``: GPU index -> MIG mode currently enabled."""
    by_gpu: dict[int, list[GpuInstance]] = {}
    for inst in instances:
        by_gpu.setdefault(inst.gpu, []).append(inst)
    unknown = sorted(set(by_gpu) - set(range(len(layouts))))
    if unknown:
        raise ValueError(f"nvidia-smi lists MIG instances on GPU {unknown}; the spec has {len(layouts)} GPUs")
    for i, want in enumerate(layouts):
        bad = [p for p in want if p not in model.mig_profiles]
        if bad:
            raise ValueError(f"GPU {i}: {bad} are not MIG profiles of {model.name} (valid: {', '.join(model.mig_profiles)})")
    return MigPlan([plan_gpu(model, i, list(want), by_gpu.get(i, []), mig_modes.get(i, bool(by_gpu.get(i))))
                    for i, want in enumerate(layouts)])


def parse_mig_modes(text: str) -> dict[int, bool]:
    """``nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader`` -> {index: enabled}."""
    out: dict[int, bool] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 2 and cells[0].isdigit():
            out[int(cells[0])] = cells[1].lower() == "enabled"
    return out


def plan_from_texts(gpu_type: str, layouts: list[list[str]], lgi_text: str, modes_text: str) -> MigPlan:
    """:func:`plan` from the spec's GPU type and layouts and the node's ``nvidia-smi mig -lgi`` and
    ``nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader`` outputs."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.inventory.smi import parse_mig_lgi
    from gpuhpc.spec.gpus import gpu_model

    model = gpu_model(gpu_type)
    if model is None or not model.mig_capable:
        raise UserInputError(f"GPU type {gpu_type!r} has no MIG profiles gpuhpc knows", field="gpu_type")
    modes = parse_mig_modes(modes_text)
    # `nvidia-smi mig -lgi` on a GPU without MIG mode fails; only MIG-enabled GPUs' instances count
    instances = parse_mig_lgi(lgi_text) if any(modes.values()) and lgi_text.strip() else []
    try:
        return plan(model, layouts, [g for g in instances if modes.get(g.gpu, True)], modes)
    except ValueError as exc:
        raise UserInputError(str(exc), field="layouts") from None


# ------------------------------------------------------------------ gres.conf File= from the driver's minors
def parse_mig_minors(text: str) -> dict[tuple[int, int, int | None], int]:
    """``/proc/driver/nvidia-caps/mig-minors`` -> {(gpu minor, GI, CI or None): cap minor}.

    Lines ``gpu0/gi1/access 12`` (a GPU instance) and ``gpu0/gi1/ci0/access 13`` (a compute
    instance); ``config`` and ``monitor`` lines are skipped. The numbers are the driver's: the
    minors of ``/dev/nvidia-caps/nvidia-capN``."""
    import re

    out: dict[tuple[int, int, int | None], int] = {}
    for line in text.splitlines():
        m = re.match(r"^gpu(\d+)/gi(\d+)(?:/ci(\d+))?/access\s+(\d+)\s*$", line.strip())
        if m:
            out[(int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) is not None else None)] = int(m.group(4))
    return out


def slice_cap_minors(layouts: list[list[str]], instances: list[GpuInstance],
                     minors: dict[tuple[int, int, int | None], int]) -> list[list[int]]:
    """Per GPU, the nvidia-caps minor of each slice of the spec's layout (in the layout's order):
    the GPU instance's access capability, which slurmd's cgroup confines a job to. The k-th
    ``profile`` of a layout is the k-th instance of that profile by placement. The GPU's
    nvidia-smi index is taken as its minor (``gpuN`` of mig-minors), as on NVIDIA's systems.
    A ValueError names the slice without an instance or a minor."""
    out: list[list[int]] = []
    for gpu, layout in enumerate(layouts):
        by_profile: dict[str, list[GpuInstance]] = {}
        for inst in sorted((i for i in instances if i.gpu == gpu), key=lambda i: (_start(i) or 0, i.gi)):
            by_profile.setdefault(inst.profile, []).append(inst)
        seen: Counter[str] = Counter()
        row = []
        for prof in layout:
            have = by_profile.get(prof, [])
            if seen[prof] >= len(have):
                raise ValueError(f"GPU {gpu}: the layout has {layout.count(prof)} {prof}, nvidia-smi mig -lgi lists "
                                 f"{len(have)}: apply the MIG layout first")
            inst = have[seen[prof]]
            seen[prof] += 1
            if (gpu, inst.gi, None) not in minors:
                raise ValueError(f"GPU {gpu} GPU instance {inst.gi} ({prof}): no gpu{gpu}/gi{inst.gi}/access line "
                                 "in mig-minors")
            row.append(minors[(gpu, inst.gi, None)])
        out.append(row)
    return out


def node_gres_lines(gres_lines: list[dict], node: dict, lgi_text: str, minors_text: str) -> list[dict]:
    """The template context's ``gres_lines`` with ``node``'s MIG rows' File= made of the driver's
    nvidia-caps minors (``node``: its entry of the context's ``nodes``; ``lgi_text``: its
    ``nvidia-smi mig -lgi``; ``minors_text``: its mig-minors). Rows of other nodes stay; a row that
    merged this node with others is split. Rows without File= (AutoDetect=nvml) stay as they are."""
    from gpuhpc import hostlist
    from gpuhpc.inventory.smi import parse_mig_lgi

    name, layouts, pattern = node["name"], node.get("mig_layouts"), node.get("mig_device")
    if not layouts or not pattern or not any(d.get("mig") for d in node.get("gpus", [])):
        return gres_lines
    caps = slice_cap_minors(layouts, parse_mig_lgi(lgi_text), parse_mig_minors(minors_text))
    files = iter(pattern.format(index=minor, node=name) for row in caps for minor in row)
    # the node's MIG entries are in GPU order, then layout order (gpuhpc.conf.context._node_gpus)
    new_file = {id(d): next(files) for d in node["gpus"] if d.get("mig")}
    out: list[dict] = []
    for row in gres_lines:
        names = hostlist.expand(row["nodes"])
        if name not in names:
            out.append(row)
            continue
        others = [n for n in names if n != name]
        if others:
            out.append({**row, "nodes": hostlist.compress(others)})
        mine = [d for d in node["gpus"] if d["type"] == row["type"] and d.get("cores") == row.get("cores")]
        if row.get("file") is None or not mine or not all(d.get("mig") for d in mine):
            out.append({**row, "nodes": name})
            continue
        out.append({**row, "nodes": name, "file": hostlist.compress([new_file[id(d)] for d in mine])})
    return out
