"""The sweeps read their GPUHPC_* settings through gpuhpc.config's registry (issue 40.14): typed,
blank means the default, a bad value is a UserInputError naming the variable."""
from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.sweeps import control, store


def test_the_driver_poll_through_the_registry(monkeypatch):
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "7.5")
    assert control.driver_poll_s() == 7.5
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", " ")
    assert control.driver_poll_s() == 10.0
    monkeypatch.setenv("GPUHPC_SWEEP_DRIVER_POLL", "soon")
    with pytest.raises(UserInputError) as e:
        control.driver_poll_s()
    assert e.value.field == "GPUHPC_SWEEP_DRIVER_POLL"


def test_the_sweep_root_from_its_variable_else_the_data_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_SWEEP_ROOT", str(tmp_path / "s"))
    assert store.sweep_root() == tmp_path / "s"
    monkeypatch.setenv("GPUHPC_SWEEP_ROOT", "")
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path / "d"))
    assert store.sweep_root() == (tmp_path / "d" / "sweeps").absolute()
