"""The layering of docs/DEVELOPING.md, enforced: the import contracts in pyproject.toml
(``[tool.importlinter]``, run here through ``lint-imports``) and "only gpuhpc.slurm builds Slurm
command lines", which is not an import and is checked on the syntax tree. Both read the source
only: nothing is imported from gpuhpc and nothing needs to run."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "gpuhpc"

SLURM_COMMANDS = frozenset({"sbatch", "srun", "salloc", "squeue", "sacct", "sacctmgr", "scontrol", "scancel",
                            "sinfo", "sstat", "sreport", "sprio", "sshare"})
# words that follow a command name in a command line written as one string ("scontrol show config")
_SUBCOMMANDS = frozenset({"show", "update", "requeue", "requeuehold", "reconfigure", "hold", "release",
                          "add", "modify", "delete", "list", "create", "cluster", "user"})

# (file, literal) -> why it is not a command line. Keep each reason true; a stale entry fails.
ALLOWED: dict[tuple[str, str], str] = {
    ("gpuhpc/jobs/api.py", "squeue"): 'Job.info()\'s "source" label: which query answered',
    ("gpuhpc/jobs/api.py", "sacct"): 'Job.info()\'s "source" label: which query answered',
    ("gpuhpc/ledger/ingest.py", "sacct"): "the ingest source's name, stored in the ledger (IngestState)",
}


def _lint_imports() -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(exe), "--no-cache", str(REPO / "pyproject.toml")], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_import_contracts_are_kept():
    proc = _lint_imports()
    assert proc.returncode == 0, f"lint-imports: a layering contract is broken\n{proc.stdout}\n{proc.stderr}"
    assert "0 broken" in proc.stdout


def _looks_like_a_command(text: str) -> bool:
    words = text.split()
    if not words or words[0] not in SLURM_COMMANDS:
        return False
    return len(words) == 1 or words[1].startswith("-") or words[1] in _SUBCOMMANDS


def slurm_command_literals(root: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(file, line, literal) for every string literal outside gpuhpc/slurm that is a Slurm
    command name, or a command line starting with one (``"scontrol show config"``)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.startswith("gpuhpc/slurm/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _looks_like_a_command(node.value):
                found.append((rel, node.lineno, node.value.strip()))
    return found


def test_only_gpuhpc_slurm_builds_slurm_command_lines():
    found = slurm_command_literals()
    bad = [f"{f}:{line}: {text!r}" for f, line, text in found if (f, text.split()[0]) not in ALLOWED]
    assert not bad, ("Slurm command lines are built only in gpuhpc/slurm/commands.py and run through "
                     "SlurmClient; move these there (or, for a literal that is not a command, add it to "
                     "ALLOWED with the reason):\n  " + "\n  ".join(bad))
    stale = set(ALLOWED) - {(f, text.split()[0]) for f, _, text in found}
    assert not stale, f"ALLOWED entries no longer needed: {sorted(stale)}"


def test_the_command_check_sees_what_it_should(tmp_path):
    pkg = tmp_path / "gpuhpc"
    (pkg / "slurm").mkdir(parents=True)
    (pkg / "slurm" / "commands.py").write_text('ARGV = ["sbatch", "--parsable"]\n')
    (pkg / "ledger.py").write_text('A = ["sacctmgr", "-i", "add"]\nB = f"scontrol {1}"\nC = "scontrol show config"\n'
                                   'D = "sbatch option"\nE = "squeue failed: ..."\n')
    found = sorted((f, text) for f, _, text in slurm_command_literals(pkg))
    assert found == [("gpuhpc/ledger.py", "sacctmgr"), ("gpuhpc/ledger.py", "scontrol"),
                     ("gpuhpc/ledger.py", "scontrol show config")]
