from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.transport.local import LocalRunner
from gpuhpc.transport.ssh import parse_target


def test_parse_target():
    assert parse_target("alice@login1:2222") == ("alice", "login1", 2222)
    assert parse_target("login1") == (None, "login1", None)      # None: ~/.ssh/config or 22
    with pytest.raises(UserInputError):
        parse_target("login1; rm -rf ~")
    with pytest.raises(UserInputError):
        parse_target("a@b:xx")


def test_local_runner_argv_is_not_a_shell(tmp_path):
    res = LocalRunner().run(["echo", "$(touch pwned); `id`"])
    assert res.stdout.strip() == "$(touch pwned); `id`"
    target = tmp_path / "d" / "f.txt"
    LocalRunner().write_file(str(target), "hi", 0o600)
    assert target.read_text() == "hi" and (target.stat().st_mode & 0o777) == 0o600
