"""Configless compute hosts in the lab (issue 36.4; see conftest.py): the lab's spec makes c1 and c2
configless (ansible/inventories/lab/cluster.yaml: ``configless: true``). They keep no slurm.conf of
their own, their slurmd runs with ``--conf-server ctl,login`` and fetches its files from slurmctld
(``SlurmctldParameters=enable_configless``). A change made on ctl alone, with no Ansible and no file
copied to c1 or c2, reaches both with ``scontrol reconfigure``: their slurmd's cache of the fetched
files (``SlurmdSpoolDir/conf-cache``) holds it, and jobs still run on both.
"""
from __future__ import annotations

import shlex

import pytest

from polling import wait_for

from .conftest import Lab

pytestmark = pytest.mark.integration

COMPUTE = ("c1", "c2")
SLURM_CONF = "/etc/slurm/slurm.conf"
CACHE = "/var/spool/slurmd/conf-cache"        # SlurmdSpoolDir/conf-cache (the lab spec's spool dir)
# the harmless change: the compute partition's MaxTime (INFINITE in the spec) on ctl's slurm.conf only
PARTITION = "PartitionName=compute "
BEFORE, AFTER = " MaxTime=INFINITE", " MaxTime=3-00:00:00"


def _cached(lab: Lab, host: str) -> str:
    """The slurm.conf the host's slurmd fetched and runs with (its conf-cache), '' when absent."""
    return lab.ssh(host, f"cat {CACHE}/slurm.conf 2>/dev/null || true")


def _partition_line(text: str) -> str:
    return next((line for line in text.splitlines() if line.startswith(PARTITION)), "")


def _job_on_both(lab: Lab) -> None:
    """A two-node step across c1 and c2 (srun from the login host, which keeps its own files)."""
    out = lab.ssh("login", "srun --nodes=2 --nodelist=c1,c2 --label hostname", timeout=120)
    assert sorted(line.split(": ")[1] for line in out.split("\n") if line) == list(COMPUTE), out


def test_configless_hosts_take_a_change_made_on_the_controller_alone(lab: Lab):
    ctl_conf = lab.ssh("ctl", f"cat {SLURM_CONF}")
    params = next((line for line in ctl_conf.splitlines() if line.startswith("SlurmctldParameters=")), "")
    assert "enable_configless" in params.partition("=")[2].split(","), params or ctl_conf[:2000]
    for host in COMPUTE:
        # no file of their own: a stale one would be what the commands there read
        for name in ("slurm.conf", "gres.conf", "topology.conf", "cgroup.conf"):
            assert lab.ssh(host, f"test -e /etc/slurm/{name} && echo present || echo absent").strip() == "absent", \
                (host, name)
        # slurmd runs with --conf-server (Debian's unit, SLURMD_OPTIONS from /etc/default/slurmd)
        pid = lab.ssh(host, "systemctl show --property MainPID --value slurmd").strip()
        argv = lab.ssh(host, f"tr '\\0' ' ' < /proc/{pid}/cmdline").split()
        assert argv[argv.index("--conf-server") + 1] == "ctl,login", argv
        # and runs what it fetched: the controller's file, byte for byte
        assert _cached(lab, host) == ctl_conf, host
    # the Slurm commands on c1 find the fetched config by themselves (/run/slurm/conf)
    config = lab.ssh("c1", "scontrol show config")
    assert "ClusterName             = lab" in config and "enable_configless" in config, config[:2000]

    assert _partition_line(ctl_conf).count(BEFORE) == 1, _partition_line(ctl_conf)
    changed = ctl_conf.replace(_partition_line(ctl_conf), _partition_line(ctl_conf).replace(BEFORE, AFTER))
    sed = shlex.quote(f"/^{PARTITION}/s/{BEFORE}/{AFTER}/")
    try:
        # on ctl only, by hand (no Ansible), then scontrol reconfigure
        lab.ssh("ctl", f"sed -i {sed} {SLURM_CONF} && scontrol reconfigure")
        for host in COMPUTE:
            wait_for(lambda h=host: _cached(lab, h) == changed, 60,
                     lambda h=host: f"{h}'s fetched slurm.conf to have{AFTER} (now {_partition_line(_cached(lab, h))!r})")
            # nothing was written to the host itself
            assert lab.ssh(host, f"test -e {SLURM_CONF} && echo present || echo absent").strip() == "absent"
        # slurmctld runs it (the partition's limit), and slurmd on both hosts still takes jobs
        assert "MaxTime=3-00:00:00" in lab.ssh("c1", "scontrol show partition compute")
        _job_on_both(lab)
    finally:
        lab.ssh("ctl", f"cat > {SLURM_CONF} && scontrol reconfigure", stdin=ctl_conf)
    for host in COMPUTE:
        wait_for(lambda h=host: _cached(lab, h) == ctl_conf, 60, f"{host}'s fetched slurm.conf to be restored")
