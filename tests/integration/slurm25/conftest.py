"""Slurm 25.11, built from source by the collection (scripts/slurm_build.sh, the
gpuhpc_slurm_build role), on a private controller: its own slurmctld and one ``slurmd -N`` from
the build's prefix (tests/private_slurm.py's PrivateSlurm with that prefix first on PATH), and
pyslurm built against it (a ``pip --target`` directory in the build cache, put on sys.path).

Where no build is installed these tests are skipped, saying how to build one; with
``GPUHPC_REQUIRE_SLURM25=1`` (CI's stage, which runs the build first) a missing build fails them.
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from polling import wait_for
from private_slurm import PrivateSlurm, busy_ports

VERSION = os.environ.get("GPUHPC_SLURM_VERSION", "25.11.7")
PYSLURM_VERSION = os.environ.get("GPUHPC_PYSLURM_VERSION", "25.11.2")
PREFIX = Path(os.environ.get("GPUHPC_SLURM25_PREFIX") or f"/opt/gpuhpc/slurm-{VERSION}")
CACHE = Path(os.environ.get("GPUHPC_SLURM_BUILD_CACHE") or Path.home() / ".cache/gpuhpc/slurm-build")
PORTS = (17925, 17926, 17930)       # SlurmctldPort, SlurmdPort, the node's port
DBD_PORT = 17927 + int(os.environ.get("GPUHPC_PRIVATE_SLURM_PORT_OFFSET") or 0)
NODE = "s25-node1"


def _missing(what: str) -> None:
    msg = f"{what}: build it with `bash scripts/slurm_build.sh --pyslurm` (docs/admin.md, Slurm from source)"
    if os.environ.get("GPUHPC_REQUIRE_SLURM25") == "1":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def installed_key() -> str:
    """The build key of the installed package (its version ends in ``+gpuhpc.<key>``)."""
    res = subprocess.run(["dpkg-query", "-W", "-f=${Version}", f"gpuhpc-slurm-{VERSION.rsplit('.', 1)[0]}"],
                         capture_output=True, text=True)
    return res.stdout.rsplit("gpuhpc.", 1)[-1] if res.returncode == 0 and "gpuhpc." in res.stdout else ""


def pyslurm_dir() -> Path | None:
    given = os.environ.get("GPUHPC_PYSLURM_DIR")
    if given:
        return Path(given)
    key = installed_key()
    path = CACHE / key / f"pyslurm-{PYSLURM_VERSION}"
    return path if key and (path / ".done").exists() else None


@pytest.fixture(scope="package")
def slurm25_prefix() -> Path:
    if not (PREFIX / "sbin" / "slurmctld").exists():
        _missing(f"no Slurm {VERSION} under {PREFIX}")
    return PREFIX


def _gres(base: Path) -> None:
    (base / "dev").mkdir(exist_ok=True)
    for i in range(2):
        os.mknod(base / "dev" / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(195, i))
    (base / "gres.conf").write_text(f"AutoDetect=off\nNodeName={NODE} Name=gpu Type=h100 File={base}/dev/nvidia[0-1]\n")


class PrivateDbd:
    """A slurmdbd 25.11 of the private cluster (a 22.05 slurmdbd cannot serve a 25.11 slurmctld): its
    own port and database (``gpuhpc_s25_<pid>``) on the local MariaDB, reached as root over its
    socket; the database is dropped at the end."""

    def __init__(self, base: Path, cluster: str, env: dict[str, str]):
        self.base, self.cluster, self.env = base, cluster, env
        self.db = f"gpuhpc_s25_{os.getpid()}"
        self.pid_file = base / "run" / "slurmdbd.pid"

    def start(self) -> None:
        conf = self.base / "slurmdbd.conf"       # slurmdbd reads it beside $SLURM_CONF
        conf.write_text(f"DbdHost=localhost\nDbdPort={DBD_PORT}\nSlurmUser=root\nAuthType=auth/munge\n"
                        f"PidFile={self.pid_file}\nLogFile={self.base}/log/slurmdbd.log\n"
                        f"StorageType=accounting_storage/mysql\nStorageHost=localhost\nStorageUser=root\n"
                        f"StorageLoc={self.db}\n")
        conf.chmod(0o600)
        subprocess.run(["mariadb", "-e", f"DROP DATABASE IF EXISTS `{self.db}`"], check=True, timeout=60)
        subprocess.run(["slurmdbd"], env=self.env, check=True, timeout=120)
        wait_for(lambda: subprocess.run(["sacctmgr", "-n", "list", "cluster"], env=self.env, capture_output=True,
                                        timeout=30).returncode == 0, 120,
                 f"the private slurmdbd to answer (log: {self.base}/log/slurmdbd.log)", interval=0.5)
        subprocess.run(["sacctmgr", "-i", "add", "cluster", self.cluster], env=self.env, check=True,
                       capture_output=True, timeout=60)

    def stop(self) -> None:
        try:
            pid = int(self.pid_file.read_text())
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not Path(f"/proc/{pid}").exists() or
                     Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z", 60, "slurmdbd to stop")
        except (OSError, ValueError):
            pass
        subprocess.run(["mariadb", "-e", f"DROP DATABASE IF EXISTS `{self.db}`"], check=False, timeout=60)


@pytest.fixture(scope="package")
def slurm25(slurm25_prefix):
    """The private 25.11 cluster with its own 25.11 slurmdbd, started; for the package's tests PATH
    starts with the build's bin/sbin and SLURM_CONF is the private slurm.conf (what pyslurm reads)."""
    dbd: list[PrivateDbd] = []
    cluster = PrivateSlurm(
        "gpuhpcs25", ports=PORTS,
        nodes={NODE: "CPUs=2 RealMemory=500 Gres=gpu:h100:2 State=UNKNOWN"},
        partitions=[f"PartitionName=s25 Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
                    f"PartitionName=s25-hi Nodes={NODE} PriorityTier=10 MaxTime=60 State=UP"],
        extra={"GresTypes": "gpu", "AccountingStorageType": "accounting_storage/slurmdbd",
               "AccountingStorageHost": "localhost", "AccountingStoragePort": str(DBD_PORT),
               "AccountingStorageTRES": "gres/gpu,gres/gpu:h100", "JobAcctGatherType": "jobacct_gather/linux"},
        on_stop=lambda base: [d.stop() for d in dbd])

    def before_start(base: Path) -> None:
        _gres(base)
        dbd.append(PrivateDbd(base, cluster.name, {**os.environ, "SLURM_CONF": str(base / "slurm.conf")}))
        dbd[0].start()

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{slurm25_prefix}/bin:{slurm25_prefix}/sbin:{os.environ['PATH']}")
        assert not busy_ports([DBD_PORT]), f"port {DBD_PORT} (the private slurmdbd's) is in use"
        cluster.start(before_start=before_start)
        with cluster:
            mp.setenv("SLURM_CONF", str(cluster.conf))
            try:
                yield cluster
            finally:
                # a running job's slurmstepd must tell slurmctld it ended before slurmctld stops, or
                # slurmd (25.11) waits on it and does not stop
                cluster.cancel_all(wait=60)


@pytest.fixture(scope="package")
def pyslurm_module(slurm25):
    """pyslurm built against the 25.11 prefix, imported with the private cluster's SLURM_CONF."""
    path = pyslurm_dir()
    if path is None:
        _missing(f"no pyslurm {PYSLURM_VERSION} built against Slurm {VERSION} in {CACHE}")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(path))
        import pyslurm

        yield pyslurm
    sys.modules.pop("pyslurm", None)
