"""Render a :class:`~gpuhpc.jobs.spec.JobSpec` into an sbatch script from ``job-templates/``.

Quoting rules (a template is code):
- shell context: every user value is :func:`shlex.quote`d here, in :func:`context`; the
  command becomes a bash array of quoted words, never a string to ``eval``;
- ``#SBATCH`` lines are parsed by sbatch, not by a shell: sbatch understands double quotes
  and backslash escapes (not single quotes), so those values use :func:`sbatch_quote`;
- control characters were rejected when the spec was built (exit 2).

Templates only *substitute* these finished strings (no filters, no logic on job values).
So a template is rendered by jinja2 once, with a sentinel per variable, into a "skeleton"
cached under ``~/.cache/gpuhpc/templates`` (keyed by the template files' size and mtime and
the gpuhpc version); each submission fills the skeleton in. ``gpuhpc submit`` thus does not
import jinja2 (~30 ms) on every call. :func:`render_jinja` renders directly (tests prove
both give the same text).
"""
from __future__ import annotations

import os
import re
import shlex
import sys
import zlib
from pathlib import Path

from gpuhpc.config import getenv
from gpuhpc.errors import UserInputError
from gpuhpc.fsutil import bundled_dir, write_atomic
from gpuhpc.jobs.spec import SETUP_RUNNER, JobSpec, check_text, container_srun_args, sbatch_options

_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./\[\]-]+$")
_SENTINEL = re.compile("\x00([a-z_]+)\x00")
VARIABLES = ("sbatch_lines", "version", "template", "grace", "max_requeues", "env_lines",
             "checkpoint_dir", "command", "nproc_per_node", "mpi", "python", "collective_timeout",
             "torchrun_args", "container", "stop_timeout", "setup", "setup_runner")


_BUNDLED_TEMPLATES = bundled_dir("job-templates")


def template_dir() -> Path:
    """``$GPUHPC_TEMPLATE_DIR``, else ``job-templates/`` (the checkout's, or the wheel's copy)."""
    env = getenv("GPUHPC_TEMPLATE_DIR")
    if env:
        return Path(env)
    return _BUNDLED_TEMPLATES


def sbatch_quote(value: object) -> str:
    """Quote a value for an ``#SBATCH --opt=VALUE`` line (sbatch's own tokenizer)."""
    text = check_text(str(value), "sbatch option")
    if _PLAIN.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _q(value: object) -> str:
    return shlex.quote(check_text(str(value), "value"))


def default_checkpoint_dir() -> str:
    """``$GPUHPC_CHECKPOINT_ROOT/%j``, else ``<gpuhpc data dir>/checkpoints/%j``."""
    root = getenv("GPUHPC_CHECKPOINT_ROOT")
    if not root:
        from gpuhpc.fsutil import data_dir

        root = os.path.join(data_dir(), "checkpoints")
    return os.path.join(os.path.expanduser(root), "%j")


def _runs_python(spec: JobSpec) -> bool:
    """A torchrun command that names its interpreter (``python -u train.py``) keeps it, with
    its flags: torchrun runs it as a program (``--no_python``: torch 1.x knows only this spelling, 2.x both) instead of dropping it."""
    cmd = spec.command
    return spec.template == "torchrun" and bool(re.fullmatch(r"python[0-9.]*", os.path.basename(cmd[0])))


def collective_timeout_s(grace_s: int) -> int:  # noqa: ARG001  (the run's: not tied to the grace)
    """``GPUHPC_COLLECTIVE_TIMEOUT_S``, the run's collective timeout: 600 s, torch's default (a
    slow evaluation or compilation is not a hang); the short one is :func:`stop_timeout_s`."""
    return 600


def stop_timeout_s(grace_s: int) -> int:
    """``GPUHPC_STOP_COLLECTIVE_TIMEOUT_S``, the stop handshake's: three quarters of the grace
    period (at least 10 s), so a hung collective there fails while there is still time to requeue."""
    return max(10, grace_s * 3 // 4)


def context(spec: JobSpec) -> dict[str, str]:
    """Every template variable as a finished (quoted) string."""
    from gpuhpc import __version__

    sbatch_lines = "\n".join(
        f"#SBATCH --{opt}" + ("" if value is None else f"={sbatch_quote(value)}")
        for opt, value in sbatch_options(spec.resources, spec, batch_signal=True))
    return {
        "sbatch_lines": sbatch_lines,
        "version": __version__,
        "template": spec.template,
        "grace": str(spec.grace_s),
        "max_requeues": str(spec.max_requeues),
        "env_lines": "\n".join(f"export {k}={_q(v)}" for k, v in sorted(spec.env.items())),
        "checkpoint_dir": _q(spec.checkpoint_dir or default_checkpoint_dir()),
        "command": " ".join(_q(arg) for arg in spec.command),
        "nproc_per_node": str(max(1, spec.resources.gpus)),
        "mpi": _q(spec.mpi),
        "python": _q(sys.executable or "python3"),
        "collective_timeout": str(collective_timeout_s(spec.grace_s)),
        "stop_timeout": str(stop_timeout_s(spec.grace_s)),
        "torchrun_args": "--no_python " if _runs_python(spec) else "",
        # the setup lines, one per line, as one quoted word (each line was checked: no newline,
        # no control character, no template syntax); the templates run them with setup_runner
        "setup": shlex.quote("\n".join(spec.setup_lines)),
        "setup_runner": SETUP_RUNNER,
        **container_context(spec),
    }


def container_context(spec: JobSpec) -> dict[str, str]:
    """``container``: pyxis' options for the program's srun step in the job's image, quoted
    words with a trailing blank ("" without an image); the single template runs its program
    in a one-task srun step when they are there. One container name per job (``gpuhpc-JOBID``):
    every step of the job on a node reuses the imported image instead of unpacking it again."""
    args = container_srun_args(spec.resources, spec.workdir)
    if not args:
        return {"container": ""}
    from gpuhpc.containers.cache import shell_image_option   # the node image cache (docs/containers.md)

    words = [shell_image_option(spec.resources.image or "") or _q(args[0]), *(_q(a) for a in args[1:])]
    return {"container": " ".join(words) + ' --container-name="gpuhpc-$SLURM_JOB_ID" '}


def _template_path(name: str) -> Path:
    path = template_dir() / f"{name}.sbatch.j2"
    if not path.is_file():
        raise UserInputError(f"template {name!r} not found in {template_dir()}", field="template")
    return path


def render_jinja(name: str, ctx: dict[str, str]) -> str:
    """Render template ``name`` with jinja2 (no cache)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(template_dir())),
                             undefined=jinja2.StrictUndefined, autoescape=False,
                             keep_trailing_newline=True)
    text = env.get_template(_template_path(name).name).render(**ctx)
    return text if text.endswith("\n") else text + "\n"


def _cache_dir() -> Path:
    from gpuhpc.fsutil import cache_dir

    return cache_dir() / "templates"


def _skeleton(name: str) -> str:
    """The template rendered with a sentinel per variable; cached on disk."""
    from gpuhpc import __version__

    _template_path(name)
    tdir = template_dir()
    key = "%08x" % zlib.crc32(repr((str(tdir), __version__, sorted(
        (e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(tdir) if e.name.endswith(".j2")
    ))).encode())
    path = _cache_dir() / f"{name}-{key}.sh"
    try:
        return path.read_text()
    except OSError:
        pass
    text = render_jinja(name, {v: f"\x00{v}\x00" for v in VARIABLES})
    try:
        write_atomic(path, text)
    except OSError:
        pass        # a read-only home: render without the cache
    return text


def render(spec: JobSpec) -> str:
    """The sbatch script for ``spec`` (nothing is submitted)."""
    ctx = context(spec)
    return _SENTINEL.sub(lambda m: ctx[m.group(1)], _skeleton(spec.template))
