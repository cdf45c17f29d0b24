"""gpuhpc_slurmdbd's MariaDB tuning and record retention, from the installed gpuhpc.cluster collection,
on a private MariaDB and slurmdbd of their own (own directories under BASE, own ports; the shared
munged), run by the pid-file service manager as the local cluster runs its own (PID 1 is not
systemd here; the lab covers systemd).

- the role writes its MariaDB option file (gpuhpc_slurmdbd_mariadb_conf_file) and mariadbd runs
  with those InnoDB settings (SchedMD's accounting.html);
- slurmdbd.conf carries the spec's Purge*After/Archive* lines and slurmdbd starts with them; the
  archive directory is SlurmUser's, 0700;
- a second run reports changed=0 and restarts nothing; a changed setting rewrites the file and
  restarts MariaDB (the handler), not slurmdbd, which reconnects and keeps writing to it.

The role converges once per module; the later runs start from that state.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, recap, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

LOCAL_ROLES = REPO / "ansible" / "local" / "roles"   # the local cluster's test machinery
BASE = Path("/var/tmp/gpuhpc-test-dbtune")
DBD_PORT, MARIADB_PORT = 16939, 13336
SOCKET = BASE / "mysqld" / "mysqld.sock"
CNF = BASE / "mysql-conf" / "60-slurmdbd.cnf"
TUNING = {"gpuhpc_slurmdbd_mariadb_buffer_pool_size": "48M", "gpuhpc_slurmdbd_mariadb_log_file_size": "24M",
          "gpuhpc_slurmdbd_mariadb_lock_wait_timeout": 900, "gpuhpc_slurmdbd_mariadb_max_allowed_packet": "32M"}

SPEC = {
    "name": "dbtunetest", "controller": {"hosts": ["localhost"]},
    "runtime": {"slurm_user": "root", "conf_dir": f"{BASE}/etc", "log_dir": f"{BASE}/log", "run_dir": f"{BASE}/run",
                "state_save_location": f"{BASE}/state", "slurmd_spool_dir": f"{BASE}/spool",
                "proctrack": "linuxproc", "task_plugins": ["none"]},
    "slurmdbd": {"host": "localhost", "port": DBD_PORT, "storage_host": "127.0.0.1", "storage_port": MARIADB_PORT,
                 "storage_db": "dbtunetest_acct_db",
                 "purge_step_after": "3month", "purge_job_after": "24month", "purge_event_after": "90days",
                 "purge_txn_after": "720hours", "archive_jobs": True, "archive_dir": f"{BASE}/archive"},
    "node_groups": [{"name": "cpu", "hostname": "dbtune-node{n}", "count": 1, "sockets": 1, "cores_per_socket": 2,
                     "memory_mb": 1000}],
    "partitions": [{"name": "debug", "nodes": ["ALL"], "default": True}],
}

# enough slurm.conf for sacctmgr to reach this slurmdbd
CLIENT_CONF = f"""\
ClusterName=dbtunetest
SlurmctldHost=localhost
AuthInfo=socket=/run/munge/munge.socket.2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={DBD_PORT}
AccountingStoragePass=/run/munge/munge.socket.2
"""

PLAY = """\
- name: gpuhpc_slurmdbd on a private MariaDB ({entry})
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Load the cluster spec (gpuhpc_slurm_common_conf)
      ansible.builtin.include_role:
        name: gpuhpc.cluster.gpuhpc_slurm_common
        tasks_from: context.yml
    - name: The slurmdbd role
      ansible.builtin.include_role:
        name: gpuhpc.cluster.gpuhpc_slurmdbd
        tasks_from: {entry}
"""


class DbdRoot:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.vars = BASE / "vars.yml"

    def play(self, entry: str, **extra) -> str:
        play = BASE / f"{entry}.yml"
        play.write_text(PLAY.format(entry=f"{entry}.yml"))
        variables = {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "gpuhpc_slurm_common_spec": str(BASE / "spec.yaml"), "gpuhpc_slurm_common_billing_file": "",
            "gpuhpc_slurmdbd_service_manager": str(LOCAL_ROLES / "gpuhpc_test_pidfile_service"),
            "gpuhpc_slurmdbd_storage_pass": "dbtune-pass-1",
            "gpuhpc_slurmdbd_manage_accounts": False,      # no slurm.conf here: slurmdbd and MariaDB only
            "gpuhpc_slurmdbd_mariadb_datadir": f"{BASE}/mysql",
            "gpuhpc_slurmdbd_mariadb_socket": str(SOCKET),
            "gpuhpc_slurmdbd_mariadb_pid_file": f"{BASE}/mysqld/mysqld.pid",
            "gpuhpc_slurmdbd_mariadb_log_file": f"{BASE}/mysql-log/error.log",
            "gpuhpc_slurmdbd_mariadb_conf_file": str(CNF),
            **TUNING, **extra,
        }
        self.vars.write_text(yaml.safe_dump(variables, sort_keys=False))
        return str(play)

    def run(self, entry: str = "main", **extra) -> tuple[dict[str, int], str]:
        proc = run_playbook(self.play(entry, **extra), "localhost,", "-e", f"@{self.vars}", tmp=self.tmp, timeout=300)
        assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
        return recap(proc), proc.stdout

    def teardown(self) -> None:
        if BASE.exists():
            self.run("teardown")

    @staticmethod
    def pid(name: str) -> str:
        path = BASE / ("mysqld/mysqld.pid" if name == "mariadbd" else "run/slurmdbd.pid")
        pid = path.read_text().strip()
        assert Path(f"/proc/{pid}/comm").read_text().strip() == name, f"{name} ({pid}) is not running"
        return pid

    @staticmethod
    def variables() -> dict[str, str]:
        out = subprocess.run(
            ["mariadb", f"--socket={SOCKET}", "-uroot", "--batch", "--skip-column-names", "-e",
             "SELECT @@innodb_buffer_pool_size, @@innodb_log_file_size, @@innodb_lock_wait_timeout, @@max_allowed_packet"],
            capture_output=True, text=True, timeout=60, check=True).stdout.split()
        return dict(zip(("buffer_pool", "log_file", "lock_wait", "packet"), out))


@pytest.fixture(scope="module")
def dbd(collection, tmp_path_factory):
    root = DbdRoot(tmp_path_factory.mktemp("dbtune"))
    try:
        root.teardown()                      # leftovers of an interrupted earlier run
    except AssertionError:
        pass
    shutil.rmtree(BASE, ignore_errors=True)
    for sub in ("etc", "log", "run"):        # what gpuhpc_slurm_common makes on a real host
        (BASE / sub).mkdir(parents=True)
    (BASE / "etc" / "slurm.conf").write_text(CLIENT_CONF)
    (BASE / "spec.yaml").write_text(yaml.safe_dump(SPEC, sort_keys=False))
    root.first = root.run()
    root.first_pids = (root.pid("mariadbd"), root.pid("slurmdbd"))
    root.second = root.run()
    try:
        yield root
    finally:
        root.teardown()
        shutil.rmtree(BASE, ignore_errors=True)


def test_option_file_is_written_and_mariadbd_runs_with_it(dbd):
    assert dbd.first[0]["failed"] == 0
    text = CNF.read_text()
    assert "[mysqld]\n" in text, text
    for line in ("innodb_buffer_pool_size = 48M", "innodb_log_file_size = 24M", "innodb_lock_wait_timeout = 900",
                 "max_allowed_packet = 32M"):
        assert f"\n{line}\n" in text, text
    assert stat.S_IMODE(CNF.stat().st_mode) == 0o644
    # the running server took them (MariaDB's defaults: 128M, 96M, 50, 16M)
    assert dbd.variables() == {"buffer_pool": str(48 << 20), "log_file": str(24 << 20), "lock_wait": "900",
                               "packet": str(32 << 20)}


def test_slurmdbd_runs_with_the_spec_retention_settings(dbd):
    conf = (BASE / "etc" / "slurmdbd.conf").read_text().splitlines()
    for line in (f"ArchiveDir={BASE}/archive", "ArchiveJobs=yes", "PurgeEventAfter=90days", "PurgeJobAfter=24month",
                 "PurgeStepAfter=3month", "PurgeTXNAfter=720hours"):
        assert line in conf, conf
    assert not [line for line in conf if line.startswith(("PurgeResv", "PurgeSuspend", "PurgeUsage", "ArchiveSteps"))]
    dbd.pid("slurmdbd")                      # Slurm accepted them: it exits on a bad Purge*After
    archive = (BASE / "archive").stat()
    assert stat.S_IMODE(archive.st_mode) == 0o700 and archive.st_uid == 0   # SlurmUser (root here)


def test_a_second_run_changes_and_restarts_nothing(dbd):
    recap2, out = dbd.second
    assert recap2 == {"changed": 0, "failed": 0}, out[-3000:]
    assert (dbd.pid("mariadbd"), dbd.pid("slurmdbd")) == dbd.first_pids


def test_a_changed_setting_restarts_mariadb_not_slurmdbd(dbd):
    mariadbd, slurmdbd = dbd.pid("mariadbd"), dbd.pid("slurmdbd")
    recap3, out = dbd.run(gpuhpc_slurmdbd_mariadb_lock_wait_timeout=1200)
    assert recap3["changed"] > 0, out[-3000:]
    assert "innodb_lock_wait_timeout = 1200\n" in CNF.read_text()
    assert dbd.pid("mariadbd") != mariadbd, "MariaDB was not restarted for its new option file"
    assert dbd.variables()["lock_wait"] == "1200"
    assert dbd.pid("slurmdbd") == slurmdbd, "slurmdbd restarted though slurmdbd.conf did not change"
    # ... and still writes to the database (it reconnects to the restarted server)
    env = {**os.environ, "SLURM_CONF": str(BASE / "etc" / "slurm.conf")}
    add = subprocess.run(["sacctmgr", "--immediate", "add", "cluster", "dbtunetest"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert add.returncode == 0, add.stdout + add.stderr
    listed = subprocess.run(["sacctmgr", "--noheader", "--parsable2", "list", "cluster", "format=cluster"], env=env,
                            capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert "dbtunetest" in listed, listed
