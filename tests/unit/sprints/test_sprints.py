"""Sprint analysis on synthetic trial records, the sprint file's validation, the report."""
from decimal import Decimal

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sprints.analysis import TrialRecord, analyse, bottlenecks, cost_per_million, recommend, scaling
from gpuhpc.sprints.report import render_html, text_table
from gpuhpc.sprints.spec import from_mapping

RATE = Decimal("2.50")


def rec(trial, bs, gpn, nodes, placement, thr, util=None, cpu=None, rate=RATE, state="completed"):
    return TrialRecord({"batch_size": bs, "gpus_per_node": gpn, "nodes": nodes, "placement": placement},
                       state=state, throughput=thr, util_percent=util, cpu_percent=cpu, rate=rate, trial=trial)


def test_cost_per_million_samples():
    r = rec(0, 64, 4, 2, "one-leaf", 10_000.0)
    assert cost_per_million(r) == Decimal("0.5556")           # 2.50 x 8 GPUs / 36e6 samples per hour x 1e6
    assert cost_per_million(rec(1, 64, 1, 1, "one-leaf", None)) is None


def test_scaling_against_one_gpu_same_batch():
    recs = [rec(0, 64, 1, 1, "one-leaf", 1000.0), rec(1, 64, 4, 1, "one-leaf", 3000.0),
            rec(2, 128, 4, 1, "one-leaf", 3000.0)]
    assert scaling(recs) == {0: 1.0, 1: 0.75, 2: None}


def test_recommend_lowest_cost_then_throughput_and_unpriced():
    recs = [rec(0, 64, 1, 1, "one-leaf", 1000.0), rec(1, 64, 2, 1, "one-leaf", 2000.0),
            rec(2, 64, 2, 2, "spread", 2500.0, state="failed")]
    best, why = recommend(recs)
    assert best.trial == 1 and "lowest cost per million" in why        # same $/M, higher throughput
    best, why = recommend([rec(0, 64, 1, 1, "one-leaf", 1000.0, rate=None),
                           rec(1, 64, 2, 1, "one-leaf", 1800.0, rate=None)])
    assert best.trial == 0 and "no price" in why
    assert recommend([rec(0, 64, 1, 1, "one-leaf", None)])[0] is None


def test_bottleneck_guesses():
    recs = [rec(0, 64, 1, 2, "one-leaf", 4000.0, util=40), rec(1, 64, 1, 2, "spread", 2000.0, util=20),
            rec(2, 64, 1, 1, "one-leaf", 2000.0, util=30), rec(3, 256, 1, 1, "one-leaf", 2050.0, util=25),
            rec(4, 256, 4, 1, "one-leaf", 4000.0, util=20, cpu=95), rec(5, 512, 1, 1, "one-leaf", 5000.0, util=90)]
    got = {b["trial"]: b["bottleneck"] for b in bottlenecks(recs)}
    assert got == {1: "communication", 3: "input", 4: "CPU"}


def test_analyse_table_and_html():
    recs = [rec(0, 64, 1, 1, "one-leaf", 1000.0, util=50), rec(1, 64, 1, 2, "spread", 1200.0, util=20)]
    res = analyse("t", "samples_per_s", recs)
    assert res.best["trial"] == 0 and res.rows[1]["scaling_efficiency"] == 0.6
    assert "recommended: trial 0" in text_table(res)
    page = render_html(res)
    assert page.count("<svg") == 2 and 'id="sprint-table"' in page and "<script" not in page


def _file(**over):
    data = {"name": "t", "command": "python x.py --bs {batch_size} --p {placement}",
            "axes": {"batch_size": [32, 64], "placement": ["one-leaf", "spread"]},
            "resources": {"partition": "cpu", "time": "1m"}}
    data.update(over)
    return data


def test_sprint_file_becomes_a_grid_sweep():
    spec = from_mapping(_file())
    assert len(spec.configurations()) == 4
    m = spec.sweep_mapping()
    assert m["method"] == "grid" and set(m["parameters"]) == {"batch_size", "placement"}
    assert m["metric"] == {"name": "samples_per_s", "goal": "maximize"}


@pytest.mark.parametrize("over, field", [
    ({"axes": {"batch_size": [0]}}, "axes.batch_size"),
    ({"axes": {"placement": ["one-leaf", "nowhere"]}}, "axes.placement[1]"),
    ({"axes": {"nodes": [1, 2]}, "request": False}, "axes.nodes"),   # no {nodes} in the command
    ({"axes": {"batch_size": [1, 2]}, "command": "x"}, "axes.batch_size"),
    ({"template": "slurm"}, "template"),
    ({"budget": {"trials": 2}}, "budget.trials"),
    ({"budget": {"gpu_hours": 0.01}}, "budget.gpu_hours"),
    ({"colour": "red"}, "colour"),
    ({"name": "bad name"}, "name"),
])
def test_bad_sprint_file_names_the_field(over, field):
    with pytest.raises(UserInputError) as exc:
        from_mapping(_file(**over))
    assert exc.value.exit_code == 2 and exc.value.field == field
