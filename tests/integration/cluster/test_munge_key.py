"""gpuhpc_munge's one trusted key, on three "hosts" of this machine (connection local, each with its
own key path under the test's tmp directory; munged is a stand-in service manager role that records
what it is asked, so this machine's munged and /etc/munge are never touched).

One scenario, in order, from a fresh cluster whose hosts hold Debian's random postinst keys:
create the trusted key on the control node (never on a managed host) and install it everywhere;
re-run: changed=0; `--limit n2` after n2's key was deleted restores the trusted key there and no
other host's key changes; without the trusted key a limited run stops with one line; hosts that
disagree stop the play naming them; hosts that agree are adopted (their key becomes the trusted one,
no host's key changes), into a control-node directory made private (0700) before the key lands.
"""
from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import recap, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

HOSTS = ("c1", "n1", "n2")

# a service manager role that runs nothing: munged's start and restart are recorded in a file
STUB = {"start.yml": "started", "restart.yml": "restarted", "stop.yml": "stopped"}


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.cache = tmp / "control" / "munge.key"
        role = tmp / "stub_service" / "tasks"
        role.mkdir(parents=True)
        for name, word in STUB.items():
            (role / name).write_text(yaml.safe_dump([{
                "name": f"Record {word}", "ansible.builtin.shell": {
                    "cmd": f"echo {word} >> {tmp}/{{{{ inventory_hostname }}}}/service.log"},
                "changed_when": word == "restarted"}]))
        hosts = {}
        for h in HOSTS:
            (tmp / h).mkdir()
            (tmp / h / "munge.socket").touch()
            hosts[h] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                        "gpuhpc_munge_key_path": str(tmp / h / "etc" / "munge.key"),
                        "gpuhpc_munge_socket": str(tmp / h / "munge.socket"),
                        "gpuhpc_munge_log_file": str(tmp / h / "log" / "munged.log"),
                        "gpuhpc_munge_seed_file": str(tmp / h / "lib" / "munged.seed")}
        self.inventory = tmp / "hosts.yml"
        self.inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts, "vars": {
            "gpuhpc_munge_install_packages": False, "gpuhpc_munge_user": "root",
            "gpuhpc_munge_service_manager": str(tmp / "stub_service"),
            "gpuhpc_munge_key_cache": str(self.cache)}}}))
        self.playbook = tmp / "munge.yml"
        self.playbook.write_text(yaml.safe_dump([{"name": "munge", "hosts": "all", "gather_facts": False,
                                                  "roles": [{"role": "gpuhpc.cluster.gpuhpc_munge"}]}]))

    def key(self, host: str) -> Path:
        return self.tmp / host / "etc" / "munge.key"

    def sums(self) -> dict[str, str | None]:
        return {h: hashlib.sha256(self.key(h).read_bytes()).hexdigest() if self.key(h).exists() else None
                for h in HOSTS}

    def random_key(self, host: str) -> None:
        """What Debian's munge postinst leaves: a random key of the host's own."""
        self.key(host).parent.mkdir(parents=True, exist_ok=True)
        self.key(host).write_bytes(os.urandom(128))

    def run(self, *extra: str) -> subprocess.CompletedProcess:
        return run_playbook(str(self.playbook), str(self.inventory), *extra, tmp=self.tmp, timeout=300)


def _one_line(proc: subprocess.CompletedProcess, start: str) -> str:
    lines = [line for line in proc.stdout.splitlines() if start in line]
    assert lines, proc.stdout[-4000:]
    return lines[0]


@pytest.fixture(scope="module")
def cluster(collection, tmp_path_factory) -> Cluster:
    c = Cluster(tmp_path_factory.mktemp("munge"))
    for h in HOSTS:
        c.random_key(h)
    return c


def test_a_fresh_cluster_gets_a_control_node_key_and_a_rerun_changes_nothing(cluster):
    assert len(set(cluster.sums().values())) == 3           # three random postinst keys
    proc = cluster.run()
    assert proc.returncode == 0, proc.stdout[-4000:]
    trusted = hashlib.sha256(cluster.cache.read_bytes()).hexdigest()
    assert set(cluster.sums().values()) == {trusted}
    assert stat.S_IMODE(cluster.cache.stat().st_mode) == 0o600
    assert "munge: 3 host(s) agree on the trusted key" in proc.stdout, proc.stdout[-4000:]
    assert all("restarted" in (cluster.tmp / h / "service.log").read_text() for h in HOSTS)   # the new key

    again = cluster.run()
    assert again.returncode == 0 and recap(again) == {"changed": 0, "failed": 0}, again.stdout[-4000:]


def test_limit_on_a_host_whose_key_was_deleted_restores_the_trusted_key(cluster):
    before = cluster.sums()
    cluster.key("n2").unlink()
    proc = cluster.run("--limit", "n2")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert cluster.sums() == before
    assert "munge.key was missing on n2: the trusted key is installed" in proc.stdout, proc.stdout[-4000:]


def test_without_the_trusted_key_a_limited_run_stops_and_changes_nothing(cluster):
    before = cluster.sums()
    cluster.cache.unlink()
    cluster.random_key("n2")                                 # n2 reimaged: the package's own key
    after_reimage = cluster.sums()
    proc = cluster.run("--limit", "n2")
    assert proc.returncode != 0
    assert "munge: no trusted key:" in _one_line(proc, "munge: no trusted key:")
    assert "limited to n2; run once without --limit" in proc.stdout, proc.stdout[-4000:]
    assert cluster.sums() == after_reimage and not cluster.cache.exists()

    # without --limit the hosts disagree (c1 and n1 share a key, n2 has its own): stop, naming them
    proc = cluster.run()
    assert proc.returncode != 0
    line = _one_line(proc, "the hosts disagree")
    assert "c1,n1 have sha1" in line and "n2 have sha1" in line, line
    assert cluster.sums() == after_reimage and not cluster.cache.exists()

    # n2's key removed: every host that has a key agrees; that key is adopted and n2 gets it. The
    # control node's directory was left open (0755, as other tools make ~/.gpuhpc): the fetch writes
    # with the control node's umask, so the directory must be private before the key lands there
    cluster.key("n2").unlink()
    os.chmod(cluster.cache.parent, 0o755)
    proc = cluster.run()
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert cluster.sums() == before
    assert hashlib.sha256(cluster.cache.read_bytes()).hexdigest() == before["c1"]
    assert stat.S_IMODE(cluster.cache.stat().st_mode) == 0o600         # fetched, then made private
    assert stat.S_IMODE(cluster.cache.parent.stat().st_mode) == 0o700  # never readable by others meanwhile
