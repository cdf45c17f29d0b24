"""Every panel of every dashboard, run against the local cluster's Prometheus: with its template
variables set to real values (those of a GPU job this module runs: its job id, its node, its
partition, each checked to be among what the variable's own query offers), each panel query must
return data. A panel that shows nothing on a cluster with a running GPU job is a broken panel.

The job holds 2 H100s on the `gpu` partition; the Prolog hook (run with slurmd's environment, as
in test_prometheus.py) maps them, so the job's GPU series, job_info, the recording rules and the
Slurm exporter's job series all exist while it runs."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from gpuhpc.monitoring.promql import dashboard_exprs
from gpuhpc.slurm.client import SlurmClient
from polling import wait_for

pytestmark = pytest.mark.integration

PROM = os.environ.get("GPUHPC_PROMETHEUS_URL", "http://127.0.0.1:9090")
JOBMAP_DIR = os.environ.get("GPUHPC_JOBMAP_DIR", "/var/tmp/gpuhpc-prometheus/jobmap")
DASHBOARDS = Path(__file__).resolve().parents[3] / "gpuhpc" / "monitoring" / "dashboards"
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$")


def query(expr: str) -> list[dict]:
    url = f"{PROM}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def _hook(kind: str, node: str, job: str, idx: list[int]) -> None:
    env = {**os.environ, "SLURMD_NODENAME": node, "SLURM_JOB_ID": job, "SLURM_JOB_USER": "root",
           "SLURM_JOB_GPUS": ",".join(map(str, idx)), "GPUHPC_JOBMAP_DIR": JOBMAP_DIR}
    subprocess.run([sys.executable, "-m", "gpuhpc.monitoring.jobmap", kind], env=env, check=True, timeout=30)


@pytest.fixture(scope="module")
def values(tmp_path_factory):
    """The template variables' values: a running 2-GPU job's id, node and partition."""
    tmp = tmp_path_factory.mktemp("dash")
    client = SlurmClient()
    job = client.submit_script("#!/bin/bash\nsleep 300\n", extra=[
        "--partition=gpu", "--nodes=1", "--gres=gpu:h100:2", "--time=6", "--job-name=gpuhpc-dashboards",
        f"--output={tmp}/%j.out"])
    idx: dict[str, list[int]] = {}
    try:
        wait_for(lambda: (rows := client.queue(job_ids=[job])) and rows[0].state.raw == "RUNNING", 120,
                 f"job {job} to run")
        idx = client.job_gpu_indexes(job)
        (node, gpus), = idx.items()
        _hook("prolog", node, job, gpus)
        yield {"job_id": job, "node": node, "partition": "gpu"}
    finally:
        client.cancel(job)
        for node, gpus in idx.items():
            _hook("epilog", node, job, gpus)


def _offered(var_query: str) -> set[str]:
    """What a `label_values(SELECTOR, LABEL)` variable offers (as Grafana asks: the series' label)."""
    m = _LABEL_VALUES.match(var_query.strip())
    assert m, f"not a label_values() variable: {var_query!r}"
    return {r["metric"].get(m.group(2), "") for r in query(m.group(1))}


@pytest.mark.parametrize("name", ["cluster", "partition", "node", "job"])
def test_every_panel_returns_data(name, values):
    d = json.loads((DASHBOARDS / f"{name}.json").read_text())
    variables = {v["name"]: (v["query"]["query"] if isinstance(v["query"], dict) else v["query"])
                 for v in d.get("templating", {}).get("list", []) if v.get("type") == "query"}
    assert set(variables) <= set(values), variables
    for var, var_query in variables.items():         # the value is one the variable's query offers
        wait_for(lambda: values[var] in _offered(var_query), 60,
                 lambda: f"${var} to offer {values[var]} (offers {sorted(_offered(var_query))})")
    panels = [(title, expr) for title, expr in dashboard_exprs(d) if not title.startswith("$")]
    assert panels

    def substituted(expr: str) -> str:
        for var in variables:
            expr = expr.replace(f"${var}", values[var])
        assert "$" not in expr, expr
        return expr

    def empty() -> list[str]:
        return [f"{title}: {substituted(expr)}" for title, expr in panels if not query(substituted(expr))]

    # series appear within a scrape, rate() after two, a recording rule after its next evaluation,
    # the job's sstat series after slurmd's first accounting sample
    wait_for(lambda: not empty(), 120, lambda: f"every {name} panel to return data (empty: {empty()})")
