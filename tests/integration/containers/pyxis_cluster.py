"""A private one-node Slurm controller whose plugstack.conf loads pyxis, with enroot and pyxis
built by scripts/build-containers.sh into its own prefix (own ports, state, logs and enroot
directories under one directory in /var/tmp; no accounting; a few seconds). Never the shared
cluster's plugstack: every job of every user there would load it. Its node is a GPU node of
stand-ins: gres gpu:4 on device nodes without a driver, and tests/standins/nvidia-container-cli on slurmd's
PATH (enroot's 98-nvidia hook calls it for an image that asks for GPUs), with the role's
90-gpuhpc-slurm-gpus.sh hook. Used by test_pyxis_private.py and bench/container_start.py."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport.local import LocalRunner
from polling import wait_for

ROOT = Path(__file__).resolve().parents[3]
NAME = "gpuhpcpyxis"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16937, 16938, 17331
GPUS = 4
HOOK = ROOT / "ansible/roles/gpuhpc_containers/files/90-gpuhpc-slurm-gpus.sh"
STANDINS = ROOT / "tests/standins"


def _conf(base: Path, auth_info: str) -> str:
    return f"""ClusterName={NAME}
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
AuthType=auth/munge
CredType=cred/munge
AuthInfo={auth_info}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
PlugStackConfig={base}/plugstack.conf
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerParameters=batch_sched_delay=0,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
NodeName=pyx-node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port={NODE_PORT} CPUs=2 RealMemory=1000 Gres=gpu:{GPUS} State=UNKNOWN
PartitionName=pyx Nodes=pyx-node1 Default=YES MaxTime=INFINITE State=UP
"""


def logs(base: Path) -> str:
    """The private cluster's logs' last lines, for a failure's message (the dir is removed)."""
    return "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:])
                     for f in sorted((base / "log").glob("*.log")))


def _stop(base: Path) -> None:
    for name in ("slurmd-pyx-node1.pid", "slurmctld.pid"):
        try:
            pid = int((base / "run" / name).read_text())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            continue
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), 30, f"{name} to stop")


SQUASH_OPTIONS = "-noI -noD -noF -noX -no-duplicates"


def registry_image(tag: str = "1") -> str:
    """The local registry's test image (tag ``ngc``: its NGC-style twin) pinned by digest
    (scripts/services/registry.sh start)."""
    script = str(ROOT / "scripts/services/registry.sh")
    started = subprocess.run(["bash", script, "start"], capture_output=True, text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    if tag != "1":
        started = subprocess.run(["bash", script, "image", tag], capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stderr
    return started.stdout.strip().splitlines()[-1]           # 127.0.0.1:PORT#gpuhpc/test@sha256:…


@contextlib.contextmanager
def pyxis_cluster() -> Iterator[tuple[SlurmClient, dict, Path]]:
    """(client, environment for Slurm commands and gpuhpc, the cluster's directory)."""
    # short: slurmstepd's socket lives in the spool dir, and a Unix socket path has 108 bytes
    base = Path(tempfile.mkdtemp(prefix="gpuhpc-pyx-", dir="/var/tmp"))
    prefix = base / "p"
    build = subprocess.run(["bash", str(ROOT / "scripts/build-containers.sh"), "--prefix", str(prefix)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    # pyxis hands enroot only PATH: its settings are in its enroot.conf (per-node runtime dirs)
    with open(prefix / "etc" / "enroot" / "enroot.conf", "a") as fh:
        fh.write(f"ENROOT_RUNTIME_PATH {base}/enroot/run/$(id -u)\nENROOT_CACHE_PATH {base}/enroot/cache/$(id -u)\n"
                 f"ENROOT_DATA_PATH {base}/enroot/data/$(id -u)\nENROOT_TEMP_PATH {base}/enroot/tmp\n"
                 f"ENROOT_ALLOW_HTTP yes\nENROOT_SQUASH_OPTIONS {SQUASH_OPTIONS}\n")
    shutil.copy(HOOK, prefix / "etc" / "enroot" / "hooks.d" / HOOK.name)
    enroot_dirs = ("enroot", "enroot/tmp", "enroot/run", "enroot/cache", "enroot/data")
    for d in ("state", "spool", "log", "run", "dev", *enroot_dirs):
        (base / d).mkdir(parents=True, exist_ok=True)
    for i in range(GPUS):          # gres wants character devices: NVIDIA's major, no driver behind it
        os.mknod(base / "dev" / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(195, i))
    (base / "gres.conf").write_text(f"AutoDetect=off\nNodeName=pyx-node1 Name=gpu File={base}/dev/nvidia[0-{GPUS - 1}]\n")
    # ordinary users' jobs: enroot makes their directories (per uid) in these
    base.chmod(0o755)
    for d in enroot_dirs:
        (base / d).chmod(0o1777)
    # container_scope=global: pyxis' job epilog (scope job) looks for enroot on
    # /usr/local/bin:/usr/bin:/bin only, and this enroot is in the test's prefix
    (base / "plugstack.conf").write_text(
        f"required {prefix}/lib/slurm/spank_pyxis.so runtime_path={base}/pyxis container_scope=global\n")
    shared = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30,
                            check=True).stdout
    auth = next((line.split("=", 1)[1].strip() for line in shared.splitlines()
                 if line.startswith("AuthInfo")), "(null)")
    conf = base / "slurm.conf"
    conf.write_text(_conf(base, auth.replace("(null)", "")))
    # slurmd's PATH reaches enroot's hooks (pyxis passes PATH only): enroot, then the stand-ins
    env = {**os.environ, "SLURM_CONF": str(conf), "PATH": f"{prefix}/bin:{STANDINS}:{os.environ['PATH']}"}
    client = SlurmClient(LocalRunner(env={"SLURM_CONF": str(conf)}))
    try:
        subprocess.run(["slurmctld", "-f", str(conf)], env=env, check=True, timeout=60)
        subprocess.run(["slurmd", "-f", str(conf), "-N", "pyx-node1"], env=env, check=True, timeout=60)
        wait_for(lambda: "idle" in client.run(["sinfo", "-h", "-o", "%t"], check=False).stdout, 60,
                 "the private pyxis cluster's node to be idle")
        yield client, env, base
    finally:
        for job_id in client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split():
            client.run(["scancel", job_id], check=False)
        client.run(["scontrol", "shutdown"], check=False)
        _stop(base)
        shutil.rmtree(base, ignore_errors=True)


