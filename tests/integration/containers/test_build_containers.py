"""enroot and pyxis build from the pinned source archives of the mirror in $GPUHPC_VENDOR_DIR
(CI points it at the offline mirror) and install into a prefix; a second run does nothing."""
from __future__ import annotations

import os
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
