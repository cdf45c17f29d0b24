"""The gate's memory across runs, with a scripted node (commands and files answered from text,
Slurm's node state kept in a fake client) and a fake clock:

- XID marks are per boot: an XID logged after a reboot, at a dmesg time below the old boot's
  mark, is found.
- A regular hardware drain (``gpuhpc:hw:``: XID 79, a double-bit ECC error, a lost GPU) sticks:
  a clean regular run leaves it; an admin's resume or a passing deep run returns the node.
- Perf hysteresis: a perf failure drains only when N of the last M samples failed, a perf drain
  lasts at least ``min_drain_s``, benign throttle bits never count.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuhpc.errors import TransportError, UserInputError
from gpuhpc.health import Action, HealthSpec, check_node
from gpuhpc.health import checks as c
from gpuhpc.health import gate
from gpuhpc.health.collect import BOOT_ID, SMI_COUNTERS
from gpuhpc.health import deep
from gpuhpc.health.deep import NCCL
from gpuhpc.health.spec import load
from gpuhpc.slurm.parsers import NodeInfo
from gpuhpc.transport import CommandResult

FIX = Path(__file__).parent / "fixtures"
NODE = "gpu-node1"
GRES = "/etc/slurm/gres.conf"
FILES = [f"/dev/fake/nvidia{i}" for i in range(8)]
LISTING = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d}-1111-2222-3333-444444444444)\n" for i in range(8))
XID79 = "[  200.500000] NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.\n"


def counters(**gpu3) -> str:
    """``nvidia-smi --query-gpu=<COUNTER_FIELDS>`` rows: 8 clean H100s, GPU 3 as given."""
    rows = []
    for i in range(8):
        g = {"ecc": 0, "pending": "No", "remap_fail": 0, "remap_pending": 0, "throttle": "0x0000000000000000",
             "sm": 1980, **(gpu3 if i == 3 else {})}
        rows.append(f"{i}, {g['ecc']}, {g['pending']}, {g['remap_fail']}, {g['remap_pending']}, {g['throttle']}, "
                    f"{g['sm']}, 1980\n")
    return "".join(rows)


class Node:
    """A scripted node: the runner (commands, files) and the Slurm client (its state)."""

    def __init__(self) -> None:
        self.files = {GRES: f"NodeName={NODE} Name=gpu Type=h100 File=/dev/fake/nvidia[0-7]\n",
                      "/proc/mounts": "", BOOT_ID: "boot-a\n"}
        self.dmesg = ""
        self.counters = counters()
        self.listing = LISTING
        self.deep: dict[str, str] = {}          # dcgmi / all_reduce_perf output (missing: not installed)
        self.state, self.reason = "IDLE", ""
        self.resumes = 0
        self.reservations: set[str] = set()
        self.jobs: list[tuple[str, str]] = []   # the deep-check jobs: (reservation, node state when it ran)

    # ---------------------------------------------------------------- Runner
    is_local = False

    def getenv(self, key):
        return None

    def run(self, argv, *, input=None, timeout=None, env=None, check=True):
        argv = list(argv)
        out, rc = "", 0
        if argv[:3] == ["scontrol", "create", "reservation"]:
            self.reservations.add(argv[3].split("=", 1)[1])
        elif argv[:2] == ["scontrol", "delete"]:
            name = argv[2].split("=", 1)[1]
            rc = 0 if name in self.reservations else 1
            self.reservations.discard(name)
        elif argv[0] == "stat":
            out = "".join(f"character special file|{f}\n" for f in argv[3:])
        elif argv[0] in ("munge", "unmunge"):
            out = "cred" if argv[0] == "munge" else "STATUS: Success (0)\n"
        elif argv == ["nvidia-smi", "-L"]:
            out = self.listing
        elif argv == list(SMI_COUNTERS):
            out = self.counters
        elif argv == ["dmesg"]:
            out = self.dmesg
        elif argv[0] in ("dcgmi", "all_reduce_perf") and argv[0] in self.deep:
            out = self.deep[argv[0]]
        else:
            rc = 127
        return CommandResult(tuple(argv), rc, out, "")

    def read_file(self, path):
        if path not in self.files:
            raise TransportError(f"cannot read {path}: No such file or directory")
        return self.files[path]

    def write_file(self, path, content, mode=0o644):
        self.files[path] = content

    def makedirs(self, path):
        pass

    # ---------------------------------------------------------------- SlurmClient
    def node(self, name):
        assert name == NODE
        return NodeInfo(NODE, self.state, 16, 0, 64000, 0, ("gpu",), reason=self.reason)

    def drain_node(self, name, reason):
        self.state, self.reason = "IDLE+DRAIN", f"{reason} [root@2026-12-02T21:00:00]"

    def resume_node(self, name):
        self.state, self.reason, self.resumes = "IDLE", "", self.resumes + 1

    # ---------------------------------------------------------------- Slurm: the deep-check job
    def partitions(self):
        return []

    def submit_script(self, script, *, extra=(), workdir=None, script_dir=None):
        """The job runs at once, alone on the node (what Slurm does once the node is free)."""
        import shlex

        opts = dict(a[2:].split("=", 1) for a in extra if a.startswith("--") and "=" in a)
        assert "--exclusive" in extra and opts["nodelist"] == NODE and opts["reservation"] in self.reservations
        job = str(100 + len(self.jobs))
        self.jobs.append((opts["reservation"], self.state))
        argv = shlex.split(script.splitlines()[-1])[1:]
        base = float(argv[argv.index("--baseline") + 1]) if "--baseline" in argv else None
        report, measured = deep.run_deep_checks(NODE, self, SPEC, baseline=base, mig="--mig" in argv)
        self.files[opts["output"].replace("%j", job)] = deep.job_result(NODE, job, report, measured) + "\n"
        return job

    def queue(self, *, user=None, job_ids=()):
        return []               # ended

    # ---------------------------------------------------------------- helpers
    def check(self, spec: HealthSpec, *, mode: str = "full", now: float = 0.0, apply: bool = True):
        return check_node(NODE, runner=self, client=self, spec=spec, mode=mode, apply=apply, now=now)

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.state


@pytest.fixture
def node() -> Node:
    return Node()


SPEC = HealthSpec(state_dir="/var/lib/gpuhpc/health")


def statuses(out) -> dict[str, tuple[str, str, str]]:
    return {r.check: (r.status.value, r.category, r.message) for r in out.report.results}


# ------------------------------------------------------------------ 6: XID marks per boot
def test_xid_mark_is_kept_per_boot():
    assert c.xid_since(None, "b") is None and c.xid_since("", "b") is None
    assert c.xid_since("b 200.5\n", "b") == 200.5
    assert c.xid_since("a 200.5\n", "b") is None           # another boot: every XID of this one is new
    assert c.xid_since("200.5\n", "b") == 200.5            # a mark from before boot ids: this boot's
    assert c.xid_since("b junk\n", "b") is None
    assert c.xid_mark_text("b", 200.5) == "b 200.5\n" and c.xid_mark_text("", 200.5) == "200.5\n"


def test_xid_after_a_reboot_below_the_old_mark_is_found(node):
    node.dmesg = XID79
    out = node.check(SPEC)
    assert statuses(out)["xid"] == ("fail", "hw", "xid 79 on 0000:3b:00")
    assert node.files[f"{SPEC.state_dir}/xid-{NODE}"] == "boot-a 200.5\n"
    node.resume_node(NODE)                                  # an admin looked at it
    # the same boot, the same XID: not news
    assert statuses(node.check(SPEC))["xid"][0] == "ok"
    # a reboot: dmesg's clock starts again, and the new boot's XID 79 is logged at 50 s, below 200.5
    node.files[BOOT_ID] = "boot-b\n"
    node.dmesg = "[   50.000000] NVRM: Xid (PCI:0000:18:00): 79, pid=0, GPU has fallen off the bus.\n"
    out = node.check(SPEC)
    assert statuses(out)["xid"] == ("fail", "hw", "xid 79 on 0000:18:00")
    assert node.drained and node.reason.startswith("gpuhpc:hw: xid 79 on 0000:18:00")
    assert node.files[f"{SPEC.state_dir}/xid-{NODE}"] == "boot-b 50.0\n"


def test_a_look_without_apply_leaves_the_xid_for_the_run_that_acts(node):
    node.dmesg = XID79
    out = node.check(SPEC, apply=False)
    assert out.decision.action is Action.DRAIN and not out.applied and not node.drained
    assert f"{SPEC.state_dir}/xid-{NODE}" not in node.files
    node.check(SPEC)
    assert node.drained and node.reason.startswith("gpuhpc:hw: xid 79")


# ------------------------------------------------------------------ 6: hardware drains stick
def test_failure_categories_hardware_sticks_device_state_returns():
    sticky = c.check_xid(XID79, None)[0]
    other = c.check_xid("[  9.0] NVRM: Xid (PCI:0000:3b:00): 61, pid=0, Internal micro-controller breakpoint\n",
                        None)[0]
    both = c.check_xid("[  9.0] NVRM: Xid (PCI:0000:18:00): 61, pid=0, x\n" + XID79 +
                       "[  300.0] NVRM: Xid (PCI:0000:5c:00): 92, pid=0, x\n", None)[0]
    assert (sticky.category, other.category) == (c.HW, c.DEV)
    assert (both.category, both.message) == (c.HW, "xid 79 on 0000:3b:00 (+2 more)")
    dbe, _ = c.check_gpu_counters(counters(ecc=2))
    remap, _ = c.check_gpu_counters(counters(remap_fail=1))
    pending, _ = c.check_gpu_counters(counters(pending="Yes", remap_pending=1))
    assert (dbe.status, dbe.category, dbe.message) == (c.Status.FAIL, c.HW, "gpu3 ecc uncorrected 2")
    assert (remap.category, remap.message) == (c.HW, "gpu3 row remap failure")
    assert (pending.category, pending.message) == (c.DEV, "gpu3 retired pages pending; gpu3 row remap pending")
    lost = c.check_gpu_listing({"h100": 8}, LISTING[: LISTING.index("GPU 7")])
    assert (lost.category, lost.message) == (c.HW, "gpu count 7/8 (h100 7/8)")
    mig = (Path(__file__).parents[2] / "fixtures" / "nvidia-smi" / "L-h100-80gb-mig-7x1g.10gb.txt").read_text()
    assert c.check_gpu_listing({"1g.10gb": 6}, mig).category == c.DEV
    # MIG instances lost (a reboot): whole GPUs listed where gres.conf wants MIG devices is a layout
    gone = c.check_gpu_listing({"1g.10gb": 7, "3g.40gb": 2}, LISTING[: LISTING.index("GPU 2")])
    assert (gone.category, gone.message) == (c.DEV, "mig layout 2/9 (1g.10gb 0/7, 3g.40gb 0/2, h100 2/0)")
    assert c.check_ib("CA 'm'\n\tPort 1:\n\t\tState: Down\n\t\tLink layer: InfiniBand\n", min_rate=400).category == c.DEV
    assert gate.reason_for([c.fail("ib", "ib m/1 down", c.DEV), c.fail("munge", "munge", c.SW), dbe]) == \
        "gpuhpc:hw: gpu3 ecc uncorrected 2 (+2 more)"


HW = "gpuhpc:hw: xid 79 on 0000:3b:00 [root@2026-12-02T21:00:00]"
DEEP_HW = "gpuhpc:hw: dcgm diag -r 2 GPU Memory gpu 3 [root@2026-12-02T21:00:00]"


@pytest.mark.parametrize("reason,results,deep,action", [
    # a clean regular run leaves a hardware drain; it returns other regular drains
    (HW, [c.ok("xid")], False, Action.NONE),
    ("gpuhpc:hw: gpu count 7/8 (h100 7/8)", [c.ok("gpu-listing")], False, Action.NONE),
    ("gpuhpc:dev: ib mlx5_1/1 down [root@t]", [c.ok("ib", "", c.DEV)], False, Action.RESUME),
    ("gpuhpc:sw: munge [root@t]", [c.ok("munge", "", c.SW)], False, Action.RESUME),
    # a regular failure keeps the hardware fault's reason (no rewrite to a lesser one)
    (HW, [c.fail("munge", "munge", c.SW)], False, Action.NONE),
    (HW, [c.fail("gpu-ecc", "gpu3 ecc uncorrected 2")], False, Action.NONE),
    # a passing deep run returns it, a deep run that tested nothing or failed does not
    (HW, [c.ok(NCCL, "nccl 435 GB/s", c.PERF), c.ok("dcgm-diag")], True, Action.RESUME),
    (HW, [c.skip("dcgm-diag", "no dcgmi"), c.skip(NCCL, "no all_reduce_perf", c.PERF)], True, Action.NONE),
    (HW, [c.fail("dcgm-diag", "dcgm diag -r 2 GPU Memory gpu 3")], True, Action.NONE),
    (DEEP_HW, [c.ok("dcgm-diag")], True, Action.RESUME),
    (DEEP_HW, [c.ok("xid")], False, Action.NONE),
    # an admin's drain stays whatever either set says
    ("xid 79, RMA ticket 7 [alice@t]", [c.ok("dcgm-diag")], True, Action.NONE),
    ("xid 79, RMA ticket 7 [alice@t]", [c.ok("xid")], False, Action.NONE),
])
def test_decide_hardware_drains_stick_until_admin_or_deep(reason, results, deep, action):
    assert gate.decide("IDLE+DRAIN", reason, results, deep=deep).action is action


def test_hardware_drain_stays_through_clean_runs_and_returns_with_deep_or_admin(node):
    node.counters = counters(ecc=2)
    out = node.check(SPEC)
    assert out.applied and node.reason.startswith("gpuhpc:hw: gpu3 ecc uncorrected 2 [")
    # the reboot that cleared the volatile counter, then clean runs: the node stays out
    node.counters = counters()
    node.files[BOOT_ID] = "boot-b\n"
    for _ in range(3):
        out = node.check(SPEC)
        assert out.decision.action is Action.NONE and node.drained, out.decision
    assert "hardware fault" in out.decision.why
    # a deep run that tests nothing (no dcgmi, no all_reduce_perf) proves nothing
    assert node.check(SPEC, mode="deep").decision.action is Action.NONE and node.drained
    # a passing deep run returns it
    node.deep = {"dcgmi": (FIX / "dcgmi-diag-r2-pass.json").read_text(),
                 "all_reduce_perf": (FIX / "all_reduce_perf-h100x8.txt").read_text()}
    out = node.check(SPEC, mode="deep")
    assert out.decision.action is Action.RESUME and out.applied and not node.drained and node.resumes == 2
    # each deep run was a job in a maintenance reservation, on the node lifted from its drain for it
    # (the run that tested nothing put the drain back); no reservation is left
    assert node.jobs == [("gpuhpc-deep-gpu-node1", "IDLE")] * 2 and not node.reservations
    # again, and this time the admin's resume (scontrol update State=RESUME) returns it
    node.counters = counters(remap_fail=1)
    node.check(SPEC)
    assert node.reason.startswith("gpuhpc:hw: gpu3 row remap failure")
    node.counters = counters()
    node.check(SPEC)
    assert node.drained
    node.resume_node(NODE)
    assert node.check(SPEC).decision.action is Action.NONE and not node.drained


def test_apply_rereads_the_reason_before_a_deep_resume(node):
    node.state, node.reason = "IDLE+DRAIN", "RMA ticket 7 [alice@t]"      # an admin drained it meanwhile
    gate.apply(node, NODE, gate.Decision(Action.RESUME, None, "x"), deep=True)
    assert node.drained and node.resumes == 0
    node.reason = HW
    gate.apply(node, NODE, gate.Decision(Action.RESUME, None, "x"), deep=True)
    assert not node.drained
    node.state, node.reason = "IDLE+DRAIN", HW
    gate.apply(node, NODE, gate.Decision(Action.RESUME, None, "x"))         # a regular run never does
    assert node.drained


# ------------------------------------------------------------------ 7: perf hysteresis
HOT = "0x0000000000000040"          # HwThermalSlowdown
FAST = HealthSpec(state_dir="/s", hysteresis=c.Hysteresis(fail_samples=3, window=5, min_drain_s=600))


def test_damp_counts_the_last_samples():
    h = c.Hysteresis(fail_samples=2, window=3, min_drain_s=0)
    hot = [c.fail("gpu-clocks", "gpu3 throttled (hw thermal)", c.PERF), c.fail("munge", "munge", c.SW)]
    out, s = gate.damp(hot, {}, h)
    assert [r.status for r in out] == [c.Status.WARN, c.Status.FAIL] and s == {"gpu-clocks": [1]}
    assert out[0].message == "gpu3 throttled (hw thermal) (1 of the last 1 samples; drains at 2 of 3)"
    out, s = gate.damp(hot, s, h)
    assert out[0].status is c.Status.FAIL and s == {"gpu-clocks": [1, 1]}
    out, s = gate.damp([c.ok("gpu-clocks", "", c.PERF)], {"gpu-clocks": [1, 0, 1]}, h)
    assert s == {"gpu-clocks": [0, 1, 0]}
    out, s = gate.damp(hot, s, h)                        # 1, 0, 1 in the window: 2 of 3
    assert out[0].status is c.Status.FAIL
    out, s2 = gate.damp([c.skip("gpu-clocks", "no counters", c.PERF)], s, h)
    assert s2 == s                                      # no counters: no sample
    assert gate.PerfState.from_text(gate.PerfState(s, 12.5).to_text()) == gate.PerfState(s, 12.5)
    assert gate.PerfState.from_text("garbage") == gate.PerfState()


def test_one_throttled_sample_drains_nothing_three_of_five_do(node):
    node.counters = counters(throttle=HOT, sm=900)
    for t in (0, 60):
        out = node.check(FAST, now=t)
        assert statuses(out)["gpu-clocks"][0] == "warn" and out.report.healthy and not node.drained
    node.counters = counters()
    assert node.check(FAST, now=120).decision.action is Action.NONE
    node.counters = counters(throttle=HOT, sm=900)
    out = node.check(FAST, now=180)                     # 1, 1, 0, 1: three of the last four
    assert out.decision.action is Action.DRAIN and node.reason.startswith("gpuhpc:perf: gpu3 throttled (hw thermal")


def test_a_perf_drain_lasts_min_drain_s_then_the_count_starts_again(node):
    node.counters = counters(throttle=HOT)
    for t in (0, 60, 120):
        node.check(FAST, now=t)
    assert node.drained and node.reason.startswith("gpuhpc:perf:")
    reason = node.reason
    node.counters = counters(throttle="0x0000000000000060", sm=500)     # still throttled, other words
    assert node.check(FAST, now=180).decision.action is Action.NONE and node.reason == reason
    node.counters = counters()
    out = node.check(FAST, now=500)                     # clean, but drained 380 s < 600 s ago
    assert out.decision.action is Action.NONE and node.drained and "600 s" in out.decision.why
    out = node.check(FAST, now=720)                     # 600 s after the drain: back
    assert out.decision.action is Action.RESUME and not node.drained
    # the count started again: one more throttled sample is a warning, not a drain
    node.counters = counters(throttle=HOT)
    out = node.check(FAST, now=780)
    assert statuses(out)["gpu-clocks"][0] == "warn" and not node.drained


def test_an_admin_resume_of_a_perf_drain_restarts_the_count(node):
    node.counters = counters(throttle=HOT)
    for t in (0, 60, 120):
        node.check(FAST, now=t)
    assert node.drained
    node.resume_node(NODE)
    out = node.check(FAST, now=180)
    assert statuses(out)["gpu-clocks"][0] == "warn" and not node.drained


@pytest.mark.parametrize("bits,bad", [
    ("0x0000000000000001", False),        # GpuIdle
    ("0x0000000000000002", False),        # ApplicationsClocksSetting
    ("0x0000000000000004", False),        # SwPowerCap
    ("0x0000000000000100", False),        # DisplayClockSetting
    ("0x0000000000000107", False),
    ("0x0000000000000008", True),         # HwSlowdown
    ("0x0000000000000010", True),         # SyncBoost
    ("0x0000000000000020", True),         # SwThermalSlowdown
    ("0x0000000000000080", True),         # HwPowerBrakeSlowdown
    ("0x0000000000000014", True),         # SwPowerCap + SyncBoost
])
def test_benign_throttle_bits_never_count(bits, bad):
    _, clocks = c.check_gpu_counters(counters(throttle=bits, sm=700))
    assert (clocks.status is c.Status.FAIL) is bad, clocks


def test_benign_bits_never_drain_the_node(node):
    node.counters = counters(throttle="0x0000000000000005", sm=600)     # idle + power cap
    for t in range(0, 600, 60):
        assert node.check(FAST, now=t).decision.action is Action.NONE
    assert not node.drained


def test_spec_perf_settings():
    s = load("perf: {fail_samples: 2, window: 4, min_drain_s: 30}\n")
    assert s.hysteresis == c.Hysteresis(2, 4, 30.0)
    assert load("").hysteresis == c.Hysteresis(3, 5, 600.0)
    with pytest.raises(UserInputError, match="perf.fail_samples"):
        load("perf: {fail_samples: 6}\n")
    with pytest.raises(UserInputError, match="perf.min_drain_s"):
        load("perf: {min_drain_s: -1}\n")
    with pytest.raises(UserInputError, match="unknown key 'samples'"):
        load("perf: {samples: 3}\n")

