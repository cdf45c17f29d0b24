"""An NVML stand-in: the subset of ``pynvml`` (nvidia-ml-py) the GPU exporter calls, driven by
a JSON state file that tests and the local cluster script (``GPUHPC_NVML_STANDIN=/path/state.json``).
Test machinery, not part of the gpuhpc package: the GPU exporter uses it when
``GPUHPC_NVML_MODULE=standins.nvml_standin`` and ``tests/`` is on ``PYTHONPATH``
(scripts/services/prometheus.sh; tests import it as ``standins.nvml_standin``).
The file is re-read on every :func:`nvmlInit`, so a test changes what a GPU "does" by
rewriting it between scrapes::

    {"driver": "535.161.08",
     "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "util": 97, "mem_util": 40,
               "memory_total": 85899345920, "memory_used": 42949672960, "power_mw": 612000,
               "temperature": 61, "pcie_tx_kbs": 1200, "pcie_rx_kbs": 800,
               "nvlink_tx_kib": 123456, "nvlink_rx_kib": 654321,
               "mig": [{"profile": "1g.10gb", "uuid": "MIG-...", "gi": 9, "ci": 0, "util": 50,
                        "memory_total": 10200547328, "memory_used": 1073741824}]}]}

A value left out is "not supported" (``NVMLError_NotSupported``), as real NVML answers for,
say, PCIe throughput on a MIG device. :func:`state_from_listing` builds a state from a real
``nvidia-smi -L`` capture.
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_FOUND = 6
NVML_TEMPERATURE_GPU = 0
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
ENV = "GPUHPC_NVML_STANDIN"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 2: "Invalid Argument", 6: "Not Found"}.get(self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


_state: dict | None = None


def nvmlInit() -> None:  # noqa: N802 (pynvml's names throughout)
    global _state
    path = os.environ.get(ENV)
    if not path:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    with open(path, encoding="utf-8") as fh:
        _state = json.load(fh)


def nvmlShutdown() -> None:  # noqa: N802
    global _state
    _state = None


def _gpus() -> list[dict]:
    if _state is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _state.get("gpus", [])


class _Handle:
    __slots__ = ("gpu", "mig", "data")

    def __init__(self, gpu: int, mig: int | None, data: dict) -> None:
        self.gpu, self.mig, self.data = gpu, mig, data


def _get(h: _Handle, key: str):
    if key not in h.data or h.data[key] is None:
        raise NVMLError_NotSupported()
    return h.data[key]


def nvmlSystemGetDriverVersion() -> str:  # noqa: N802
    return (_state or {}).get("driver", "0.0")


def nvmlDeviceGetCount() -> int:  # noqa: N802
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(i: int) -> _Handle:  # noqa: N802
    gpus = _gpus()
    if not 0 <= i < len(gpus):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(i, None, gpus[i])


def nvmlDeviceGetIndex(h: _Handle) -> int:  # noqa: N802
    return h.gpu


def nvmlDeviceGetName(h: _Handle) -> str:  # noqa: N802
    if h.mig is None:
        return h.data.get("name", "NVIDIA GPU")
    return f"{_gpus()[h.gpu].get('name', 'NVIDIA GPU')} MIG {h.data.get('profile', '1g')}"


def nvmlDeviceGetUUID(h: _Handle) -> str:  # noqa: N802
    return _get(h, "uuid")


def nvmlDeviceGetMigMode(h: _Handle) -> list[int]:  # noqa: N802
    if h.mig is not None:
        raise NVMLError_NotSupported()
    on = NVML_DEVICE_MIG_ENABLE if h.data.get("mig") else NVML_DEVICE_MIG_DISABLE
    return [on, on]


def nvmlDeviceGetMaxMigDeviceCount(h: _Handle) -> int:  # noqa: N802
    return 7 if h.data.get("mig") else 0


def nvmlDeviceGetMigDeviceHandleByIndex(h: _Handle, i: int) -> _Handle:  # noqa: N802
    migs = h.data.get("mig") or []
    if not 0 <= i < len(migs):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(h.gpu, i, migs[i])


def nvmlDeviceGetGpuInstanceId(h: _Handle) -> int:  # noqa: N802
    return _get(h, "gi")


def nvmlDeviceGetComputeInstanceId(h: _Handle) -> int:  # noqa: N802
    return _get(h, "ci")


def nvmlDeviceGetUtilizationRates(h: _Handle):  # noqa: N802
    return SimpleNamespace(gpu=_get(h, "util"), memory=h.data.get("mem_util", 0))


def nvmlDeviceGetMemoryInfo(h: _Handle):  # noqa: N802
    total, used = _get(h, "memory_total"), _get(h, "memory_used")
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetPowerUsage(h: _Handle) -> int:  # noqa: N802
    return _get(h, "power_mw")


def nvmlDeviceGetTemperature(h: _Handle, sensor: int) -> int:  # noqa: N802
    return _get(h, "temperature")


def nvmlDeviceGetPcieThroughput(h: _Handle, counter: int) -> int:  # noqa: N802
    return _get(h, "pcie_tx_kbs" if counter == NVML_PCIE_UTIL_TX_BYTES else "pcie_rx_kbs")


def nvmlDeviceGetFieldValues(h: _Handle, field_ids):  # noqa: N802
    keys = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "nvlink_tx_kib", NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "nvlink_rx_kib"}
    out = []
    for f in field_ids:
        fid = f[0] if isinstance(f, tuple) else f
        key = keys.get(fid)
        value = h.data.get(key) if key else None
        out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED,
                                   value=SimpleNamespace(ullVal=int(value or 0))))
    return out


# ------------------------------------------------------------------ states from captures
_PROFILE_MEM_GB = {"1g.10gb": 10, "1g.20gb": 20, "2g.20gb": 20, "3g.40gb": 40, "4g.40gb": 40, "7g.80gb": 80,
                   "1g.5gb": 5, "2g.10gb": 10, "3g.20gb": 20, "1g.12gb": 12}


def state_from_listing(text: str, *, util: int = 0) -> dict:
    """A stand-in state from a real ``nvidia-smi -L`` capture: its GPUs, UUIDs and MIG layout,
    idle (``util``), 80 GB per GPU, MIG memory from the profile's name."""
    from gpuhpc.inventory.smi import parse_list

    gpus = []
    for g in parse_list(text):
        gpu = {"name": g.name, "uuid": g.uuid, "util": util, "mem_util": 0, "memory_total": 80 * 2**30,
               "memory_used": 0, "power_mw": 70000, "temperature": 30, "pcie_tx_kbs": 0, "pcie_rx_kbs": 0,
               "nvlink_tx_kib": 0, "nvlink_rx_kib": 0}
        if g.mig:
            gpu["mig"] = [{"profile": m.profile, "uuid": m.uuid, "gi": m.gi if m.gi is not None else k,
                           "ci": m.ci if m.ci is not None else 0, "util": util,
                           "memory_total": _PROFILE_MEM_GB.get(m.profile or "", 10) * 2**30, "memory_used": 0}
                          for k, m in enumerate(g.mig)]
        gpus.append(gpu)
    return {"driver": "535.161.08", "gpus": gpus}


def state_from_query(text: str, *, util: int = 0) -> dict:
    """A stand-in state from a real ``nvidia-smi -q`` (text or XML) capture's GPUs."""
    from gpuhpc.inventory.smi import parse_query_text, parse_query_xml, sniff

    q = parse_query_text(text) if sniff(text) == "query" else parse_query_xml(text)
    listing = "\n".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in q.gpus)
    return state_from_listing(listing, util=util)


def with_mig_geometry(state: dict, lgip_text: str, gpu_type: str) -> dict:
    """``state`` with each GPU's MIG geometry for the nvidia-smi stand-in's MIG commands: profile IDs,
    memory and instance counts from a real ``nvidia-smi mig -lgip`` capture (its GPU 0), compute and
    memory slices from :mod:`gpuhpc.spec.gpus`. Profiles gpuhpc does not model (``+me``) are left out."""
    from gpuhpc.inventory.smi import parse_mig_lgip
    from gpuhpc.spec.gpus import gpu_model

    model = gpu_model(gpu_type)
    if model is None or not model.mig_capable:
        raise ValueError(f"{gpu_type!r} is not a MIG-capable GPU type")
    rows = [r for r in parse_mig_lgip(lgip_text) if r.gpu == 0 and r.profile in model.mig_profiles]
    profiles = [{"name": r.profile, "id": r.profile_id, "max": r.total, "memory_gib": r.memory_gib, "sms": r.sms,
                 "compute": model.mig_profiles[r.profile].compute_slices,
                 "memory": model.mig_profiles[r.profile].memory_slices} for r in rows]
    for g in state["gpus"]:
        g["mig_profiles"] = profiles
        g["mig_slices"] = [model.compute_slices, model.memory_slices]
    return state

def local_cluster_states(fixtures: str) -> dict[str, dict]:
    """Stand-in states for the local test cluster's nodes, from the nvidia-smi captures (tests/fixtures):
    gpu-node1/2 an 8x H100 SXM box, mig-node1 two H100s split 7x 1g.10gb and 2x 3g.40gb (its
    gres.conf: 7 + 2 MIG instances, in that order)."""
    import copy

    smi = os.path.join(fixtures, "nvidia-smi")
    with open(os.path.join(smi, "q-text-h100-sxm-8gpu-535.161.08.txt"), encoding="utf-8") as fh:
        eight = state_from_query(fh.read())
    with open(os.path.join(smi, "L-h100-80gb-mig-7x1g.10gb.txt"), encoding="utf-8") as fh:
        seven = state_from_listing(fh.read())
    g1 = copy.deepcopy(seven["gpus"][0])
    g1["uuid"] = g1["uuid"][:-4] + "0001"
    g1["mig"] = [{**g1["mig"][k], "profile": "3g.40gb", "gi": 1 + k, "memory_total": 40 * 2**30,
                  "uuid": g1["mig"][k]["uuid"][:-4] + f"{k:04d}"} for k in range(2)]
    states = {"gpu-node1": eight, "gpu-node2": copy.deepcopy(eight),
              "mig-node1": {"driver": seven["driver"], "gpus": [seven["gpus"][0], g1]}}
    for n, (name, st) in enumerate(states.items()):      # distinct UUIDs per node
        for g in st["gpus"]:
            g["uuid"] = f"{g['uuid'][:-2]}{n:02d}"
    return states


def main(argv: list[str] | None = None) -> int:
    """``python -m standins.nvml_standin local-cluster FIXTURES OUTDIR``: one state file per
    local node (OUTDIR/<node>.json), existing files kept (a test may be scripting them)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "local-cluster":
        sys.stderr.write("usage: python -m standins.nvml_standin local-cluster FIXTURES OUTDIR\n")
        return 2
    os.makedirs(args[2], exist_ok=True)
    for node, st in local_cluster_states(args[1]).items():
        path = os.path.join(args[2], f"{node}.json")
        if not os.path.exists(path):
            write_state(path, st)
    return 0


def write_state(path: str, state: dict) -> None:
    """Write a state file atomically (the exporter may be reading it)."""
    from gpuhpc.fsutil import write_atomic

    write_atomic(path, json.dumps(state, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
