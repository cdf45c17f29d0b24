"""The one registry of GPUHPC_* environment variables (gpuhpc.config.ENV): every name the code, the
job templates and the scripts use is in it, nothing in it is unused, docs/configuration.md's table
is the one it generates, and gpuhpc.config.getenv returns each value typed."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuhpc import config
from gpuhpc.errors import UserInputError

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("gpuhpc", "scripts", "job-templates")
# a GPUHPC_ name on its own (not the tail of another name such as click's _GPUHPC_COMPLETE)
NAME = re.compile(r"(?<![A-Za-z0-9_])GPUHPC_[A-Z0-9_]+")
REGISTRY = re.compile(r"^ENV: dict\[str, EnvVar\] = \{.*?^\)\}$", re.S | re.M)
TABLE = re.compile(r"<!-- env-table: start[^>]*-->\n(.*?)<!-- env-table: end -->", re.S)


def names_in(root: Path = REPO, *, registry_too: bool = True) -> dict[str, str]:
    """{name: the first file that holds it} over gpuhpc/, scripts/ and job-templates/. A name that
    ends in ``_`` is a family's prefix in a comment (``GPUHPC_TEST_SSH_*``). ``registry_too=False``:
    not the names in the registry's own entries (gpuhpc/config.py's ``ENV``)."""
    found: dict[str, str] = {}
    for top in SCANNED:
        for path in sorted((root / top).rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            if not registry_too and path == root / "gpuhpc" / "config.py":
                text = REGISTRY.sub("", text)
            for name in NAME.findall(text):
                found.setdefault(name, path.relative_to(root).as_posix())
    return found


def unregistered(found: dict[str, str], registry=None) -> list[str]:
    registry = config.ENV if registry is None else registry
    return sorted(f"{name} ({where})" for name, where in found.items()
                  if name not in registry and not (name.endswith("_") and any(k.startswith(name) for k in registry)))


def test_every_gpuhpc_variable_in_the_code_is_registered():
    bad = unregistered(names_in())
    assert not bad, ("GPUHPC_* variables the code uses that gpuhpc.config.ENV does not register (add an EnvVar: "
                     "name, type, default, one line of doc; then regenerate docs/configuration.md's table with "
                     "`python -m gpuhpc.config --env-table`):\n  " + "\n  ".join(bad))


def test_every_registered_variable_is_used():
    stale = sorted(set(config.ENV) - set(names_in(registry_too=False)))
    assert not stale, f"registered in gpuhpc.config.ENV but used nowhere: {stale}"


def test_the_scan_sees_names_and_prefixes_and_skips_other_names(tmp_path):
    (tmp_path / "gpuhpc").mkdir()
    (tmp_path / "scripts").mkdir()
    (tmp_path / "job-templates").mkdir()
    (tmp_path / "gpuhpc" / "a.py").write_text('os.environ.get("GPUHPC_NEW_THING")\n"_GPUHPC_COMPLETE"\n')
    (tmp_path / "scripts" / "b.sh").write_text("echo $GPUHPC_TEST_SSH_* ${GPUHPC_SLURM_URL_SHA256:-}\n")
    (tmp_path / "gpuhpc" / "config.py").write_text('x = "GPUHPC_READ"\nENV: dict[str, EnvVar] = {v.name: v for v in (\n'
                                                    '    EnvVar("GPUHPC_ONLY_REGISTERED", str, None, "x"),\n)}\n')
    assert set(names_in(tmp_path)) - set(names_in(tmp_path, registry_too=False)) == {"GPUHPC_ONLY_REGISTERED"}
    (tmp_path / "gpuhpc" / "config.py").unlink()
    found = names_in(tmp_path)
    assert found == {"GPUHPC_NEW_THING": "gpuhpc/a.py", "GPUHPC_TEST_SSH_": "scripts/b.sh",
                     "GPUHPC_SLURM_URL_SHA256": "scripts/b.sh"}
    assert unregistered(found) == ["GPUHPC_NEW_THING (gpuhpc/a.py)"]


def test_each_entry_has_a_type_a_default_of_that_type_and_one_line_of_doc():
    for name, var in config.ENV.items():
        assert var.name == name and NAME.fullmatch(name), name
        assert var.type in (str, int, float, bool), name
        assert var.default is None or isinstance(var.default, var.type), name
        assert var.doc.strip() and "\n" not in var.doc, name


def test_the_docs_table_is_the_registrys():
    text = (REPO / "docs" / "configuration.md").read_text()
    block = TABLE.search(text)
    assert block, "docs/configuration.md has no env-table block"
    assert block.group(1) == config.env_table(), ("docs/configuration.md's table is not the registry's: "
                                                  "regenerate it with `python -m gpuhpc.config --env-table`")


def test_getenv_types_values_and_refuses_what_is_not_of_its_type():
    env = {"GPUHPC_SNAPSHOT_MAX_MB": " 250 ", "GPUHPC_STOP_TIMEOUT": "7.5", "GPUHPC_CACHE_VERIFY": "full",
           "GPUHPC_CHECKPOINT_SYNC_S": "  "}
    assert config.getenv("GPUHPC_SNAPSHOT_MAX_MB", env) == 250
    assert config.getenv("GPUHPC_STOP_TIMEOUT", env) == 7.5
    assert config.getenv("GPUHPC_CACHE_VERIFY", env) == "full"
    assert config.getenv("GPUHPC_CHECKPOINT_SYNC_S", env) == 2.0            # blank: the default
    assert config.getenv("GPUHPC_CMDSERVER_IDLE", {}) == 900.0              # unset: the default
    assert config.getenv("GPUHPC_DB_URL", {}) is None
    with pytest.raises(UserInputError) as exc:
        config.getenv("GPUHPC_SNAPSHOT_MAX_MB", {"GPUHPC_SNAPSHOT_MAX_MB": "lots"})
    assert exc.value.field == "GPUHPC_SNAPSHOT_MAX_MB" and "'lots' is not an integer" in str(exc.value)
    with pytest.raises(KeyError):
        config.getenv("GPUHPC_NOT_REGISTERED", {})


def test_getenv_reads_booleans(monkeypatch):
    monkeypatch.setitem(config.ENV, "GPUHPC_FLAG", config.EnvVar("GPUHPC_FLAG", bool, False, "a flag"))
    assert [config.getenv("GPUHPC_FLAG", {"GPUHPC_FLAG": v}) for v in ("1", "Yes", "off", "")] == [True, True, False,
                                                                                                   False]
    with pytest.raises(UserInputError, match="is not true or false"):
        config.getenv("GPUHPC_FLAG", {"GPUHPC_FLAG": "maybe"})
    monkeypatch.setenv("GPUHPC_FLAG", "true")
    assert config.getenv("GPUHPC_FLAG") is True                             # this process's environment
