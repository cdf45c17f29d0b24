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
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from private_slurm import PrivateSlurm

ROOT = Path(__file__).resolve().parents[3]
NAME = "gpuhpcpyxis"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16937, 16938, 17331
GPUS = 4
HOOK = ROOT / "ansible/roles/gpuhpc_containers/files/90-gpuhpc-slurm-gpus.sh"
STANDINS = ROOT / "tests/standins"
ENROOT_DIRS = ("enroot", "enroot/tmp", "enroot/run", "enroot/cache", "enroot/data")


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
def pyxis_cluster() -> Iterator[PrivateSlurm]:
    """The private cluster (tests/private_slurm.py), started; ``.env`` runs Slurm commands and
    gpuhpc on it (enroot and the stand-ins on PATH), ``.base`` is its directory."""
    cluster = PrivateSlurm(
        NAME, ports=(CTLD_PORT, SLURMD_PORT, NODE_PORT),
        nodes={"pyx-node1": f"CPUs=2 RealMemory=1000 Gres=gpu:{GPUS} State=UNKNOWN"},
        partitions=["PartitionName=pyx Nodes=pyx-node1 Default=YES MaxTime=INFINITE State=UP"],
        extra={"PlugStackConfig": "{base}/plugstack.conf", "GresTypes": "gpu"},
        extra_dirs=("dev", *ENROOT_DIRS))

    def prepare(base: Path) -> None:
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
        for i in range(GPUS):          # gres wants character devices: NVIDIA's major, no driver behind it
            os.mknod(base / "dev" / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(195, i))
        (base / "gres.conf").write_text(f"AutoDetect=off\nNodeName=pyx-node1 Name=gpu File={base}/dev/nvidia[0-{GPUS - 1}]\n")
        # ordinary users' jobs: enroot makes their directories (per uid) in these
        base.chmod(0o755)
        for d in ENROOT_DIRS:
            (base / d).chmod(0o1777)
        # container_scope=global: pyxis' job epilog (scope job) looks for enroot on
        # /usr/local/bin:/usr/bin:/bin only, and this enroot is in the test's prefix
        (base / "plugstack.conf").write_text(
            f"required {prefix}/lib/slurm/spank_pyxis.so runtime_path={base}/pyxis container_scope=global\n")
        # slurmd's PATH reaches enroot's hooks (pyxis passes PATH only): enroot, then the stand-ins
        cluster.env["PATH"] = f"{prefix}/bin:{STANDINS}:{os.environ['PATH']}"

    cluster.start(before_start=prepare)
    try:
        yield cluster
    finally:
        cluster.stop()
