"""A private one-node Slurm controller whose plugstack.conf loads pyxis, with enroot and pyxis
built by scripts/build-containers.sh into its own prefix (own ports, state, logs and enroot
directories under one directory in /var/tmp; no accounting; a few seconds). Never the shared
cluster's plugstack: every job of every user there would load it. Its nodes are GPU nodes of
stand-ins: gres gpu:4 on device nodes without a driver, and tests/standins/nvidia-container-cli on slurmd's
PATH (enroot's 98-nvidia hook calls it for an image that asks for GPUs), with the role's
90-gpuhpc-slurm-gpus.sh hook (rendered: its importer is ``base/gpu-importer``, this checkout's
gpuhpc.containers.importer, which maps the job's GPUs to UUIDs through the NVML the job's
GPUHPC_NVML_MODULE names), and enroot's 50-slurm-pmi and 50-slurm-pytorch hooks enabled as the role
enables them. Used by test_pyxis_private.py and bench/container_start.py.

Two nodes on one host: partition ``pyx`` is pyx-node1 alone, ``pyx2`` both (its jobs are
preempted by those of ``pyxhi``, with the job's signal and a 30 s GraceTime). Two slurmd on one
host would share pyxis' runtime_path and enroot's runtime, data and temp directories (and the
node image cache): the second node's slurmd runs in a mount namespace of its own (``unshare
--mount --propagation slave``, tests/private_slurm.py's ``slurmd_prefix``) where
``base/nodes/pyx-node2/{pyxis,enroot,images}`` are bind-mounted over ``base/{pyxis,enroot,images}``
(the paths in plugstack.conf, enroot.conf and the site's node_cache_dir). pyx-node1 uses
``base/…`` itself: :func:`node_dir` gives a node's directory as seen from the host."""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jinja2
from private_slurm import PrivateSlurm

ROOT = Path(__file__).resolve().parents[3]
NAME = "gpuhpcpyxis"
CTLD_PORT, SLURMD_PORT, NODE_PORT = 16937, 16938, 17331      # node i: NODE_PORT + i - 1
GPUS = 4
NODES = ("pyx-node1", "pyx-node2")
PER_NODE = ("pyxis", "enroot", "images")        # bound per node (the second node's namespace)
HOOK = ROOT / "ansible/roles/gpuhpc_containers/templates/90-gpuhpc-slurm-gpus.sh.j2"
STANDINS = ROOT / "tests/standins"
EXTRA_HOOKS = ("50-slurm-pmi.sh", "50-slurm-pytorch.sh")     # enroot's own, which the role enables
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


PYTHON_REPO = "gpuhpc/python"
_PYTHON_TOOLS = ("sh", "env", "cat", "ls", "id", "echo", "true", "sleep", "mkdir", "rm", "grep", "hostname", "test")


def python_image() -> str:
    """An image with a Python, pushed once to the local registry as ``gpuhpc/python:VERSION-cpV``
    and pinned by digest: Debian's ``/usr/bin/python3.11`` with its standard library, cloudpickle
    (this gpuhpc's, pure Python) in its dist-packages, ``bash``, busybox for the rest, and the
    shared libraries they load, from this host's files (what a debootstrap root would hold, in a
    few seconds and offline). gpuhpc and the test programs come in through a mount and PYTHONPATH
    (gpuhpc's job-side modules are stdlib only)."""
    import cloudpickle

    pinned = registry_image()
    port = pinned.split("#")[0].rsplit(":", 1)[1]
    version = subprocess.run(["/usr/bin/python3.11", "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    dest = f"docker://127.0.0.1:{port}/{PYTHON_REPO}:{version}-cp{cloudpickle.__version__}"
    return f"127.0.0.1:{port}#{PYTHON_REPO}@{_pushed_once(dest, _build_python_image)}"


def _pushed_once(dest: str, build) -> str:
    """The digest of ``dest`` (docker://…) in the local registry: built and pushed first, by
    ``build(work_dir, dest)`` in a scratch directory, when the registry does not have it."""
    def digest() -> str | None:
        res = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", dest],
                             capture_output=True, text=True, timeout=60)
        return res.stdout.strip() if res.returncode == 0 else None

    found = digest()
    if found is None:
        work = Path(tempfile.mkdtemp(prefix="gpuhpc-img-", dir="/var/tmp"))
        try:
            build(work, dest)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        found = digest()
        assert found, f"{dest} was not pushed"
    return found


def _run(*argv: str) -> None:
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{argv}: {res.stderr}"


@contextlib.contextmanager
def _image_root(work: Path, dest: str, tools: tuple[str, ...], os_release: str) -> Iterator[Path]:
    """A usr-merged root filesystem (bin, lib, lib64 -> usr/...) with busybox and ``tools`` linked
    to it, in a fresh OCI layout under ``work``, for the block to fill; then /etc's os-release
    (``os_release``), passwd and group (root only), packed and pushed to ``dest`` (docker://…, v2s2:
    enroot gets 404 for an OCI manifest)."""
    oci, bundle = work / "oci", work / "bundle"
    _run("umoci", "init", "--layout", str(oci))
    _run("umoci", "new", "--image", f"{oci}:img")
    _run("umoci", "unpack", "--image", f"{oci}:img", str(bundle))
    root = bundle / "rootfs"
    for d in ("usr/bin", "usr/lib", "usr/lib64", "etc", "tmp", "root", "proc", "sys", "dev", "home"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        (root / link).symlink_to(target)
    (root / "usr/bin/busybox").write_bytes(Path(shutil.which("busybox")).read_bytes())
    (root / "usr/bin/busybox").chmod(0o755)
    for tool in tools:
        (root / "usr/bin" / tool).symlink_to("busybox")
    yield root
    (root / "etc/os-release").write_text(os_release)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")
    _run("umoci", "repack", "--image", f"{oci}:img", str(bundle))
    _run("umoci", "config", "--image", f"{oci}:img", "--config.cmd", "/bin/sh",
         "--config.env", "PATH=/usr/local/bin:/usr/bin:/bin")
    _run("skopeo", "copy", "--quiet", "--format", "v2s2", "--dest-tls-verify=false", f"oci:{oci}:img", dest)


def _build_python_image(work: Path, dest: str) -> None:
    import cloudpickle

    with _image_root(work, dest, _PYTHON_TOOLS,
                     'NAME="gpuhpc test python image"\nID=gpuhpc-python\nVERSION_ID=3.11\n') as root:
        stdlib = Path("/usr/lib/python3.11")
        shutil.copytree(stdlib, root / "usr/lib/python3.11", symlinks=True,
                        ignore=shutil.ignore_patterns("site-packages", "dist-packages", "test", "idlelib", "tkinter",
                                                      "ensurepip", "lib2to3"))
        binaries = [Path("/usr/bin/python3.11"), Path("/usr/bin/bash"), *stdlib.glob("lib-dynload/*.so")]
        for b in binaries[:2]:
            shutil.copy2(b, root / "usr/bin" / b.name)
        (root / "usr/bin/python3").symlink_to("python3.11")
        shutil.copytree(Path(cloudpickle.__file__).parent, root / "usr/lib/python3/dist-packages/cloudpickle",
                        ignore=shutil.ignore_patterns("__pycache__"))
        _copy_libraries(root, binaries)

def _copy_libraries(root: Path, binaries) -> None:
    """The shared libraries ``binaries`` load (ldd), copied from this host into the image root
    ``root`` under /usr (Debian 12 is usr-merged: lib -> usr/lib, lib64 -> usr/lib64)."""
    libs = set()
    for b in binaries:       # ldd: "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x…)", "/lib64/ld-linux… (0x…)"
        out = subprocess.run(["ldd", str(b)], capture_output=True, text=True, timeout=60).stdout
        libs |= {w for line in out.splitlines() for w in line.split() if w.startswith("/")}
    for lib in libs:
        real = Path(lib).resolve()
        for path in {Path(lib), real}:
            rel = str(path).lstrip("/")
            rel = rel if rel.startswith("usr/") else f"usr/{rel}"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            if not (root / rel).exists():
                shutil.copy2(real, root / rel)


MPI_REPO = "gpuhpc/mpi"
#: Open MPI's and PMIx's plugin directories (Debian 12's libopenmpi3, libpmix2): loaded at run time
MPI_PLUGIN_DIRS = (Path("/usr/lib/x86_64-linux-gnu/openmpi/lib"), Path("/usr/lib/x86_64-linux-gnu/pmix2"))
MPI_HELLO = r"""#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    int rank, size, sum = 0, len;
    char name[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(name, &len);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("rank %d of %d on %s sum %d\n", rank, size, name, sum);
    MPI_Finalize();
    return 0;
}
"""


def mpi_image() -> str:
    """An image with an MPI program, pushed once to the local registry as ``gpuhpc/mpi:OMPI-VERSION``
    and pinned by digest: ``/usr/bin/mpi_hello`` (each rank prints its rank, the world size, its node
    and an MPI_Allreduce of the ranks), built with this host's Open MPI (Debian's libopenmpi-dev, which
    scripts/bootstrap.sh installs), with Open MPI's and PMIx's libraries and plugins and what they
    load, from this host's files; busybox for a shell. No mpirun: srun starts the ranks (``--mpi=pmix``)."""
    pinned = registry_image()
    port = pinned.split("#")[0].rsplit(":", 1)[1]
    mpicc = shutil.which("mpicc")
    assert mpicc, "mpicc (Debian's libopenmpi-dev) is needed; scripts/bootstrap.sh installs it"
    version = subprocess.run([mpicc, "--showme:version"], capture_output=True, text=True, timeout=60,
                             check=True).stdout + subprocess.run(["sha256sum"], input=MPI_HELLO, capture_output=True,
                                                                 text=True, timeout=60, check=True).stdout
    tag = "ompi-" + "".join(c for c in version.split("Open MPI")[-1].split()[0] if c.isalnum() or c == ".") + \
        "-" + version.split()[-2][:12]
    dest = f"docker://127.0.0.1:{port}/{MPI_REPO}:{tag}"
    found = _pushed_once(dest, lambda work, to: _build_mpi_image(work, to, mpicc))
    return f"127.0.0.1:{port}#{MPI_REPO}@{found}"


def _build_mpi_image(work: Path, dest: str, mpicc: str) -> None:
    (work / "hello.c").write_text(MPI_HELLO)
    _run(mpicc, "-O2", "-o", str(work / "mpi_hello"), str(work / "hello.c"))
    with _image_root(work, dest, ("sh", "env", "cat", "ls", "echo", "hostname"),
                     'NAME="gpuhpc test MPI image"\nID=gpuhpc-mpi\nVERSION_ID=1\n') as root:
        shutil.copy2(work / "mpi_hello", root / "usr/bin/mpi_hello")
        plugins = []
        for d in MPI_PLUGIN_DIRS:
            shutil.copytree(d, root / str(d).lstrip("/"), symlinks=True, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("*.a", "*.la", "include"))
            plugins += [p for p in d.rglob("*.so*") if p.is_file() and not p.is_symlink()]
        for share in (Path("/usr/share/openmpi"), Path("/etc/openmpi")):     # help texts, MCA defaults
            if share.is_dir():
                shutil.copytree(share, root / str(share).lstrip("/"), symlinks=True, dirs_exist_ok=True)
        _copy_libraries(root, [work / "mpi_hello", *plugins])

def node_dir(base: Path, node: str, name: str) -> Path:
    """Where ``base/NAME`` (one of PER_NODE) of ``node`` is, seen from the host."""
    return base / name if node == NODES[0] else base / "nodes" / node / name


def _namespace(base: Path, node: str) -> list[str]:
    """The argv before ``node``'s slurmd: none for the first node; a mount namespace of its own,
    with its directories bound over the shared paths, for the others."""
    if node == NODES[0]:
        return []
    script = base / "nodes" / node / "ns.sh"
    binds = "".join(f'mount --bind "{node_dir(base, node, d)}" "{base / d}"\n' for d in PER_NODE)
    script.write_text(f"#!/bin/sh\nset -e\n{binds}exec \"$@\"\n")
    script.chmod(0o755)
    return ["unshare", "--mount", "--propagation", "slave", "--", str(script)]


@contextlib.contextmanager
def pyxis_cluster() -> Iterator[PrivateSlurm]:
    """The private cluster (tests/private_slurm.py), started; ``.env`` runs Slurm commands and
    gpuhpc on it (enroot and the stand-ins on PATH), ``.base`` is its directory."""
    cluster = PrivateSlurm(
        NAME, ports=(CTLD_PORT, SLURMD_PORT, NODE_PORT),
        nodes={n: f"CPUs=2 RealMemory=1000 Gres=gpu:{GPUS} State=UNKNOWN" for n in NODES},
        # pyx2's jobs are preempted by pyxhi's (the job's signal, then 30 s: the local cluster's gpu/gpu-hi)
        partitions=["PartitionName=pyx Nodes=pyx-node1 Default=YES MaxTime=INFINITE State=UP",
                    f"PartitionName=pyx2 Nodes={','.join(NODES)} PriorityTier=1 PreemptMode=REQUEUE GraceTime=30 "
                    "MaxTime=INFINITE State=UP",
                    f"PartitionName=pyxhi Nodes={','.join(NODES)} PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE "
                    "State=UP"],
        extra={"PlugStackConfig": "{base}/plugstack.conf", "GresTypes": "gpu", "PreemptType": "preempt/partition_prio",
               "PreemptMode": "REQUEUE", "SlurmctldParameters": "preempt_send_user_signal"},
        extra_dirs=("dev", "pyxis", "images", *ENROOT_DIRS,
                    *(f"nodes/{n}/{d}" for n in NODES[1:] for d in ("pyxis", "images", *ENROOT_DIRS))),
        slurmd_prefix=lambda node: _namespace(cluster.base, node))

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
        importer = base / "gpu-importer"
        importer.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(ROOT))} exec {shlex.quote(sys.executable)} "
                            "-m gpuhpc.containers.importer \"$@\"\n")
        importer.chmod(0o755)
        hook = prefix / "etc" / "enroot" / "hooks.d" / HOOK.name.removesuffix(".j2")
        jenv = jinja2.Environment(keep_trailing_newline=True)
        jenv.filters["quote"] = shlex.quote
        hook.write_text(jenv.from_string(HOOK.read_text()).render(ansible_managed="rendered by pyxis_cluster.py",
                                                                  gpuhpc_containers_importer=str(importer)))
        hook.chmod(0o755)
        for extra in EXTRA_HOOKS:      # enabled as the role does (gpuhpc_containers_extra_hooks)
            (prefix / "etc" / "enroot" / "hooks.d" / extra).symlink_to(prefix / "share" / "enroot" / "hooks.d" / extra)
        for i in range(GPUS):          # gres wants character devices: NVIDIA's major, no driver behind it
            os.mknod(base / "dev" / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(195, i))
        (base / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={n} Name=gpu File={base}/dev/nvidia[0-{GPUS - 1}]\n" for n in NODES))
        # ordinary users' jobs: enroot makes their directories (per uid) in these
        base.chmod(0o755)
        for n in NODES:
            for d in ENROOT_DIRS:
                node_dir(base, n, d).chmod(0o1777)
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


def shuffled_nvml(where: Path, minors: list[int]) -> dict[str, str]:
    """A job environment whose NVML (for the GPU hook's importer) sees GPUs with the device minor
    numbers ``minors`` in that index order (an HGX board whose /dev/nvidiaN numbering is not its
    PCI bus order): the NVML stand-in (tests/standins/nvml_standin.py, its documented JSON state)
    plus the minor number, which it does not answer. UUID of minor M: ``GPU-minor-M``."""
    state = where / "nvml-state.json"
    state.write_text(json.dumps({"driver": "535.161.08", "gpus": [
        {"name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-minor-{m}", "minor": m} for m in minors]}))
    module = where / "shuffled_nvml.py"
    module.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests')!r})\n"
                      "from standins.nvml_standin import *  # noqa: F403\n\n\n"
                      "def nvmlDeviceGetMinorNumber(h):  # noqa: N802\n    return h.data['minor']\n")
    for p in (where, state, module):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return {"GPUHPC_NVML_MODULE": str(module), "GPUHPC_NVML_STANDIN": str(state)}


def torch_style_image() -> str:
    """The local registry's test image with ``PYTORCH_VERSION`` set (as NGC's PyTorch images set it: what
    enroot's 50-slurm-pytorch hook looks for), pushed once as ``gpuhpc/test:torchenv``, pinned by digest."""
    pinned = registry_image()
    registry = pinned.split("#")[0]
    dest = f"docker://{registry}/gpuhpc/test:torchenv"

    def run(*argv: str) -> str:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"{argv}: {res.stderr}"
        return res.stdout.strip()

    work = Path(tempfile.mkdtemp(prefix="gpuhpc-torchimg-", dir="/var/tmp"))
    try:
        run("skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry}/gpuhpc/test:1", f"oci:{work}/oci:t")
        run("umoci", "config", "--image", f"{work}/oci:t", "--config.env", "PYTORCH_VERSION=2.3.0")
        run("skopeo", "copy", "--quiet", "--format", "v2s2", "--dest-tls-verify=false", f"oci:{work}/oci:t", dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    digest = run("skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}", dest)
    return f"{registry}#gpuhpc/test@{digest}"
