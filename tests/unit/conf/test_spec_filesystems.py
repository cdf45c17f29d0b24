"""The spec's filesystems, NVMe scratch drives and management networks: checked by `gpuhpc conf
validate` (exit 2, one line naming the field) and handed to the roles through `gpuhpc conf context`."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from gpuhpc.cli.main import main

from .conftest import EXAMPLES

DGX = yaml.safe_load((EXAMPLES / "dgx-h100-pod.yaml").read_text())


@pytest.fixture()
def dgx_data() -> dict:
    return copy.deepcopy(DGX)


def _validate(capsys, write_spec, data) -> tuple[int, str]:
    rc = main(["conf", "validate", str(write_spec(data))])
    return rc, capsys.readouterr().err.strip()


def _lustre(d):
    return d["filesystems"]["lustre"]


CASES = [
    # (id, change, field, words)
    ("mgs-on-no-client-net", lambda d: _lustre(d)["mounts"][0].update(mgs_nids=["10.20.0.1@o2ib1"]),
     "filesystems.lustre.mounts[0].mgs_nids[0]", "LNet network o2ib1"),
    ("bad-nid", lambda d: _lustre(d)["mounts"][0].update(mgs_nids=["10.20.0.1"]),
     "filesystems.lustre.mounts[0].mgs_nids", "not a Lustre NID"),
    ("bad-lnet-net", lambda d: _lustre(d)["lnet"][0].update(net="ib0"),
     "filesystems.lustre.lnet[0].net", "not an LNet network"),
    ("lnet-net-twice", lambda d: _lustre(d)["lnet"][1].update(net="o2ib"),
     "filesystems.lustre.lnet", "o2ib0 is listed twice"),
    ("lnet-no-interface", lambda d: _lustre(d)["lnet"][0].update(interfaces=[]),
     "filesystems.lustre.lnet[0].interfaces", "at least 1"),
    ("fsname-too-long", lambda d: _lustre(d)["mounts"][0].update(fsname="datasets01"),
     "filesystems.lustre.mounts[0].fsname", "not a Lustre fsname"),
    ("mount-option-with-comma", lambda d: _lustre(d)["mounts"][0].update(options=["flock,noatime"]),
     "filesystems.lustre.mounts[0].options[0]", "one mount option per list entry"),
    ("beegfs-inside-lustre", lambda d: d["filesystems"]["beegfs"][0].update(mountpoint="/lustre/lfs1/home"),
     "filesystems.beegfs[0].mountpoint", "overlaps /lustre/lfs1"),
    ("beegfs-same-ports", lambda d: d["filesystems"]["beegfs"][1].update(client_port=None),
     "filesystems.beegfs[1].client_port", "each BeeGFS mount needs its own"),
    ("beegfs-same-name", lambda d: d["filesystems"]["beegfs"][1].update(name="home"),
     "filesystems.beegfs[1].name", "duplicate BeeGFS mount name"),
    ("beegfs-secret-in-spec", lambda d: d["filesystems"]["beegfs"][0].update(connauth_secret="s3cr3t p@ss"),
     "filesystems.beegfs[0].connauth_secret", "not the secret itself"),
    ("scratch-on-a-filesystem", lambda d: d["node_groups"][0]["scratch"].update(path="/beegfs/scratch/raid"),
     "node_groups[0].scratch.path", "overlaps /beegfs/scratch"),
    ("scratch-device-twice", lambda d: d["node_groups"][0]["scratch"].update(devices=["/dev/nvme2n1"] * 2),
     "node_groups[0].scratch.devices", "listed twice"),
    ("management-network-twice", lambda d: d.update(management_networks=["10.10.0.0/16", "10.10.0.0/16"]),
     "management_networks", "duplicate network"),
]


@pytest.mark.parametrize(("change", "field", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_rejects_with_field_path(capsys, write_spec, dgx_data, change, field, words):
    change(dgx_data)
    rc, err = _validate(capsys, write_spec, dgx_data)
    assert rc == 2, err
    assert "\n" not in err
    assert err.startswith(f"error: {field}: "), err
    assert words in err


def test_context_carries_what_the_roles_need(capsys):
    assert main(["conf", "context", str(EXAMPLES / "dgx-h100-pod.yaml")]) == 0
    ctx = json.loads(capsys.readouterr().out)
    assert ctx["management_networks"] == ["10.10.0.0/16"]
    lustre = ctx["filesystems"]["lustre"]
    assert lustre["lnet"] == [{"net": "o2ib0", "interfaces": ["ib0", "ib1"]}, {"net": "tcp0", "interfaces": ["bond0"]}]
    assert lustre["mounts"] == [{"fsname": "lfs1", "source": "10.20.0.1@o2ib:10.20.0.2@o2ib:/lfs1",
                                 "mountpoint": "/lustre/lfs1", "options": ["flock", "noatime", "_netdev"]}]
    home, scratch = ctx["filesystems"]["beegfs"]
    assert (home["name"], home["rdma"], home["connauth_secret"]) == ("home", False, "vault_beegfs_home_connauth")
    assert (scratch["client_port"], scratch["helperd_port"], scratch["conn_interfaces"]) == (8014, 8016, ["ib0", "ib1"])
    dgx001 = next(n for n in ctx["nodes"] if n["name"] == "dgx001")
    assert dgx001["scratch"] == "/raid" and len(dgx001["scratch_devices"]) == 8
    assert dgx001["scratch_mount_options"] == ["defaults", "noatime"]


def test_a_spec_without_preemption_has_none(capsys, write_spec, dgx_data):
    """Omitting `preemption` used to render preempt/partition_prio with PreemptMode=OFF, which
    slurmctld refuses; now it is no preemption at all."""
    del dgx_data["preemption"]
    for p in dgx_data["partitions"]:
        p.pop("preempt_mode", None)
    for q in dgx_data["qos"]:
        q.pop("preempt_mode", None)
    path = write_spec(dgx_data)
    assert main(["conf", "validate", str(path)]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["conf", "context", str(path)]) == 0
    ctx = json.loads(capsys.readouterr().out)
    assert (ctx["preempt_type"], ctx["preempt_mode"]) == ("preempt/none", "OFF")
