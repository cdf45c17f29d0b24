"""enroot and pyxis build from the pinned source archives of the mirror in $GPUHPC_VENDOR_DIR
(CI points it at the offline mirror) and install into a prefix; a second run does nothing. The
stamp names what was built (versions, the sources' pinned tree digests, the installed Slurm's
version), and a build for another Slurm (one upgraded since) is rebuilt."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-containers.sh"
pytestmark = [pytest.mark.integration, pytest.mark.isolated]     # no shared cluster


def test_build_from_the_mirror_into_a_prefix(tmp_path):
    assert os.environ.get("GPUHPC_VENDOR_DIR"), "set GPUHPC_VENDOR_DIR to the source mirror (docs/containers.md)"
    prefix = tmp_path / "prefix"
    res = subprocess.run(["bash", str(SCRIPT), "--prefix", str(prefix)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert "from the mirror" in res.stderr and "sha256 checked" in res.stderr
    version = subprocess.run([str(prefix / "bin" / "enroot"), "version"], capture_output=True, text=True)
    assert version.stdout.strip() == "4.1.2"
    plugin = prefix / "lib" / "slurm" / "spank_pyxis.so"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(plugin)], capture_output=True, text=True).stdout
    assert "slurm_spank_init" in symbols
    assert (prefix / "share" / "pyxis" / "pyxis.conf").read_text() == f"required {plugin}\n"
    if os.geteuid() == 0:       # make setcap: image import as an ordinary user
        caps = subprocess.run(["getcap", str(prefix / "bin" / "enroot-mksquashovlfs")], capture_output=True, text=True)
        assert "cap_sys_admin" in caps.stdout
    again = subprocess.run(["bash", str(SCRIPT), "--prefix", str(prefix)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "already in" in again.stderr

    # the stamp: this source's pinned tree digests and the Slurm installed here
    source = (SCRIPT.parent.parent / "ansible/roles/gpuhpc_containers/files/build-containers.sh").read_text()
    pinned = re.findall(r'^  "(\w+) \S+ [0-9a-f]{64} ([0-9a-f]{64}) ', source, re.MULTILINE)
    trees = " ".join(f"{name}:{tree}" for name, tree in pinned)
    slurm = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "slurmd"], capture_output=True, text=True).stdout
    assert trees.count(":") == 2 and slurm, (trees, slurm)
    stamp = prefix / "share" / "gpuhpc" / "containers.stamp"
    built = stamp.read_text()
    assert f" trees {trees} slurm {slurm} " in built, built
    # built for an older Slurm (the one before an upgrade): pyxis is rebuilt, the stamp names this one
    stamp.write_text(built.replace(f" slurm {slurm} ", " slurm 21.08.8-2 "))
    rebuilt = subprocess.run(["bash", str(SCRIPT), "--prefix", str(prefix)], capture_output=True, text=True,
                             timeout=300)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "already in" not in rebuilt.stderr and "pyxis 0.24.0 installed" in rebuilt.stderr
    assert stamp.read_text() == built
