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
``nvidia-smi -L`` capture; :func:`state_from_query` from a real ``nvidia-smi -q`` (text or XML)
capture, with each GPU's health fields read from it (:func:`health_from_query`: clocks, clock
event reasons, power limit, PCIe replays, ECC counts, retired pages, remapped rows; what the
capture shows as N/A is left out, so NVML answers "not supported").

The dcgm-exporter fields (a GPU's keys; all optional)::

    "sm_clock_mhz", "mem_clock_mhz", "clock_reasons" (NVML's bitmask), "power_limit_mw",
    "energy_mj", "pcie_replay", "ecc": {"sbe_vol", "dbe_vol", "sbe_agg", "dbe_agg"},
    "retired_sbe", "retired_dbe" (page counts), "retired_pending" (0/1),
    "remapped_rows": [correctable, uncorrectable, pending, failure],
    "nvlink_errors": {"crc_flit", "crc_data", "replay", "recovery"}

a MIG instance's ``"gpm_graphics_util"`` (percent, what NVML GPM reports between two samples),
and the node's ``"xid_events": [[gpu index, xid], ...]`` (append only: an event set delivers
the events appended after it was created, each once).
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
NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_ERROR_TIMEOUT = 10
nvmlEventTypeXidCriticalError = 0x8  # noqa: N816 (pynvml's name)
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRICS_GET_VERSION = 1
ENV = "GPUHPC_NVML_STANDIN"


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {3: "Not Supported", 2: "Invalid Argument", 6: "Not Found", 10: "Timeout"}.get(
            self.value, f"NVML error {self.value}")


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


_state: dict | None = None
_inits = 0          # NVML counts its inits: the state goes with the last shutdown


def nvmlInit() -> None:  # noqa: N802 (pynvml's names throughout)
    global _state, _inits
    path = os.environ.get(ENV)
    if not path:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    with open(path, encoding="utf-8") as fh:
        _state = json.load(fh)
    _inits += 1


def nvmlShutdown() -> None:  # noqa: N802
    global _state, _inits
    _inits = max(0, _inits - 1)
    if not _inits:
        _state = None


def shutdown_all() -> None:
    """Undo every nvmlInit (a test's end: the GPU exporter's XID watch holds one)."""
    while _inits:
        nvmlShutdown()


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
    errors = {NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit", NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL:
              "crc_data", NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
              NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery"}
    out = []
    for f in field_ids:
        fid = f[0] if isinstance(f, tuple) else f
        key = keys.get(fid)
        value = h.data.get(key) if key else (h.data.get("nvlink_errors") or {}).get(errors.get(fid, ""))
        out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED,
                                   value=SimpleNamespace(ullVal=int(value or 0))))
    return out


def nvmlDeviceGetMinorNumber(h: _Handle) -> int:  # noqa: N802
    if h.mig is not None:
        raise NVMLError_NotSupported()
    return h.data.get("minor", h.gpu)


def nvmlDeviceGetClockInfo(h: _Handle, clock: int) -> int:  # noqa: N802
    return _get(h, "sm_clock_mhz" if clock == NVML_CLOCK_SM else "mem_clock_mhz")


def nvmlDeviceGetCurrentClocksEventReasons(h: _Handle) -> int:  # noqa: N802
    return _get(h, "clock_reasons")


def nvmlDeviceGetPowerManagementLimit(h: _Handle) -> int:  # noqa: N802
    return _get(h, "power_limit_mw")


def nvmlDeviceGetTotalEnergyConsumption(h: _Handle) -> int:  # noqa: N802
    return _get(h, "energy_mj")


def nvmlDeviceGetPcieReplayCounter(h: _Handle) -> int:  # noqa: N802
    return _get(h, "pcie_replay")


def nvmlDeviceGetTotalEccErrors(h: _Handle, error_type: int, counter_type: int) -> int:  # noqa: N802
    ecc = _get(h, "ecc")
    key = ("sbe" if error_type == NVML_MEMORY_ERROR_TYPE_CORRECTED else "dbe") + \
        ("_vol" if counter_type == NVML_VOLATILE_ECC else "_agg")
    if ecc.get(key) is None:
        raise NVMLError_NotSupported()
    return ecc[key]


def nvmlDeviceGetRetiredPages(h: _Handle, cause: int) -> list[int]:  # noqa: N802
    n = _get(h, "retired_sbe" if cause == NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS else "retired_dbe")
    return [0x1000 * (k + 1) for k in range(n)]


def nvmlDeviceGetRetiredPagesPendingStatus(h: _Handle) -> int:  # noqa: N802
    return _get(h, "retired_pending")


def nvmlDeviceGetRemappedRows(h: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
    return tuple(_get(h, "remapped_rows"))


# XID events: an event set delivers the state's "xid_events" appended after it was created
class _EventSet:
    def __init__(self, start: int) -> None:
        self.next, self.gpus = start, set()


def nvmlEventSetCreate() -> _EventSet:  # noqa: N802
    return _EventSet(len((_state or {}).get("xid_events", [])))


def nvmlDeviceRegisterEvents(h: _Handle, types: int, events: _EventSet) -> None:  # noqa: N802
    if h.mig is not None:
        raise NVMLError_NotSupported()
    if types & nvmlEventTypeXidCriticalError:
        events.gpus.add(h.gpu)


def nvmlEventSetWait_v2(events: _EventSet, timeout_ms: int):  # noqa: N802
    queued = (_state or {}).get("xid_events", [])
    while events.next < len(queued):
        gpu, xid = queued[events.next]
        events.next += 1
        if gpu in events.gpus:
            return SimpleNamespace(device=_Handle(gpu, None, _gpus()[gpu]), eventType=nvmlEventTypeXidCriticalError,
                                   eventData=xid, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
    raise NVMLError(NVML_ERROR_TIMEOUT)


# GPM (Hopper): a sample holds the instance's "gpm_graphics_util"; the metric between two
# samples is the second's value
def nvmlGpmQueryDeviceSupport(h: _Handle):  # noqa: N802
    return SimpleNamespace(version=1, isSupportedDevice=int(any("gpm_graphics_util" in m
                                                                for m in h.data.get("mig") or [])))


def nvmlGpmSampleAlloc():  # noqa: N802
    return SimpleNamespace(util=None)


def nvmlGpmSampleFree(sample) -> None:  # noqa: N802
    sample.util = None


def nvmlGpmMigSampleGet(h: _Handle, gi: int, sample):  # noqa: N802
    for m in h.data.get("mig") or []:
        if m.get("gi") == gi:
            sample.util = _get(_Handle(h.gpu, 0, m), "gpm_graphics_util")
            return sample
    raise NVMLError(NVML_ERROR_NOT_FOUND)


class c_nvmlGpmMetricsGet_t:  # noqa: N801 (pynvml's name)
    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = None
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0) for _ in range(4)]


def nvmlGpmMetricsGet(q: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:  # noqa: N802
    if q.sample1 is None or q.sample2 is None or q.sample2.util is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    for m in q.metrics[: q.numMetrics]:
        if m.metricId == NVML_GPM_METRIC_GRAPHICS_UTIL:
            m.value, m.nvmlReturn = float(q.sample2.util), NVML_SUCCESS
        else:
            m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return q


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
    """A stand-in state from a real ``nvidia-smi -q`` (text or XML) capture's GPUs, each with
    the health fields the capture shows (:func:`health_from_query`)."""
    from gpuhpc.inventory.smi import parse_query_text, parse_query_xml, sniff

    q = parse_query_text(text) if sniff(text) == "query" else parse_query_xml(text)
    listing = "\n".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})" for g in q.gpus)
    state = state_from_listing(listing, util=util)
    for gpu, fields in zip(state["gpus"], health_from_query(text)):
        gpu.update(fields)
    return state


# NVML's clock event reason bits, by nvidia-smi -q's line (text) and element suffix (XML)
REASON_BITS = {"idle": 0x1, "applications clocks setting": 0x2, "sw power cap": 0x4, "hw slowdown": 0x8,
               "sync boost": 0x10, "sw thermal slowdown": 0x20, "hw thermal slowdown": 0x40,
               "hw power brake slowdown": 0x80, "display clock setting": 0x100}
_XML_REASONS = {"gpu_idle": "idle", "applications_clocks_setting": "applications clocks setting",
                "sw_power_cap": "sw power cap", "hw_slowdown": "hw slowdown", "sync_boost": "sync boost",
                "sw_thermal_slowdown": "sw thermal slowdown", "hw_thermal_slowdown": "hw thermal slowdown",
                "hw_power_brake_slowdown": "hw power brake slowdown", "display_clocks_setting": "display clock setting"}


def _number(v: str | None) -> float | None:
    """``"700.00 W"``, ``"2619 MHz"``, ``"67"`` -> the number; N/A, missing or text -> None."""
    word = (v or "").split()[:1]
    try:
        return float(word[0]) if word else None
    except ValueError:
        return None


def _text_tree(block: list[str]) -> dict[str, str]:
    """One GPU's ``-q`` text lines -> {"Section/Sub/Key": value} (nesting by indentation)."""
    out, stack = {}, []
    for line in block:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key.strip()))
        if sep:
            out["/".join(k for _, k in stack)] = value.strip()
    return out


def _fields(get, reasons: dict[str, str]) -> dict:
    """The stand-in keys from one GPU's values: ``get(key)`` for the generic keys, ``reasons``
    {reason: "Active"/"Not Active"}."""
    g: dict = {}

    def put(key: str, value, scale: float = 1) -> None:
        if value is not None:
            g[key] = int(round(value * scale))

    put("pcie_replay", _number(get("replay")))
    put("sm_clock_mhz", _number(get("sm")))
    put("mem_clock_mhz", _number(get("mem")))
    put("power_limit_mw", _number(get("power_limit")), 1000)
    if reasons:
        g["clock_reasons"] = sum(bit for name, bit in REASON_BITS.items() if reasons.get(name, "").lower() == "active")
    ecc = {}
    for key, parts in (("sbe_vol", get("vol_corr")), ("dbe_vol", get("vol_unc")),
                       ("sbe_agg", get("agg_corr")), ("dbe_agg", get("agg_unc"))):
        values = [_number(p) for p in parts]
        if values and all(v is not None for v in values):
            ecc[key] = int(sum(values))
    if ecc:
        g["ecc"] = ecc
    put("retired_sbe", _number(get("retired_sbe")))
    put("retired_dbe", _number(get("retired_dbe")))
    pending = (get("retired_pending") or "").strip().lower()
    if pending in ("yes", "no"):
        g["retired_pending"] = int(pending == "yes")
    rows = [get("remap_corr"), get("remap_unc"), get("remap_pending"), get("remap_failure")]
    if all(r is not None and r.strip().upper() != "N/A" for r in rows):
        g["remapped_rows"] = [int(_number(rows[0]) or 0), int(_number(rows[1]) or 0),
                              int(rows[2].strip().lower() in ("yes", "1")), int(rows[3].strip().lower() in ("yes", "1"))]
    return g


def health_from_query(text: str) -> list[dict]:
    """Each GPU's dcgm-exporter fields from a real ``nvidia-smi -q`` capture (text or ``-x``
    XML), as stand-in state keys; a value the capture shows as N/A is left out."""
    if text.lstrip().startswith("<?xml") or text.lstrip().startswith("<"):
        return _health_from_xml(text)
    blocks, cur = [], None
    for line in text.splitlines():
        if line.startswith("GPU ") and ":" in line:
            cur = []
            blocks.append(cur)
        elif cur is not None:
            cur.append(line)
    out = []
    for block in blocks:
        t = _text_tree(block)
        reasons_section = "Clocks Event Reasons" if any(k.startswith("Clocks Event Reasons/") for k in t) \
            else "Clocks Throttle Reasons"
        reasons = {k.rsplit("/", 1)[1].lower(): v for k, v in t.items() if k.startswith(reasons_section + "/")}
        power = "GPU Power Readings" if "GPU Power Readings/Current Power Limit" in t else "Power Readings"
        unc = ("SRAM Uncorrectable Parity", "SRAM Uncorrectable SEC-DED", "DRAM Uncorrectable")

        def both(kind: str, names: tuple[str, ...]) -> list[str]:
            got = [t[f"ECC Errors/{kind}/{n}"] for n in names if f"ECC Errors/{kind}/{n}" in t]
            return got or [t.get(f"ECC Errors/{kind}/SRAM Uncorrectable", "N/A")]

        keys = {"replay": t.get("PCI/Replays Since Reset"), "sm": t.get("Clocks/SM"), "mem": t.get("Clocks/Memory"),
                "power_limit": t.get(f"{power}/Current Power Limit", t.get(f"{power}/Power Limit")),
                "vol_corr": [t.get("ECC Errors/Volatile/SRAM Correctable"), t.get("ECC Errors/Volatile/DRAM Correctable")],
                "agg_corr": [t.get("ECC Errors/Aggregate/SRAM Correctable"),
                             t.get("ECC Errors/Aggregate/DRAM Correctable")],
                "vol_unc": both("Volatile", unc), "agg_unc": both("Aggregate", unc),
                "retired_sbe": t.get("Retired Pages/Single Bit ECC"), "retired_dbe": t.get("Retired Pages/Double Bit ECC"),
                "retired_pending": t.get("Retired Pages/Pending Page Blacklist"),
                "remap_corr": t.get("Remapped Rows/Correctable Error"),
                "remap_unc": t.get("Remapped Rows/Uncorrectable Error"), "remap_pending": t.get("Remapped Rows/Pending"),
                "remap_failure": t.get("Remapped Rows/Remapping Failure Occurred")}
        out.append(_fields(lambda k, keys=keys: keys[k], reasons))
    return out


def _health_from_xml(text: str) -> list[dict]:
    import xml.etree.ElementTree as ET

    out = []
    for gpu in ET.fromstring(text).findall("gpu"):
        def x(path: str) -> str | None:
            e = gpu.find(path)
            return e.text if e is not None and e.text is not None and len(e) == 0 else None

        reasons = {}
        for section in ("clocks_event_reasons", "clocks_throttle_reasons"):
            for e in gpu.findall(f"{section}/*"):
                suffix = e.tag.split("_reason_", 1)[-1]
                if suffix in _XML_REASONS:
                    reasons[_XML_REASONS[suffix]] = e.text or ""
        power = "gpu_power_readings" if gpu.find("gpu_power_readings") is not None else "power_readings"
        keys = {"replay": x("pci/replay_counter"), "sm": x("clocks/sm_clock"), "mem": x("clocks/mem_clock"),
                "power_limit": x(f"{power}/current_power_limit") or x(f"{power}/power_limit"),
                "vol_corr": [x("ecc_errors/volatile/sram_correctable"), x("ecc_errors/volatile/dram_correctable")],
                "vol_unc": [x("ecc_errors/volatile/sram_uncorrectable"), x("ecc_errors/volatile/dram_uncorrectable")],
                "agg_corr": [x("ecc_errors/aggregate/sram_correctable"), x("ecc_errors/aggregate/dram_correctable")],
                "agg_unc": [x("ecc_errors/aggregate/sram_uncorrectable"), x("ecc_errors/aggregate/dram_uncorrectable")],
                "retired_sbe": x("retired_pages/multiple_single_bit_retirement/retired_count"),
                "retired_dbe": x("retired_pages/double_bit_retirement/retired_count"),
                "retired_pending": x("retired_pages/pending_retirement"),
                "remap_corr": x("remapped_rows/remapped_row_corr"), "remap_unc": x("remapped_rows/remapped_row_unc"),
                "remap_pending": x("remapped_rows/remapped_row_pending"),
                "remap_failure": x("remapped_rows/remapped_row_failure")}
        out.append(_fields(lambda k, keys=keys: keys[k], reasons))
    return out


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
