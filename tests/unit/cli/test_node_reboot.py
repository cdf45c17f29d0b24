"""`gpuhpc node reboot`: its argument checks (exit 2, one line naming the field) and its batches,
against `scontrol --oneliner show node` records captured from Slurm (the local cluster's 22.05 and
the lab's 24.11 during a real reboot, tests/integration/lab/test_lab_reboot.py), replayed in order."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli_helpers import gpuhpc
from gpuhpc.errors import UserInputError
from gpuhpc.slurm import reboot as rb
from gpuhpc.transport import CommandResult

# the local cluster (Slurm 22.05.8), an idle node
LOCAL_IDLE = (
    "NodeName=cpu-node1 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=16 CPUTot=16 CPULoad=1.08 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=127.0.0.1 NodeHostName=localhost "
    "Port=17104 Version=22.05.8 OS=Linux 6.18.44-fc-v1098 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=32000 "
    "AllocMem=0 FreeMem=19836 Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
    "MCS_label=N/A Partitions=cpu,all  BootTime=2026-12-02T20:47:18 SlurmdStartTime=2026-12-03T12:50:16 "
    "LastBusyTime=2026-12-03T12:50:49 CfgTRES=cpu=16,mem=32000M,billing=16 AllocTRES= CapWatts=n/a "
    "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s")

# ---------------------------------------------------------------- the lab's c1 (Slurm 24.11) during
# `gpuhpc node reboot c1 --reason "driver update"` with a job on it: the records as they changed
LAB_STEPS: dict[str, list[str]] = {}


def _record(name: str, text: str) -> str:
    """A recorded record under another node name (the records hold no other trace of the name)."""
    first = text.split(" ", 1)
    return f"NodeName={name} {first[1]}"


class Replay:
    """A runner that answers `scontrol --oneliner show node NODES` from recorded records: each node
    has its records in the order Slurm showed them, the first until its reboot is asked, then one
    more per read (the last one stays). It records every argv it was given."""
    is_local = False

    def __init__(self, steps: dict[str, list[str]], refuse: str | None = None):
        self.steps = steps
        self.pos = {n: 0 for n in steps}
        self.asked: set[str] = set()
        self.argvs: list[list[str]] = []
        self.refuse = refuse

    def getenv(self, name, default=None):
        return default

    def run(self, argv, *, input=None, timeout=None, env=None, cwd=None):
        argv = list(argv)
        self.argvs.append(argv)
        if argv[:2] == ["scontrol", "reboot"]:
            if self.refuse:
                return CommandResult(tuple(argv), 1, "", self.refuse)
            self.asked.update(argv[-1].split(","))
            return CommandResult(tuple(argv), 0, "", "")
        assert argv[:4] == ["scontrol", "--oneliner", "show", "node"], argv
        names = argv[4].split(",") if len(argv) > 4 else list(self.steps)
        lines = []
        for n in names:
            recs = self.steps[n]
            lines.append(recs[min(self.pos[n], len(recs) - 1)])
            if n in self.asked:
                self.pos[n] += 1
        return CommandResult(tuple(argv), 0, "\n".join(lines) + "\n", "")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


# ---------------------------------------------------------------- argument checks
@pytest.mark.parametrize("args, field", [
    (["c1", "--batch", "0", "--reason", "x"], "--batch"),
    (["c1", "--batch", "-2", "--reason", "x"], "--batch"),
    (["c1", "--reason", "  "], "--reason"),
    (["c1", "--reason", "driver\nupdate"], "--reason"),
    (["c1", "--reason", 'say "hi"'], "--reason"),
    (["c1", "--reason", "x" * 201], "--reason"),
    (["c[1-", "--reason", "x"], "NODES"),
    (["c1", "--reason", "x", "--timeout", "0"], "--timeout"),
])
def test_bad_input_exits_2_with_one_line_naming_the_field_before_any_slurm_call(args, field):
    res = gpuhpc("node", "reboot", *args, env={"PATH": "/nonexistent"})   # no scontrol could run
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and field in lines[0], res.stderr


def test_a_missing_reason_is_a_usage_error():
    res = gpuhpc("node", "reboot", "c1", env={"PATH": "/nonexistent"})
    assert res.returncode == 2 and "--reason" in res.stderr


def test_an_unknown_node_exits_2_naming_it_and_nothing_is_rebooted(monkeypatch):
    from gpuhpc.cli import node as node_cli

    replay = Replay({"cpu-node1": [LOCAL_IDLE]})
    monkeypatch.setattr(node_cli, "_runner", lambda: replay)
    res = CliRunner().invoke(node_cli.node_group, ["reboot", "cpu-node[1-2]", "--reason", "fw"],
                             standalone_mode=False)
    assert isinstance(res.exception, UserInputError) and res.exception.field == "NODES"
    assert "cpu-node2" in str(res.exception)
    assert not any(a[:2] == ["scontrol", "reboot"] for a in replay.argvs)


def test_the_reason_is_one_argv_word_after_asap_and_nextstate_resume():
    assert rb.reboot_argv("c[1-2]", "driver 550 update; rm -rf /") == [
        "scontrol", "reboot", "ASAP", "nextstate=RESUME", "reason=driver 550 update; rm -rf /", "c[1-2]"]
    with pytest.raises(UserInputError):
        rb.reboot_argv("c1", "a'b")


def test_batches_keep_the_order_and_the_last_may_be_short():
    assert rb.batches(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert rb.batches(["a"], 8) == [["a"]]
    with pytest.raises(UserInputError):
        rb.batches(["a"], 0)


# ---------------------------------------------------------------- recorded records
def test_the_recorded_22_05_record_parses_with_its_boot_time():
    node = rb.parse_node_boots(LOCAL_IDLE)["cpu-node1"]
    assert node.base == "IDLE" and node.flags == frozenset() and node.reason == ""
    import datetime as dt
    assert node.boot_time == dt.datetime(2026, 12, 2, 20, 47, 18).timestamp()
