"""pyxis' image importer (pyxis >= 0.24, ``importer=PATH`` in plugstack.conf; docs/containers.md):
the point where a plain ``srun``/``sbatch --container-image`` is held to the site's policy too.

pyxis runs ``PATH get docker://REF`` as the job's user, with the job's environment, before it
creates the container, and reads the squashfs file's path from stdout; ``PATH release`` after.
``get`` refuses (exit 1, the reason on stderr, which pyxis prints) an image the site's
``[containers]`` policy does not allow on the job's partition (``SLURM_JOB_PARTITION``): a
registry not listed, or a tag where pins are required. The policy is ``/etc/gpuhpc/config.toml``'s
(a job's ``GPUHPC_SITE_CONFIG`` may add rules, never lift them: :func:`site_policies`). An allowed
image pinned by digest comes from the node image cache when the site has one (imported once per
node); anything else is imported with ``enroot import`` into a directory of this step with a name
nobody can know before (``mkdtemp``, 0700: another user cannot make or link the file's name
first) that ``release`` removes. The site installs a two-line script as PATH: ``exec PYTHON -m gpuhpc.containers.importer "$@"``.
``PATH gpus 1,2`` prints the UUIDs of Slurm's GPUs 1 and 2 on this node (the role's enroot GPU hook:
:mod:`gpuhpc.containers.gpus`).
"""
from __future__ import annotations

import glob
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from gpuhpc.containers.cache import enroot_import, ensure, settings
from gpuhpc.containers.gpus import job_gpu_uuids
from gpuhpc.containers.image import check_image
from gpuhpc.errors import GpuhpcError


def _step_prefix() -> tuple[Path, str]:
    """(the directory for this step's import: ``ENROOT_TEMP_PATH``, ``TMPDIR`` or /tmp, the job's;
    the name prefix of this user's step directories there)."""
    base = Path(os.environ.get("ENROOT_TEMP_PATH") or os.environ.get("TMPDIR") or "/tmp")
    step = f"{os.environ.get('SLURM_JOB_ID', 'nojob')}.{os.environ.get('SLURM_STEP_ID', 'nostep')}"
    return base, f"gpuhpc-import-{os.geteuid()}-{step}."


def _step_dir() -> Path:
    """A new directory of this step's import: a name nobody could know before (mkdtemp: made with
    O_EXCL semantics, mode 0700, never a path that existed), in a base only root, this user or the
    sticky bit guard (else another user could rename it away and put theirs in its place). enroot
    writes the squashfs file inside it, where nobody else can make, replace or link a name."""
    base, prefix = _step_prefix()
    try:
        st = os.stat(base)
    except OSError as exc:
        raise GpuhpcError(f"the import directory {base} (ENROOT_TEMP_PATH, else TMPDIR): {exc.strerror}") from None
    if st.st_uid not in (0, os.geteuid()) or (st.st_mode & 0o022 and not st.st_mode & 0o1000):
        raise GpuhpcError(f"the import directory {base} (uid {st.st_uid}, mode {st.st_mode & 0o7777:04o}) lets other "
                          "users replace what is made in it", hint="set TMPDIR to a directory of yours, or a sticky one")
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def get(uri: str) -> str:
    """The squashfs file of ``uri`` (``docker://REF``), after the site's policy allowed it."""
    ref = check_image(uri.removeprefix("docker://"), os.environ.get("SLURM_JOB_PARTITION") or None,
                      field="--container-image")
    s = settings()
    if s.enabled and ref.pinned:
        path, _ = ensure(ref, s)
        return str(path)
    d = _step_dir()
    try:
        enroot_import(ref, d / "image.sqsh")
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    return str(d / "image.sqsh")


def release() -> None:
    """Remove this step's import directories: this user's own (never a symlink, nor another's of
    the same prefix)."""
    base, prefix = _step_prefix()
    for p in base.glob(f"{glob.escape(prefix)}*"):
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            shutil.rmtree(p, ignore_errors=True)


def main(argv: list[str]) -> int:
    try:
        if len(argv) == 2 and argv[0] == "get":
            print(get(argv[1]))
            return 0
        if argv == ["release"]:
            release()
            return 0
        if len(argv) == 2 and argv[0] == "gpus":            # the role's enroot GPU hook (gpuhpc.containers.gpus)
            print(",".join(job_gpu_uuids(argv[1])))
            return 0
    except GpuhpcError as exc:
        if argv[:1] == ["gpus"]:
            sys.stderr.write(f"gpuhpc: cannot give the container the job's GPUs {argv[1]} by UUID: {exc}\n")
            return 1
        hint = f" ({exc.hint})" if getattr(exc, "hint", None) else ""
        sys.stderr.write(f"gpuhpc: image refused or not imported: {exc}{hint}\n")
        return 1
    sys.stderr.write("usage: importer get docker://REF | importer release | importer gpus INDICES\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
