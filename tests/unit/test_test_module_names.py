"""pytest imports a test module outside a package by its basename (rootdir, prepend mode): two
``test_x.py`` in plain directories collide ("import file mismatch") and the collection stops, so
`scripts/test.sh --fast` (which collects tests/unit beside tests/integration) fails. A module in a
package (an ``__init__.py`` beside it) is imported by its dotted name, so at most one module of a
basename may live outside packages."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_plain_test_modules_share_a_name():
    where: dict[str, list[Path]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" not in path.parts:
            where[path.name].append(path)
    plain = {name: [str(p.relative_to(TESTS)) for p in paths if not (p.parent / "__init__.py").exists()]
             for name, paths in where.items()}
    clashes = {name: paths for name, paths in plain.items() if len(paths) > 1}
    assert clashes == {}, f"rename one of each (or make their directories packages): {clashes}"
