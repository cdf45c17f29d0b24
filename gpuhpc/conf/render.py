"""Render ``slurm-conf/*.j2`` for a cluster spec.

The Jinja environment matches Ansible's ``template`` module defaults (``trim_blocks=True``,
``lstrip_blocks=False``, trailing newline kept), so the roles produce byte-identical files from
the same context (``tests/integration/cluster/test_collection.py`` proves it, with the built collection).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuhpc.config import getenv
from gpuhpc.errors import GpuhpcError
from gpuhpc.fsutil import bundled_dir

# output file -> template; slurmdbd.conf only when the spec has a slurmdbd section
CONF_FILES = ("slurm.conf", "gres.conf", "cgroup.conf", "topology.conf", "slurmdbd.conf")
STORAGE_PASS_ENV = "GPUHPC_SLURMDBD_STORAGE_PASS"
STORAGE_PASS_PLACEHOLDER = "CHANGE-ME"


def templates_dir() -> Path:
    """``slurm-conf/`` of this checkout (``GPUHPC_SLURM_CONF_DIR`` overrides)."""
    env = getenv("GPUHPC_SLURM_CONF_DIR")
    path = Path(env) if env else bundled_dir("slurm-conf")
    if not (path / "slurm.conf.j2").is_file():
        raise GpuhpcError(f"slurm-conf templates not found at {path}", hint="set GPUHPC_SLURM_CONF_DIR")
    return path


def _env(path: Path):
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(path)),
        trim_blocks=True,
        lstrip_blocks=False,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )


def render_context(context: dict[str, Any], *, storage_pass: str | None = None,
                   template_dir: Path | None = None) -> dict[str, str]:
    """Render every config file for an already-built context. Returns {filename: text}."""
    # the same JSON round trip Ansible's `from_json` does, so both sides see the same types
    ctx = json.loads(json.dumps(context))
    env = _env(template_dir or templates_dir())
    out: dict[str, str] = {}
    for name in CONF_FILES:
        if name == "slurmdbd.conf" and ctx.get("accounting") is None:
            continue
        out[name] = env.get_template(f"{name}.j2").render(
            gpuhpc_conf=ctx, gpuhpc_storage_pass=storage_pass or STORAGE_PASS_PLACEHOLDER)
    return out


def render_spec(spec, *, storage_pass: str | None = None,
                slurm_version: str | None = None) -> tuple[dict[str, str], list[str]]:
    """Validate ``spec`` fully, then render for ``slurm_version`` (default: Debian 12's 22.05).
    Returns ({filename: text}, warnings)."""
    from gpuhpc.conf.context import DEFAULT_SLURM_VERSION, build_context, slurm_release
    from gpuhpc.conf.validate import validate

    slurm_release(slurm_version or DEFAULT_SLURM_VERSION)
    warnings = validate(spec)
    return render_context(build_context(spec, slurm_version=slurm_version or DEFAULT_SLURM_VERSION),
                          storage_pass=storage_pass), warnings


def render_nccl_profiles(spec, *, template_dir: Path | None = None) -> dict[str, str]:
    """``{"nccl-<node group>.env": text}`` for each node group with GPUs: the NCCL/IB defaults
    that gpuhpc job scripts source from ``/etc/gpuhpc/nccl.env`` on that group's nodes (a value
    already in a job's environment wins). From ``slurm-conf/nccl.env.j2``."""
    from gpuhpc.conf.context import build_context

    ctx = json.loads(json.dumps(build_context(spec)))
    template = _env(template_dir or templates_dir()).get_template("nccl.env.j2")
    return {f"nccl-{p['group']}.env": template.render(gpuhpc_conf=ctx, profile=p) for p in ctx["nccl_profiles"]}


def write_files(files: dict[str, str], out_dir: Path) -> list[Path]:
    """Write rendered files (slurmdbd.conf mode 0600, the rest 0644)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out_dir / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o600 if name == "slurmdbd.conf" else 0o644)
        tmp.replace(path)
        written.append(path)
    return written
