"""Render a :class:`~gpuhpc.jobs.spec.JobSpec` into an sbatch script from ``job-templates/``.

Quoting rules (a template is code):
- shell context: every user value goes through the ``q`` filter (:func:`shlex.quote`);
  the command is rendered as a bash array of quoted words, never as a string to ``eval``;
- ``#SBATCH`` lines are parsed by sbatch, not by a shell: sbatch understands double
  quotes and backslash escapes (not single quotes), so those values use
  :func:`sbatch_quote`;
- control characters were rejected when the spec was built (exit 2).
"""
from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.spec import JobSpec, check_text, sbatch_options

_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./\[\]-]+$")


def template_dir() -> Path:
    """``$GPUHPC_TEMPLATE_DIR`` or the repository's ``job-templates/``."""
    env = os.environ.get("GPUHPC_TEMPLATE_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "job-templates"


def sbatch_quote(value: object) -> str:
    """Quote a value for an ``#SBATCH --opt=VALUE`` line (sbatch's own tokenizer)."""
    text = check_text(str(value), "sbatch option")
    if _PLAIN.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def default_checkpoint_dir() -> str:
    """``$GPUHPC_CHECKPOINT_ROOT/%j``, else ``<gpuhpc data dir>/checkpoints/%j``."""
    root = os.environ.get("GPUHPC_CHECKPOINT_ROOT")
    if not root:
        from gpuhpc.jobs.spec import default_log_dir

        root = os.path.join(os.path.dirname(default_log_dir()), "checkpoints")
    return os.path.join(os.path.expanduser(root), "%j")


def _command_for(spec: JobSpec) -> tuple[str, ...]:
    cmd = spec.command
    if spec.template == "torchrun" and re.fullmatch(r"python[0-9.]*", os.path.basename(cmd[0])) and len(cmd) > 1:
        cmd = cmd[1:]     # torchrun runs the script with its own interpreter
    return cmd


def context(spec: JobSpec) -> dict:
    from gpuhpc import __version__

    return {
        "sbatch": sbatch_options(spec.resources, spec, batch_signal=True),
        "version": __version__,
        "template": spec.template,
        "grace": spec.grace_s,
        "max_requeues": spec.max_requeues,
        "env": sorted(spec.env.items()),
        "checkpoint_dir": spec.checkpoint_dir or default_checkpoint_dir(),
        "command": _command_for(spec),
        "nproc_per_node": max(1, spec.resources.gpus),
        "mpi": spec.mpi,
    }


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=True,
        trim_blocks=False, lstrip_blocks=False,
    )
    env.filters["q"] = lambda v: shlex.quote(check_text(str(v), "value"))
    env.filters["sbatch_quote"] = sbatch_quote
    return env


def render(spec: JobSpec) -> str:
    """The sbatch script for ``spec`` (nothing is submitted)."""
    path = template_dir() / f"{spec.template}.sbatch.j2"
    if not path.is_file():
        raise UserInputError(f"template {spec.template!r} not found in {template_dir()}", field="template")
    text = _environment().get_template(path.name).render(**context(spec))
    return text if text.endswith("\n") else text + "\n"
