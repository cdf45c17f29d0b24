"""A job's GPUs as NVML UUIDs, for the role's enroot GPU hook (docs/containers.md, "GPUs in images").

Slurm names the GPUs of a job or step by GRES index (``SLURM_STEP_GPUS``, ``SLURM_JOB_GPUS``): the
position of the GPU's device file in the node's GRES list. ``nvidia-container-cli --device=N``
counts in NVML's order (PCI bus ID). On HGX boards the device files' minor numbers (the driver's
probe order) need not follow the PCI bus order, so the two indices name different GPUs; the hook
passes UUIDs instead: GRES index -> device file -> its minor number -> the NVML device with that
minor number -> its UUID.

Slurm's GRES order (its gres/gpu plugin): with ``AutoDetect=off`` (no NVML in slurmd), the node's
``Name=gpu File=`` entries of gres.conf in the file's order, ranges expanded; with
``AutoDetect=nvml`` the GPUs are sorted by their NVLink matrix, which keeps NVML's enumeration
order, so GRES index N is NVML index N.

NVML is pynvml (nvidia-ml-py, through ``gpuhpc.monitoring``'s
:func:`~gpuhpc.monitoring.gpu_exporter.load_nvml`, which also takes the module ``GPUHPC_NVML_MODULE``
names: a test stand-in; when that is the path of a ``.py`` file, that file: the importer runs
``python -I``, no PYTHONPATH), else the driver's ``nvidia-smi -q`` (its ``Minor Number`` and
``GPU UUID`` lines). The importer's Python is often the system Python with gpuhpc alone (no
python-hostlist): this module is stdlib-only, with the small bracket expansion gres.conf needs
(:func:`expand_brackets`, checked against :mod:`gpuhpc.hostlist` by its unit test). It runs as the
job's user, in the hook: what it can change is only what that user's own container is given.
"""
from __future__ import annotations

import importlib.util
import os
import re
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_brackets(text: str) -> list[str]:
    """Slurm's ``name[1-3,7]`` lists (several brackets, zero padding kept, terms split by commas
    outside brackets): ``gpu-node[1-2]`` -> ``['gpu-node1', 'gpu-node2']``."""
    terms, depth, cur = [], 0, ""
    for ch in text.strip():
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            terms.append(cur)
            cur = ""
        else:
            cur += ch
    terms.append(cur)
    out: list[str] = []
    for term in filter(None, terms):
        m = _BRACKET.search(term)
        if not m:
            out.append(term)
            continue
        head, tail = term[:m.start()], term[m.end():]
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise GpuhpcError(f"gres.conf: bad range {part!r} in {text!r}")
            for n in range(int(lo), int(hi or lo) + 1):
                out += expand_brackets(f"{head}{n:0{len(lo)}d}{tail}")
    return out


def _fields(line: str) -> dict[str, str]:
    out = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            out[key.lower()] = value
    return out


def _for_node(f: dict[str, str], node: str) -> bool:
    return "nodename" not in f or node in expand_brackets(f["nodename"])


def gres_gpu_files(text: str, node: str) -> list[str] | None:
    """The GPU device files of ``node`` in Slurm's GRES index order, from gres.conf's ``text``;
    None when slurmd takes them from NVML (``AutoDetect=nvml``: GRES index = NVML index)."""
    files: list[str] = []
    for raw in text.splitlines():
        f = _fields(raw.split("#", 1)[0])
        if not f or not _for_node(f, node):
            continue
        if f.get("autodetect", "").lower() == "nvml":
            return None
        if f.get("name") == "gpu" and f.get("file"):
            files += expand_brackets(f["file"])
    return files


def nvml_devices(nvml: object) -> list[tuple[int, str]]:
    """(minor number, UUID) of every GPU NVML sees, in NVML's index order."""
    nv = nvml
    nv.nvmlInit()
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = nv.nvmlDeviceGetUUID(h)
            out.append((int(nv.nvmlDeviceGetMinorNumber(h)), uuid.decode() if isinstance(uuid, bytes) else str(uuid)))
        return out
    finally:
        nv.nvmlShutdown()


def _minor(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise GpuhpcError(f"GPU device file {path} (gres.conf): {exc.strerror}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise GpuhpcError(f"GPU device file {path} (gres.conf) is not a character device")
    return os.minor(st.st_rdev)


def uuids(indices: list[int], files: list[str] | None, devices: list[tuple[int, str]]) -> list[str]:
    """The UUIDs of the GPUs Slurm calls ``indices`` on this node: by device file and minor number
    (``files``: :func:`gres_gpu_files`), or by NVML index when Slurm follows NVML's order (None)."""
    by_minor = {minor: uuid for minor, uuid in devices}
    out = []
    for i in indices:
        if files is None:
            if i >= len(devices):
                raise GpuhpcError(f"Slurm's GPU {i} is not among NVML's {len(devices)} GPUs")
            out.append(devices[i][1])
            continue
        if i >= len(files):
            raise GpuhpcError(f"Slurm's GPU {i} has no device file in gres.conf ({len(files)} for this node)")
        minor = _minor(files[i])
        if minor not in by_minor:
            raise GpuhpcError(f"Slurm's GPU {i} ({files[i]}, minor {minor}) is none of NVML's GPUs "
                              f"(minors {sorted(by_minor)})")
        out.append(by_minor[minor])
    return out


def smi_devices(text: str) -> list[tuple[int, str]]:
    """(minor number, UUID) of each GPU of ``nvidia-smi -q``'s output, in its order (NVML's)."""
    out, uuid = [], None
    for line in text.splitlines():
        key, _, value = (x.strip() for x in line.partition(":"))
        if key == "GPU UUID":
            uuid = value
        elif key == "Minor Number" and uuid is not None and value.isdigit():
            out.append((int(value), uuid))
            uuid = None
    return out


def load_nvml(env: Mapping[str, str]) -> object | None:
    """The NVML module (``GPUHPC_NVML_MODULE``: a module name or a ``.py`` file; else pynvml), or
    None when pynvml is not installed (then :func:`devices` asks nvidia-smi)."""
    name = getenv("GPUHPC_NVML_MODULE", env) or ""
    if name.endswith(".py"):
        spec = importlib.util.spec_from_file_location("gpuhpc_nvml_file", name)
        if spec is None or spec.loader is None:
            raise GpuhpcError(f"GPUHPC_NVML_MODULE={name} cannot be loaded")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    from gpuhpc.monitoring.gpu_exporter import load_nvml as monitoring_nvml

    if name:
        return monitoring_nvml()
    try:
        return monitoring_nvml()
    except ImportError:
        return None


def devices(env: Mapping[str, str]) -> list[tuple[int, str]]:
    """(minor, UUID) of this node's GPUs in NVML's order: NVML, else ``nvidia-smi -q``."""
    nvml = load_nvml(env)
    if nvml is not None:
        return nvml_devices(nvml)
    try:
        res = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuhpcError(f"neither pynvml (nvidia-ml-py) nor nvidia-smi: {exc}") from None
    if res.returncode != 0:
        raise GpuhpcError(f"nvidia-smi -q failed (exit {res.returncode}): {res.stderr.strip()[-200:]}")
    return smi_devices(res.stdout)


def job_gpu_uuids(gpus: str, env: Mapping[str, str] | None = None) -> list[str]:
    """``gpus`` (Slurm's indices, ``1,2``) of this node (``SLURMD_NODENAME``) as NVML UUIDs; gres.conf
    is the one beside ``SLURM_CONF`` (else /etc/slurm/gres.conf)."""
    env = os.environ if env is None else env
    try:
        indices = [int(x) for x in gpus.split(",") if x]
    except ValueError:
        raise GpuhpcError(f"{gpus!r} is not a list of Slurm GPU indices") from None
    conf = Path(env.get("SLURM_CONF") or "/etc/slurm/slurm.conf").parent / "gres.conf"
    node = env.get("SLURMD_NODENAME", "")
    try:
        text = conf.read_text()
    except OSError as exc:
        raise GpuhpcError(f"cannot read {conf}: {exc.strerror}") from None
    files = gres_gpu_files(text, node)
    try:
        found = devices(env)
    except GpuhpcError:
        raise
    except Exception as exc:            # noqa: BLE001 (NVML missing, no driver: one line, the hook fails)
        raise GpuhpcError(f"NVML: {type(exc).__name__}: {exc}") from None
    return uuids(indices, files, found)
