"""tests/golden/local against the running daemons (issue 40.10): the golden files prove only that a
render did not change; here what they say is checked against what slurmctld made of it.

The local cluster runs exactly tests/golden/local (its deployed slurm.conf, gres.conf and
cgroup.conf are those files, comments aside), and every setting, node and partition the golden
slurm.conf names is read back from slurmctld (``scontrol show config|node|partition``), each in the
form Slurm prints it: ``KillWait=5`` is ``5 sec``, ``PriorityCalcPeriod=1`` (minutes) is
``00:01:00``, a GPU's ``Cores=`` in gres.conf is the socket in ``Gres=gpu:h100:8(S:0-1)``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpuhpc.conf.context import build_context
from gpuhpc.conf.render import render_context
from gpuhpc.conf.validate import validate
from gpuhpc.hostlist import expand as hostlist_expand
from gpuhpc.ledger import budget
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.spec.cluster import load_spec

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "local"
LOCAL_SPEC = Path(__file__).resolve().parents[3] / "examples" / "clusters" / "local.yaml"


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _fields(line: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in line.split())


def _golden() -> tuple[dict[str, str], dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """The golden slurm.conf: global settings, NodeName lines, PartitionName lines."""
    settings, nodes, parts = {}, {}, {}
    for line in _lines((GOLDEN / "slurm.conf").read_text()):
        if line.startswith("NodeName="):
            nodes[_fields(line)["NodeName"]] = _fields(line)
        elif line.startswith("PartitionName="):
            parts[_fields(line)["PartitionName"]] = _fields(line)
        else:
            key, _, value = line.partition("=")
            settings[key] = value
    return settings, nodes, parts


@pytest.fixture(scope="module")
def client() -> SlurmClient:
    return SlurmClient()


def _minutes(hms: str) -> str:
    h, m, s = (int(x) for x in hms.split(":"))
    return str(h * 60 + m + s // 60)


# how `scontrol show config` prints what slurm.conf says (identity where it prints it as written)
SHOWN_AS = {
    "KillWait": lambda v: f"{v} sec",
    "MinJobAge": lambda v: f"{v} sec",
    "HealthCheckInterval": lambda v: f"{v} sec",
    "SelectTypeParameters": str.upper,
    "PriorityDecayHalfLife": lambda v: "00:00:00" if v == "0" else v,
}


def _expected(name: str) -> list[str]:
    """The golden file, unless the machine has the ledger's billing document (the quick start's
    `gpuhpc ledger sync-slurm` writes it): then the role rendered each partition with the price
    book's TRESBillingWeights, so the expected slurm.conf is the local spec rendered with that
    document, which must differ from the golden file in those weights only."""
    golden = _lines((GOLDEN / name).read_text())
    billing = budget.billing_path()
    if name != "slurm.conf" or not billing.exists():
        return golden
    spec = load_spec(LOCAL_SPEC)
    validate(spec)
    rendered = _lines(render_context(build_context(spec, billing=json.loads(billing.read_text())))[name])
    field = re.compile(r" TRESBillingWeights=\S+")
    assert [field.sub("", line) for line in rendered] == golden, f"{billing} changes more than the weights"
    assert rendered != golden, f"{billing} gave no partition a weight"
    return rendered


def test_the_local_cluster_runs_the_golden_files(client):
    conf_dir = Path(client.config()["SLURM_CONF"]).parent
    for name in ("slurm.conf", "gres.conf"):
        assert _lines((conf_dir / name).read_text()) == _expected(name), name
    # cgroup.conf is read only with a cgroup plugin, and the local cluster runs none (linuxproc, task/none)
    settings, _, _ = _golden()
    assert settings["ProctrackType"] == "proctrack/linuxproc" and settings["TaskPlugin"] == "task/none"


def test_every_golden_setting_is_what_slurmctld_runs(client):
    settings, _, _ = _golden()
    shown = client.config()
    checked = []
    for key, value in settings.items():
        if key == "PriorityCalcPeriod":                  # minutes in slurm.conf, H:M:S shown
            assert _minutes(shown[key]) == value, (key, shown[key])
        elif key == "AccountingStorageTRES":             # Slurm adds its own (cpu, mem, node, billing, ...)
            assert set(value.split(",")) <= set(shown[key].split(",")), (key, shown[key])
        elif key == "PrologFlags":                       # Contain implies Alloc, and Slurm says so
            assert set(value.split(",")) <= set(shown[key].split(",")), (key, shown[key])
        elif key in ("SlurmctldHost", "SlurmUser", "SlurmdUser", "SlurmdSpoolDir", "SlurmdPidFile",
                     "SlurmdLogFile", "AuthType", "CredType", "SlurmdParameters", "HealthCheckNodeState",
                     "JobSubmitPlugins", "AccountingStoragePass", "InactiveLimit"):
            continue                                     # printed in another shape (host(addr), user(uid), ...)
        elif key in shown:
            assert shown[key] == SHOWN_AS.get(key, str)(value), (key, value, shown[key])
        else:
            continue
        checked.append(key)
    # the settings the tests rely on (docs/DEVELOPING.md "The local cluster") are among those read back
    assert {"ClusterName", "MaxArraySize", "MaxJobCount", "SchedulerParameters", "PreemptType", "PreemptMode",
            "SlurmctldParameters", "AuthInfo", "EnforcePartLimits", "AccountingStorageEnforce", "GresTypes",
            "PriorityCalcPeriod", "JobContainerType", "KillWait", "MinJobAge"} <= set(checked), sorted(checked)
    # hand-checked: what the local spec (examples/clusters/local.yaml) asks for, as slurmctld runs it
    assert shown["MaxArraySize"] == "51" and shown["AuthInfo"].endswith(",cred_expire=10")
    assert "sched_interval=2" in shown["SchedulerParameters"].split(",")


def test_every_golden_node_and_partition_is_what_slurmctld_has(client):
    _, nodes, parts = _golden()
    live = {n.name: n for n in client.nodes()}
    assert set(live) == set(nodes)
    for name, want in nodes.items():
        n = live[name]
        assert n.cpus == int(want["CPUs"]) and n.real_memory_mb == int(want["RealMemory"]), name
        gres = {}
        for item in filter(None, want.get("Gres", "").split(",")):
            _, typ, count = item.split(":")
            gres[typ] = int(count)
        assert n.gpus_total == gres, (name, n.gpus_total)
        assert set(n.features) == set(filter(None, want.get("Feature", "").split(","))), name
    # hand-checked against the spec: 8 H100s on each GPU node, 7 + 2 MIG slices, none on the CPU node
    assert live["gpu-node1"].gpus_total == {"h100": 8} and live["cpu-node1"].gpus_total == {}
    assert live["mig-node1"].gpus_total == {"1g.10gb": 7, "3g.40gb": 2}
    live_parts = {p.name: p for p in client.partitions()}
    assert set(parts) <= set(live_parts)
    for name, want in parts.items():
        p = live_parts[name]
        all_nodes = ",".join(sorted(nodes)) if want["Nodes"] == "ALL" else None
        assert p.nodes == want["Nodes"] or ",".join(sorted(hostlist_expand(p.nodes))) == all_nodes, name
        assert p.priority_tier == int(want["PriorityTier"]), name
        assert p.preempt_mode == want.get("PreemptMode", p.preempt_mode), name       # unset: the cluster's
        assert p.default == (want.get("Default") == "YES"), name
        assert p.grace_time == int(want.get("GraceTime", "0")), name
        if "AllowAccounts" in want:
            assert p.allow_accounts == want["AllowAccounts"], name
    assert live_parts["gpu"].default and live_parts["gpu-hi"].priority_tier == 10


def test_gres_cores_are_the_sockets_slurmd_reports(client):
    """gres.conf binds GPUs 0-3 to cores 0-7 and 4-7 to cores 8-15 (two sockets of 8 cores):
    slurmctld shows that as socket affinity S:0-1 for the node's eight H100s."""
    cores = [_fields(line) for line in _lines((GOLDEN / "gres.conf").read_text()) if line.startswith("NodeName=gpu-node1")]
    assert [(c["File"].rsplit("/", 1)[1], c["Cores"]) for c in cores] == [
        ("gpu-node1-nvidia[0-3]", "0-7"), ("gpu-node1-nvidia[4-7]", "8-15")]
    shown = client.run(["scontrol", "show", "node", "gpu-node1"]).stdout
    assert re.search(r"\bGres=gpu:h100:8\(S:0-1\)", shown), shown
