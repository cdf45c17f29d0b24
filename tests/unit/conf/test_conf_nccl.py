"""NCCL/IB profiles per GPU node group (slurm-conf/nccl.env.j2) against tests/golden/nccl/;
a setting already in the environment wins over the profile.

Regenerate on purpose: GPUHPC_REGEN_GOLDEN=1 .venv/bin/pytest tests/unit/conf/test_conf_nccl.py
"""
from __future__ import annotations

import os
import subprocess

import pytest

from gpuhpc.conf.render import render_nccl_profiles
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES, REPO, SPECS

GOLDEN = REPO / "tests" / "golden" / "nccl"


@pytest.mark.parametrize("spec_name", SPECS)
def test_profiles_match_golden(spec_name):
    files = render_nccl_profiles(load_spec(EXAMPLES / f"{spec_name}.yaml"))
    d = GOLDEN / spec_name
    if os.environ.get("GPUHPC_REGEN_GOLDEN") == "1":
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        for name, text in files.items():
            (d / name).write_text(text)
    assert sorted(p.name for p in d.iterdir()) == sorted(files)
    for name, text in files.items():
        assert text == (d / name).read_text(), f"{spec_name}/{name}: GPUHPC_REGEN_GOLDEN=1 if intended"


def test_spec_settings_and_user_override(local_data, write_spec, tmp_path):
    local_data["node_groups"][0]["ib_hcas"] = ["mlx5_2", "mlx5_0"]
    local_data["nccl"] = {"ib_gid_index": 3, "socket_ifname": "^lo,docker", "env": {"NCCL_IB_TIMEOUT": "22"}}
    files = render_nccl_profiles(load_spec(write_spec(local_data)))
    profile = tmp_path / "nccl.env"
    profile.write_text(files[f"nccl-{local_data['node_groups'][0]['name']}.env"])
    out = subprocess.run(["bash", "-c", f'export NCCL_IB_GID_INDEX=0; . {profile}; '
                                        'echo "$NCCL_IB_HCA|$NCCL_IB_GID_INDEX|$NCCL_SOCKET_IFNAME|$NCCL_IB_TIMEOUT"'],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "=mlx5_2:1,mlx5_0:1|0|^lo,docker|22"           # rail order kept; the user's GID index wins


def test_bad_nccl_settings_are_rejected(local_data, write_spec):
    from gpuhpc.errors import SpecError

    local_data["nccl"] = {"env": {"LD_PRELOAD": "/x.so"}}
    with pytest.raises(SpecError):
        load_spec(write_spec(local_data))
    local_data["nccl"] = {"socket_ifname": "eth0; rm -rf /"}
    with pytest.raises(SpecError):
        load_spec(write_spec(local_data))
