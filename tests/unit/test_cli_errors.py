"""The CLI's error contract: bad input exits 2 with one line, no traceback."""
from __future__ import annotations

import subprocess
import sys

from gpuhpc.cli.main import main


def test_unknown_command_and_missing_argument_exit_2(capsys):
    assert main(["nosuch"]) == 2
    assert main(["conf", "render"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_submit_fast_path_bad_input_is_one_line_exit_2():
    res = subprocess.run([sys.executable, "-c", "import sys; from gpuhpc.cli.submit import fast_main; "
                          "sys.exit(fast_main(['--name', 'a\\nb', '--dry-run', '--', 'true']))"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ") and "name" in res.stderr
    assert res.stdout == ""
