"""ansible-lint (production profile, offline) passes on ansible/, the way CI runs it:
    cd ansible && ansible-lint --offline --profile production
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import REPO


def test_ansible_lint_production_profile(tmp_path):
    exe = Path(sys.executable).with_name("ansible-lint")
    lint = str(exe) if exe.exists() else shutil.which("ansible-lint")
    assert lint, "ansible-lint is not installed (pip install -e '.[ansible]')"
    env = {**os.environ, "ANSIBLE_LOCAL_TEMP": str(tmp_path), "NO_COLOR": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run([lint, "--offline", "--profile", "production"], cwd=REPO / "ansible",
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
