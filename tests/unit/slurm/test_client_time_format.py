"""SLURM_TIME_FORMAT is pinned for the Slurm commands whose output gpuhpc parses, and not for those
that start a job (sbatch, srun, salloc): their environment becomes the job's, and a user's own
SLURM_TIME_FORMAT must reach their job unchanged."""
from __future__ import annotations

from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport import CommandResult


class Recording:
    is_local = True

    def __init__(self):
        self.envs: list[tuple[str, dict | None]] = []

    def run(self, argv, *, input=None, timeout=None, env=None):
        self.envs.append((argv[0], env))
        return CommandResult(tuple(argv), 0, "", "")


def test_parsed_commands_get_the_pin_and_job_starters_do_not():
    r = Recording()
    c = SlurmClient(r)
    c.run(cmd.scontrol_show_config(), check=False)
    c.run(["sacct", "-j", "1"], check=False)
    c.run(["sbatch", "--parsable", "--wrap", "true"], check=False)
    c.run(["/usr/bin/srun", "true"], check=False)
    c.run(["salloc", "true"], env={"X": "1"}, check=False)
    got = {name: (env or {}).get("SLURM_TIME_FORMAT") for name, env in r.envs}
    assert got == {"scontrol": "standard", "sacct": "standard", "sbatch": None, "/usr/bin/srun": None,
                   "salloc": None}
    assert r.envs[-1][1] == {"X": "1"}
