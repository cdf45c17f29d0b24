"""The collection's restart-or-reconfigure decision (ansible/plugins/filter/slurm_conf.py).

The table is Slurm 22.05's own list (slurm.conf(5), gres.conf(5), scontrol(1) "reconfigure"):
the parameters it names need a restart of the daemons it names; everything else takes
`scontrol reconfigure`. Each case edits the local example's rendered slurm.conf / gres.conf.
"""
from __future__ import annotations

import importlib.util
import re

import pytest

from gpuhpc.conf.render import render_spec
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES, REPO


def _plugin():
    path = REPO / "ansible" / "plugins" / "filter" / "slurm_conf.py"
    spec = importlib.util.spec_from_file_location("gpuhpc_slurm_conf_filter", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


change = _plugin().slurm_conf_change
FILES, _ = render_spec(load_spec(EXAMPLES / "local.yaml"))


def _edit(name: str, pattern: str, repl: str) -> dict[str, str]:
    new, n = re.subn(pattern, repl, FILES[name], flags=re.M)
    assert n, f"{pattern!r} not found in {name}"
    return {**FILES, name: new}


CASES = [
    # (what, file, pattern, replacement, daemons to restart)
    ("scheduler knob", "slurm.conf", r"^SchedulerParameters=.*$", "SchedulerParameters=sched_interval=5", []),
    ("kill wait", "slurm.conf", r"^KillWait=\d+$", "KillWait=7", []),
    ("partition grace time", "slurm.conf", r"GraceTime=30", "GraceTime=60", []),
    ("new partition", "slurm.conf", r"\Z", "PartitionName=extra Nodes=cpu-node1 MaxTime=INFINITE State=UP\n", []),
    ("debug level", "slurm.conf", r"^SlurmctldDebug=.*$", "SlurmctldDebug=debug", []),
    ("preempt_send_user_signal off", "slurm.conf", r"^SlurmctldParameters=.*$", "SlurmctldParameters=", []),
    # keys are case-insensitive and comments are ignored: nothing for the daemons to do
    ("key case differs only", "slurm.conf", r"^KillWait=", "killwait=", None),
    ("comment only", "slurm.conf", r"^# nodes$", "# the nodes", None),
    ("enable_configless", "slurm.conf", r"^SlurmctldParameters=(.*)$", r"SlurmctldParameters=\1,enable_configless",
     ["slurmctld"]),
    ("SelectTypeParameters", "slurm.conf", r"^SelectTypeParameters=.*$", "SelectTypeParameters=CR_Core", ["slurmctld"]),
    ("SelectType", "slurm.conf", r"^SelectType=.*$", "SelectType=select/cons_res", ["slurmctld", "slurmd"]),
    ("SlurmctldPort", "slurm.conf", r"^SlurmctldPort=.*$", "SlurmctldPort=6900", ["slurmctld"]),
    ("SlurmdPort", "slurm.conf", r"^SlurmdPort=.*$", "SlurmdPort=6901", ["slurmctld"]),
    ("StateSaveLocation", "slurm.conf", r"^StateSaveLocation=.*$", "StateSaveLocation=/srv/slurmctld", ["slurmctld"]),
    ("SlurmctldHost", "slurm.conf", r"^SlurmctldHost=.*$", "SlurmctldHost=ctl2", ["slurmctld"]),
    ("ProctrackType", "slurm.conf", r"^ProctrackType=.*$", "ProctrackType=proctrack/cgroup", ["slurmctld"]),
    ("AccountingStorageEnforce", "slurm.conf", r"\Z", "AccountingStorageEnforce=limits\n", ["slurmctld"]),
    ("GresTypes", "slurm.conf", r"^GresTypes=.*$", "GresTypes=gpu,shard", ["slurmctld", "slurmd"]),
    ("AuthInfo cred_expire", "slurm.conf", r"cred_expire=\d+", "cred_expire=30", ["slurmctld", "slurmd"]),
    ("AuthType", "slurm.conf", r"^AuthType=.*$", "AuthType=auth/none", ["slurmctld", "slurmd"]),
    ("SwitchType", "slurm.conf", r"\Z", "SwitchType=switch/none\n", ["slurmctld", "slurmd"]),
    ("PluginDir", "slurm.conf", r"\Z", "PluginDir=/opt/slurm/lib\n", ["slurmctld", "slurmd"]),
    ("CoreSpecPlugin", "slurm.conf", r"\Z", "CoreSpecPlugin=core_spec/none\n", ["slurmd"]),
    ("node memory", "slurm.conf", r"RealMemory=32000", "RealMemory=31000", ["slurmctld", "slurmd"]),
    ("node added", "slurm.conf", r"^(NodeName=cpu-node1 .*)$",
     r"\1\nNodeName=cpu-node2 CPUs=16 RealMemory=32000 State=UNKNOWN", ["slurmctld", "slurmd"]),
    ("node removed", "slurm.conf", r"^NodeName=cpu-node1 .*\n", "", ["slurmctld", "slurmd"]),
    ("gres Cores", "gres.conf", r"Cores=0-7", "Cores=0-3", ["slurmctld"]),
    ("gres Type", "gres.conf", r"Type=h100", "Type=a100", ["slurmctld", "slurmd"]),
    ("gres File", "gres.conf", r"nvidia\[0-3\]", "nvidia[0-2,4]", []),
    ("topology.conf", "topology.conf", r"^SwitchName=spine .*$", "SwitchName=spine Switches=leaf[1-2] LinkSpeed=400", []),
]


@pytest.mark.parametrize(("what", "name", "pattern", "repl", "restart"), CASES, ids=[c[0] for c in CASES])
def test_change_table(what, name, pattern, repl, restart):
    got = change(FILES, _edit(name, pattern, repl))
    if restart is None:
        assert got == {"changed": False, "restart": [], "reconfigure": False, "reasons": []}
        return
    assert got["changed"] and got["reconfigure"], got
    assert got["restart"] == restart, got
    assert got["reasons"], got


def test_no_change():
    assert change(FILES, dict(FILES)) == {"changed": False, "restart": [], "reconfigure": False, "reasons": []}


def test_added_cgroup_conf_reconfigures():
    got = change({k: v for k, v in FILES.items() if k != "cgroup.conf"}, FILES)
    assert got["changed"] and got["restart"] == [], got


def test_reasons_name_the_parameter_and_the_daemons():
    got = change(FILES, _edit("slurm.conf", r"^SelectTypeParameters=.*$", "SelectTypeParameters=CR_Core"))
    assert got["reasons"] == ["selecttypeparameters: slurmctld"], got
