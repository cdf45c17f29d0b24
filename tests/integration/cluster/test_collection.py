"""The gpuhpc.cluster collection as a site installs it: built with `ansible-galaxy collection build`,
installed into a collections path, and run from there (never from this checkout).

- its render_conf playbook writes byte-identical files to `gpuhpc conf render` (one template source:
  slurm-conf/, copied into the collection at build time);
- ansible-lint's production profile passes on the collection;
- a private second cluster (own ports, directories, MariaDB and cluster name; the shared munged)
  installs from nothing with `gpuhpc.cluster.site` (slurmdbd and accounts included); an unchanged
  spec then reports changed=0, a reconfigure-class change keeps slurmctld's and slurmd's pids and a
  running job, and a restart-class change restarts slurmctld.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuhpc.conf.render import render_spec
from gpuhpc.spec.cluster import load_spec
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner
from polling import wait_for

from .conftest import REPO, ansible_env, recap, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

EXAMPLES = REPO / "examples" / "clusters"
LOCAL_ROLES = REPO / "ansible" / "local" / "roles"   # the local cluster's test machinery


def test_installed_collection_carries_the_templates_and_no_checkout_paths(collection):
    manifest = json.loads((collection / "MANIFEST.json").read_text())["collection_info"]
    assert (manifest["namespace"], manifest["name"]) == ("gpuhpc", "cluster")
    templates = sorted((REPO / "slurm-conf").glob("*.j2"))
    assert {t.name for t in templates} >= {"slurm.conf.j2", "gres.conf.j2", "topology.conf.j2", "cgroup.conf.j2"}
    for source in templates:
        role = "gpuhpc_slurmdbd" if source.name == "slurmdbd.conf.j2" else "gpuhpc_slurm_common"
        carried = collection / "roles" / role / "templates" / source.name
        assert carried.read_bytes() == source.read_bytes(), source.name
    assert not (collection / "inventories").exists()      # test machinery stays in the checkout
    for path in (collection / "roles").rglob("*.yml"):
        text = path.read_text()
        assert "playbook_dir" not in text and "role_path" not in text, path


@pytest.mark.parametrize("spec_name", ["local", "dgx-h100-pod"])
def test_collection_renders_the_same_bytes_as_gpuhpc_conf_render(collection, tmp_path, spec_name):
    spec_path = EXAMPLES / f"{spec_name}.yaml"
    dest = tmp_path / "ansible"
    dest.mkdir()
    # no billing document: this compares the templates, not whatever prices this host last published
    proc = run_playbook("gpuhpc.cluster.render_conf", "localhost,", "-e", f"gpuhpc_slurm_common_spec={spec_path}",
                        "-e", f"gpuhpc_slurm_common_dest_dir={dest}", "-e", "gpuhpc_slurm_common_billing_file=''",
                        tmp=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]

    python_files, _ = render_spec(load_spec(spec_path))
    ansible_files = {p.name: p.read_bytes() for p in dest.iterdir()}
    for name in ("slurm.conf", "gres.conf", "topology.conf"):
        assert name in ansible_files, f"the role did not write {name}"
    for name, data in ansible_files.items():
        if name == "job_submit.lua":            # copied as it is, not rendered
            assert data == (REPO / "slurm-conf" / name).read_bytes(), name
            continue
        assert data == python_files[name].encode(), f"{spec_name}/{name}: ansible and gpuhpc conf render differ"


def test_topology_hook_uses_the_fabric(collection, tmp_path):
    """With gpuhpc_slurm_common_ibnetdiscover_file set, topology.conf is
    `gpuhpc topology from-ibnetdiscover FILE` output, not the spec's switches."""
    dump = tmp_path / "ibnetdiscover.out"
    synth = subprocess.run(
        [sys.executable, "-m", "gpuhpc", "topology", "synth", "--hosts", "dgx[001-032]", "--leaves", "4",
         "--hosts-per-leaf", "8", "--rails", "1", "-o", str(dump)],
        capture_output=True, text=True, timeout=120)
    assert synth.returncode == 0, synth.stderr
    dest = tmp_path / "ansible"
    dest.mkdir()
    proc = run_playbook("gpuhpc.cluster.render_conf", "localhost,",
                        "-e", f"gpuhpc_slurm_common_spec={EXAMPLES / 'dgx-h100-pod.yaml'}",
                        "-e", f"gpuhpc_slurm_common_dest_dir={dest}",
                        "-e", f"gpuhpc_slurm_common_ibnetdiscover_file={dump}", tmp=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    topo = (dest / "topology.conf").read_text()
    assert str(dump) in topo, topo                      # written by the topology command ...
    assert "SwitchName=leaf1 " not in topo, topo        # ... not from the spec's switches
    listed = " ".join(line for line in topo.splitlines() if "Nodes=" in line)
    assert "dgx" in listed, topo


def test_missing_gpuhpc_on_the_control_node_is_one_clear_error(collection, tmp_path):
    proc = run_playbook("gpuhpc.cluster.render_conf", "localhost,",
                        "-e", f"gpuhpc_slurm_common_spec={EXAMPLES / 'local.yaml'}",
                        "-e", f"gpuhpc_slurm_common_dest_dir={tmp_path}",
                        "-e", '{"gpuhpc_slurm_common_gpuhpc_cmd": ["/nonexistent/gpuhpc"]}', tmp=tmp_path, timeout=300)
    assert proc.returncode != 0
    assert "needs the gpuhpc Python package on the control node" in proc.stdout, proc.stdout[-3000:]


def test_ansible_lint_production_profile(collection, tmp_path):
    """ansible-lint --offline --profile production on the collection's source (ansible/)."""
    exe = Path(sys.executable).with_name("ansible-lint")
    lint = str(exe) if exe.exists() else shutil.which("ansible-lint")
    assert lint, "ansible-lint is not installed (pip install -e '.[ansible]')"
    proc = subprocess.run([lint, "--offline", "--profile", "production"], cwd=REPO / "ansible",
                          capture_output=True, text=True, env=ansible_env(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]


# --- a private second cluster: reconfigure instead of restart --------------------------------------

BASE = Path("/var/tmp/gpuhpc-test-reconfigure")
CTLD_PORT, SLURMD_PORT, NODE_PORT, DBD_PORT, MARIADB_PORT = 16917, 16918, 17311, 16919, 13316


def _spec(**runtime) -> dict:
    rt = {
        "slurm_user": "root", "conf_dir": f"{BASE}/etc", "slurmctld_port": CTLD_PORT, "slurmd_port": SLURMD_PORT,
        "state_save_location": f"{BASE}/state", "slurmd_spool_dir": f"{BASE}/spool", "log_dir": f"{BASE}/log",
        "run_dir": f"{BASE}/run", "munge_socket": "/run/munge/munge.socket.2", "multiple_slurmd": True,
        "proctrack": "linuxproc", "task_plugins": ["none"], "slurmd_parameters": ["config_overrides"],
        "return_to_service": 2, "kill_wait": 5, **runtime,
    }
    return {
        "name": "reconftest", "controller": {"hosts": ["localhost"]}, "runtime": rt,
        "slurmdbd": {"host": "localhost", "port": DBD_PORT, "storage_host": "127.0.0.1", "storage_port": MARIADB_PORT,
                     "storage_db": "reconftest_acct_db"},
        "qos": [{"name": "normal", "priority": 100}],
        # "ops" names no qos: the user inherits the cluster's, and a second run must still report changed=0
        "accounts": [{"name": "research", "users": ["root"], "qos": ["normal"], "default_qos": "normal"},
                     {"name": "ops", "users": ["root"]}],
        "preemption": {"type": "partition_prio", "mode": "REQUEUE"},
        "node_groups": [{"name": "cpu", "hostname": "reconf-node{n}", "count": 1, "sockets": 1, "cores_per_socket": 2,
                         "threads_per_core": 1, "memory_mb": 1000, "addr": "127.0.0.1", "node_hostname": "localhost",
                         "port": NODE_PORT}],
        "partitions": [{"name": "debug", "nodes": ["ALL"], "default": True}],
    }


def _inventory(spec_path: Path) -> dict:
    manager = str(LOCAL_ROLES / "gpuhpc_test_pidfile_service")
    host = {"localhost": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}
    return {"all": {
        "hosts": host,
        "vars": {"gpuhpc_slurm_common_spec": str(spec_path),
                 # this machine's /etc/logrotate.d belongs to the local cluster (test_log_rotation.py)
                 "gpuhpc_slurm_common_logrotate_dir": f"{BASE}/logrotate.d",
                 "gpuhpc_munge_service_manager": manager,
                 "gpuhpc_slurm_controller_service_manager": manager,
                 "gpuhpc_slurm_compute_service_manager": manager,
                 "gpuhpc_slurmdbd_service_manager": manager,
                 "gpuhpc_slurmdbd_storage_pass": "reconftest-pass-1",
                 "gpuhpc_slurmdbd_mariadb_datadir": f"{BASE}/mysql",
                 "gpuhpc_slurmdbd_mariadb_socket": f"{BASE}/mysqld/mysqld.sock",
                 "gpuhpc_slurmdbd_mariadb_pid_file": f"{BASE}/mysqld/mysqld.pid",
                 "gpuhpc_slurmdbd_mariadb_log_file": f"{BASE}/mysql-log/error.log",
                 "gpuhpc_slurmdbd_mariadb_buffer_pool_size": "32M",
                 # its own option file: the default is the local cluster's (/etc/mysql/mariadb.conf.d)
                 "gpuhpc_slurmdbd_mariadb_conf_file": f"{BASE}/mysql-conf/60-slurmdbd.cnf",
                 "gpuhpc_slurm_compute_nodes": ["reconf-node1"],
                 "gpuhpc_slurm_compute_start_timeout": 60,
                 # this machine's own sshd and PAM are not the private cluster's to harden
                 # (as in ansible/inventories/local)
                 "gpuhpc_hardening_ssh_no_passwords": False,
                 "gpuhpc_hardening_pam_slurm_adopt": False,
                 # one test host: Slurm's ports open, the state on the disk /tmp is on (verify names both)
                 "gpuhpc_hardening_allow_open_slurm_ports": True,
                 "gpuhpc_hardening_allow_shared_state_filesystem": True},
        "children": {"slurm_controller": {"hosts": {"localhost": None}},
                     "slurmdbd": {"hosts": {"localhost": None}},
                     "slurm_compute": {"hosts": {"localhost": None}}},
    }}


class PrivateCluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.spec_path = BASE / "spec.yaml"
        self.inventory = BASE / "hosts.yml"
        self.slurm = SlurmClient(LocalRunner(env={"SLURM_CONF": f"{BASE}/etc/slurm.conf"}))

    def write(self, **runtime) -> None:
        self.spec_path.write_text(yaml.safe_dump(_spec(**runtime), sort_keys=False))

    def site(self) -> dict[str, int]:
        proc = run_playbook("gpuhpc.cluster.site", str(self.inventory), tmp=self.tmp)
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
        self.last = proc.stdout
        return recap(proc)

    def teardown(self) -> None:
        if self.inventory.exists():
            # munged is the shared cluster's: it stays up
            run_playbook("gpuhpc.cluster.teardown", str(self.inventory), "-e", "gpuhpc_teardown_purge=true",
                         "-e", "gpuhpc_teardown_munge=false", tmp=self.tmp)

    def pids(self) -> tuple[str, str]:
        return ((BASE / "run" / "slurmctld.pid").read_text().strip(),
                (BASE / "run" / "slurmd-reconf-node1.pid").read_text().strip())

    def config(self, key: str) -> str:
        out = subprocess.run(["scontrol", "show", "config"], env={**os.environ, "SLURM_CONF": f"{BASE}/etc/slurm.conf"},
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return next(line.split("=", 1)[1].strip() for line in out.splitlines() if line.split("=")[0].strip() == key)


@pytest.fixture()
def private_cluster(collection, tmp_path):
    cluster = PrivateCluster(tmp_path)
    cluster.teardown()                       # leftovers of an interrupted earlier run
    shutil.rmtree(BASE, ignore_errors=True)
    BASE.mkdir(parents=True)
    cluster.inventory.write_text(yaml.safe_dump(_inventory(cluster.spec_path), sort_keys=False))
    cluster.write()
    try:
        yield cluster
    finally:
        cluster.teardown()
        shutil.rmtree(BASE, ignore_errors=True)


def test_reconfigure_keeps_daemons_and_jobs_restart_class_change_restarts(private_cluster, tmp_path):
    c = private_cluster
    assert c.site()["failed"] == 0                             # a fresh install, slurmdbd included
    # (idempotence: the last run below, with the spec unchanged since the run before, reports changed=0)
    assocs = subprocess.run(["sacctmgr", "--noheader", "--parsable2", "list", "association", "format=cluster,account,user"],
                            env={**os.environ, "SLURM_CONF": f"{BASE}/etc/slurm.conf"}, capture_output=True, text=True,
                            timeout=60, check=True).stdout.split()
    assert "reconftest|research|root" in assocs, assocs
    job = c.slurm.submit_script("#!/bin/bash\nsleep 300\n", extra=["--time=10", f"--output={tmp_path / 'job.out'}"])
    try:
        wait_for(lambda: (c.slurm.show_job(job) or {}).get("JobState") == "RUNNING", 60, f"job {job} to run")
        before = c.pids()

        # KillWait: `scontrol reconfigure` takes it; slurmctld, slurmd and the job stay
        c.write(kill_wait=7)
        c.site()
        assert "killwait: reconfigure" in c.last, c.last[-3000:]
        assert c.pids() == before
        assert c.config("KillWait") == "7 sec"
        assert (c.slurm.show_job(job) or {}).get("JobState") == "RUNNING"

        # SelectTypeParameters: Slurm documents a slurmctld restart; slurmd keeps running
        c.write(kill_wait=7, select_type_parameters="CR_Core")
        c.site()
        assert "selecttypeparameters: slurmctld" in c.last, c.last[-3000:]
        after = c.pids()
        assert after[0] != before[0], "slurmctld was not restarted"
        assert after[1] == before[1], "slurmd restarted for a slurmctld-only parameter"
        assert c.config("SelectTypeParameters") == "CR_CORE"
        wait_for(lambda: (c.slurm.show_job(job) or {}).get("JobState") == "RUNNING", 30, f"job {job} to survive")

        assert c.site()["changed"] == 0, c.last[-3000:]          # idempotent, accounts and slurmdbd included
        assert c.pids() == after
    finally:
        c.slurm.cancel(job)
