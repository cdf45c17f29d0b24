"""gpuhpc.config: the site and user config files, and the command server setting they give."""
from __future__ import annotations

import pytest

from gpuhpc import config
from gpuhpc.errors import UserInputError


@pytest.fixture
def files(tmp_path):
    site, user = tmp_path / "site.toml", tmp_path / "user.toml"
    return site, user, {"GPUHPC_SITE_CONFIG": str(site), "GPUHPC_CONFIG": str(user)}


def test_paths(files, monkeypatch, tmp_path):
    site, user, env = files
    assert config.config_paths(env) == (str(site), str(user))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config.config_paths({}) == ("/etc/gpuhpc/config.toml", str(tmp_path / "xdg" / "gpuhpc" / "config.toml"))


def test_the_command_server_is_off_by_default(files):
    _site, _user, env = files
    setting = config.cmdserver(env)                # neither file exists
    assert not setting.enabled and "enabled = true" in setting.hint


@pytest.mark.parametrize("site, user, mode, enabled, why", [
    ("", "[cmdserver]\nenabled = true\n", None, True, "enabled in"),
    ("[cmdserver]\nallowed = true\n", "[cmdserver]\nenabled = true\n", None, True, "enabled in"),
    ("", "[cmdserver]\nenabled = false\n", None, False, "off (the default)"),
    ("[cmdserver]\nallowed = false\n", "[cmdserver]\nenabled = true\n", None, False, "forbidden by the site"),
    ("", "[cmdserver]\nenabled = true\n", "off", False, "GPUHPC_CMDSERVER=off"),
    ("", "[cmdserver]\nenabled = true\n", "noautostart", True, "enabled in"),
])
def test_user_enables_site_forbids_env_forces_off(files, site, user, mode, enabled, why):
    site_path, user_path, env = files
    site_path.write_text(site)
    user_path.write_text(user)
    if mode:
        env = {**env, "GPUHPC_CMDSERVER": mode}
    setting = config.cmdserver(env)
    assert setting.enabled is enabled and why in setting.reason


def test_the_site_veto_needs_no_valid_user_file(files):
    site_path, user_path, env = files
    site_path.write_text("[cmdserver]\nallowed = false\n")
    user_path.write_text("this is not toml")
    assert not config.cmdserver(env).enabled


@pytest.mark.parametrize("which, text, words", [
    ("user", "[cmdserver\nenabled = true\n", ["not a valid TOML file"]),
    ("user", "[cmdserver]\nenabled = \"yes\"\n", ["cmdserver.enabled must be true or false", "'yes'"]),
    ("user", "[cmdserver]\nenabeld = true\n", ["unknown key cmdserver.enabeld", "valid here: cmdserver.enabled"]),
    ("user", "[cmdserver]\nallowed = true\n", ["cmdserver.allowed belongs in the site config"]),
    ("site", "[cmdserver]\nenabled = true\n", ["cmdserver.enabled belongs in the user config"]),
    ("site", "[nosuch]\nx = 1\n", ["unknown section [nosuch]"]),
    ("site", "cmdserver = 1\n", ["cmdserver must be a table"]),
    ("site", b"\xff\xfe", ["not a valid TOML file"]),
])
def test_a_bad_file_is_one_error_naming_file_and_key(files, which, text, words):
    site_path, user_path, env = files
    path = site_path if which == "site" else user_path
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(UserInputError) as err:
        config.cmdserver(env)
    line = err.value.one_line()
    assert line.startswith(f"{path}: ") and "\n" not in line
    for w in words:
        assert w in line


def test_an_unreadable_file_is_an_error(files):
    _site, user_path, env = files
    user_path.mkdir()
    with pytest.raises(UserInputError, match="cannot read the user config"):
        config.cmdserver(env)


def test_importing_it_reads_nothing_and_loads_no_heavy_module():
    import subprocess
    import sys

    code = ("import sys, gpuhpc.config; "
            "print(sorted({'tomllib', 'platformdirs', 'typer', 'rich', 'pydantic'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_users_site_override_adds_a_veto_never_lifts_the_sites(files, tmp_path, monkeypatch):
    site_path, user_path, env = files
    real = tmp_path / "etc-config.toml"          # stands for /etc/gpuhpc/config.toml
    monkeypatch.setattr(config, "SITE_CONFIG", str(real))
    real.write_text("[cmdserver]\nallowed = false\n")
    site_path.write_text("[cmdserver]\nallowed = true\n")      # the user's own "site" file
    user_path.write_text("[cmdserver]\nenabled = true\n")
    monkeypatch.setattr(config.os, "geteuid", lambda: 1000)
    setting = config.cmdserver(env)
    assert not setting.enabled and str(real) in setting.reason
    real.write_text("")                                           # the site allows it
    site_path.write_text("[cmdserver]\nallowed = false\n")       # the override may still forbid
    assert not config.cmdserver(env).enabled
    site_path.write_text("")
    assert config.cmdserver(env).enabled
    monkeypatch.setattr(config.os, "geteuid", lambda: 0)          # root points wherever it likes
    real.write_text("[cmdserver]\nallowed = false\n")
    assert config.cmdserver(env).enabled
