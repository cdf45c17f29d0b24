"""gpuhpc_login installs the gpuhpc version the collection was built with."""
from __future__ import annotations

import tomllib

import yaml

from .conftest import REPO


def test_login_installs_the_collections_own_version():
    defaults = yaml.safe_load((REPO / "ansible" / "roles" / "gpuhpc_login" / "defaults" / "main.yml").read_text())
    galaxy = yaml.safe_load((REPO / "ansible" / "galaxy.yml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert defaults["gpuhpc_login_version"] == galaxy["version"] == project["version"]
