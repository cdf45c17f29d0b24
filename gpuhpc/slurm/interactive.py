"""Interactive allocations (``gpuhpc shell``): the ``salloc ... srun --pty`` argv and running it
on this terminal.

:func:`salloc_pty` is a pure builder: ``salloc`` with the job's resource options, then, as the
command salloc runs on the login node, one ``srun --pty --overlap --preserve-env`` step (one task
on the first node) running ``command``, as Slurm's own ``use_interactive_step`` does: ``--overlap``
leaves the allocation's CPUs, memory and GPUs to the ``srun`` steps the user starts from the
shell, ``--preserve-env`` keeps the job's ``SLURM_NNODES``/``SLURM_NTASKS`` there (not the
step's one), so a plain ``srun hostname`` in the shell of a two-node allocation runs on both.
Every value is one argv element: no shell sees a job name or a command word.

:func:`run_on_terminal` runs that argv with this process's terminal: salloc's stdin and stdout are
the terminal, its stderr passes through here unchanged (the step's own output goes through the
pty, on stdout), read for the job id salloc reports (``salloc: Granted job allocation N``), so
the caller can tie the ledger's hold to it while the shell runs. When salloc's command ends, salloc
gives the allocation back. Over SSH the runner's ``run_interactive(argv, env=..., on_output=...)``
runs it on a pty on the login node (:class:`gpuhpc.transport.ssh.SSHRunner`: paramiko's
``get_pty``); a runner without one is refused by :func:`check_terminal` before anything is
reserved or allocated.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence

from gpuhpc.errors import UserInputError

#: The long options salloc (Slurm 22.05) takes that a job's resources translate to
#: (:func:`gpuhpc.jobs.spec.sbatch_options`), pass-through ones included; an sbatch-only
#: option (``--output``, ``--requeue``, ``--array``, ``--propagate`` ...) is not among them.
SALLOC_OPTIONS = frozenset({
    "account", "acctg-freq", "bb", "bbf", "begin", "chdir", "cluster-constraint", "comment", "constraint",
    "contiguous", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-task", "deadline", "delay-boot",
    "dependency", "distribution", "exclude", "exclusive", "extra-node-info", "get-user-env", "gpu-bind",
    "gpu-freq", "gres", "gres-flags", "hint", "hold", "job-name", "licenses", "mail-type", "mail-user",
    "mcs-label", "mem", "mem-bind", "mincpus", "network", "nice", "no-kill", "nodelist", "nodes",
    "ntasks-per-node", "overcommit", "oversubscribe", "partition", "power", "prefer", "priority", "profile",
    "qos", "reboot", "reservation", "signal", "sockets-per-node", "spread-job", "switches", "thread-spec",
    "threads-per-core", "time", "tmp", "use-min-nodes", "wait-all-nodes", "wckey",
})

#: salloc's line naming the job id (``Pending`` while it waits, ``Granted`` once it has it), whole.
JOB_ID_LINE = re.compile(rb"salloc: (?:Pending|Granted) job allocation ([0-9]+)\r?\n")


def salloc_pty(options: Sequence[tuple[str, str | None]], command: Sequence[str], *,
               step_options: Sequence[str] = ()) -> list[str]:
    """``salloc --OPT=VALUE ... -- srun --pty --overlap --preserve-env --nodes=1 --ntasks=1 STEP_OPTIONS
    -- COMMAND``.
    ``options``: ``(long option, value or None for a flag)``, each one salloc takes
    (:data:`SALLOC_OPTIONS`; another raises ValueError); ``step_options``: the step's own
    (pyxis' ``--container-*``). Each value stays one argv element."""
    if not command:
        raise ValueError("no command")
    argv = ["salloc"]
    for opt, value in options:
        if opt not in SALLOC_OPTIONS:
            raise ValueError(f"salloc has no --{opt}")
        argv.append(f"--{opt}" if value is None else f"--{opt}={value}")
    return [*argv, "--", "srun", "--pty", "--overlap", "--preserve-env", "--nodes=1", "--ntasks=1", *step_options,
            "--", *command]


def check_terminal(runner) -> None:
    """Refuse (exit 2) a runner that cannot give the step a terminal: an SSH runner without
    ``run_interactive`` (a pty on the login node). Nothing is reserved or allocated before."""
    if runner.is_local or callable(getattr(runner, "run_interactive", None)):
        return
    raise UserInputError("this transport cannot open a terminal (pty) on the login node", field="--cluster",
                         hint="run gpuhpc shell on the login node itself (ssh -t LOGIN gpuhpc shell ...)")


class JobIdWatch:
    """Fed salloc's stderr in chunks; remembers the first job id it names (:data:`JOB_ID_LINE`)."""

    def __init__(self, on_job_id: Callable[[str], None] | None = None) -> None:
        self.job_id: str | None = None
        self._tail = b""
        self._on_job_id = on_job_id

    def feed(self, chunk: bytes) -> None:
        if self.job_id is not None:
            return
        self._tail = (self._tail + chunk)[-4096:]
        m = JOB_ID_LINE.search(self._tail)
        if m:
            self.job_id = m.group(1).decode()
            if self._on_job_id is not None:
                self._on_job_id(self.job_id)


def run_on_terminal(argv: Sequence[str], runner, *, env: dict[str, str] | None = None,
                    on_job_id: Callable[[str], None] | None = None) -> int:
    """Run ``argv`` (:func:`salloc_pty`) on this terminal and return its exit status (the
    command's; 128+N when a signal N ended salloc). ``on_job_id(job_id)`` is called in this
    thread as soon as salloc names the job, while the step still runs. Ctrl-C is left to salloc
    and its step (this process ignores SIGINT meanwhile)."""
    check_terminal(runner)
    if not runner.is_local:
        watch = JobIdWatch()
        rc = runner.run_interactive(list(argv), env=env, on_output=watch.feed)
        if watch.job_id is not None and on_job_id is not None:
            on_job_id(watch.job_id)
        return rc
    import queue
    import signal
    import subprocess
    import threading

    environment = getattr(runner, "environment", None)
    full = dict(environment() if callable(environment) else os.environ)
    full.update(env or {})
    try:
        proc = subprocess.Popen(list(argv), env=full, stderr=subprocess.PIPE)
    except FileNotFoundError as exc:
        from gpuhpc.errors import TransportError

        raise TransportError(f"command not found: {argv[0]}", hint="is Slurm's client installed and on PATH?") from exc
    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None    # after the exec: salloc keeps its own
    found: queue.Queue[str | None] = queue.Queue()
    watch = JobIdWatch(found.put)
    sink = getattr(sys.stderr, "buffer", None)

    def pump() -> None:
        fd = proc.stderr.fileno()      # type: ignore[union-attr]
        while True:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            if sink is not None:
                sink.write(chunk)
                sink.flush()
            else:
                sys.stderr.write(chunk.decode(errors="replace"))
            watch.feed(chunk)
        found.put(None)

    reader = threading.Thread(target=pump, name="salloc-stderr", daemon=True)
    reader.start()
    failed: BaseException | None = None
    try:
        job_id = found.get()
        if job_id is not None and on_job_id is not None:
            try:
                on_job_id(job_id)
            except Exception as exc:        # the shell runs on; raised once salloc has ended
                failed = exc
        rc = proc.wait()
        reader.join()
    finally:
        if main:
            signal.signal(signal.SIGINT, old)
    if failed is not None:
        raise failed
    return 128 - rc if rc < 0 else rc
