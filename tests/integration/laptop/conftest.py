"""The laptop: a cluster profile that reaches the real sshd (scripts/services/sshd.sh) on
127.0.0.1:2222, key auth, a pinned host key and a non-root user (``gpuhpc-laptop``, made by
sshd.sh, in a Slurm account of its own made here); the login node behind it is the local
cluster. Each test gets its own ``remote_dir`` in that user's home, removed afterwards: the
user's jobs write there, and this process (root, standing in for an observer on the cluster)
reads it.

A long test asks for ``private_login`` first: the login node's Slurm is then a private controller
(tests/private_slurm.py) with a ``cpu`` partition as the local cluster's, and the test is marked
``isolated`` (it runs beside the shared-cluster stream, issue 19)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Laptop:
    env: dict[str, str]
    config: Path
    known_hosts: Path
    key: str
    slurm_conf: str | None
    user: str
    python: str
    remote: Path                    # this test's remote_dir (in the user's home)
    home: str = ""                  # the user's home on the cluster (hidden from a laptop apart)

    def profile(self, name: str = "lab", **over) -> None:
        """(Re)write the profile ``name`` (the other profiles stay)."""
        text = self.config.read_text() if self.config.exists() else ""
        values = {"host": "127.0.0.1", "user": self.user, "port": 2222, "key": self.key,
                  "known_hosts": str(self.known_hosts), "python": self.python, "remote_dir": str(self.remote),
                  **({"slurm_conf": self.slurm_conf} if self.slurm_conf else {}), **over}
        body = "".join(f"{k} = {v!r}\n".replace("'", '"') if isinstance(v, str) else f"{k} = {v}\n"
                       for k, v in values.items() if v is not None)
        blocks = [b for b in text.split("\n[") if b and not b.lstrip("[").startswith(f"clusters.{name}]")]
        text = "\n[".join(blocks)
        self.config.write_text((text.rstrip() + "\n\n" if text.strip() else "") + f"[clusters.{name}]\n{body}")

    def gpuhpc(self, *args: str, env: dict | None = None, timeout: float = 180, apart: bool = False, **kw):
        """``gpuhpc ARGS`` on the laptop; ``apart``: a laptop of its own, in a mount namespace
        where the cluster user's home (remote_dir: snapshots, logs, traces, sweeps) is an empty
        tmpfs, so whatever the command shows of those it got from the cluster, over SSH."""
        argv = [sys.executable, "-m", "gpuhpc", *args]
        if apart:
            argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    'mount -t tmpfs -o size=1m,mode=0700 laptop "$0" && exec "$@"', self.home, *argv]
        return subprocess.run(argv, env={**os.environ, **self.env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout, **kw)


@pytest.fixture(scope="session")
def sshd() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/sshd.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    env = dict(kv.split("=", 1) for kv in out.split())
    # the user's Slurm association: an account of its own (no budget on it), as a site adds a user
    slurm, user = SlurmClient(LocalRunner()), env["GPUHPC_TEST_SSH_USER"]
    # (on this cluster only: a private test cluster may share the slurmdbd)
    on = ("Cluster", slurm.cluster_name())
    have = {(r["Account"], r["User"]) for r in slurm.sacctmgr_list("association", f"cluster={on[1]}",
                                                                    fields=["Account", "User"])}
    if (user, "") not in have:
        slurm.sacctmgr_add("account", user, [on, ("Description", "laptop tests"), ("Organization", "gpuhpc")])
    if (user, user) not in have:
        slurm.sacctmgr_add("user", user, [on, ("Account", user), ("DefaultAccount", user)])
    # the user's own state database on the login node follows this gpuhpc's schema, as after an
    # upgrade of the login node (a home kept from an older checkout's run is otherwise refused)
    subprocess.run(["runuser", "-u", user, "--", env["GPUHPC_TEST_SSH_USER_PYTHON"], "-m", "gpuhpc", "db", "upgrade"],
                   check=True, capture_output=True, text=True, cwd="/",
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("GPUHPC_")},
                        "HOME": env["GPUHPC_TEST_SSH_USER_HOME"], "USER": user})
    return env


LOGIN_NAME = "gpuhpclap"
LOGIN_PORTS = (16987, 16988, 17471)       # unlike every other private cluster's (grep before reuse)


@pytest.fixture
def private_login(sshd, monkeypatch):
    """A private controller (partition ``cpu``: one 16-CPU node) under its own cluster name in
    the shared slurmdbd, where the laptop user has an account of its own as on the local cluster
    (associations enforced, as there); SLURM_CONF points at it for the test, so the profile
    ``laptop`` writes sends it to the login node's Slurm commands, and the jobs inherit it. Its
    directory is readable by the laptop user (the Slurm commands read its slurm.conf). Stopped
    and forgotten (its associations with it) at the end."""
    from private_slurm import PrivateSlurm

    cluster = PrivateSlurm(
        LOGIN_NAME, LOGIN_PORTS, {"lap-cpu1": "CPUs=16 RealMemory=32000 State=UNKNOWN"},
        ["PartitionName=cpu Nodes=lap-cpu1 Default=YES MaxTime=INFINITE State=UP"],
        extra={"SlurmdParameters": "config_overrides", "MaxArraySize": "51", "MinJobAge": "600", "JobRequeue": "1",
               "KillWait": "5", "SchedulerParameters": "batch_sched_delay=0,sched_interval=2,bf_interval=5",
               "AccountingStorageEnforce": "associations"},
        accounting=True)
    user, on = sshd["GPUHPC_TEST_SSH_USER"], ("Cluster", LOGIN_NAME)
    with cluster.in_slurmdbd(before_start=lambda base: base.chmod(0o755)):
        cluster.client.sacctmgr_add("account", user, [on, ("Description", "laptop tests"), ("Organization", "gpuhpc")])
        cluster.client.sacctmgr_add("user", user, [on, ("Account", user), ("DefaultAccount", user)])
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster


@pytest.fixture
def laptop(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    shutil.copy(sshd["GPUHPC_TEST_SSH_KNOWN_HOSTS"], known)
    (tmp_path / "ssh_config").write_text("")
    env = {"GPUHPC_CONFIG": str(tmp_path / "config.toml"), "GPUHPC_SITE_CONFIG": str(tmp_path / "site.toml"),
           "GPUHPC_SSH_CONFIG": str(tmp_path / "ssh_config"), "GPUHPC_LEDGER": "off",
           "GPUHPC_DATA_DIR": str(tmp_path / "data"), "GPUHPC_CMDSERVER": "off"}
    for k in ("GPUHPC_SSH_HOST", "GPUHPC_CLUSTER", "GPUHPC_SSH_KEY", "GPUHPC_SSH_KNOWN_HOSTS"):
        env[k] = ""
    user = sshd["GPUHPC_TEST_SSH_USER"]
    remote = Path(sshd["GPUHPC_TEST_SSH_USER_HOME"]) / "laptop-tests" / uuid.uuid4().hex[:12]
    lap = Laptop(env, tmp_path / "config.toml", known, sshd["GPUHPC_TEST_SSH_USER_KEY"], os.environ.get("SLURM_CONF"),
                 user, sshd["GPUHPC_TEST_SSH_USER_PYTHON"], remote, sshd["GPUHPC_TEST_SSH_USER_HOME"])
    lap.profile("lab")
    yield lap
    shutil.rmtree(remote, ignore_errors=True)


JUMP_TARGET = "behind.gpuhpc.invalid"       # resolves only on the jump host (.invalid: never in DNS)


@dataclass
class JumpHost:
    port: int
    target: str                     # the login node's name, which only the jump host resolves


@pytest.fixture
def jump_host(sshd, laptop, tmp_path):
    """A second sshd, the jump host (127.0.0.1, a free port, the laptop user's own key), in a
    mount namespace of its own whose /etc/hosts names the login node (the sshd on :2222)
    ``behind.gpuhpc.invalid``: nowhere else does that name resolve, so a client reaches the login
    node by that name only through the jump host. Both host keys go into the laptop's
    known_hosts. Stopped at the end."""
    import socket

    from polling import wait_for

    d = tmp_path / "jump"
    d.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_ed25519")], check=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_ed25519\nPidFile {d}/sshd.pid\n"
        f"AuthorizedKeysFile .ssh/authorized_keys\nAllowUsers {laptop.user}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nAllowTcpForwarding yes\n")
    (d / "hosts").write_text(f"127.0.0.1 localhost\n127.0.0.1 {JUMP_TARGET}\n")
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             'mount --bind "$0" /etc/hosts && exec /usr/sbin/sshd -D -e -f "$1"',
                             str(d / "hosts"), str(d / "sshd_config")], stdout=log, stderr=subprocess.STDOUT)
    try:
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, 30, f"the jump sshd on 127.0.0.1:{port}",
                 abort=lambda: proc.poll() is not None and f"sshd exited: {(d / 'sshd.log').read_text()}")
        target_key = open(sshd["GPUHPC_TEST_SSH_KNOWN_HOSTS"]).read().split()[1:3]
        jump_key = (d / "host_ed25519.pub").read_text().split()[:2]
        with open(laptop.known_hosts, "a") as kh:
            kh.write(f"[127.0.0.1]:{port} {' '.join(jump_key)}\n[{JUMP_TARGET}]:2222 {' '.join(target_key)}\n")
        yield JumpHost(port, JUMP_TARGET)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
