"""`gpuhpc sprint examples/sprints/toy.yaml` on the local cluster: 12 configurations run as a
sweep, each its own Slurm request (GPUs per node, nodes, one leaf or spread: the toy reports the
shape it got; sacct, the GPUs, nodes and leaves each trial's job was given, one array per shape),
the best $/throughput is found, and the HTML report renders its table and charts
in headless Chromium."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from polling import wait_for

from gpuhpc.hostlist import expand
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.topology.placement import leaf_nodes, placement

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "examples" / "sprints"))


@pytest.fixture
def sprint_env(tmp_path, monkeypatch) -> dict:
    from ledger_helpers import private_data_dir

    private_data_dir(tmp_path, monkeypatch, "GPUHPC_LOG_DIR", "GPUHPC_CHECKPOINT_ROOT", "GPUHPC_DB_URL",
                     "GPUHPC_SWEEP_ROOT")
    return dict(os.environ)


def _cancel_sweep(sid: int) -> None:
    from gpuhpc.sweeps import control

    try:
        control.cancel(sid)
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
    from gpuhpc.sweeps import store

    trials = {t["trial"]: t for t in store.trial_rows(res["sweep_id"])}
    for r in rows:
        got = trials[r["trial"]]["metrics"]
        assert (got["alloc_nodes"], got["alloc_gpus_per_node"]) == (r["nodes"], r["gpus_per_node"]), (r, got)
        assert got["alloc_leaves"] == (2 if r["nodes"] == 2 and r["placement"] == "spread" else 1), (r, got)
    # ... and Slurm's accounting says so: each trial's job got its configuration's nodes and GPUs
    # (AllocTRES), one array per shape (GPUs per node, nodes, placement)
    jobs = {r["trial"]: trials[r["trial"]]["job_id"] for r in rows}

    def alloc() -> dict | None:
        got = {a.job_id: a for a in SlurmClient().accounting(job_ids=jobs.values())}
        return got if all(j in got and got[j].alloc_tres.get("node") for j in jobs.values()) else None

    acct = wait_for(alloc, 30, "sacct AllocTRES of every trial's job")
    leaves = leaf_nodes(SlurmClient().topology())
    arrays: dict[str, set] = {}
    for r in rows:
        t = acct[jobs[r["trial"]]].alloc_tres
        assert (int(t["node"]), int(t.get("gres/gpu", 0))) == (r["nodes"], r["nodes"] * r["gpus_per_node"]), (r, t)
        spanned = len(placement(leaves, expand(acct[jobs[r["trial"]]].nodelist)).leaves)
        assert spanned == (2 if r["nodes"] == 2 and r["placement"] == "spread" else 1), (r, acct[jobs[r["trial"]]])
        arrays.setdefault(jobs[r["trial"]].split("_")[0], set()).add((r["gpus_per_node"], r["nodes"], r["placement"]
                                                                       if r["nodes"] > 1 else ""))
    assert all(len(shapes) == 1 for shapes in arrays.values()), arrays
    assert len(arrays) == len({(r["gpus_per_node"], r["nodes"], r["placement"] if r["nodes"] > 1 else "")
                               for r in rows})
    # the toy's model, priced: the configuration the sprint must recommend
    expected = min(rows, key=lambda r: (r["gpus"] / model(r["batch_size"], r["gpus_per_node"], r["nodes"],
                                                          r["placement"])[0],
                                        -model(r["batch_size"], r["gpus_per_node"], r["nodes"], r["placement"])[0],
                                        r["trial"]))["trial"]
    assert res["recommended"]["trial"] == expected
    assert all(r["usd_per_million"] and r["gpu_util_percent"] is not None for r in rows)
    assert {b["bottleneck"] for b in res["bottlenecks"]} >= {"communication", "input"}
    # the throughput leaves the toy's warm-up report (a fifth) out and shows the spread (issue 33.9)
    for r in rows:
        thr = model(r["batch_size"], r["gpus_per_node"], r["nodes"], r["placement"])[0]
        assert r["reports"] == 3 and r["throughput"] == pytest.approx(thr, rel=1e-6), r
        assert r["throughput_low"] == pytest.approx(0.98 * thr, rel=1e-4), r
        assert r["throughput_high"] == pytest.approx(1.02 * thr, rel=1e-4), r
    # the question users ask, on the same trials: the cheapest configuration that finishes 10^9
    # samples by a deadline the cheapest-per-sample one misses
    samples, rate = 10**9, res["recommended"]["rate_per_gpu_hour"]
    need = {r["trial"]: samples / r["throughput"] / 3600 for r in rows}
    shorter = sorted(h for h in set(need.values()) if h < need[res["recommended"]["trial"]])
    lo, hi = max(zip(shorter, shorter[1:] + [need[res["recommended"]["trial"]]]), key=lambda p: p[1] - p[0])
    minutes = int((lo + hi) / 2 * 60)
    fits = [r for r in rows if need[r["trial"]] <= minutes / 60]
    expected = min(fits, key=lambda r: (r["gpus"] * rate * need[r["trial"]], need[r["trial"]], r["trial"]))
    import yaml
    from decimal import Decimal

    from gpuhpc.sprints.run import collect
    from gpuhpc.sprints.spec import from_mapping

    data = yaml.safe_load((REPO / "examples" / "sprints" / "toy.yaml").read_text())
    goal = collect(from_mapping({**data, "goal": {"samples": samples, "deadline": f"{minutes}m"}}), res["sweep_id"],
                   Decimal(str(rate)), utilisation=False)
    assert goal.best["trial"] == expected["trial"] != res["recommended"]["trial"], goal.reason
    assert goal.reason.startswith(f"cheapest configuration that finishes 1,000,000,000 samples by {minutes}m"), goal.reason
    assert sum(1 for r in goal.rows if r["finishes_in_time"]) == len(fits)
    print(f"goal 10^9 samples in {minutes} min: trial {expected['trial']} ({goal.reason}); "
          f"without a goal: trial {res['recommended']['trial']}")

    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    assert 'id="sprint-table"' in dom and dom.count("<tr") == len(configs) + 1
    assert dom.count("<svg") == 3 and "Recommended:" in dom


def test_a_configuration_no_node_holds_exits_2_naming_the_axis_and_submits_nothing(sprint_env):
    """A GPUs-per-node value past the partition's largest node (checked against the real nodes):
    the one-line error (exit 2) names the axis and the fix, and no sweep is written (its row comes
    before any sbatch), so nothing is submitted. In process: the CLI's mapping of the error to one
    line and exit 2 is the same for every command (tests/unit/test_cli_errors.py)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.sprints.run import sprint
    from gpuhpc.sweeps import store

    with pytest.raises(UserInputError) as exc:
        sprint({"name": "too-many-gpus", "command": "echo {batch_size}",
                "axes": {"batch_size": [1, 2], "gpus_per_node": [1, 9]}, "resources": {"partition": "gpu", "time": "1m"}})
    line = exc.value.one_line()
    assert exc.value.exit_code == 2 and exc.value.field == "axes.gpus_per_node", line
    assert "9 GPUs per node requested" in line and "smaller axes.gpus_per_node values" in line
    with pytest.raises(UserInputError, match="no sweep"):
        store.sweep_info(1)
