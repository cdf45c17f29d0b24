"""Placeholders are one literal word in every quoting context, or refused (issue 21, point 9);
a grid cannot silently become huge."""
from __future__ import annotations

import subprocess

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps.spec import SweepSpec, quoting_contexts, render_command

HOSTILE = ["lion; touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a\nb; touch PWNED", "it's \"q\" | & >x", "-n",
           "*", "\\", "a'b\"c$d`e\\f", "$HOME", "${HOME}", "!!"]


@pytest.mark.parametrize("command, expect", [
    ("printf %s {v}", "{}"), ('printf %s "{v}"', "{}"), ("printf %s '{v}'", "{}"),
    ('printf %s "pre-{v}-post"', "pre-{}-post"), ("printf %s 'x{v}y'", "x{}y"),
    ("printf %s \"$(printf %s '{{')\"{v}", "{{{}"),
])
def test_a_value_arrives_literally_in_every_quoting_context(tmp_path, command, expect):
    for v in HOSTILE:
        out = subprocess.run(["bash", "-c", render_command(command, {"v": v})], capture_output=True, text=True,
                             cwd=tmp_path).stdout
        assert out == expect.replace("{}", v).replace("{{", "{"), (command, v)
    assert not (tmp_path / "PWNED").exists()


def test_contexts():
    cmd = 'a {x} "b {y}" \'{z}\' $(( {w} + 1 )) `echo {u}` "${{HOME}} {t}" "$(echo {s})"'
    assert quoting_contexts(cmd) == [("x", "plain"), ("y", "double"), ("z", "single"), ("w", "expansion"),
                                     ("u", "expansion"), ("t", "double"), ("s", "expansion")]


def _spec(**kw):
    base = dict(name="s", metric={"name": "loss"}, method="grid", command="run {opt}",
                parameters={"opt": {"values": ["a", "b"]}})
    return SweepSpec.from_mapping({**base, **kw})


def test_a_text_placeholder_inside_a_substitution_is_refused():
    with pytest.raises(UserInputError) as e:
        _spec(command="echo $(echo {opt})")
    assert e.value.field == "command" and "shell code" in e.value.message
    _spec(command="echo $(( {n} * 2 ))", parameters={"n": {"type": "int", "low": 1, "high": 3}})   # numbers: fine


def test_a_grid_past_max_trials_is_refused_unless_raised():
    big = {f"p{i}": {"type": "int", "low": 1, "high": 10} for i in range(5)}       # 100,000 points
    with pytest.raises(UserInputError) as e:
        _spec(command="run", parameters=big)
    assert e.value.field == "trials" and "100000" in e.value.message and "max_trials" in e.value.message
    assert _spec(command="run", parameters=big, max_trials=100_000).n_trials == 100_000
    assert _spec(command="run", parameters=big, trials=50).n_trials == 50
