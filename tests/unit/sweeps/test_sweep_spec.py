"""Sweep files: validation (exit 2 with the field path), trials, command quoting."""
from __future__ import annotations

import subprocess

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps.spec import SweepSpec, load_file, placeholders, render_command

BASE = {
    "name": "lr-search",
    "command": "python train.py --lr {lr} --layers {layers} --opt {opt}",
    "parameters": {"lr": {"type": "loguniform", "low": 1e-5, "high": 1e-1},
                   "layers": {"type": "int", "low": 2, "high": 12},
                   "opt": {"values": ["adam", "sgd", "lion; rm -rf ~"]}},
    "method": "random", "seed": 7, "trials": 200, "parallelism": 16,
    "resources": {"gpus": 1, "gpu_type": "1g.10gb", "partition": "mig", "time": "30m"},
    "metric": {"name": "loss", "goal": "minimize"}, "max_requeues": 5,
}


def _with(**changes):
    data = {**BASE, **changes}
    return data


def _param(name, **p):
    return _with(parameters={**BASE["parameters"], name: p})


@pytest.mark.parametrize("data, field", [
    (_param("lr", type="uniform", low=1.0, high=1.0), "parameters.lr.high"),          # empty range
    (_param("lr", type="uniform", low=2.0, high=1.0), "parameters.lr.low"),           # low > high
    (_param("lr", type="loguniform", low=0.0, high=1.0), "parameters.lr.low"),
    (_param("layers", type="int", low=1.5, high=3), "parameters.layers.low"),
    (_param("opt", values=[]), "parameters.opt.values"),
    (_param("lr", type="uniform", high=1.0), "parameters.lr.low"),
    (_param("lr", low=0.1, high=1.0), "parameters.lr.type"),
    (_param("lr", type="gaussian", low=0.1, high=1.0), "parameters.lr.type"),
    (_with(method="bayes"), "method"),                                                # unknown method
    (_with(parallelism=-1), "parallelism"),                                           # negative parallelism
    (_with(parallelism=0), "parallelism"),
    (_with(trials=0), "trials"),
    (_with(method="grid", trials=None), "parameters.lr.values"),                     # grid without values
    (_with(command="python train.py --lr {lr} --wd {wd}"), "command"),                # placeholder w/o param
    (_with(command="python train.py {lr!r}"), "command"),
    (_with(command="echo 'a\nb' {lr}"), "command"),
    (_with(name="bad name"), "name"),
    (_with(metric={"name": "loss", "goal": "lowest"}), "metric.goal"),
    (_with(metric={"name": "my loss"}), "metric.name"),
    (_with(resources={"gpus": 1, "gpu_type": "h100", "colour": "red"}), "resources.colour"),
    (_with(resources={"time": "forever"}), "resources.time"),
    (_with(resources={"array": "0-3"}), "resources.array"),
    (_with(nonsense=1), "nonsense"),
    (_with(trials=None), "trials"),
    (_with(max_requeues=-2), "max_requeues"),
    (_with(chunk_size=0), "chunk_size"),
])
def test_bad_files_name_the_field(data, field):
    with pytest.raises(UserInputError) as exc:
        SweepSpec.from_mapping(data)
    assert exc.value.exit_code == 2
    assert exc.value.field == field, exc.value.message


def test_tpe_without_optuna_is_one_line_exit_2(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "optuna", None)     # as if not installed
    with pytest.raises(UserInputError) as exc:
        SweepSpec.from_mapping(_with(method="tpe"))
    assert exc.value.field == "method" and "optuna" in exc.value.one_line().lower()


def test_valid_file_and_frozen(tmp_path):
    f = tmp_path / "s.yaml"
    import yaml

    f.write_text(yaml.safe_dump(BASE))
    spec = load_file(str(f))
    assert spec.n_trials == 200 and spec.res.gpus == 1 and spec.res.partition == "mig"
    with pytest.raises(Exception):
        spec.trials = 3          # frozen


def test_unreadable_file_is_exit_2(tmp_path):
    with pytest.raises(UserInputError):
        load_file(str(tmp_path / "missing.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(UserInputError):
        load_file(str(bad))


def test_random_is_seeded_and_in_range():
    spec = SweepSpec.from_mapping(BASE)
    a, b = spec.generate(), spec.generate()
    assert a == b and len(a) == 200
    assert spec.generate(10, 5) == a[10:15]                  # trial i does not depend on the others
    assert all(1e-5 <= t["lr"] <= 1e-1 and 2 <= t["layers"] <= 12 and t["opt"] in BASE["parameters"]["opt"]["values"]
               for t in a)
    other = SweepSpec.from_mapping(_with(seed=8)).generate()
    assert other != a


def test_grid_is_the_product_in_order():
    spec = SweepSpec.from_mapping(_with(method="grid", trials=None, command="run {a} {b}",
                                        parameters={"a": {"values": [1, 2]}, "b": {"type": "int", "low": 0, "high": 2}}))
    assert spec.n_trials == 6
    assert spec.generate() == [{"a": 1, "b": 0}, {"a": 1, "b": 1}, {"a": 1, "b": 2},
                               {"a": 2, "b": 0}, {"a": 2, "b": 1}, {"a": 2, "b": 2}]
    with pytest.raises(UserInputError) as exc:
        SweepSpec.from_mapping(_with(method="grid", trials=7, command="run {a}", parameters={"a": {"values": [1]}}))
    assert exc.value.field == "trials"


def test_placeholders_and_literal_braces():
    assert placeholders("echo {a} {{not}} {b}") == ["a", "b"]
    assert render_command("echo {{x}} {a}", {"a": "1"}) == "echo {x} 1"


@pytest.mark.parametrize("value", ["lion; rm -rf ~", "$(touch /tmp/gpuhpc-pwned)", "`id`", "a\nb", "it's",
                                   '"dq"', "  spaces  ", "", "-n", "*", "\\", "é ✓"])
def test_hostile_values_arrive_literally(value, tmp_path):
    out = subprocess.run(["bash", "-c", render_command("printf '%s' {v}", {"v": value})],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out == value
    assert list(tmp_path.iterdir()) == []


def test_float_values_round_trip():
    assert render_command("{x}", {"x": 0.1 + 0.2}) == "0.30000000000000004"
    assert render_command("{x}", {"x": True}) == "true"


def test_yaml_exponent_without_a_dot_is_a_number(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: a\ncommand: run {lr}\nparameters:\n  lr: {type: loguniform, low: 1e-5, high: 1e-1}\n"
                 "trials: 2\nmetric: {name: loss}\n")
    assert load_file(str(f)).parameters["lr"].low == 1e-5


def test_spec_round_trips_through_json():
    from gpuhpc.sweeps.spec import spec_from_json, spec_json

    spec = SweepSpec.from_mapping(BASE)
    assert spec_from_json(spec_json(spec)) == spec
