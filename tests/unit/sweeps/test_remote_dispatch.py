"""gpuhpc.sweep is gpuhpc.remote.sweeps.sweep: here it is gpuhpc.sweeps.api.sweep, with
cluster="NAME" a driver job on that cluster; what cannot go together is refused before anything runs."""
import pytest

import gpuhpc
from gpuhpc.errors import UserInputError
from gpuhpc.remote import sweeps as remote_sweeps


def objective(x):
    return x


def test_gpuhpc_sweep_is_the_remote_layers_dispatcher():
    assert gpuhpc.sweep is remote_sweeps.sweep


def test_a_wrong_keyword_is_a_type_error_before_anything_runs():
    with pytest.raises(TypeError, match="trails"):
        gpuhpc.sweep(objective, {"x": [1, 2]}, trails=3, cluster="lab")


def test_driver_options_need_a_cluster():
    with pytest.raises(UserInputError, match="cluster"):
        gpuhpc.sweep(objective, {"x": [1, 2]}, driver_resources={"time": "1h"})


@pytest.mark.parametrize("name", ["client", "url"])
def test_a_sweep_on_a_cluster_uses_the_clusters_own_client_and_ledger(name):
    with pytest.raises(UserInputError, match=name):
        gpuhpc.sweep(objective, {"x": [1, 2]}, cluster="lab", **{name: "x"})


def test_the_call_goes_where_cluster_says(monkeypatch):
    calls = []
    monkeypatch.setattr("gpuhpc.sweeps.api.sweep", lambda fn, space, **kw: calls.append(("here", kw)) or "S")
    monkeypatch.setattr(remote_sweeps, "sweep_on_cluster", lambda fn, space, **kw: calls.append(("there", kw)) or "R")
    assert gpuhpc.sweep(objective, {"x": [1]}, trials=1) == "S"
    assert gpuhpc.sweep(objective, {"x": [1]}, trials=1, cluster="lab", driver_env={"A": "1"}) == "R"
    assert calls == [("here", {"trials": 1}),
                     ("there", {"cluster": "lab", "driver_resources": None, "env": {"A": "1"},
                                "kwargs": {"trials": 1}})]
