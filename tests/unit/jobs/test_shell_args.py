"""``gpuhpc shell``: the salloc/srun argv (gpuhpc.slurm.interactive), the resources it shares
with ``gpuhpc submit``, and the checks a submission passes before anything is allocated.
Nothing runs Slurm here (tests/integration/jobs/test_shell.py does, through a pty)."""
from __future__ import annotations

import shlex
import sys
import textwrap
from types import SimpleNamespace

import pytest

from gpuhpc.cli import shell as shell_cli
from gpuhpc.cli.main import main
from gpuhpc.errors import QuotaExceeded, UserInputError
from gpuhpc.slurm import interactive
from gpuhpc.transport.local import LocalRunner

HOSTILE = "x'; rm -rf ~ $(id) `id` \"$HOME\" | & ; > /tmp/pwned * ?"


def _dry_run(capsys, *argv: str) -> list[str]:
    assert main(["shell", "--dry-run", *argv]) == 0, capsys.readouterr().err
    return shlex.split(capsys.readouterr().out)


def test_salloc_pty_keeps_each_hostile_value_one_argument():
    argv = interactive.salloc_pty([("job-name", HOSTILE), ("nodes", "1"), ("exclusive", None)],
                                  ["sh", "-c", HOSTILE, "--", "-x"], step_options=["--container-image=a#b:1"])
    assert argv == ["salloc", f"--job-name={HOSTILE}", "--nodes=1", "--exclusive", "--",
                    "srun", "--pty", "--overlap", "--preserve-env", "--nodes=1", "--ntasks=1", "--container-image=a#b:1",
                    "--", "sh", "-c", HOSTILE, "--", "-x"]


def test_salloc_pty_refuses_an_option_salloc_does_not_take():
    with pytest.raises(ValueError, match="--output"):
        interactive.salloc_pty([("output", "x.out")], ["true"])
    with pytest.raises(ValueError, match="no command"):
        interactive.salloc_pty([], [])


def test_dry_run_prints_the_exact_argv_with_hostile_name_and_command(capsys):
    argv = _dry_run(capsys, "--gpus", "1", "--partition", "gpu", "--time", "30m", "-J", HOSTILE,
                    "--", "sh", "-c", HOSTILE)
    assert argv == ["salloc", f"--job-name={HOSTILE}", "--nodes=1", "--ntasks-per-node=1", "--gres=gpu:1",
                    "--time=00:30:00", "--partition=gpu", "--", "srun", "--pty", "--overlap", "--preserve-env", "--nodes=1",
                    "--ntasks=1", "--", "sh", "-c", HOSTILE]


def test_shell_gets_the_resources_a_submitted_job_gets(capsys):
    """The same options through the same translation: every resource option of the submitted
    job's #SBATCH lines is on salloc's line, and only the batch-only ones are not."""
    opts = ["--gpus", "2", "--gpu-type", "h100", "--time", "2h", "--partition", "gpu", "--account", "research",
            "--qos", "normal", "--mem", "64G", "-c", "4", "-C", "h100", "-x", "gpu-node2", "--exclusive",
            "--sbatch-arg=--reservation=maint", "-J", "dbg", "-D", "/var/tmp"]
    salloc = _dry_run(capsys, *opts, "--", "true")
    assert main(["submit", "--dry-run", *opts, "--", "true"]) == 0
    script = capsys.readouterr().out
    sbatch = [shlex.split(line[len("#SBATCH "):])[0] for line in script.splitlines() if line.startswith("#SBATCH ")]
    batch_only = {"output", "open-mode", "requeue", "no-requeue", "signal"}
    assert [o for o in sbatch if o.split("=", 1)[0][2:] not in batch_only] == salloc[1:salloc.index("--")]
    assert {o.split("=", 1)[0][2:] for o in sbatch} & batch_only      # the submitted job has them


def test_file_resources_and_flags_override_as_in_submit(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text(textwrap.dedent("""\
        name: train
        command: [python, train.py]
        resources: {gpus: 8, gpu_type: h100, time: 4h, partition: gpu}
        checkpoint_dir: /var/tmp/ck
        """))
    argv = _dry_run(capsys, "-f", str(job), "--gpus", "1", "--", "bash")
    assert "--gres=gpu:h100:1" in argv and "--time=04:00:00" in argv and "--partition=gpu" in argv
    assert argv[argv.index("--", argv.index("srun")) + 1:] == ["bash"]        # not the file's command
    assert f"--job-name={shell_cli.DEFAULT_NAME}" in argv


def test_multi_node_shell_gets_one_task_per_node(capsys):
    argv = _dry_run(capsys, "--nodes", "2", "--gpus", "8", "--", "bash")
    assert "--nodes=2" in argv and "--ntasks-per-node=1" in argv and "--gres=gpu:8" in argv


def test_default_command_is_the_login_shell_and_bash_in_an_image(capsys, monkeypatch):
    monkeypatch.setenv("SHELL", "/bin/zsh")
    for var in ("GPUHPC_CLUSTER", "GPUHPC_SSH_HOST"):
        monkeypatch.delenv(var, raising=False)
    argv = _dry_run(capsys)
    assert argv[-3:] == ["--", "/bin/zsh", "-l"]
    argv = _dry_run(capsys, "--image", "nvcr.io#nvidia/pytorch:24.05-py3", "--mount", "/data:/data:ro",
                    "--container-workdir", "/w")
    step = argv[argv.index("srun"):]
    assert step == ["srun", "--pty", "--overlap", "--preserve-env", "--nodes=1", "--ntasks=1",
                    "--container-image=nvcr.io#nvidia/pytorch:24.05-py3", "--container-mounts=/data:/data:ro",
                    "--container-workdir=/w", "--", "bash", "-l"]


def test_env_is_shown_in_the_dry_run_and_given_to_salloc(capsys):
    argv = _dry_run(capsys, "-e", "A=b c", "-e", "B=$(id)", "--", "true")
    assert argv[:3] == ["env", "A=b c", "B=$(id)"] and argv[3] == "salloc"


@pytest.mark.parametrize(("argv", "field"), [
    (["--partition", "gpu;x"], "resources.partition"),
    (["--gpus", "-1"], "resources.gpus"),
    (["--time", "soon"], "time"),
    (["-J", "a\nb"], "name"),
    (["--sbatch-arg=--propagate=ALL"], "sbatch_args"),
    (["--sbatch-arg=--gres=gpu:8"], "--sbatch-arg[0]"),
    (["--", "sh", "-c", "a\x1bb"], "command[2]"),
])
def test_bad_input_exits_2_in_one_line_naming_the_field(argv, field, capsys, monkeypatch):
    """Refused while the spec is built: without --dry-run nothing is reserved or allocated."""
    def boom(*a, **k):
        raise AssertionError("allocated after bad input")

    monkeypatch.setattr(interactive, "run_on_terminal", boom)
    monkeypatch.setattr(shell_cli, "run_shell", boom)
    assert main(["shell", *argv] if "--" in argv else ["shell", *argv, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and field in err, err


def test_a_job_file_key_salloc_cannot_take_is_refused_naming_it(tmp_path, capsys):
    job = tmp_path / "job.yaml"
    job.write_text("array: 0-3\ngpus: 1\n")
    assert main(["shell", "--dry-run", "-f", str(job), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: array: ") and err.count("\n") == 1, err


# ------------------------------------------------------------ the checks before salloc
class _Runner:
    is_local = True

    def getenv(self, key):
        return None


class _Client:
    def __init__(self, runner=None, nodes=()):
        self.runner = runner or _Runner()
        self._nodes = list(nodes)

    def nodes(self):
        return self._nodes

    def partitions(self):
        return []

    def topology(self):
        return []


def _node(name, gpus, partition="gpu"):
    return SimpleNamespace(name=name, partitions=[partition], gpus_total={"h100": gpus})


def _spec(*argv: str):
    ns = SimpleNamespace(**{p.name: None for p in shell_cli.shell.params}, template=None)
    for k, v in zip(argv[::2], argv[1::2]):
        setattr(ns, k, v)
    return shell_cli.shell_spec(ns, ["true"])


class _Hold:
    def __init__(self):
        self.attached, self.released = [], 0

    def attach_job(self, job_id):
        self.attached.append(job_id)

    def release(self):
        self.released += 1


def _no_terminal(*a, **k):
    raise AssertionError("salloc ran")


def test_quota_refusal_allocates_nothing(monkeypatch):
    from gpuhpc.jobs import admission

    def over(*a, **k):
        raise QuotaExceeded("account research: 0.5 GPU-hours left, the shell needs 1")

    monkeypatch.setattr(admission, "reserve", over)
    monkeypatch.setattr(interactive, "run_on_terminal", _no_terminal)
    with pytest.raises(QuotaExceeded):
        shell_cli.run_shell(_spec("gpus", 1, "partition", "gpu"), client=_Client(nodes=[_node("n1", 8)]))


def test_a_shell_no_node_can_hold_is_refused_before_the_ledger(monkeypatch):
    from gpuhpc.jobs import admission

    monkeypatch.setattr(admission, "reserve", _no_terminal)
    monkeypatch.setattr(interactive, "run_on_terminal", _no_terminal)
    with pytest.raises(UserInputError, match="gpus: 9 h100 GPUs per node"):
        shell_cli.run_shell(_spec("gpus", 9, "gpu_type", "h100", "partition", "gpu"),
                            client=_Client(nodes=[_node("n1", 8)]))


def test_the_image_policy_applies_to_a_shell(monkeypatch):
    from gpuhpc.containers import image as image_mod
    from gpuhpc.jobs import admission

    def refuse(ref, partition, field="image"):
        raise UserInputError("registry evil.example is not trusted", field=field)

    monkeypatch.setattr(image_mod, "check_image", refuse)
    monkeypatch.setattr(admission, "reserve", _no_terminal)
    monkeypatch.setattr(interactive, "run_on_terminal", _no_terminal)
    with pytest.raises(UserInputError, match="^image: registry evil"):
        shell_cli.run_shell(_spec("image", "evil.example#x/y:1"), client=_Client())


def test_an_ssh_runner_without_a_pty_is_refused_before_anything_is_held(monkeypatch):
    from gpuhpc.jobs import admission

    remote = SimpleNamespace(is_local=False, getenv=lambda k: None)
    monkeypatch.setattr(admission, "reserve", _no_terminal)
    with pytest.raises(UserInputError) as exc:
        shell_cli.run_shell(_spec("gpus", 1), client=_Client(runner=remote))
    assert exc.value.field == "--cluster" and exc.value.exit_code == 2
    assert "pty" in exc.value.one_line() and "\n" not in exc.value.one_line()


def test_an_ssh_runner_with_run_interactive_gets_the_argv_and_the_job_id_reaches_the_hold(monkeypatch):
    from gpuhpc.jobs import admission

    hold = _Hold()
    seen = {}

    def run_interactive(argv, *, env, on_output):
        seen["argv"], seen["env"] = argv, env
        on_output(b"salloc: Granted job allocation 4")
        on_output(b"2\r\n$ exit\r\n")
        return 0

    remote = SimpleNamespace(is_local=False, getenv=lambda k: None, run_interactive=run_interactive)
    monkeypatch.setattr(admission, "reserve", lambda *a, **k: hold)
    assert shell_cli.run_shell(_spec("gpus", 1, "env", ("K=v",)), client=_Client(runner=remote, nodes=[_node("n1", 8)])) == 0
    assert seen["argv"][0] == "salloc" and seen["env"] == {"K": "v"}
    assert hold.attached == ["42"] and hold.released == 0


@pytest.mark.parametrize(("granted", "rc"), [(True, 7), (False, 1)])
def test_the_hold_is_tied_to_the_job_or_released(monkeypatch, granted, rc):
    from gpuhpc.jobs import admission

    hold = _Hold()

    def fake_terminal(argv, runner, *, env=None, on_job_id=None):
        if granted:
            on_job_id("123")
        return rc

    monkeypatch.setattr(admission, "reserve", lambda *a, **k: hold)
    monkeypatch.setattr(interactive, "run_on_terminal", fake_terminal)
    assert shell_cli.run_shell(_spec("gpus", 1), client=_Client(nodes=[_node("n1", 8)])) == rc
    assert (hold.attached, hold.released) == ((["123"], 0) if granted else ([], 1))


# ------------------------------------------------------------ running it
def test_job_id_watch_reads_a_line_split_across_chunks():
    seen = []
    w = interactive.JobIdWatch(seen.append)
    for chunk in (b"salloc: Pending job allocation 9", b"87\r\nsalloc: job 987 queued\r\n",
                  b"salloc: Granted job allocation 987\r\n"):
        w.feed(chunk)
    assert w.job_id == "987" and seen == ["987"]


def test_run_on_terminal_passes_stderr_through_and_returns_the_exit_status(capfd):
    code = ("import os, sys\n"
            "sys.stderr.write('salloc: Granted job allocation 77\\n'); sys.stderr.flush()\n"
            "print(os.environ['GPUHPC_T'], flush=True)\n"
            "sys.stderr.write('srun: done\\n'); sys.exit(5)\n")
    seen = []
    rc = interactive.run_on_terminal([sys.executable, "-c", code], LocalRunner(), env={"GPUHPC_T": "x y"},
                                     on_job_id=seen.append)
    out, err = capfd.readouterr()
    assert rc == 5 and seen == ["77"]
    assert out == "x y\n" and err == "salloc: Granted job allocation 77\nsrun: done\n"
