"""Early stopping: the pruners' decisions on synthetic reports (median, ASHA, and, where Optuna
is installed, the same decisions as Optuna's own pruners), ``pruner:``/``fail_fast:`` in a sweep
file (exit 2 naming the field), the reports a pruner reads, and ``gpuhpc.should_prune``."""
from __future__ import annotations

import json
import sys

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps import pruners
from gpuhpc.sweeps.pruners import TrialHistory
from gpuhpc.sweeps.spec import SweepSpec

BASE = {"name": "p", "command": "python train.py --lr {lr}", "parameters": {"lr": {"values": [0.1, 0.01]}},
        "method": "grid", "resources": {"partition": "cpu", "time": "10m"}, "metric": {"name": "loss"}}


def curve(number: int, state: str, values: list[float], t0: float = 0.0, dt: float = 1.0) -> TrialHistory:
    return TrialHistory(number, state, [(s, v, t0 + s * dt) for s, v in enumerate(values)])


# ---------------------------------------------------------------- median
def good(n: int) -> TrialHistory:
    return curve(n, "completed", [1.0 - 0.05 * s - 0.01 * n for s in range(10)])


MEDIAN = {"type": "median", "warmup_steps": 2, "min_trials": 5}


def test_median_prunes_a_trial_worse_than_the_completed_median_after_warmup():
    done = [good(n) for n in range(5)]
    bad = curve(10, "running", [2.0, 1.9, 1.8, 1.7])           # at step 3: best 1.7 > median ~0.83
    fine = curve(11, "running", [0.9, 0.8, 0.7, 0.6])          # best 0.6 < median
    got = pruners.decide(MEDIAN, "minimize", [*done, bad, fine], [10, 11])
    assert list(got) == [10] and "median" in got[10]


def test_median_waits_for_warmup_and_for_min_trials_completed():
    done = [good(n) for n in range(5)]
    early = curve(10, "running", [2.0, 1.9])                     # step 1 < warmup_steps 2
    assert pruners.decide(MEDIAN, "minimize", [*done, early], [10]) == {}
    bad = curve(10, "running", [2.0, 1.9, 1.8, 1.7])
    assert pruners.decide({**MEDIAN, "min_trials": 6}, "minimize", [*done, bad], [10]) == {}
    # only completed trials count: running ones are no reference
    running = [TrialHistory(t.number, "running", t.reports) for t in done]
    assert pruners.decide(MEDIAN, "minimize", [*running, bad], [10]) == {}


def test_median_maximize_prunes_the_low_ones_and_only_candidates():
    done = [curve(n, "completed", [0.5 + 0.05 * s for s in range(10)]) for n in range(5)]
    low = curve(10, "running", [0.1, 0.1, 0.2, 0.2])
    high = curve(11, "running", [0.6, 0.7, 0.8, 0.9])
    assert list(pruners.decide(MEDIAN, "maximize", [*done, low, high], [10, 11])) == [10]
    assert pruners.decide(MEDIAN, "maximize", [*done, low, high], [11]) == {}


# ---------------------------------------------------------------- ASHA
ASHA = {"type": "asha", "min_resource": 1, "reduction_factor": 2, "min_early_stopping_rate": 0}


def test_asha_promotes_the_best_half_at_each_rung_as_the_values_arrive():
    # rung 0 is step 1; arrival order A (1.0), B (2.0), C (0.5), D (1.5)
    a = TrialHistory(0, "running", [(0, 9, 0.0), (1, 1.0, 1.0)])
    b = TrialHistory(1, "running", [(0, 9, 0.0), (1, 2.0, 2.0)])
    c = TrialHistory(2, "running", [(0, 9, 0.0), (1, 0.5, 3.0)])
    d = TrialHistory(3, "running", [(0, 9, 0.0), (1, 1.5, 4.0)])
    got = pruners.decide(ASHA, "minimize", [a, b, c, d], [0, 1, 2, 3])
    # A: alone, goes on; B: [1, 2], not the best; C: [0.5, 1, 2], the best; D: [.5, 1, 1.5, 2], not in the best 2
    assert sorted(got) == [1, 3] and "rung 0" in got[1]
    # asynchronous: B arriving first (alone at the rung) would have gone on
    b_first = TrialHistory(1, "running", [(0, 9, 0.0), (1, 2.0, 0.5)])
    assert sorted(pruners.decide(ASHA, "minimize", [a, b_first, c, d], [0, 1, 2, 3])) == [3]


def test_asha_next_rung_competes_only_among_the_promoted_and_before_the_rung_nothing():
    # rung 1 is step 2: A and C went on at rung 0; B (pruned there) never competes at rung 1
    a = TrialHistory(0, "running", [(1, 1.0, 1.0), (2, 0.9, 5.0)])
    b = TrialHistory(1, "pruned", [(1, 2.0, 2.0), (2, 0.1, 3.0)])
    c = TrialHistory(2, "running", [(1, 0.5, 3.0), (2, 0.95, 6.0)])
    got = pruners.decide(ASHA, "minimize", [a, b, c], [0, 2])
    assert list(got) == [2] and "rung 1" in got[2]
    young = TrialHistory(5, "running", [(0, 100.0, 9.0)])        # below the first rung
    assert pruners.decide(ASHA, "minimize", [a, b, c, young], [5]) == {}


# ---------------------------------------------------------------- against Optuna's own pruners
def _optuna_replay(pruner, goal, trials):
    """Optuna's decisions when each report is told in time order and the pruner asked at once."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction=goal, pruner=pruner)
    events = sorted([(ts, 0, t.number, s, v) for t in trials for s, v, ts in t.reports]
                    + [(t.reports[-1][2] + 0.5, 1, t.number, None, t.reports[-1][1]) for t in trials
                       if t.state == "completed"])
    live, out = {}, set()
    for _, kind, n, s, v in events:
        if n in out:
            continue
        if kind == 1:
            study.tell(live.pop(n), v)
            continue
        ot = live.setdefault(n, study.ask())
        ot.report(v, s)
        if ot.should_prune():
            study.tell(live.pop(n), state=optuna.trial.TrialState.PRUNED)
            out.add(n)
    return out


def test_asha_decides_as_optunas_successive_halving_pruner():
    import optuna                 # a test dependency (pyproject: test): missing, the test must fail
    import random

    rng = random.Random(3)
    trials = []
    for n in range(24):          # staggered starts: each trial reports 9 steps, a second apart
        level = rng.uniform(0.0, 1.0)
        trials.append(TrialHistory(n, "running", [(s, level + rng.uniform(0, 0.2) / (s + 1), n * 2.3 + s)
                                                  for s in range(9)]))
    ours = pruners.decide({**ASHA, "reduction_factor": 3}, "minimize", trials, range(24))
    theirs = _optuna_replay(optuna.pruners.SuccessiveHalvingPruner(min_resource=1, reduction_factor=3), "minimize",
                            trials)
    assert set(ours) == theirs and theirs


def test_median_decides_as_optunas_median_pruner_at_the_last_step():
    import optuna                 # a test dependency (pyproject: test): missing, the test must fail
    done = [curve(n, "completed", [1.0 - 0.05 * s - 0.01 * n for s in range(10)]) for n in range(6)]
    running = [curve(10 + k, "running", [0.7 + 0.1 * k - 0.01 * s for s in range(4)], t0=100.0) for k in range(6)]
    ours = pruners.decide(MEDIAN, "minimize", [*done, *running], [t.number for t in running])
    theirs = _optuna_replay(optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=2), "minimize",
                            [*done, *running])
    assert set(ours) == theirs and 0 < len(theirs) < 6


# ---------------------------------------------------------------- the sweep file
@pytest.mark.parametrize("pruner, field", [
    ("annealing", "pruner.type"),
    ({"type": "median", "warmup": 3}, "pruner.warmup"),
    ({"type": "median", "warmup_steps": -1}, "pruner.warmup_steps"),
    ({"type": "median", "min_trials": "five"}, "pruner.min_trials"),
    ({"type": "asha", "reduction_factor": 1}, "pruner.reduction_factor"),
    ({"type": "successive_halving", "min_resource": 0.5}, "pruner.min_resource"),
    ({"type": "hyperband"}, "pruner.max_resource"),
    ({"type": "median", "grace": True}, "pruner.grace"),
    ({"warmup_steps": 3}, "pruner.type"),
    (["median"], "pruner"),
])
def test_bad_pruner_names_the_field(pruner, field):
    with pytest.raises(UserInputError) as exc:
        SweepSpec.from_mapping({**BASE, "pruner": pruner})
    assert exc.value.exit_code == 2 and exc.value.field == field, exc.value.message


@pytest.mark.parametrize("value", [0, -3, "many", 1.5])
def test_bad_fail_fast_names_the_field(value):
    with pytest.raises(UserInputError) as exc:
        SweepSpec.from_mapping({**BASE, "fail_fast": value})
    assert exc.value.exit_code == 2 and exc.value.field == "fail_fast"


def test_hyperband_without_optuna_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)       # as if not installed
    with pytest.raises(UserInputError) as exc:
        SweepSpec.from_mapping({**BASE, "pruner": {"type": "hyperband", "max_resource": 9}})
    line = exc.value.one_line()
    assert exc.value.field == "pruner.type" and "pip install optuna" in line and "\n" not in line


def test_pruner_defaults_round_trip_and_none():
    from gpuhpc.sweeps.spec import spec_from_json, spec_json

    spec = SweepSpec.from_mapping({**BASE, "pruner": "successive_halving", "fail_fast": 3})
    assert spec.pruner == {"type": "asha", "min_resource": 1, "reduction_factor": 4, "min_early_stopping_rate": 0,
                           "grace": 30} and spec.fail_fast == 3
    back = spec_from_json(spec_json(spec))
    assert back.pruner == spec.pruner and back.fail_fast == 3
    assert SweepSpec.from_mapping({**BASE, "pruner": "none"}).pruner is None
    assert SweepSpec.from_mapping(BASE).pruner is None


# ---------------------------------------------------------------- what the pruner reads, what the trial sees
def test_history_reads_the_metric_per_step_first_report_wins(tmp_path):
    from gpuhpc.sweeps.metrics import read_history

    f = tmp_path / "metrics.jsonl"
    lines = [{"ts": 1.0, "step": 0, "metrics": {"loss": 3.0}}, {"ts": 2.0, "step": 1, "metrics": {"acc": 0.5}},
             {"ts": 3.0, "step": 1, "metrics": {"loss": 2.0}}, {"ts": 4.0, "step": None, "metrics": {"loss": 1.5}}]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"ts": 5, "st')     # a torn last line
    assert read_history(f, "loss") == [(0, 3.0, 1.0), (1, 2.0, 3.0), (2, 1.5, 4.0)]
    with open(f, "a") as fh:                # read on from where it stopped; a resumed run repeats step 1
        fh.write('ep": 1, "metrics": {"loss": 9.0}}\n')
    h = TrialHistory(0, "running", read_history(f, "loss"))
    assert h.last_step == 1 and h.values()[1] == (2.0, 3.0)


def test_should_prune_reads_the_trials_mark(tmp_path, monkeypatch):
    import gpuhpc
    from gpuhpc.sweeps.trial import PRUNED

    monkeypatch.delenv("GPUHPC_TRIAL_DIR", raising=False)
    assert gpuhpc.should_prune() is False                   # outside a sweep trial
    monkeypatch.setenv("GPUHPC_TRIAL_DIR", str(tmp_path))
    assert gpuhpc.should_prune() is False
    (tmp_path / PRUNED).write_text("{}")
    assert gpuhpc.should_prune() is True


def test_hyperband_replays_the_reports_into_optunas_pruner():
    import optuna  # noqa: F401  (a test dependency: missing, the test must fail)
    cfg = pruners.parse({"type": "hyperband", "min_resource": 1, "max_resource": 9, "reduction_factor": 3})
    good = [curve(n, "completed", [1.0 - 0.05 * s for s in range(10)], t0=n * 0.1) for n in range(12)]
    bad = [curve(20 + n, "running", [5.0 + 0.01 * s for s in range(4)], t0=100 + n * 0.1) for n in range(12)]
    got = pruners.decide(cfg, "minimize", [*good, *bad], [t.number for t in [*good, *bad]])
    assert got and set(got) <= {t.number for t in bad} and all("hyperband" in why for why in got.values())
