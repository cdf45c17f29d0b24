"""Point 1: a user who prepares root's command server directory (root's runtime dir falls back
to the predictable /tmp/gpuhpc-0 when XDG_RUNTIME_DIR is unset) with a lock file that names
another process, and holds that lock, cannot make root's ``gpuhpc cmdserver stop`` (run by
bootstrap and the test teardown) kill it. GPUHPC_RUNTIME_DIR stands for that path here: the
real /tmp/gpuhpc-0 belongs to the root servers of other tests."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from gpuhpc.cmdserver import lock_path, server_id


def test_a_planted_lock_does_not_make_root_kill_its_pid(hostile):
    victim = subprocess.Popen(["sleep", "300"])              # stands for slurmctld or munged
    rundir = hostile.workdir / "gpuhpc-0"
    lock = lock_path(str(rundir / f"cmd-{server_id()}.sock"))
    holder = None
    try:
        # the user's own private directory, the lock file naming root's process, and the lock held
        assert hostile.run(["mkdir", "-m", "700", str(rundir)]).returncode == 0
        assert hostile.run(["sh", "-c", f'echo {victim.pid} > "$1"', "-", lock]).returncode == 0
        holder = subprocess.Popen(["runuser", "-u", hostile.name, "--", "flock", "-x", lock,
                                   "sh", "-c", "echo locked; exec sleep 300"], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        assert holder.stdout.readline().strip() == "locked"
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        env["GPUHPC_RUNTIME_DIR"] = str(rundir)
        for argv in (["cmdserver", "stop"], ["cmdserver", "uninstall-client", "--dest", "/nonexistent/gpuhpc"]):
            res = subprocess.run([sys.executable, "-m", "gpuhpc", *argv], env=env, capture_output=True, text=True,
                                 timeout=120)
            assert res.returncode == 1, (argv, res.stdout, res.stderr)
            assert res.stderr.count("\n") == 1 and "not stopping the command server" in res.stderr, res.stderr
        status = subprocess.run([sys.executable, "-m", "gpuhpc", "cmdserver", "status"], env=env,
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and "refusing the socket directory" in status.stdout, status.stdout
        # nothing changed: root's process and the user's lock holder both alive
        assert victim.poll() is None and holder.poll() is None
    finally:
        victim.kill()
        victim.wait()
        if holder is not None:
            os.killpg(holder.pid, signal.SIGKILL)      # runuser, flock and sleep: its own session
            holder.wait()
