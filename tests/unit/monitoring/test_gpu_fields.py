"""dcgm-exporter's default fields from the GPU exporter, under dcgm-exporter's names, with
values read from the real ``nvidia-smi -q`` captures in tests/fixtures/nvidia-smi (the NVML
stand-in answers what the capture shows; N/A there is "not supported" here, and left out).

Fields no capture holds (XID events, the energy counter, NVLink error counters, retired-page
counts, non-zero ECC/row-remap values, MIG GPM activity) are tested on stand-in values and say so."""
from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuhpc.monitoring import DCGM_LABELS, DCGM_MIG_LABELS, METRICS
from gpuhpc.monitoring.gpu_exporter import GpuCollector
from standins import nvml_standin

SMI = "nvidia-smi"


def _scrape(collector) -> dict[str, dict[str, float]]:
    """{metric: {gpu label (+ "/GI" for a MIG instance, + ":xid" for an XID count): value}}."""
    reg = CollectorRegistry()
    reg.register(collector)
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            key = s.labels.get("gpu", "") + (f"/{s.labels['GPU_I_ID']}" if "GPU_I_ID" in s.labels else "") \
                + (f":{s.labels['xid']}" if "xid" in s.labels else "")
            out.setdefault(s.name, {})[key] = s.value
    return out


def _collector(tmp_path, monkeypatch, state: dict, node: str = "gpu-node1") -> GpuCollector:
    path = tmp_path / f"{node}.json"
    nvml_standin.write_state(str(path), state)
    monkeypatch.setenv("GPUHPC_NVML_MODULE", "standins.nvml_standin")
    monkeypatch.setenv("GPUHPC_NVML_STANDIN", str(path))
    return GpuCollector(node, jobmap_dir=str(tmp_path / "jm"))


def _capture(fixtures_dir, name: str) -> dict:
    return nvml_standin.state_from_query((fixtures_dir / SMI / name).read_text())


@pytest.fixture(autouse=True)
def _fresh_nvml():
    yield
    nvml_standin.shutdown_all()       # the XID watch holds NVML initialised: leave none behind


def test_fields_from_h100_capture_535_161(fixtures_dir, tmp_path, monkeypatch):
    """q-text-h100-sxm-8gpu-535.161.08.txt, checked by hand: PCIe replays 67 63 52 43 49 53 82 67;
    SM 86 MHz, memory 2619 MHz; 'HW Slowdown' and 'HW Power Brake Slowdown' active on every GPU
    (0x8|0x80 = 136); power limit 700 W; every ECC count 0; remapped rows 0/0, not pending, no
    failure; retired pages N/A (left out)."""
    got = _scrape(_collector(tmp_path, monkeypatch, _capture(fixtures_dir, "q-text-h100-sxm-8gpu-535.161.08.txt")))
    gpus = [str(i) for i in range(8)]
    assert [got["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"][g] for g in gpus] == [67, 63, 52, 43, 49, 53, 82, 67]
    for g in gpus:
        assert got["DCGM_FI_DEV_SM_CLOCK"][g] == 86 and got["DCGM_FI_DEV_MEM_CLOCK"][g] == 2619
        assert got["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"][g] == 0x88
        assert got["DCGM_FI_DEV_POWER_MGMT_LIMIT"][g] == 700.0
        for m in ("ECC_SBE_VOL_TOTAL", "ECC_DBE_VOL_TOTAL", "ECC_SBE_AGG_TOTAL", "ECC_DBE_AGG_TOTAL",
                  "CORRECTABLE_REMAPPED_ROWS", "UNCORRECTABLE_REMAPPED_ROWS", "ROW_REMAP_PENDING", "ROW_REMAP_FAILURE"):
            assert got[f"DCGM_FI_DEV_{m}"][g] == 0, m
    for m in ("DCGM_FI_DEV_RETIRED_SBE", "DCGM_FI_DEV_RETIRED_DBE", "DCGM_FI_DEV_RETIRED_PENDING"):
        assert m not in got, m                  # N/A on H100 (row remapping instead)


def test_fields_from_h100_capture_535_183(fixtures_dir, tmp_path, monkeypatch):
    """q-text-h100-sxm-8gpu-535.183.01.txt: GPU 0 idle (0x1) at 345 MHz with 120 PCIe replays; GPU 2
    at 1980 MHz with 'SW Power Cap', 'SW Thermal Slowdown' and 'HW Power Brake Slowdown' active
    (0x4|0x20|0x80 = 164) while 'HW Slowdown' reads Not Active: the bits are taken as the capture
    shows them, not inferred."""
    got = _scrape(_collector(tmp_path, monkeypatch, _capture(fixtures_dir, "q-text-h100-sxm-8gpu-535.183.01.txt")))
    reasons = got["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"]
    assert reasons["0"] == 0x1 and reasons["2"] == 0xA4
    assert got["DCGM_FI_DEV_SM_CLOCK"]["0"] == 345 and got["DCGM_FI_DEV_SM_CLOCK"]["2"] == 1980
    assert got["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]["0"] == 120 and got["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]["2"] == 58


def test_fields_from_a100_xml_capture(fixtures_dir, tmp_path, monkeypatch):
    """q-x-a100-sxm4-80gb-mig-4x1g-1of4gpus.xml (-q -x, driver 535.54.03): replay_counter 0, sm_clock
    1275 MHz, mem_clock 1593 MHz, current_power_limit 500 W, no clock event reason active; ECC 0;
    remapped_rows and retired pages N/A (left out)."""
    got = _scrape(_collector(tmp_path, monkeypatch, _capture(fixtures_dir, "q-x-a100-sxm4-80gb-mig-4x1g-1of4gpus.xml")))
    assert got["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == {"0": 0}
    assert got["DCGM_FI_DEV_SM_CLOCK"] == {"0": 1275} and got["DCGM_FI_DEV_MEM_CLOCK"] == {"0": 1593}
    assert got["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == {"0": 500.0} and got["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] == {"0": 0}
    assert got["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] == {"0": 0}
    assert not {m for m in got if "REMAP" in m or "RETIRED" in m}


def test_dcgm_labels_and_names(fixtures_dir, tmp_path, monkeypatch):
    """dcgm-exporter's labels (gpu = NVML index, UUID, device, modelName, Hostname) and its exact
    names: a counter of its has no _total suffix."""
    col = _collector(tmp_path, monkeypatch, _capture(fixtures_dir, "q-text-h100-sxm-8gpu-535.161.08.txt"))
    reg = CollectorRegistry()
    reg.register(col)
    text = generate_latest(reg).decode()
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER_total" not in text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    s = fams["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].samples[0]
    assert set(s.labels) == set(DCGM_LABELS) and s.labels["UUID"].startswith("GPU-") and s.labels["device"] == "nvidia0"
    assert s.labels["modelName"] == "NVIDIA H100 80GB HBM3" and s.labels["Hostname"] == s.labels["node"] == "gpu-node1"


def test_fields_no_capture_holds_on_stand_in_values(fixtures_dir, tmp_path, monkeypatch):
    """Stand-in values (no capture has them): energy, NVLink error counters, retired pages, non-zero
    ECC and a failed, pending row remap."""
    st = _capture(fixtures_dir, "q-text-h100-sxm-8gpu-535.161.08.txt")
    st["gpus"][5].update({"energy_mj": 123456789, "nvlink_errors": {"crc_flit": 3, "crc_data": 4, "replay": 5,
                                                                   "recovery": 6},
                          "retired_sbe": 2, "retired_dbe": 1, "retired_pending": 1,
                          "ecc": {"sbe_vol": 7, "dbe_vol": 1, "sbe_agg": 70, "dbe_agg": 2},
                          "remapped_rows": [4, 1, 1, 1]})
    got = _scrape(_collector(tmp_path, monkeypatch, st))
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == {"5": 123456789}
    assert [got[f"DCGM_FI_DEV_NVLINK_{k}_COUNT_TOTAL"]["5"] for k in
            ("CRC_FLIT_ERROR", "CRC_DATA_ERROR", "REPLAY_ERROR", "RECOVERY_ERROR")] == [3, 4, 5, 6]
    assert (got["DCGM_FI_DEV_RETIRED_SBE"], got["DCGM_FI_DEV_RETIRED_DBE"], got["DCGM_FI_DEV_RETIRED_PENDING"]) == \
        ({"5": 2}, {"5": 1}, {"5": 1})
    assert [got[f"DCGM_FI_DEV_ECC_{k}_TOTAL"]["5"] for k in ("SBE_VOL", "DBE_VOL", "SBE_AGG", "DBE_AGG")] == [7, 1, 70, 2]
    assert [got[f"DCGM_FI_DEV_{k}"]["5"] for k in ("CORRECTABLE_REMAPPED_ROWS", "UNCORRECTABLE_REMAPPED_ROWS",
                                                    "ROW_REMAP_PENDING", "ROW_REMAP_FAILURE")] == [4, 1, 1, 1]
    assert got["DCGM_FI_DEV_ROW_REMAP_FAILURE"]["4"] == 0
    assert got["gpuhpc_gpu_exporter_errors_total"][""] == 0


def test_xid_events_last_value_and_count(fixtures_dir, tmp_path, monkeypatch):
    """Stand-in XID events (no capture has any): the last XID per GPU and a count per code, each event
    counted once, whatever the number of scrapes; events before the exporter started are not its."""
    st = _capture(fixtures_dir, "q-text-h100-sxm-8gpu-535.161.08.txt")
    st["xid_events"] = [[0, 13]]                        # before the exporter: the health checks' (kernel log)
    col = _collector(tmp_path, monkeypatch, st)
    path = tmp_path / "gpu-node1.json"
    got = _scrape(col)
    assert got["DCGM_FI_DEV_XID_ERRORS"] == {str(i): 0 for i in range(8)} and "gpuhpc_gpu_xid_errors" not in got
    st["xid_events"] += [[3, 79], [3, 48], [1, 31], [3, 48]]
    nvml_standin.write_state(str(path), st)
    for _ in range(2):                                  # a second scrape counts nothing twice
        got = _scrape(col)
        assert got["DCGM_FI_DEV_XID_ERRORS"]["3"] == 48 and got["DCGM_FI_DEV_XID_ERRORS"]["1"] == 31
        assert got["DCGM_FI_DEV_XID_ERRORS"]["0"] == 0
        assert got["gpuhpc_gpu_xid_errors_total"] == {"3:79": 1, "3:48": 2, "1:31": 1}


def test_mig_instance_activity_from_gpm(fixtures_dir, tmp_path, monkeypatch):
    """Stand-in GPM values (no capture has any). Real NVML answers 'not supported' for a MIG
    device's utilisation; GPM gives the instance's graphics activity between two scrapes, as
    DCGM_FI_PROF_GR_ENGINE_ACTIVE and as the instance's gpuhpc utilisation."""
    st = nvml_standin.local_cluster_states(str(fixtures_dir))["mig-node1"]
    for g in st["gpus"]:
        for k, m in enumerate(g["mig"]):
            m.pop("util")
            m["gpm_graphics_util"] = 10.0 * k
    col = _collector(tmp_path, monkeypatch, st, node="mig-node1")
    first = _scrape(col)
    assert "DCGM_FI_PROF_GR_ENGINE_ACTIVE" not in first and "gpuhpc_gpu_utilization_percent" not in first
    got = _scrape(col)
    gr = got["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    gi0 = st["gpus"][0]["mig"][3]["gi"]
    assert len(gr) == 9 and gr[f"0/{gi0}"] == pytest.approx(0.3)
    util = got["gpuhpc_gpu_utilization_percent"]        # by GRES index: 7 + 2 instances
    assert util["3"] == pytest.approx(30.0) and util["8"] == pytest.approx(10.0)
    fams = {f.name: f for f in text_string_to_metric_families(generate_latest(_registry(col)).decode())}
    s = fams["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples[-1]
    assert set(s.labels) == set(DCGM_MIG_LABELS) and s.labels["GPU_I_PROFILE"] == "3g.40gb" and s.labels["gpu"] == "1"
    assert got["gpuhpc_gpu_exporter_errors_total"][""] == 0


def _registry(col) -> CollectorRegistry:
    reg = CollectorRegistry()
    reg.register(col)
    return reg


def test_catalogue_has_every_dcgm_field_exported(fixtures_dir, tmp_path, monkeypatch):
    st = _capture(fixtures_dir, "q-text-h100-sxm-8gpu-535.161.08.txt")
    st["gpus"][0].update({"energy_mj": 1, "nvlink_errors": {"crc_flit": 0, "crc_data": 0, "replay": 0, "recovery": 0},
                          "retired_sbe": 0, "retired_dbe": 0, "retired_pending": 0})
    got = _scrape(_collector(tmp_path, monkeypatch, st))
    want = {m for m in METRICS if m.startswith("DCGM_FI_DEV_")}
    assert want <= set(got), want - set(got)
    assert json.dumps(sorted(want))          # the catalogue names are plain strings
