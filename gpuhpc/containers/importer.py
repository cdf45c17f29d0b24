"""pyxis' image importer (pyxis >= 0.24, ``importer=PATH`` in plugstack.conf; docs/containers.md):
the point where a plain ``srun``/``sbatch --container-image`` is held to the site's policy too.

pyxis runs ``PATH get docker://REF`` as the job's user, with the job's environment, before it
creates the container, and reads the squashfs file's path from stdout; ``PATH release`` after.
``get`` refuses (exit 1, the reason on stderr, which pyxis prints) an image the site's
``[containers]`` policy does not allow on the job's partition (``SLURM_JOB_PARTITION``): a
registry not listed, or a tag where pins are required. The policy is ``/etc/gpuhpc/config.toml``'s
(a job's ``GPUHPC_SITE_CONFIG`` may add rules, never lift them: :func:`site_policies`). An allowed
image pinned by digest comes from the node image cache when the site has one (imported once per
node); anything else is imported with ``enroot import`` into a file of this step that ``release``
removes. The site installs a two-line script as PATH: ``exec PYTHON -m gpuhpc.containers.importer "$@"``.
``PATH gpus 1,2`` prints the UUIDs of Slurm's GPUs 1 and 2 on this node (the role's enroot GPU hook:
:mod:`gpuhpc.containers.gpus`).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from gpuhpc.containers.cache import enroot_import, ensure, settings
from gpuhpc.containers.gpus import job_gpu_uuids
from gpuhpc.containers.image import check_image
from gpuhpc.errors import GpuhpcError


def _step_file() -> Path:
    base = os.environ.get("ENROOT_TEMP_PATH") or os.environ.get("TMPDIR") or "/tmp"
    step = f"{os.environ.get('SLURM_JOB_ID', 'nojob')}.{os.environ.get('SLURM_STEP_ID', 'nostep')}"
    return Path(base) / f"gpuhpc-import-{os.geteuid()}-{step}.sqsh"


def get(uri: str) -> str:
    """The squashfs file of ``uri`` (``docker://REF``), after the site's policy allowed it."""
    ref = check_image(uri.removeprefix("docker://"), os.environ.get("SLURM_JOB_PARTITION") or None,
                      field="--container-image")
    s = settings()
    if s.enabled and ref.pinned:
        path, _ = ensure(ref, s)
        return str(path)
    dest = _step_file()
    dest.unlink(missing_ok=True)
    enroot_import(ref, dest)
    return str(dest)


def release() -> None:
    _step_file().unlink(missing_ok=True)


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
