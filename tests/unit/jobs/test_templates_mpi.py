"""The mpi template checks the program's MPI (ldd) against srun's plugin: Open MPI 5 needs
PMIx, MPICH without libpmix needs PMI2; a mismatch fails clearly instead of starting N
one-rank jobs. Fake libraries, ompi_info and srun; no Slurm needed."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs a C compiler")


def _program(tmp_path: Path, soname: str) -> Path:
    """A binary linked against a fake MPI library called ``soname``."""
    lib = tmp_path / "mpi" / "lib"
    lib.mkdir(parents=True)
    (tmp_path / "mpi.c").write_text("int MPI_Init(void *a, void *b) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(lib / soname),
                    str(tmp_path / "mpi.c")], check=True)
    (lib / soname.split(".so")[0].__add__(".so")).symlink_to(soname)
    (tmp_path / "main.c").write_text("int MPI_Init(void *, void *); int main(void) { return MPI_Init(0, 0); }\n")
    prog = tmp_path / "a.out"
    subprocess.run(["gcc", "-o", str(prog), str(tmp_path / "main.c"), f"-L{lib}", f"-l{soname[3:].split('.so')[0]}",
                    f"-Wl,-rpath,{lib}"], check=True)
    return prog


def _run(tmp_path: Path, prog: Path, mpi: str, listed: str, ompi_version: str | None = None):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/srun.log\n'
                                 f'case "$*" in *--mpi=list*) printf "MPI plugin types are...\\n{listed}\\n";; esac\n')
    (bindir / "scontrol").write_text("#!/bin/sh\nexit 0\n")
    if ompi_version:
        (tmp_path / "mpi" / "bin").mkdir()
        (tmp_path / "mpi" / "bin" / "ompi_info").write_text(f'#!/bin/sh\necho "Open MPI v{ompi_version}"\n')
        (tmp_path / "mpi" / "bin" / "ompi_info").chmod(0o755)
    for f in bindir.iterdir():
        f.chmod(0o755)
    spec = JobSpec(command=(str(prog),), template="mpi", mpi=mpi, resources=Resources(nodes=2, gpus=4),
                   checkpoint_dir=str(tmp_path / "ck"))
    (tmp_path / "job.sh").write_text(render(spec))
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "SLURM_JOB_ID": "3",
                              "SLURM_NTASKS": "8"})
    log = (tmp_path / "srun.log").read_text() if (tmp_path / "srun.log").exists() else ""
    return res.returncode, res.stderr, log


def test_open_mpi_5_with_pmi2_fails_clearly(tmp_path):
    rc, err, _ = _run(tmp_path, _program(tmp_path, "libmpi.so.40"), "pmi2", "  pmi2\n  pmix", ompi_version="5.0.3")
    assert rc == 1 and "Open MPI 5" in err and "needs srun --mpi=pmix" in err, err


def test_open_mpi_5_without_pmix_in_srun_fails_in_auto(tmp_path):
    rc, err, log = _run(tmp_path, _program(tmp_path, "libmpi.so.40"), "auto", "  pmi2", ompi_version="5.0.3")
    assert rc == 1 and "no MPI interface that Open MPI 5" in err, err
    assert "--mpi=pmi2 --nodes=1" not in log                         # pmi2 not even tried


def test_open_mpi_5_gets_pmix(tmp_path):
    rc, err, log = _run(tmp_path, _program(tmp_path, "libmpi.so.40"), "auto", "  pmi2\n  pmix", ompi_version="5.0.3")
    assert rc == 0, err
    assert "--mpi=pmix --cpus-per-task" in log


def test_mpich_gets_pmi2_even_where_pmix_is_offered(tmp_path):
    rc, err, log = _run(tmp_path, _program(tmp_path, "libmpi.so.12"), "auto", "  pmi2\n  pmix")
    assert rc == 0, err
    assert "--mpi=pmi2 --cpus-per-task" in log and "MPICH" in err
