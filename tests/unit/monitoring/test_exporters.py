"""GPU exporter on the NVML stand-in, the job map, the Slurm exporter on recorded output, and
dashboards/rules checked against the metric catalogue. Nothing runs: no NVML, no Slurm."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuhpc.monitoring import METRICS, RECORDED, jobmap
from gpuhpc.monitoring.gpu_exporter import GpuCollector
from gpuhpc.monitoring.promql import dashboard_exprs, metric_names
from gpuhpc.monitoring.slurm_exporter import node_state, samples, tres_gpus
from gpuhpc.slurm.parsers import parse_nodes
from standins import nvml_standin

PKG = Path(__file__).resolve().parents[3] / "gpuhpc" / "monitoring"
NODE_EXPORTER = {"node_cpu_seconds_total", "node_memory_MemAvailable_bytes"}


def _scrape(collector) -> dict[str, list]:
    reg = CollectorRegistry()
    reg.register(collector)
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


@pytest.fixture()
def states(fixtures_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_NVML_MODULE", "standins.nvml_standin")   # the exporter's NVML: the stand-in
    st = nvml_standin.local_cluster_states(str(fixtures_dir))
    for node, state in st.items():
        nvml_standin.write_state(str(tmp_path / f"{node}.json"), state)
    return tmp_path


def test_gpu_exporter_labels_devices_with_their_jobs(states, tmp_path, monkeypatch):
    path = states / "gpu-node1.json"
    st = json.loads(path.read_text())
    st["gpus"][2]["util"] = 97
    nvml_standin.write_state(str(path), st)
    monkeypatch.setenv("GPUHPC_NVML_STANDIN", str(path))
    jm = tmp_path / "jm"
    jobmap.assign("gpu-node1", "1234", "alice", [2, 3], str(jm))
    got = _scrape(GpuCollector("gpu-node1", jobmap_dir=str(jm)))
    util = {s.labels["gpu"]: s.value for s in got["gpuhpc_gpu_utilization_percent"]}
    assert len(util) == 8 and util["2"] == 97.0 and util["3"] == 0.0
    # the job and user: one job_info series per held GPU, and on no other series
    jobs = {s.labels["gpu"]: (s.value, s.labels["job_id"], s.labels["user"]) for s in got["gpuhpc_gpu_job_info"]}
    assert jobs == {"2": (1.0, "1234", "alice"), "3": (1.0, "1234", "alice")}
    assert all("job_id" not in s.labels and "user" not in s.labels
               for name, ss in got.items() if name != "gpuhpc_gpu_job_info" for s in ss)
    exported = {n[: -len("_total")] if n.endswith("_total") else n for n in got} | set(got)
    for name in METRICS:
        # an XID count exists once NVML reported an XID (tests/unit/monitoring/test_gpu_fields.py)
        if name.startswith("gpuhpc_gpu_") and name != "gpuhpc_gpu_xid_errors_total":
            assert name in exported, name
    jobmap.release("gpu-node1", "1234", base=str(jm))
    assert jobmap.read("gpu-node1", str(jm)) == {}


def test_gpu_exporter_mig_instances_get_job_labels(states, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_NVML_STANDIN", str(states / "mig-node1.json"))
    jm = tmp_path / "jm"
    jobmap.assign("mig-node1", "77", "bob", [8], str(jm))
    got = _scrape(GpuCollector("mig-node1", jobmap_dir=str(jm)))
    info = [s.labels for s in got["gpuhpc_gpu_info"]]
    assert [i["mig"] for i in info] == ["1g.10gb"] * 7 + ["3g.40gb"] * 2
    assert [(i["gpu"], i["mig"], i["job_id"], i["user"]) for i in (s.labels for s in got["gpuhpc_gpu_job_info"])] \
        == [("8", "3g.40gb", "77", "bob")]
    # board values once per physical GPU, with no GPU index (several jobs share a board)
    power = got["gpuhpc_gpu_power_watts"]
    assert len(power) == 2 and all(s.labels["gpu"] == "" for s in power)
    mem = {s.labels["gpu"]: s.value for s in got["gpuhpc_gpu_memory_total_bytes"]}
    assert mem["0"] == 10 * 2**30 and mem["8"] == 40 * 2**30


def test_per_gpu_series_do_not_change_with_the_job(states, tmp_path, monkeypatch):
    """Cardinality: a new job on a GPU makes one new series (its job_info), not one per metric.
    The per-GPU series are the same set whichever job (or none) holds the GPUs."""
    monkeypatch.setenv("GPUHPC_NVML_STANDIN", str(states / "gpu-node1.json"))
    jm = tmp_path / "jm"

    def series(job: str | None) -> tuple[set, set]:
        jobmap.release("gpu-node1", "1", base=str(jm))
        jobmap.release("gpu-node1", "2", base=str(jm))
        if job:
            jobmap.assign("gpu-node1", job, f"user{job}", list(range(8)), str(jm))
        got = _scrape(GpuCollector("gpu-node1", jobmap_dir=str(jm)))
        ids = {(name, tuple(sorted(s.labels.items()))) for name, ss in got.items() for s in ss}
        return ({i for i in ids if i[0] != "gpuhpc_gpu_job_info"}, {i for i in ids if i[0] == "gpuhpc_gpu_job_info"})

    (none, none_jobs), (a, a_jobs), (b, b_jobs) = series(None), series("1"), series("2")
    assert none == a == b and len(a) > 8 * 9
    assert none_jobs == set() and len(a_jobs) == len(b_jobs) == 8 and not a_jobs & b_jobs


def test_unsupported_values_are_left_out_not_errors(states, monkeypatch):
    path = states / "gpu-node2.json"
    st = json.loads(path.read_text())
    for g in st["gpus"]:
        g.pop("nvlink_tx_kib"), g.pop("pcie_rx_kbs")
    nvml_standin.write_state(str(path), st)
    monkeypatch.setenv("GPUHPC_NVML_STANDIN", str(path))
    got = _scrape(GpuCollector("gpu-node2", jobmap_dir="/nonexistent"))
    assert "gpuhpc_gpu_nvlink_tx_bytes_total" not in got and "gpuhpc_gpu_pcie_rx_bytes_per_second" not in got
    assert got["gpuhpc_gpu_exporter_errors_total"][0].value == 0


def test_jobmap_hook_reads_slurm_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_JOBMAP_DIR", str(tmp_path))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node2")
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    monkeypatch.setenv("SLURM_JOB_USER", "carol")
    monkeypatch.setenv("SLURM_JOB_GPUS", "0-1,5")
    assert jobmap.main(["prolog"]) == 0
    assert sorted(jobmap.read("gpu-node2")) == [0, 1, 5]
    jobmap.assign("gpu-node2", "56", "dan", [6])
    assert jobmap.main(["epilog"]) == 0
    assert jobmap.read("gpu-node2") == {6: {"job_id": "56", "user": "dan"}}
    assert jobmap.main(["nope"]) == 2
    with pytest.raises(ValueError):
        jobmap.node_dir("../etc")


NODES = """NodeName=gpu-node1 CPUTot=16 Gres=gpu:h100:8(S:0-1) State=MIXED Partitions=gpu,gpu-hi,all AllocTRES=cpu=4,gres/gpu=2,gres/gpu:h100=2
NodeName=gpu-node2 CPUTot=16 Gres=gpu:h100:8(S:0-1) State=IDLE+DRAIN Partitions=gpu,gpu-hi,all AllocTRES= Reason=gpuhpc:hw: gpu count 7/8 [root@2026-11-30T13:00:00]
NodeName=mig-node1 CPUTot=16 Gres=gpu:1g.10gb:7,gpu:3g.40gb:2 State=DOWN+NOT_RESPONDING Partitions=mig,all AllocTRES=
NodeName=cpu-node1 CPUTot=16 Gres=(null) State=ALLOCATED Partitions=cpu,all AllocTRES=cpu=16
"""


class _Row:
    def __init__(self, job_id, state, tres, nodes, partition, user="u", account="a"):
        from gpuhpc.slurm.state import SlurmState

        self.job_id, self.state, self.tres_per_node, self.nodes = job_id, SlurmState.parse(state), tres, nodes
        self.partition, self.user, self.account = partition, user, account


def test_slurm_exporter_partition_counts():
    assert [node_state(s) for s in ("IDLE+DRAIN", "MIXED", "ALLOCATED", "DOWN+NOT_RESPONDING", "DRAINED")] == \
        ["drain", "mixed", "alloc", "down", "drain"]
    assert tres_gpus("gres:gpu:h100:8") == {"h100": 8} and tres_gpus("gres/gpu:2") == {"gpu": 2}
    assert tres_gpus("N/A") == {}
    queue = [_Row("1", "PENDING", "gres:gpu:h100:8", 2, "gpu"), _Row("2", "RUNNING", "gres:gpu:h100:2", 1, "gpu"),
             _Row("3", "PENDING", "N/A", 1, "cpu,all")]
    got = {(m, labels): v for m, labels, v in samples(parse_nodes(NODES), queue)}
    assert got[("gpuhpc_slurm_partition_gpus", ("gpu", "h100", "alloc"))] == 2
    assert got[("gpuhpc_slurm_partition_gpus", ("gpu", "h100", "idle"))] == 6
    assert got[("gpuhpc_slurm_partition_gpus", ("gpu", "h100", "drained"))] == 8
    assert got[("gpuhpc_slurm_partition_gpus", ("mig", "1g.10gb", "down"))] == 7
    assert got[("gpuhpc_slurm_partition_nodes", ("gpu", "drain"))] == 1
    assert got[("gpuhpc_slurm_partition_nodes", ("cpu", "alloc"))] == 1
    assert got[("gpuhpc_slurm_partition_pending_gpus", ("gpu", "h100"))] == 16
    assert got[("gpuhpc_slurm_partition_pending_jobs", ("all",))] == 1
    assert got[("gpuhpc_slurm_job_gpus", ("2", "u", "a", "gpu", "h100"))] == 2
    assert got[("gpuhpc_slurm_partition_pending_gpus", ("gpu-hi", "h100"))] == 0      # nothing pends: 0
    # the cluster: each node once, though gpu-node1 is in three partitions (no partition named "all" needed)
    assert {k[1]: v for k, v in got.items() if k[0] == "gpuhpc_slurm_gpus" and v} == {
        ("h100", "alloc"): 2, ("h100", "idle"): 6, ("h100", "drained"): 8, ("1g.10gb", "down"): 7,
        ("3g.40gb", "down"): 2}
    assert {k[1][0]: v for k, v in got.items() if k[0] == "gpuhpc_slurm_nodes"} == \
        {"mixed": 1, "drain": 1, "down": 1, "alloc": 1}
    assert {m for m, _ in got} <= set(METRICS)


def _known() -> set[str]:
    return set(METRICS) | RECORDED | NODE_EXPORTER


@pytest.mark.parametrize("name", ["cluster", "partition", "node", "job"])
def test_dashboard_queries_name_exported_metrics(name):
    d = json.loads((PKG / "dashboards" / f"{name}.json").read_text())
    exprs = dashboard_exprs(d)
    assert exprs and d["uid"] == f"gpuhpc-{name}"
    for title, expr in exprs:
        names = metric_names(expr)
        assert names, f"{name}: {title!r}: no metric in {expr!r}"
        assert names <= _known(), f"{name}: {title!r}: unknown {names - _known()}"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", ["cluster", "partition", "node", "job"])
def test_dashboard_panels_follow_the_dashboards_variables(name):
    """Every panel of a dashboard with a $node, $partition or $job_id variable is filtered by it,
    and no dashboard names a node, partition or job itself (`partition="all"` is the local
    cluster's partition, not every site's)."""
    import re

    d = json.loads((PKG / "dashboards" / f"{name}.json").read_text())
    variables = [v["name"] for v in d.get("templating", {}).get("list", []) if v.get("type") == "query"]
    for title, expr in dashboard_exprs(d):
        if title.startswith("$"):
            continue
        for label, value in re.findall(r'\b(partition|node|job_id)\s*=~?\s*"([^"]*)"', expr):
            assert value == f"${label}", f"{name}: {title!r} names {label}={value!r} itself: {expr}"
        for var in variables:
            assert f"${var}" in expr, f"{name}: {title!r} is not filtered by ${var}: {expr}"


def test_rules_read_and_record_known_metrics():
    rules = yaml.safe_load((PKG / "prometheus" / "rules.yml").read_text())
    recorded = set()
    for path in sorted((PKG / "prometheus").glob("*.yml")):        # rules.yml and rules-long-range.yml
        for group in yaml.safe_load(path.read_text())["groups"]:
            for r in group["rules"]:
                assert metric_names(r["expr"]) <= set(METRICS) | RECORDED, r
                if "record" in r:
                    recorded.add(r["record"])
    assert recorded == RECORDED
    alert = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpuhpcIdleGpuHeld"][0]
    minutes = int(alert["for"].rstrip("m"))
    assert minutes < 15       # fires within 15 minutes of a held GPU going idle
