"""The layering of docs/DEVELOPING.md, enforced: the import contracts in pyproject.toml
(``[tool.importlinter]``, run here through ``lint-imports``) and "only gpuhpc.slurm builds Slurm
command lines" and "no module uses another module's private names", which are not import
contracts and are checked on the syntax tree. All read the source only: nothing is imported
from gpuhpc and nothing needs to run."""
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
    ("gpuhpc/jobs/handle.py", "squeue"): 'Job.info()\'s "source" label: which query answered',
    ("gpuhpc/jobs/handle.py", "sacct"): 'Job.info()\'s "source" label: which query answered',
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


def import_cycles(package: str = "gpuhpc") -> list[list[str]]:
    """Every set of modules that import one another in a circle (strongly connected components
    of the module import graph, deferred and TYPE_CHECKING imports included, a package's
    ``__init__`` a module like any other). no-cycles in pyproject.toml compares siblings only."""
    import grimp

    sys.path.insert(0, str(REPO))
    try:
        graph = grimp.build_graph(package, cache_dir=None)
    finally:
        sys.path.remove(str(REPO))
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in edges:                      # Tarjan, iterative (no recursion limit)
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            for j in range(i, len(edges[node])):
                nxt = edges[node][j]
                if nxt not in index:
                    work += [(node, j + 1), (nxt, 0)]
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
    return out


def test_no_module_import_cycle():
    cycles = import_cycles()
    assert not cycles, ("modules that import one another (a function-level import counts too): move what "
                        "both need into a module below both (docs/DEVELOPING.md, Rules):\n  "
                        + "\n  ".join(" <-> ".join(c) for c in cycles))


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


# ------------------------------------------------------------------ private names stay private
# (importer, "module.name") -> why it may use another module's private name. Keep each reason
# true; a stale entry fails.
PRIVATE_ALLOWED: dict[tuple[str, str], str] = {}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def private_uses(root: Path = PACKAGE) -> list[tuple[str, int, str]]:
    """(importer, line, "module.name") for every private name of one gpuhpc module that another
    uses: ``from gpuhpc.x import _y``, ``x._y`` on a module bound by an import, and a private
    module (``gpuhpc.p._m``) imported from outside its package ``gpuhpc.p``."""
    files = {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    found = []
    for me, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        here = me if me in packages else me.rpartition(".")[0]
        bound: dict[str, str] = {}          # local name -> gpuhpc module

        def check_module(mod: str, line: int) -> None:
            parent, _, last = mod.rpartition(".")
            if _private(last) and not (me == parent or me.startswith(parent + ".")):
                found.append((me, line, mod))

        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    base = f"{anchor}.{base}" if base else anchor
                if base.partition(".")[0] != root.name:
                    continue
                check_module(base, node.lineno)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in files:
                        bound[alias.asname or alias.name] = full
                        check_module(full, node.lineno)
                    elif _private(alias.name) and base != me:
                        found.append((me, node.lineno, full))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.partition(".")[0] == root.name:
                        check_module(alias.name, node.lineno)
                        if alias.asname:
                            bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                    and bound.get(node.value.id, me) != me):
                found.append((me, node.lineno, f"{bound[node.value.id]}.{node.attr}"))
    return sorted(set(found))


def test_no_module_uses_another_modules_private_names():
    found = private_uses()
    bad = [f"{me}:{line}: {name}" for me, line, name in found if (me, name) not in PRIVATE_ALLOWED]
    assert not bad, ("a private name (a leading underscore) belongs to its module: make it public in the "
                     "module where it belongs, or move it (PRIVATE_ALLOWED takes an entry with its reason "
                     "only when truly needed):\n  " + "\n  ".join(bad))
    stale = set(PRIVATE_ALLOWED) - {(me, name) for me, _, name in found}
    assert not stale, f"PRIVATE_ALLOWED entries no longer needed: {sorted(stale)}"


def test_the_private_name_check_sees_what_it_should(tmp_path):
    pkg = tmp_path / "gpuhpc"
    (pkg / "a").mkdir(parents=True)
    for f in ("__init__.py", "a/__init__.py", "a/_impl.py"):
        (pkg / f).write_text("")
    (pkg / "a" / "low.py").write_text("def _hidden(): ...\ndef shown(): ...\n_CONST = 1\n")
    (pkg / "a" / "mine.py").write_text("from gpuhpc.a import _impl\nfrom . import _impl as i2\n")   # own package
    (pkg / "b.py").write_text(
        "from gpuhpc.a.low import _hidden, shown\n"
        "def f():\n"
        "    from gpuhpc.a import low\n"
        "    import gpuhpc.a.low as lo\n"
        "    return low._CONST + lo._CONST + low.shown() + low.__name__.count('')\n"
        "from gpuhpc.a import _impl\n"
        "import gpuhpc.a._impl\n")
    got = sorted({(me, name) for me, _, name in private_uses(pkg)})
    assert got == [("gpuhpc.b", "gpuhpc.a._impl"), ("gpuhpc.b", "gpuhpc.a.low._CONST"),
                   ("gpuhpc.b", "gpuhpc.a.low._hidden")]
