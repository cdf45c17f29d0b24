"""``runtime.mpi_default`` (issue 39.6): the PMI a step gets without ``--mpi`` (slurm.conf's
``MpiDefault``), ``pmix`` where Slurm's mpi/pmix plugin and PMIx are on every node; Slurm's
``none`` when the spec says nothing. Anything else is refused naming the field."""
from __future__ import annotations

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.errors import UserInputError
from gpuhpc.spec.cluster import spec_from_data


def _mpi_default(data: dict) -> list[str]:
    files, _ = render_spec(spec_from_data(data), storage_pass="pw-12345678")
    return [line for line in files["slurm.conf"].splitlines() if line.startswith("MpiDefault")]


def test_mpi_default_is_none_unless_the_spec_names_one(local_data):
    local_data["runtime"].pop("mpi_default", None)
    assert _mpi_default(local_data) == ["MpiDefault=none"]


@pytest.mark.parametrize("value", ["pmix", "pmi2"])
def test_mpi_default_renders_the_spec_value(local_data, value):
    local_data["runtime"]["mpi_default"] = value
    assert _mpi_default(local_data) == [f"MpiDefault={value}"]


def test_an_unknown_mpi_default_is_refused_naming_the_field(local_data):
    local_data["runtime"]["mpi_default"] = "openmpi"
    with pytest.raises(UserInputError) as err:
        spec_from_data(local_data)
    assert "runtime.mpi_default" in str(err.value)
