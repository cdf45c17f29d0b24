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


def test_topology_hook_uses_the_fabric(tmp_path):
    """With gpuhpc_slurm_common_ibnetdiscover_file set, topology.conf is
    `gpuhpc topology from-ibnetdiscover FILE` output, not the spec's switches."""
    dump = tmp_path / "ibnetdiscover.out"
    synth = subprocess.run(
        [sys.executable, "-m", "gpuhpc", "topology", "synth", "--hosts", "dgx[001-032]", "--leaves", "4",
         "--hosts-per-leaf", "8", "--rails", "1", "-o", str(dump)],
        capture_output=True, text=True, timeout=120)
    assert synth.returncode == 0, synth.stderr
    dest = tmp_path / "ansible"
    dest.mkdir()
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / ".ansible-tmp"), "ANSIBLE_NOCOLOR": "1"}
    proc = subprocess.run(
        [_ansible_playbook(), "-i", "localhost,", str(REPO / "ansible" / "render-conf.yml"),
         "-e", f"gpuhpc_slurm_common_spec={EXAMPLES / 'dgx-h100-pod.yaml'}",
         "-e", f"gpuhpc_slurm_common_dest_dir={dest}", "-e", f"gpuhpc_slurm_common_ibnetdiscover_file={dump}"],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    topo = (dest / "topology.conf").read_text()
    assert str(dump) in topo, topo                      # written by the topology command ...
    assert "SwitchName=leaf1 " not in topo, topo        # ... not from the spec's switches
    listed = " ".join(line for line in topo.splitlines() if "Nodes=" in line)
    assert "dgx" in listed, topo
