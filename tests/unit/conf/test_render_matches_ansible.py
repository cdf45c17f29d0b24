"""`gpuhpc conf render` and the gpuhpc_slurm_common role write byte-identical config files.

The role's own template tasks run (ansible/render-conf.yml, connection=local, no daemons) for
each example spec; the result must equal the Python renderer's output byte for byte.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES, REPO, SPECS


def _ansible_playbook() -> str:
    exe = Path(sys.executable).with_name("ansible-playbook")
    return str(exe) if exe.exists() else (shutil.which("ansible-playbook") or "ansible-playbook")


@pytest.mark.parametrize("spec_name", SPECS)
def test_ansible_role_renders_the_same_bytes(tmp_path, spec_name):
    spec_path = EXAMPLES / f"{spec_name}.yaml"
    dest = tmp_path / "ansible"
    dest.mkdir()
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [_ansible_playbook(), "-i", "localhost,", str(REPO / "ansible" / "render-conf.yml"),
         "-e", f"gpuhpc_slurm_common_spec={spec_path}", "-e", f"gpuhpc_slurm_common_dest_dir={dest}"],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]

    python_files, _ = render_spec(load_spec(spec_path))
    ansible_files = {p.name: p.read_bytes() for p in dest.iterdir()}
    for name in ("slurm.conf", "gres.conf", "topology.conf"):
        assert name in ansible_files, f"the role did not write {name}"
    for name, data in ansible_files.items():
        assert data == python_files[name].encode(), f"{spec_name}/{name}: ansible and gpuhpc conf render differ"
