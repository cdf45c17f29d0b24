"""Pure health checks and the drain/resume decision, fed recorded text."""
from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.health import checks as c
from gpuhpc.health.gate import Action, decide, is_ours, reason_for
from gpuhpc.health.spec import load

GRES = """# gres.conf
AutoDetect=off
NodeName=gpu-node[1-2] Name=gpu Type=h100 File=/dev/fake/nvidia[0-3] Cores=0-7
NodeName=gpu-node2 Name=gpu Type=h100 File=/dev/fake/nvidia[4-7] Cores=8-15
NodeName=mig-node1 Name=gpu Type=1g.10gb File=/dev/fake/mig[0-6]
NodeName=mig-node1 Name=gpu Type=3g.40gb Count=2
"""


def _stat(files):
    return "".join(f"character special file|{f}\n" for f in files)


def test_gres_conf_lines_per_node():
    lines = c.parse_gres_conf(GRES, "gpu-node2")
    assert [g.n for g in lines] == [4, 4]
    assert c.expected_counts(lines) == {"h100": 8}
    assert c.expected_counts(c.parse_gres_conf(GRES, "mig-node1")) == {"1g.10gb": 7, "3g.40gb": 2}
    assert c.parse_gres_conf(GRES, "cpu-node1") == []


def test_gpu_devices_count_and_missing_device():
    lines = c.parse_gres_conf(GRES, "gpu-node2")
    files = [f for g in lines for f in g.files]
    assert c.check_gpu_devices(lines, c.parse_stat(_stat(files))).status is c.Status.OK
    r = c.check_gpu_devices(lines, c.parse_stat(_stat(files[:3] + files[4:])))
    assert r.status is c.Status.FAIL and r.category == c.HW
    assert r.message.startswith("gpu count 7/8") and "/dev/fake/nvidia3" in r.message
    # a plain file where a device should be is no GPU
    r = c.check_gpu_devices(lines, {**c.parse_stat(_stat(files)), files[0]: "regular empty file"})
    assert r.message.startswith("gpu count 7/8")
    assert c.check_gpu_devices([], {}).status is c.Status.SKIP


def test_gpu_listing_types_and_mig_layout(fixtures_dir):
    smi = fixtures_dir / "nvidia-smi"
    mig = (smi / "L-h100-80gb-mig-7x1g.10gb.txt").read_text()
    from gpuhpc.inventory.smi import parse_list

    profiles = {}
    for g in parse_list(mig):
        for m in g.mig:
            profiles[m.profile] = profiles.get(m.profile, 0) + 1
    assert c.check_gpu_listing(profiles, mig).status is c.Status.OK
    wrong = {k: v + 1 for k, v in profiles.items()}
    r = c.check_gpu_listing(wrong, mig)
    assert r.status is c.Status.FAIL and r.message.startswith("mig layout")
    listing = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)" for i in range(7))
    r = c.check_gpu_listing({"h100": 8}, listing)
    assert r.status is c.Status.FAIL and r.message.startswith("gpu count 7/8")
    assert c.check_gpu_listing({"h100": 8}, "garbage").status is c.Status.FAIL


DMESG = """[    5.100000] nvidia: loading out-of-tree module
[  100.250000] NVRM: Xid (PCI:0000:18:00): 13, pid=1234, Graphics Exception
[  200.500000] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.
"""


def test_xid_since_last_run():
    r, mark = c.check_xid(DMESG, None)
    assert r.status is c.Status.FAIL and r.message == "xid 79 on 0000:3b:00" and mark == 200.5
    r, mark2 = c.check_xid(DMESG, mark)
    assert r.status is c.Status.OK and mark2 == mark
    r, _ = c.check_xid(DMESG, 150.0)
    assert r.status is c.Status.FAIL
    r, _ = c.check_xid(DMESG.splitlines()[1] + "\n", None)
    assert r.status is c.Status.WARN        # 13: the application's own error


def test_gpu_counters_ecc_remap_and_throttle():
    clean = "0, 0, No, 0, 0, 0x0000000000000000, 1980, 1980\n1, 0, No, 0, 0, 0x0000000000000001, 345, 1980\n"
    ecc, clocks = c.check_gpu_counters(clean)
    assert ecc.status is c.Status.OK and clocks.status is c.Status.OK
    bad = "0, 3, Yes, 0, 1, 0x0000000000000040, 900, 1980\n1, [N/A], [N/A], [N/A], [N/A], [N/A], [N/A], [N/A]\n"
    ecc, clocks = c.check_gpu_counters(bad)
    assert ecc.status is c.Status.FAIL and "gpu0 ecc uncorrected 3" in ecc.message
    assert "retired pages pending" in ecc.message and "row remap pending" in ecc.message
    assert clocks.status is c.Status.FAIL and clocks.category == c.PERF and "hw thermal" in clocks.message
    ecc, _ = c.check_gpu_counters(bad, c.Thresholds(ecc_uncorrected=5, retired_pages_pending=False,
                                                     row_remap_pending=False))
    assert ecc.status is c.Status.OK
    assert {r.status for r in c.check_gpu_counters("")} == {c.Status.SKIP}


IBSTAT = """CA 'mlx5_0'
\tCA type: MT4129
\tNumber of ports: 1
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tLink layer: InfiniBand
CA 'mlx5_1'
\tCA type: MT4129
\tPort 1:
\t\tState: Down
\t\tPhysical state: Disabled
\t\tRate: 10
\t\tLink layer: InfiniBand
CA 'mlx5_2'
\tPort 1:
\t\tState: Active
\t\tRate: 200
\t\tLink layer: InfiniBand
CA 'mlx5_eth'
\tPort 1:
\t\tState: Active
\t\tRate: 100
\t\tLink layer: Ethernet
"""


def test_ibstat_ports_state_and_rate():
    ports = c.parse_ibstat(IBSTAT)
    assert [(p.ca, p.state, p.rate) for p in ports][:2] == [("mlx5_0", "Active", 400), ("mlx5_1", "Down", 10)]
    r = c.check_ib(IBSTAT, min_rate=400, ports=3)
    assert r.status is c.Status.FAIL and "mlx5_1/1 down" in r.message and "mlx5_2/1 rate 200<400" in r.message
    assert c.check_ib(IBSTAT.split("CA 'mlx5_1'")[0], min_rate=400, ports=1).status is c.Status.OK
    assert c.check_ib(IBSTAT, min_rate=None, ports=None).status is c.Status.SKIP
    assert c.check_ib(None, min_rate=400, ports=None).message == "ibstat missing"


MOUNTS = "sysfs /sys sysfs rw 0 0\n/dev/nvme0n1 /scratch xfs rw 0 0\nnfs:/home /home nfs4 rw 0 0\n"
DF = "Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/nvme0n1 1000000000 990000000 10000000 99% /scratch\n"


def test_mounts_scratch_munge():
    assert c.check_mounts(MOUNTS, ["/home"]).status is c.Status.OK
    r = c.check_mounts(MOUNTS, ["/home", "/shared"])
    assert r.status is c.Status.FAIL and r.category == c.SW and r.message == "not mounted: /shared"
    assert c.check_scratch("/scratch", DF, MOUNTS, min_free_gb=5).status is c.Status.OK
    r = c.check_scratch("/scratch", DF, MOUNTS, min_free_gb=50)
    assert r.status is c.Status.FAIL and r.message == "scratch /scratch 10 GB free < 50"
    assert c.check_scratch("/data", DF, MOUNTS, min_free_gb=1).message == "scratch /data not mounted"
    assert c.check_munge(0, 0, "STATUS: Success (0)\n").status is c.Status.OK
    assert c.check_munge(1, 1, "").message == "munge"
    assert c.check_munge(0, 15, "STATUS: Expired credential (15)\n").status is c.Status.FAIL


def test_reason_taxonomy_orders_hw_first_and_has_no_equals():
    results = [c.fail("gpu-clocks", "gpu1 throttled", c.PERF), c.fail("munge", "munge", c.SW),
               c.fail("gpu-devices", "gpu count 7/8")]
    assert reason_for(results) == "gpuhpc:hw: gpu count 7/8 (+2 more)"
    assert reason_for([c.fail("munge", "munge", c.SW)]) == "gpuhpc:sw: munge"
    assert reason_for([c.fail("x", "a=b", c.PERF)]) == "gpuhpc:perf: a:b"
    assert reason_for([c.ok("x")]) is None


@pytest.mark.parametrize("state,reason,failing,action", [
    ("IDLE", "", True, Action.DRAIN),
    ("MIXED", "", False, Action.NONE),
    ("IDLE+DRAIN", "gpuhpc:dev: ib mlx5_1/1 down [root@2026-11-30T13:00:00]", False, Action.RESUME),
    ("IDLE+DRAIN", "gpuhpc:hw: gpu count 7/8 [root@2026-11-30T13:00:00]", False, Action.NONE),   # sticks
    ("IDLE+DRAIN", "gpuhpc:hw: gpu count 7/8 [root@2026-11-30T13:00:00]", True, Action.NONE),   # same reason
    ("IDLE+DRAIN", "gpuhpc:sw: munge [root@2026-11-30T13:00:00]", True, Action.DRAIN),          # new reason
    ("IDLE+DRAIN", "bad fan, ticket 42 [alice@2026-11-30T13:00:00]", False, Action.NONE),       # an admin's
    ("IDLE+DRAIN", "bad fan, ticket 42 [alice@2026-11-30T13:00:00]", True, Action.NONE),
    ("DOWN", "Not responding", False, Action.NONE),
])
def test_decide_resumes_only_its_own_drains(state, reason, failing, action):
    results = [c.fail("gpu-devices", "gpu count 7/8")] if failing else [c.ok("gpu-devices")]
    assert decide(state, reason, results).action is action


def test_is_ours():
    assert is_ours("gpuhpc:hw: x [root@t]") and not is_ours("maintenance gpuhpc:hw") and not is_ours("")


def test_spec_file_validation():
    s = load("scratch: {path: /scratch, min_free_gb: 50}\nmounts: [/home]\nib: {min_rate: 400, ports: 8}\n")
    assert (s.scratch_path, s.scratch_min_free_gb, s.mounts, s.ib_min_rate, s.ib_ports) == ("/scratch", 50.0, ("/home",), 400, 8)
    with pytest.raises(UserInputError, match="unknown key 'scrach'"):
        load("scrach: {}\n")
    with pytest.raises(UserInputError, match="ib"):
        load("ib: {speed: 1}\n")
    with pytest.raises(UserInputError, match="mounts"):
        load("mounts: [home]\n")


def test_prolog_fails_open_on_gpuhpc_own_errors(tmp_path, monkeypatch, capsys):
    from gpuhpc.health import __main__ as entry

    bad = tmp_path / "spec.yml"
    bad.write_text("nonsense: 1\n")
    monkeypatch.setenv("SLURMD_NODENAME", "gpu-node1")
    assert entry.main(["--mode", "prolog", "--spec", str(bad)]) == 0
    assert entry.main(["--spec", str(bad)]) == 2
    assert "unknown key 'nonsense'" in capsys.readouterr().err
