"""Every file under examples/ works as the README and docs use it: CI's README smoke stage (stage q
of scripts/test.sh, with `scripts/quickstart.sh demo`). Cluster specs pass `gpuhpc conf validate`;
sweep files load as `gpuhpc sweep run` loads them, each trial's command renders and names scripts
that exist (nothing is submitted: the quickstart runs examples/sweeps/quick.yaml for real); job
files pass `gpuhpc submit --file F --dry-run`; Python examples compile. A new kind of example file
fails here until it gets a check."""
from __future__ import annotations

import py_compile
import shlex
from pathlib import Path

import pytest

from cli_helpers import gpuhpc
from gpuhpc.sweeps.spec import load_file

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
FILES = sorted(p for p in EXAMPLES.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
IDS = [str(p.relative_to(EXAMPLES)) for p in FILES]


def test_examples_exist():
    kinds = {p.parent.name for p in FILES}
    assert {"clusters", "sweeps", "jobs"} <= kinds, IDS


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_example_file(path: Path):
    kind = path.relative_to(EXAMPLES).parts[0] if len(path.relative_to(EXAMPLES).parts) > 1 else ""
    if path.suffix == ".md":
        assert path.read_text().strip()
    elif path.suffix == ".py":
        py_compile.compile(str(path), doraise=True, cfile=None)
    elif path.suffix in (".yaml", ".yml") and kind == "clusters":
        res = gpuhpc("conf", "validate", str(path), cwd=REPO)
        assert res.returncode == 0, res.stderr
    elif path.suffix in (".yaml", ".yml") and kind == "sweeps":
        spec = load_file(str(path))
        assert spec.n_trials > 0
        for params in spec.generate(0, min(spec.n_trials, 5)):
            argv = shlex.split(spec.render_command(params))
            scripts = [a for a in argv if a.endswith(".py")]
            assert all((REPO / s).is_file() for s in scripts), (path.name, argv)
    elif path.suffix in (".yaml", ".yml") and kind == "sprints":
        from gpuhpc.sprints.spec import load_file as load_sprint

        assert load_sprint(str(path)).configurations()
    elif path.suffix in (".yaml", ".yml"):
        res = gpuhpc("submit", "--file", str(path), "--dry-run", cwd=REPO)
        assert res.returncode == 0, res.stderr
        assert "#SBATCH" in res.stdout
    else:
        pytest.fail(f"examples/{path.relative_to(EXAMPLES)}: no check for this kind of example; add one here")
