"""Prometheus on the local cluster (scripts/services/prometheus.sh, started by scripts/test.sh):
it scrapes the node exporter, the Slurm exporter and one GPU exporter per GPU node; a running
job's GPUs (a MIG job's too) carry its job id once the Prolog hook has mapped them; the
partition GPU counts match ``scontrol``; every metric the dashboards read is really there.

The Prolog/Epilog hook (``python -m gpuhpc.monitoring.jobmap prolog|epilog``) is run here with
the environment slurmd gives a Prolog (the local slurm.conf names no Prolog yet); the GRES
indexes are the job's real ones from ``scontrol -d show job``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from gpuhpc.monitoring import RECORDED
from gpuhpc.monitoring.promql import dashboard_exprs, metric_names
from gpuhpc.monitoring.usage import job_series
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for
from standins import nvml_standin

pytestmark = pytest.mark.integration

PROM = os.environ.get("GPUHPC_PROMETHEUS_URL", "http://127.0.0.1:9090")
STATE_DIR = Path(os.environ.get("GPUHPC_NVML_STATE_DIR", "/var/tmp/gpuhpc-prometheus/nvml"))
JOBMAP_DIR = os.environ.get("GPUHPC_JOBMAP_DIR", "/var/tmp/gpuhpc-prometheus/jobmap")
DASHBOARDS = Path(__file__).resolve().parents[3] / "gpuhpc" / "monitoring" / "dashboards"


def query(expr: str) -> list[dict]:
    url = f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def series(expr: str, n: int, timeout: float = 40) -> list[dict]:
    """The query's result once it has at least ``n`` series; fails after ``timeout`` s."""
    def enough() -> list[dict] | None:
        res = query(expr)
        return res if len(res) >= n else None

    return wait_for(enough, timeout, lambda: f"{n} series of {expr} (now {query(expr)})", interval=1)


def _hook(kind: str, node: str, job_id: str, user: str, idx: list[int]) -> None:
    env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_JOB_ID": job_id, "SLURM_JOB_USER": user,
           "SLURM_JOB_GPUS": ",".join(map(str, idx)), "GPUHPC_JOBMAP_DIR": JOBMAP_DIR}
    subprocess.run([sys.executable, "-m", "gpuhpc.monitoring.jobmap", kind], env=env, check=True, timeout=30)


def _start(client: SlurmClient, tmp_path, *args: str) -> str:
    job = client.submit_script("#!/bin/bash\nsleep 300\n", extra=[*args, "--time=6", "--job-name=gpuhpc-metrics",
                                                                 f"--output={tmp_path}/%j.out"])
    try:
        wait_for(lambda: (rows := client.queue(job_ids=[job])) and rows[0].state.raw == "RUNNING", 120,
                 lambda: f"job {job} to start (now {client.queue(job_ids=[job])})", interval=1)
    except AssertionError:
        client.cancel(job)
        raise
    return job


def test_targets_are_up():
    res = query("up")
    jobs = {(r["metric"]["job"], r["metric"].get("node", "")): r["value"][1] for r in res}
    assert jobs.get(("slurm", "")) == "1" and any(j == "node" and v == "1" for (j, _), v in jobs.items())
    for node in ("gpu-node1", "gpu-node2", "mig-node1"):
        assert jobs.get(("gpu", node)) == "1", jobs


def test_running_jobs_gpu_series_carry_job_id_mig_included(tmp_path):
    client = SlurmClient()
    user = os.environ.get("USER") or "root"
    jobs: list[tuple[str, dict[str, list[int]]]] = []
    saved = {n: (STATE_DIR / f"{n}.json").read_text() for n in ("gpu-node1", "gpu-node2", "mig-node1")}
    try:
        gpu_job = _start(client, tmp_path, "--partition=gpu", "--gres=gpu:h100:2")
        jobs.append((gpu_job, client.job_gpu_indexes(gpu_job)))
        mig_job = _start(client, tmp_path, "--partition=mig", "--gres=gpu:3g.40gb:1")
        jobs.append((mig_job, client.job_gpu_indexes(mig_job)))
        for job, per_node in jobs:
            for node, idx in per_node.items():
                assert idx, (job, per_node)
                _hook("prolog", node, job, user, idx)
        # the stand-in: the H100 job keeps its first GPU busy, the MIG job its slice half busy
        (node, idx), = jobs[0][1].items()
        st = json.loads(saved[node])
        st["gpus"][idx[0]]["util"] = 93
        nvml_standin.write_state(str(STATE_DIR / f"{node}.json"), st)
        # the job's labels come from its job_info series (the per-GPU series carry none)
        sel = f'{{job_id="{gpu_job}"}}'
        res = series(job_series("gpuhpc_gpu_utilization_percent", sel), 2)
        assert len(res) == 2, res
        assert {r["metric"]["user"] for r in res} == {user} and {r["metric"]["node"] for r in res} == {node}
        assert sorted(int(r["metric"]["gpu"]) for r in res) == idx
        busy = series(f'({job_series("gpuhpc_gpu_utilization_percent", sel)}) > 50', 1)
        assert [int(r["metric"]["gpu"]) for r in busy] == [idx[0]]

        res = series(job_series("gpuhpc_gpu_memory_used_bytes", f'{{job_id="{mig_job}"}}'), 1)
        assert not query(f'gpuhpc_gpu_memory_used_bytes{{job_id="{mig_job}"}}')     # no job label on it
        assert len(res) == 1 and res[0]["metric"]["mig"] == "3g.40gb", res
        assert [int(r["metric"]["gpu"]) for r in res] == jobs[1][1]["mig-node1"]
        # recording rule: the job's mean utilisation
        # (the rule is evaluated on its own interval: wait until an evaluation has seen the busy GPU)
        series(f'gpuhpc:job_gpu_utilization_percent:avg{{job_id="{gpu_job}"}} > 1', 1, timeout=90)
        rec = series(f'gpuhpc:job_gpu_utilization_percent:avg{{job_id="{gpu_job}"}}', 1)
        assert rec and abs(float(rec[0]["value"][1]) - 46.5) < 0.01, rec
    finally:
        for job, per_node in jobs:
            client.cancel(job)
            for node, idx in per_node.items():
                _hook("epilog", node, job, user, idx)
        for n, text in saved.items():
            (STATE_DIR / f"{n}.json").write_text(text)


def _scontrol_gpus(client: SlurmClient, partition: str) -> tuple[dict[str, int], dict[str, int]]:
    total: dict[str, int] = {}
    alloc: dict[str, int] = {}
    for n in client.nodes():
        if partition in n.partitions:
            for t, k in n.gpus_total.items():
                total[t] = total.get(t, 0) + k
                alloc[t] = alloc.get(t, 0) + n.gpus_alloc.get(t, 0)
    return total, alloc


@pytest.mark.parametrize("partition", ["gpu", "mig"])
def test_partition_gpu_counts_match_scontrol(partition):
    client = SlurmClient()
    seen: dict[str, dict] = {}

    def agreed() -> bool:          # other tests start and end jobs: compare one quiet moment
        total, alloc = _scontrol_gpus(client, partition)
        t0 = time.time()           # a scrape after this moment (the exporter asks Slurm when scraped)
        wait_for(lambda: (ts := query(f'timestamp(gpuhpc_slurm_partition_gpus{{partition="{partition}"}})'))
                 and min(float(r["value"][1]) for r in ts) > t0, 30,
                 f"a scrape of the {partition} partition's GPUs after reading scontrol", interval=0.5)
        res = query(f'gpuhpc_slurm_partition_gpus{{partition="{partition}"}}')
        prom_total: dict[str, float] = {}
        prom_alloc: dict[str, float] = {}
        for r in res:
            t = r["metric"]["type"]
            prom_total[t] = prom_total.get(t, 0) + float(r["value"][1])
            if r["metric"]["state"] == "alloc":
                prom_alloc[t] = float(r["value"][1])
        assert prom_total == {t: float(k) for t, k in total.items()}, (prom_total, total)
        seen.update(prometheus=prom_alloc, scontrol=alloc)
        return prom_alloc == {t: float(k) for t, k in alloc.items()} and _scontrol_gpus(client, partition)[1] == alloc

    wait_for(agreed, 40, lambda: f"the allocated GPUs to agree (last: {seen})", interval=0.1)


def test_every_dashboard_metric_is_in_prometheus():
    with urllib.request.urlopen(f"{PROM}/api/v1/label/__name__/values", timeout=10) as resp:
        names = set(json.load(resp)["data"])
    missing = set()
    for path in sorted(DASHBOARDS.glob("*.json")):
        for title, expr in dashboard_exprs(json.loads(path.read_text())):
            for name in metric_names(expr):
                if name not in names and name not in RECORDED:
                    missing.add((path.name, title, name))
    assert not missing, sorted(missing)
    assert RECORDED & names, "no recording rule has produced a series yet"


def test_promtool_accepts_the_rules_and_the_roles_scrape_config(tmp_path):
    """Debian's promtool checks the packaged rules and what the Ansible role renders."""
    import jinja2
    import yaml

    role = Path(__file__).resolve().parents[3] / "ansible" / "roles" / "gpuhpc_monitoring"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(role / "templates"), undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps
    variables = yaml.safe_load((role / "defaults" / "main.yml").read_text())
    variables.update(ansible_managed="test", groups={"all": ["ctl1", "gpu1"], "slurm_controller": ["ctl1"],
                                                     "slurm_compute": ["gpu1"]}, hostvars={"ctl1": {}, "gpu1": {}})
    (tmp_path / "rules.yml").write_text(env.get_template("gpuhpc-rules.yml.j2").render(**variables))
    (tmp_path / "prometheus.yml").write_text(env.get_template("prometheus.yml.j2").render(**variables))
    packaged = DASHBOARDS.parent / "prometheus" / "rules.yml"
    for argv in (["promtool", "check", "rules", str(packaged), str(tmp_path / "rules.yml")],
                 ["promtool", "check", "config", "--syntax-only", str(tmp_path / "prometheus.yml")]):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
