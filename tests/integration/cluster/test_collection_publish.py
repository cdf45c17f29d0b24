"""The gpuhpc.cluster collection as a site gets it: `ansible-galaxy collection build` (through
scripts/cluster.sh build, which first copies slurm-conf/'s templates into the roles) gives a tarball
that `ansible-galaxy collection install` puts into a fresh collections path, and its playbooks run
from that installed copy, with no ansible.cfg and nothing of this checkout on Ansible's paths:

- site.yml passes --syntax-check against the lab's inventory (every role and play it imports is in
  the tarball; the lab itself runs site.yml from the collection the checkout installs);
- the elastic play (also site.yml's optional cloud-node play) runs in --check against a one-host
  scratch inventory with the example spec that has cloud pools.

The version is one and the changelog follows it: galaxy.yml's version names the tarball and the
installed MANIFEST.json, CHANGELOG.md's first section is that version, and it names every role.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, ansible_env, recap

pytestmark = [pytest.mark.integration, pytest.mark.isolated]


def _galaxy_version() -> str:
    return yaml.safe_load((REPO / "ansible" / "galaxy.yml").read_text())["version"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str], Path]:
    """(the installed collection's root, an environment that knows only that collections path, the tarball)."""
    tmp = tmp_path_factory.mktemp("publish")
    build = subprocess.run(["bash", "scripts/cluster.sh", "build"], cwd=REPO, env=ansible_env(),
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    built = Path(build.stdout.strip().splitlines()[-1])
    tarball = tmp / built.name                   # scripts/cluster.sh rebuilds the shared one at every install
    shutil.copy(built, tarball)
    env = {k: v for k, v in ansible_env(tmp).items() if k not in ("ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(tmp / "collections"), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false")
    galaxy = str(Path(sys.executable).with_name("ansible-galaxy"))
    proc = subprocess.run([galaxy, "collection", "install", str(tarball), "-p", str(tmp / "collections")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = tmp / "collections" / "ansible_collections" / "gpuhpc" / "cluster"
    assert (root / "MANIFEST.json").is_file(), proc.stdout
    return root, env, tarball


def _playbook(env: dict[str, str], cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_tarball_installs_and_site_yml_runs_from_the_installed_copy(installed):
    root, env, _ = installed
    proc = _playbook(env, root.parents[2], "-i", str(REPO / "ansible" / "inventories" / "lab" / "hosts.yml"),
                     "gpuhpc.cluster.site", "--syntax-check")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"playbook: {root}/playbooks/site.yml" in proc.stdout, proc.stdout
    for play in ("elastic.yml", "containers.yml", "upgrade.yml", "teardown.yml"):
        assert (root / "playbooks" / play).is_file(), play
    assert (root / "roles" / "gpuhpc_slurm_common" / "files" / "gpuhpc-slurmd-precheck").is_file()


def test_the_elastic_play_runs_in_check_mode_from_the_installed_copy(installed):
    root, env, _ = installed
    tmp = root.parents[3]
    inventory = tmp / "elastic-hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                "gpuhpc_slurm_common_spec": str(REPO / "examples" / "clusters" / "elastic.yaml"),
                                "gpuhpc_elastic_systemd_dir": str(tmp / "systemd")}},
        "children": {"slurm_controller": {"hosts": {"localhost": None}}}}}))
    proc = _playbook(env, tmp, "-i", str(inventory), "gpuhpc.cluster.elastic", "--check", "--diff")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert recap(proc)["failed"] == 0
    assert "+ExecStart=/opt/gpuhpc/venv/bin/gpuhpc power reconcile" in proc.stdout, proc.stdout[-4000:]
    for program in ("resume", "suspend", "resume-fail"):
        assert f"gpuhpc-power-{program}" in proc.stdout, program
    assert not (tmp / "systemd").exists()                 # check mode wrote nothing


def test_one_version_and_a_changelog_section_for_it(installed):
    root, _, tarball = installed
    version = _galaxy_version()
    assert tarball.name == f"gpuhpc-cluster-{version}.tar.gz"
    assert json.loads((root / "MANIFEST.json").read_text())["collection_info"]["version"] == version
    changelog = (REPO / "ansible" / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (\S+)$", changelog, re.M)
    assert sections and sections[0] == version, (sections, version)
    for role in sorted(p.name for p in (REPO / "ansible" / "roles").iterdir() if p.is_dir()):
        assert role in changelog, f"CHANGELOG.md never names {role}"
    assert (root / "CHANGELOG.md").read_text() == changelog       # shipped in the tarball
