"""GPU models and their MIG geometry.

Each MIG-capable model has a fixed number of compute slices (7 on A100/H100/H200/GH200, 4 on
A30) and memory slices (8, or 4 on A30). A GPU instance profile ``<c>g.<mem>gb`` uses ``c``
compute slices and a fixed number of memory slices, and each profile has a maximum instance
count per GPU (NVIDIA MIG user guide, "Supported MIG Profiles"). A layout fits a GPU when the
profiles exist for that model, no profile exceeds its instance limit, and the compute and memory
slices sum to no more than the GPU has.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute_slices: int
    memory_slices: int
    max_instances: int


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gb: int
    compute_slices: int = 0          # 0: no MIG
    memory_slices: int = 0
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)


def _seven_slice(name: str, memory_gb: int, one: int, two: int, three: int, seven: int,
                 aliases: tuple[str, ...] = ()) -> GpuModel:
    """The A100/H100 family: 7 compute slices, 8 memory slices, the same six profiles."""
    profiles = [
        MigProfile(f"1g.{one}gb", 1, 1, 7),
        MigProfile(f"1g.{two}gb", 1, 2, 4),
        MigProfile(f"2g.{two}gb", 2, 2, 3),
        MigProfile(f"3g.{three}gb", 3, 4, 2),
        MigProfile(f"4g.{three}gb", 4, 4, 1),
        MigProfile(f"7g.{seven}gb", 7, 8, 1),
    ]
    return GpuModel(name, memory_gb, 7, 8, {p.name: p for p in profiles}, aliases)


GPU_MODELS: dict[str, GpuModel] = {}
for _m in (
    _seven_slice("a100-40gb", 40, 5, 10, 20, 40, aliases=("a100",)),
    _seven_slice("a100-80gb", 80, 10, 20, 40, 80),
    _seven_slice("h100", 80, 10, 20, 40, 80, aliases=("h100-80gb", "h100-sxm", "h100-pcie")),
    _seven_slice("h100-94gb", 94, 12, 24, 47, 94, aliases=("h100-nvl",)),
    _seven_slice("h200", 141, 18, 35, 71, 141, aliases=("h200-141gb",)),
    _seven_slice("gh200", 96, 12, 24, 48, 96, aliases=("gh200-96gb",)),
    GpuModel("a30", 24, 4, 4, {p.name: p for p in (
        MigProfile("1g.6gb", 1, 1, 4), MigProfile("2g.12gb", 2, 2, 2), MigProfile("4g.24gb", 4, 4, 1))}),
    GpuModel("l40s", 48),
    GpuModel("l40", 48),
    GpuModel("l4", 24),
    GpuModel("a10", 24),
    GpuModel("a40", 48),
    GpuModel("v100", 32, aliases=("v100-32gb",)),
    GpuModel("b200", 180),
):
    GPU_MODELS[_m.name] = _m
    for _a in _m.aliases:
        GPU_MODELS[_a] = _m


def gpu_model(name: str) -> GpuModel | None:
    return GPU_MODELS.get(name.lower())


def check_mig_layout(model: GpuModel, layout: list[str]) -> str | None:
    """Return why ``layout`` does not fit one GPU of ``model``, or None when it fits."""
    if not model.mig_capable:
        return f"{model.name} does not support MIG"
    counts: dict[str, int] = {}
    compute = memory = 0
    for prof_name in layout:
        prof = model.mig_profiles.get(prof_name)
        if prof is None:
            return (f"{prof_name!r} is not a MIG profile of {model.name} "
                    f"(valid: {', '.join(model.mig_profiles)})")
        counts[prof_name] = counts.get(prof_name, 0) + 1
        if counts[prof_name] > prof.max_instances:
            return f"{model.name} fits at most {prof.max_instances} x {prof_name} per GPU"
        compute += prof.compute_slices
        memory += prof.memory_slices
    if compute > model.compute_slices:
        return (f"layout uses {compute} compute slices; {model.name} has {model.compute_slices}")
    if memory > model.memory_slices:
        return (f"layout uses {memory} memory slices ({memory * model.memory_gb // model.memory_slices} GB); "
                f"{model.name} has {model.memory_slices}")
    return None
