"""The command server and its compiled client, without Slurm: what runs through the server
behaves as the plain Python CLI does (output, exit code, stdin, env, cwd, signals), commands
do not see each other's environment, and every way of not using the server falls back to
the Python CLI. (tests/integration/cmdserver submits through it on the real cluster.)"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gpuhpc.cmdserver import server

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


def test_cwd_umask_and_stdin_are_the_callers(cmd_client, tmp_path, shared_fixtures):
    (tmp_path / "job.yaml").write_text("name: from-cwd\npartition: cpu\ncommand: [sleep, '1']\n")
    res = cmd_client.run("submit", "--file", "job.yaml", "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "--job-name=from-cwd" in res.stdout

    dump = shared_fixtures / "ibnetdiscover" / "ndr-dgx-multirail.out"
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
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err

    proc = subprocess.Popen([cmd_client.path, "topology", "from-ibnetdiscover", "-"], env=cmd_client.env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    proc.kill()                       # SIGKILL: nothing is forwarded; the worker sees the hang-up
    proc.wait(timeout=10)
    deadline = time.monotonic() + 20
    while True:                       # the worker held the other end of our pipe: once it has
        try:                          # gone, writing fails
            proc.stdin.write(b"x" * 65536)
            proc.stdin.flush()
        except BrokenPipeError:
            break
        assert time.monotonic() < deadline, "the worker outlived its client"
        time.sleep(0.2)


def test_fallbacks_run_the_python_cli(cmd_client, tmp_path):
    # off: never touches the server
    res = cmd_client.run("submit", "--dry-run", "--", "true", env={"GPUHPC_CMDSERVER": "off",
                                                                  "GPUHPC_RUNTIME_DIR": str(tmp_path / "r1")})
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    assert not (tmp_path / "r1").exists()
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
    # different PYTHON* settings than the server's: served by the Python CLI, same result
    res = cmd_client.run("submit", "--dry-run", "--", "true", env={"PYTHONWARNINGS": "ignore"})
    assert res.returncode == 0 and "#SBATCH" in res.stdout


def test_autostart_and_stop(make_cmd_client):
    c = make_cmd_client()
    assert c.pid() is None
    assert c.run("cmdserver", "stop").returncode == 0     # managing it never starts one
    time.sleep(1.0)
    assert c.pid() is None and not list(c.runtime.glob("*.sock"))
    first = c.run("submit", "--dry-run", "--", "true")       # no server: Python CLI + start one
    assert first.returncode == 0
    deadline = time.monotonic() + 60
    while not c.pid():
        assert time.monotonic() < deadline, "no server was started"
        time.sleep(0.2)
    while not Path(c.socket).exists():
        assert time.monotonic() < deadline
        time.sleep(0.1)
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
    deadline = time.monotonic() + 30
    while c.pid() == pid:
        assert time.monotonic() < deadline, "the server kept running after its code changed"
        time.sleep(0.2)
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
    deadline = time.monotonic() + 10
    while c.pid() == pid:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert Path(c.socket).exists()
    res = c.run("submit", "--dry-run", "--", "true")     # refused connection: Python CLI + a new server
    assert res.returncode == 0 and "#SBATCH" in res.stdout
    new = c.start()
    assert new != pid
    _same(c.run("submit", "--dry-run", "--", "true"), res)
