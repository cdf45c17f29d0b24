"""The upgrade playbook's window check (issue 37.2): a release reads the state of the previous
three releases only, so 22.05 -> 24.11 is refused with one line naming the releases to go through,
a downgrade is refused, and every move within the window (across the 23.02/23.11 irregularity and
the .05/.11 cadence since) passes. The filter file is loaded directly (no Ansible import)."""
from __future__ import annotations

import importlib.util

import pytest

from .conftest import REPO

_spec = importlib.util.spec_from_file_location("gpuhpc_slurm_upgrade_filter",
                                               REPO / "ansible" / "plugins" / "filter" / "slurm_upgrade.py")
mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mod)
refusal = mod.slurm_upgrade_refusal


@pytest.mark.parametrize("installed, target", [
    ("slurm 22.05.8", "24.05.1-1"), ("slurm 22.05.8", "23.02.7-1"), ("23.02.1", "24.05.3"),
    ("slurm 24.11.5", "25.11.7-1+gpuhpc.6f531ec5394374ec"), ("24.11.5-4+deb13u1", "24.11.6-1"),
    ("slurm 25.05.1", "26.05.2"), ("", "24.11.5-4+deb13u1")])
def test_moves_within_the_window_run(installed, target):
    assert refusal(installed, target) == ""


def test_a_jump_past_three_releases_is_refused_naming_the_way():
    assert refusal("slurm 22.05.8", "24.11.5-4+deb13u1") == (
        "Slurm 22.05 -> 24.11 skips 3 releases: a release reads the state of the previous 3 only; "
        "upgrade to 23.02 or 23.11 or 24.05 first, then on")
    assert "upgrade to 25.05 or 25.11 or 26.05 first" in refusal("slurm 24.11.5", "26.11.1")


def test_a_downgrade_and_a_version_that_is_no_release_are_refused():
    assert refusal("slurm 25.11.7", "24.11.5-4+deb13u1").startswith("Slurm 25.11 -> 24.11 is a downgrade")
    assert refusal("slurm 24.11.5", "latest").startswith("gpuhpc_slurm_common_version='latest' names no Slurm release")
    assert refusal("slurm 24.11.5", "24.08.1").startswith("gpuhpc_slurm_common_version='24.08.1' names no Slurm")
