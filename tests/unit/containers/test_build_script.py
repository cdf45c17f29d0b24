"""scripts/build-containers.sh refuses a mirror archive whose sha256 is not the pinned one,
before it installs a package or builds anything (the build itself: tests/integration/containers)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "build-containers.sh"


def test_a_tampered_mirror_archive_is_refused(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "enroot-4.1.2.tar.gz").write_bytes(b"not enroot")
    prefix = tmp_path / "prefix"
    res = subprocess.run(["bash", str(SCRIPT), "--prefix", str(prefix), "--no-setcap"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "GPUHPC_VENDOR_DIR": str(mirror)})
    assert res.returncode == 1
    assert "enroot-4.1.2.tar.gz: sha256 " in res.stderr and "expected 817e8d55" in res.stderr
    assert not prefix.exists()


def test_bad_options_exit_2(tmp_path):
    for argv in (["--prefix", "relative"], ["--bogus"]):
        res = subprocess.run(["bash", str(SCRIPT), *argv], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2, res.stderr
