"""The gpuhpc.cluster collection's source (ansible/) keeps its promises; read only, nothing runs.

Its roles stand alone (no paths into the checkout or into each other), carry no test machinery,
document every public variable in meta/argument_specs.yml, and host key checking stays on.
The collection is built, installed and run in tests/integration/cluster/test_collection.py.
"""
from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from .conftest import REPO

ANSIBLE = REPO / "ansible"
ROLES = sorted(p for p in (ANSIBLE / "roles").iterdir() if p.is_dir())


def test_galaxy_version_is_the_package_version():
    galaxy = yaml.safe_load((ANSIBLE / "galaxy.yml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert (galaxy["namespace"], galaxy["name"]) == ("gpuhpc", "cluster")
    assert galaxy["version"] == project["version"]
    assert "inventories" in galaxy["build_ignore"]


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_role_stands_alone_and_has_no_test_machinery(role):
    for path in role.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text()
        for needle in ("role_path", "playbook_dir", "../", "mknod", "daemon.sh", "direct mode"):
            assert needle not in text, f"{path.relative_to(REPO)} mentions {needle!r}"


@pytest.mark.parametrize("role", ROLES, ids=[r.name for r in ROLES])
def test_every_public_variable_has_an_argument_spec(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    documented = set(specs["main"]["options"])
    prefix = f"{role.name}_"
    for name in defaults:
        assert name.startswith(prefix), f"{role.name}: {name} lacks the {prefix} prefix"
    entry_only = {n for spec in specs.values() for n in spec.get("options", {})} - documented
    missing = set(defaults) - documented - entry_only
    assert not missing, f"{role.name}: undocumented defaults {sorted(missing)}"
    for name, opt in specs["main"]["options"].items():
        if name in defaults and "default" in opt:
            assert opt["default"] == defaults[name], f"{role.name}: {name} default differs from defaults/main.yml"


def test_host_key_checking_is_not_turned_off_for_every_inventory():
    cfg = (ANSIBLE / "ansible.cfg").read_text()
    assert not re.search(r"^\s*host_key_checking\s*=", cfg, re.M), cfg
