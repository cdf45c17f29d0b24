"""Running the installed gpuhpc.cluster collection from tests (tests/ is on sys.path through its
conftest.py): the cluster tests and the multi-host lab tests share this."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ansible_env(tmp: Path | None = None) -> dict[str, str]:
    """The environment scripts/cluster.sh runs Ansible with: the installed collection, the venv's
    tools first, and the local cluster's /etc/slurm/slurm.conf (never an inherited SLURM_CONF)."""
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update({
        "ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".ansible" / "collections"),
        "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1",
        "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
    })
    if tmp is not None:
        env["ANSIBLE_LOCAL_TEMP"] = str(tmp / ".ansible-tmp")
    return env
