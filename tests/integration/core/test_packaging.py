"""A wheel is self-contained: it carries job-templates/, slurm-conf/ (as gpuhpc/_data/) and the
command-server client's source, and gpuhpc run from the unpacked wheel, away from any checkout,
renders exactly what the checkout renders. (Builds with pip's build isolation: needs PyPI,
like the rest of CI's set-up; an integration test: it builds a wheel.)"""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

REPO = Path(__file__).resolve().parents[3]

RUN = "import sys; sys.path.insert(0, sys.argv.pop(1)); from gpuhpc.cli import entry; sys.exit(entry())"


def test_wheel_carries_templates_and_renders_like_the_checkout(tmp_path):
    src = tmp_path / "src"                  # build from a copy: pip builds in-tree (build/)
    for name in ("pyproject.toml", "setup.py", "README.md", "gpuhpc", "job-templates", "slurm-conf"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    dist = tmp_path / "dist"
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel = next(dist.glob("gpuhpc-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(tmp_path / "site")
    for name in ("job-templates/single.sbatch.j2", "job-templates/_base.sbatch.j2", "slurm-conf/slurm.conf.j2",
                 "slurm-conf/gres.conf.j2"):
        assert f"gpuhpc/_data/{name}" in names
    assert "gpuhpc/cmdserver/client.c" in names

    away = tmp_path / "elsewhere"
    away.mkdir()

    def both(*args: str) -> list[subprocess.CompletedProcess]:   # [wheel, checkout]
        out = []
        for path in (tmp_path / "site", REPO):
            out.append(subprocess.run([sys.executable, "-P", "-c", RUN, str(path), *args], cwd=away,
                                      capture_output=True, text=True, timeout=120,
                                      env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                           "GPUHPC_LEDGER": "off"}))
        return out

    probe = subprocess.run([sys.executable, "-P", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import gpuhpc;"
                            " print(gpuhpc.__file__)", str(tmp_path / "site")], capture_output=True, text=True)
    assert probe.stdout.startswith(str(tmp_path / "site"))

    wheel_run, repo_run = both("submit", "--gpus", "2", "--gpu-type", "h100", "--template", "torchrun",
                               "--dry-run", "--", "python", "train.py")
    assert wheel_run.returncode == 0, wheel_run.stderr
    assert wheel_run.stdout == repo_run.stdout

    spec = REPO / "examples" / "clusters" / "local.yaml"
    rendered = {}
    for label, path in (("wheel", tmp_path / "site"), ("checkout", REPO)):
        res = subprocess.run([sys.executable, "-P", "-c", RUN, str(path), "conf", "render", str(spec),
                              "--out", f"conf-{label}"], cwd=away, capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
        assert res.returncode == 0, res.stderr
        rendered[label] = {p.name: p.read_text() for p in (away / f"conf-{label}").iterdir()}
    assert set(rendered["wheel"]) == {"slurm.conf", "gres.conf", "cgroup.conf", "topology.conf", "slurmdbd.conf"}
    assert rendered["wheel"] == rendered["checkout"]
