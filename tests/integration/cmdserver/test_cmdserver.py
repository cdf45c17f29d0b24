"""The command server and its compiled client, without Slurm: what runs through the server
behaves as the plain Python CLI does (output, exit code, stdin, env, cwd, signals), commands
do not see each other's environment, every way of not using the server falls back to the
Python CLI (and the tests observe which path ran), and the config decides whether a server
may start at all. (tests/integration/jobs/test_jobs_cmdserver.py submits through it on the
real cluster.) These compile C and fork servers: integration tests."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gpuhpc.cmdserver import server
from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

REPO = Path(__file__).resolve().parents[3]
CLUSTER = REPO / "examples" / "clusters" / "local.yaml"


def _same(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


@pytest.mark.parametrize("args", [
    ("submit", "--partition", "cpu", "--time", "15m", "--name", "x; touch pwned", "--dry-run", "--",
     "echo", "$(touch pwned2)", "naïve 'quote'"),
    ("submit", "--gpus", "2", "--gpu-type", "h100", "--time", "1d", "--dry-run", "--", "true"),
    ("submit", "--nodes", "0", "--dry-run", "--", "true"),          # bad input: exit 2
    ("submit", "--bogus"),                                          # usage error: exit 2
    ("submit", "--help"),
    ("conf", "validate", str(CLUSTER)),
    ("nosuch",),
    (),
])
def test_output_and_exit_code_match_the_python_cli(cmd_client, tmp_path, args):
    via_server = cmd_client.run(*args, cwd=tmp_path)
    _same(via_server, cmd_client.run_python(*args, cwd=tmp_path))
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


def test_bad_input_is_one_line_exit_2(cmd_client):
    res = cmd_client.run("submit", "--time", "forever", "--dry-run", "--", "true")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "time" in res.stderr


def test_each_command_gets_its_own_environment(cmd_client, tmp_path):
    outs = []
    for i in range(3):
        res = cmd_client.run("submit", "--partition", "cpu", "--dry-run", "--", "true",
                             env={"GPUHPC_LOG_DIR": str(tmp_path / f"logs{i}")})
        assert res.returncode == 0, res.stderr
        outs.append(res.stdout)
    for i, out in enumerate(outs):
        assert f"--output={tmp_path}/logs{i}/" in out
        assert all(f"logs{j}/" not in out for j in range(3) if j != i)
    # and a variable set for one command is gone for the next
    first = cmd_client.run("submit", "--dry-run", "--", "true", env={"GPUHPC_CHECKPOINT_ROOT": "/ckpt-a"})
    second = cmd_client.run("submit", "--dry-run", "--", "true")
    assert "/ckpt-a/" in first.stdout and "/ckpt-a/" not in second.stdout


def test_cwd_umask_and_stdin_are_the_callers(cmd_client, tmp_path, fixtures_dir):
    (tmp_path / "job.yaml").write_text("name: from-cwd\npartition: cpu\ncommand: [sleep, '1']\n")
    res = cmd_client.run("submit", "--file", "job.yaml", "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "--job-name=from-cwd" in res.stdout

    dump = fixtures_dir / "ibnetdiscover" / "ndr-dgx-multirail.out"
    text = dump.read_text(errors="replace")
    via_stdin = cmd_client.run("topology", "from-ibnetdiscover", "-", input=text)
    _same(via_stdin, cmd_client.run_python("topology", "from-ibnetdiscover", "-", input=text))
    assert via_stdin.returncode == 0 and "SwitchName=" in via_stdin.stdout

    modes = []
    for name, run in (("server", cmd_client.run), ("python", cmd_client.run_python)):
        out = tmp_path / name
        res = run("conf", "render", str(CLUSTER), "--out", str(out), preexec_fn=lambda: os.umask(0o077))
        assert res.returncode == 0, res.stderr
        modes.append({p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()})
        modes[-1]["<dir>"] = stat.S_IMODE(out.stat().st_mode)     # made under the caller's umask
    assert modes[0] == modes[1] and modes[0]["<dir>"] == 0o700


def test_ctrl_c_reaches_the_command_and_a_killed_client_ends_it(cmd_client):
    # a command that blocks reading stdin from us
    proc = subprocess.Popen([cmd_client.path, "topology", "from-ibnetdiscover", "-"], env=cmd_client.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert cmd_client.taken(proc) == "server"      # a worker holds its stdin: the command is running
    proc.send_signal(signal.SIGINT)
    # our end of its stdin stays open until it has exited: closed at once (communicate), the command
    # could read end-of-file and fail on empty input before the forwarded SIGINT reached it
    proc.wait(timeout=30)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err

    proc = subprocess.Popen([cmd_client.path, "topology", "from-ibnetdiscover", "-"], env=cmd_client.env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert cmd_client.taken(proc) == "server"
    proc.kill()                       # SIGKILL: nothing is forwarded; the worker sees the hang-up
    proc.wait(timeout=10)
    def pipe_broken() -> bool:        # the worker held the other end of our pipe: once it has
        try:                          # gone, writing fails
            proc.stdin.write(b"x" * 65536)
            proc.stdin.flush()
        except BrokenPipeError:
            return True
        return False
    wait_for(pipe_broken, 20, "the worker to end with its killed client (our pipe to break)", interval=0.2)


def test_fallbacks_run_the_python_cli(cmd_client, tmp_path):
    assert cmd_client.who_runs() == "server"
    # off: never touches the server
    res = cmd_client.run("submit", "--dry-run", "--", "true", env={"GPUHPC_CMDSERVER": "off",
                                                                  "GPUHPC_RUNTIME_DIR": str(tmp_path / "r1")})
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    assert not (tmp_path / "r1").exists()
    assert cmd_client.who_runs(env={"GPUHPC_CMDSERVER": "off"}) == "python"
    # noautostart without a server: the Python CLI runs and no server is started
    res = cmd_client.run("submit", "--dry-run", "--", "true", env={"GPUHPC_CMDSERVER": "noautostart",
                                                                  "GPUHPC_RUNTIME_DIR": str(tmp_path / "r2")})
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    assert not list((tmp_path / "r2").glob("*.sock"))
    # a socket directory others can write to is refused (a planted socket would get our env)
    shared = tmp_path / "r3"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    res = cmd_client.run("submit", "--dry-run", "--", "true", env={"GPUHPC_RUNTIME_DIR": str(shared)})
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    time.sleep(0.5)
    assert not list(shared.iterdir())
    # different PYTHON* settings than the server's: the server declines (its log says so) and
    # the Python CLI gives the same result
    cmd_client.start()                # (in a shared checkout, someone's edit may have stopped it)
    before = len(cmd_client.declines())
    res = cmd_client.run("submit", "--dry-run", "--", "true", env={"PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    declined = cmd_client.declines()[before:]
    assert len(declined) == 1 and "declined submit: python_env: PYTHONWARNINGS differs" in declined[0]
    assert cmd_client.who_runs(env={"PYTHONWARNINGS": "ignore"}) == "python"
    cmd_client.start()
    assert cmd_client.who_runs() == "server"


def test_callers_limits_and_groups_must_match_the_workers(cmd_client):
    """A job inherits the submitting process's limits and gid: a caller whose differ from
    the worker's is never served (the server logs why) and runs the Python CLI itself."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cases = {
        "nofile": (["bash", "-c", f'ulimit -Sn {soft - 1}; exec "$@"', "-"], f"limits: RLIMIT_NOFILE {soft - 1}/{hard} != {soft}/{hard}"),
        "stack": (["bash", "-c", 'ulimit -s 4321; exec "$@"', "-"], "limits: RLIMIT_STACK 4424704/4424704"),
        "gid": (["setpriv", "--regid", "65534", "--keep-groups", "--"], "identity: uid/gid"),
        "groups": (["setpriv", "--groups", "0,65534", "--"], "identity: groups"),
    }
    for name, (wrapper, reason) in cases.items():
        cmd_client.start()            # (in a shared checkout, someone's edit may have stopped it)
        before = len(cmd_client.declines())
        assert cmd_client.who_runs(*wrapper) == "python", name
        new = cmd_client.declines()[before:]
        assert len(new) == 1 and f"declined topology: {reason}" in new[0], (name, new)
    # the same limits set again, and the same groups in another order: served
    same = ["bash", "-c", f'ulimit -Sn {soft}; ulimit -Hn {hard}; exec "$@"', "-"]
    cmd_client.start()
    assert cmd_client.who_runs(*same) == "server"
    assert cmd_client.who_runs() == "server"


def test_the_config_decides_whether_a_server_starts(make_cmd_client):
    c = make_cmd_client()
    submit = ("submit", "--dry-run", "--", "true")
    for user, site in (("", ""), ("[cmdserver]\nenabled = false\n", ""),
                       ("[cmdserver]\nenabled = true\n", "[cmdserver]\nallowed = false\n"),
                       ("[cmdserver]\nenabled = yes\n", "")):
        c.user_config.write_text(user)
        c.site_config.write_text(site)
        res = c.run(*submit)                     # no server: the Python CLI, and none is started
        assert res.returncode == 0 and "#SBATCH" in res.stdout, res.stderr
        status = c.run_python("cmdserver", "status", "--json")
        assert json.loads(status.stdout)["enabled"] is False, status.stdout
        with pytest.raises(Exception, match="command server is|config"):
            c.start()
        time.sleep(1.0)
        assert c.pid() is None and not Path(c.socket).exists(), (user, site)
        assert c.who_runs() == "python"
        refused = c.run_python("cmdserver", "start")
        assert refused.returncode == 2 and refused.stderr.startswith("error: ")
    # enabled, and the site allows it: the first call starts one
    c.user_config.write_text("[cmdserver]\nenabled = true\n")
    c.site_config.write_text("[cmdserver]\nallowed = true\n")
    assert c.run(*submit).returncode == 0
    wait_for(lambda: c.pid() and Path(c.socket).exists(), 60, "the first call to start a server", interval=0.2)
    assert c.who_runs() == "server"
    # the site forbids it while it runs: the next command is declined, and the server stops
    pid = c.pid()
    c.site_config.write_text("[cmdserver]\nallowed = false\n")
    assert c.run(*submit).returncode == 0
    wait_for(lambda: c.pid() != pid, 30, "the server to stop once the site forbade it", interval=0.2)
    assert any("declined submit: stale" in line for line in c.declines())
    assert c.who_runs() == "python" and c.pid() is None


def test_autostart_and_stop(make_cmd_client):
    c = make_cmd_client()
    assert c.pid() is None
    assert c.run("cmdserver", "stop").returncode == 0     # managing it never starts one
    time.sleep(1.0)
    assert c.pid() is None and not list(c.runtime.glob("*.sock"))
    first = c.run("submit", "--dry-run", "--", "true")       # no server: Python CLI + start one
    assert first.returncode == 0
    wait_for(lambda: c.pid() and Path(c.socket).exists(), 60, "the first call to start a server (pid and socket)",
             interval=0.1)
    _same(c.run("submit", "--dry-run", "--", "true"), first)
    assert stat.S_IMODE(os.stat(c.runtime).st_mode) == 0o700
    c.stop()
    assert c.pid() is None and not Path(c.socket).exists()


def test_a_code_change_retires_the_server(make_cmd_client):
    c = make_cmd_client()
    pid = c.start()
    module = Path(server.__file__)
    st = module.stat()
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))     # same times: only an inotify event
    wait_for(lambda: c.pid() != pid, 30, "the server to retire after its code changed", interval=0.2)
    res = c.run("submit", "--dry-run", "--", "true", env={"GPUHPC_CMDSERVER": "noautostart"})
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    c.stop()


def test_request_parsing_rejects_garbage(cmd_client):
    import socket

    for payload in (b"", b"NOPE\x00\x00\x00\x10", b"GPH1\xff\xff\xff\xff"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(cmd_client.socket)
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        s.settimeout(15)
        assert s.recv(16) == b""      # no fds, bad magic, too long: closed, nothing ran
        s.close()
    assert cmd_client.run("submit", "--dry-run", "--", "true").returncode == 0


def test_a_killed_server_is_replaced(make_cmd_client):
    c = make_cmd_client()
    pid = c.start()
    os.kill(pid, signal.SIGKILL)                 # leaves its socket file behind
    wait_for(lambda: c.pid() != pid, 10, f"the killed server {pid} to be gone", interval=0.1)
    assert Path(c.socket).exists()
    res = c.run("submit", "--dry-run", "--", "true")     # refused connection: Python CLI + a new server
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    new = c.start()
    assert new != pid
    _same(c.run("submit", "--dry-run", "--", "true"), res)


def test_install_client_is_opt_in_and_uninstall_restores_the_console_script(make_cmd_client, tmp_path):
    c = make_cmd_client()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    dest = bin_dir / "gpuhpc"
    script = "#!/usr/bin/python3\n# the console script pip wrote\n"
    dest.write_text(script)
    install = ("cmdserver", "install-client", "--dest", str(dest))
    c.user_config.write_text("")
    refused = c.run_python(*install)
    assert refused.returncode == 2 and "enabled = true" in refused.stderr and dest.read_text() == script
    c.user_config.write_text("[cmdserver]\nenabled = true\n")
    assert c.run_python(*install).returncode == 0
    assert dest.read_bytes()[:4] == b"\x7fELF" and (bin_dir / ".gpuhpc.console-script").read_text() == script
    assert c.run_python(*install).returncode == 0            # again: the kept script stays pip's
    assert (bin_dir / ".gpuhpc.console-script").read_text() == script
    # --if-disabled leaves an enabled user's client alone
    uninstall = ("cmdserver", "uninstall-client", "--dest", str(dest))
    assert c.run_python(*uninstall, "--if-disabled").returncode == 0 and dest.read_bytes()[:4] == b"\x7fELF"
    res = c.run_python(*uninstall)
    assert res.returncode == 0 and dest.read_text() == script and not (bin_dir / ".gpuhpc.console-script").exists()
    assert "nothing to do" in c.run_python(*uninstall).stdout
    # without a kept script, uninstall writes one for this interpreter, which runs the CLI
    assert c.run_python(*install).returncode == 0
    (bin_dir / ".gpuhpc.console-script").unlink()
    c.user_config.write_text("[cmdserver]\nenabled = false\n")
    assert c.run_python(*uninstall, "--if-disabled").returncode == 0
    assert dest.read_text().startswith("#!") and os.access(dest, os.X_OK)
    res = subprocess.run([str(dest), "submit", "--dry-run", "--", "true"], env=c.env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and "#SBATCH" in res.stdout
