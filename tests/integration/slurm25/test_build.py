"""Issue 37 point 1: the collection's gpuhpc_slurm_build role, run as scripts/slurm_build.sh runs it.

After the build (CI's stage runs it first: the first build is not a test's to wait for), a run of
the play builds nothing and reports ``changed=0``, and the installed package is the cached build's;
an archive whose sha256 is not the pinned one is refused with one line before anything is built.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "ansible/roles/gpuhpc_slurm_build/files/gpuhpc-slurm-build.sh"
PINNED = "fde046ae991d17cd27f53732b6f3544a2980ff6faadd2fde540c87783ad03bef"


def _mirror() -> Path:
    vendor = Path(os.environ.get("GPUHPC_VENDOR_DIR") or REPO.parent / "shared/vendor")
    archive = vendor / "slurm-25.11.7.tar.gz"
    if not archive.exists():
        msg = f"no source mirror ({archive}): set GPUHPC_VENDOR_DIR"
        if os.environ.get("GPUHPC_REQUIRE_SLURM25") == "1":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    return archive


def test_a_second_run_of_the_play_builds_nothing(slurm25_prefix):
    _mirror()
    res = subprocess.run(["bash", str(REPO / "scripts/slurm_build.sh")], capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    recap = re.search(r"localhost\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", res.stdout)
    assert recap and recap.group(1) == "0", res.stdout[-3000:]
    assert res.stdout.strip().splitlines()[-1].startswith(f"prefix={slurm25_prefix} ")
    version = subprocess.run([str(slurm25_prefix / "sbin/slurmctld"), "-V"], capture_output=True, text=True)
    assert version.stdout.strip() == "slurm 25.11.7"
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "gpuhpc-slurm-25.11"], capture_output=True,
                               text=True).stdout
    key = installed.rsplit("gpuhpc.", 1)[-1]
    cache = Path(os.environ.get("GPUHPC_SLURM_BUILD_CACHE") or Path.home() / ".cache/gpuhpc/slurm-build")
    assert (cache / key / "DONE").exists() and PINNED not in key


def test_an_archive_whose_digest_differs_is_refused(tmp_path):
    archive = _mirror()
    tampered = tmp_path / archive.name
    shutil.copyfile(archive, tampered)
    with tampered.open("ab") as fh:
        fh.write(b"\0")
    cache = tmp_path / "cache"
    res = subprocess.run(["bash", str(BUILD), "--archive", str(tampered), "--sha256", PINNED, "--version", "25.11.7",
                          "--cache", str(cache)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and f"pinned {PINNED}: refusing it" in res.stderr, res.stderr
    assert not cache.exists()                   # nothing built, nothing cached
