"""``python -m gpuhpc.sweeps.best SWEEP_ID -- COMMAND ...``: run COMMAND with the sweep's best
trial in its environment (what ``gpuhpc submit --after-sweep SWEEP_ID`` puts in front of a job's
command; the job starts once the sweep has ended, so the best trial is final):

- ``GPUHPC_BEST_PARAMS``: the best trial's parameters as JSON (``{"lr": 0.003, "layers": 4}``);
- ``GPUHPC_BEST_PARAMS_FILE``: the same JSON in ``<sweep dir>/best-params.json``;
- ``GPUHPC_BEST_TRIAL`` (its number), ``GPUHPC_BEST_OBJECTIVE`` (its metric), ``GPUHPC_AFTER_SWEEP``.

The job starts when the sweep's arrays (or its driver) have ended, but Slurm's accounting may
not know every trial's end yet: the best is taken once every trial is in a final state, waited
for up to ``GPUHPC_BEST_WAIT_S`` seconds (default 300; past it, the best of the trials that have
finished, with a line naming how many had not). A sweep with no completed trial has no best:
exit 1 with one line, the command not run.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or not args[0].isdigit() or args[1] != "--":
        sys.stderr.write("usage: python -m gpuhpc.sweeps.best SWEEP_ID -- COMMAND ...\n")
        return 2
    sid, cmd = int(args[0]), args[2:]
    from gpuhpc.errors import GpuhpcError
    from gpuhpc.fsutil import write_atomic
    from gpuhpc.sweeps.api import Sweep

    from gpuhpc.config import getenv
    from gpuhpc.errors import UserInputError

    try:
        wait_s = getenv("GPUHPC_BEST_WAIT_S")
    except UserInputError:
        sys.stderr.write("gpuhpc: GPUHPC_BEST_WAIT_S must be a number of seconds\n")
        return 2
    try:
        sw = Sweep.load(sid)
        deadline = time.monotonic() + wait_s
        while not sw.done() and time.monotonic() < deadline:     # accounting catching up with the ends
            time.sleep(2)
        if not sw.done():
            sys.stderr.write(f"gpuhpc: sweep {sid}: not every trial is final after {wait_s:g} s; "
                             "the best of those that are\n")
        best = sw.best()
        info = sw.info()
    except GpuhpcError as exc:
        sys.stderr.write(f"gpuhpc: sweep {sid}: {exc}\n")
        return 1
    if best is None:
        sys.stderr.write(f"gpuhpc: sweep {sid} has no completed trial: no best parameters; not running {cmd[0]}\n")
        return 1
    text = json.dumps(best["params"], sort_keys=True)
    path = os.path.join(info["directory"], "best-params.json")
    write_atomic(path, text + "\n")
    os.environ.update({"GPUHPC_BEST_PARAMS": text, "GPUHPC_BEST_PARAMS_FILE": path,
                       "GPUHPC_BEST_TRIAL": str(best["trial"]), "GPUHPC_BEST_OBJECTIVE": repr(best["objective"]),
                       "GPUHPC_AFTER_SWEEP": str(sid)})
    sys.stdout.flush()
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        sys.stderr.write(f"gpuhpc: cannot run {cmd[0]}: {exc.strerror}\n")
        return 127
    return 0        # not reached


if __name__ == "__main__":
    sys.exit(main())
