"""`gpuhpc sprint examples/sprints/toy.yaml` on the local cluster: 16 configurations run as a
sweep, each its own Slurm request (GPUs per node, nodes, one leaf or spread: the toy reports the
shape it got), the best $/throughput is found, and the HTML report renders its table and charts
in headless Chromium."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "examples" / "sprints"))


@pytest.fixture
def sprint_env(tmp_path, monkeypatch) -> dict:
    from ledger_helpers import private_data_dir

    private_data_dir(tmp_path, monkeypatch, "GPUHPC_LOG_DIR", "GPUHPC_CHECKPOINT_ROOT", "GPUHPC_DB_URL",
                     "GPUHPC_SWEEP_ROOT")
    return dict(os.environ)


def _cancel_sweep(sid: int) -> None:
    from gpuhpc.sweeps import engine

    try:
        engine.cancel(sid)
    except Exception:
        pass


def test_toy_sprint_finds_best_cost_per_throughput_and_renders(sprint_env, tmp_path):
    from toy_train import model

    from gpuhpc.sprints.spec import load_file

    spec = load_file(str(REPO / "examples" / "sprints" / "toy.yaml"))
    configs = spec.configurations()
    assert len(configs) >= 12
    page = tmp_path / "sprint.html"
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "sprint", "examples/sprints/toy.yaml", "--json",
                           "--html", str(page), "--timeout", "240"],
                          cwd=REPO, env=sprint_env, capture_output=True, text=True, timeout=300)
    try:
        assert proc.returncode == 0, proc.stderr
        res = json.loads(proc.stdout)
    finally:
        sid = next((json.loads(proc.stdout).get("sweep_id") for _ in [0] if proc.stdout.startswith("{")), None)
        if sid:
            _cancel_sweep(sid)
    rows = res["rows"]
    assert len(rows) == len(configs) and all(r["state"] == "completed" for r in rows)
    # every configuration was its own request: the shape each trial's job really had
    from gpuhpc.sweeps import engine

    seen = {t["trial"]: t["metrics"] for t in engine.trial_rows(res["sweep_id"])}
    for r in rows:
        got = seen[r["trial"]]
        assert (got["alloc_nodes"], got["alloc_gpus_per_node"]) == (r["nodes"], r["gpus_per_node"]), (r, got)
        assert got["alloc_leaves"] == (2 if r["nodes"] == 2 and r["placement"] == "spread" else 1), (r, got)
    # the toy's model, priced: the configuration the sprint must recommend
    expected = min(rows, key=lambda r: (r["gpus"] / model(r["batch_size"], r["gpus_per_node"], r["nodes"],
                                                          r["placement"])[0],
                                        -model(r["batch_size"], r["gpus_per_node"], r["nodes"], r["placement"])[0],
                                        r["trial"]))["trial"]
    assert res["recommended"]["trial"] == expected
    assert all(r["usd_per_million"] and r["gpu_util_percent"] is not None for r in rows)
    assert {b["bottleneck"] for b in res["bottlenecks"]} >= {"communication", "input"}

    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert 'id="sprint-table"' in dom and dom.count("<tr") == len(configs) + 1
    assert dom.count("<svg") == 3 and "Recommended:" in dom
