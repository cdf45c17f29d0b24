"""gpuhpc.remote.sweeps: the sweep a laptop starts is made on the cluster by one command
(``python -m gpuhpc.remote.sweeps create PICKLE``), whose answer line carries the sweep id or the
error, raised again on the laptop as the same kind with the same line and exit code; the job
that follows the sweep carries only its id (a rerun after a requeue cannot start another)."""
from __future__ import annotations

import subprocess
import sys

import cloudpickle
import pytest

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.remote import sweeps as remote_sweeps


def _create(tmp_path, fn, space, kwargs):
    path = tmp_path / "sweep.pkl"
    path.write_bytes(cloudpickle.dumps((fn, space, kwargs)))
    return subprocess.run([sys.executable, "-m", "gpuhpc.remote.sweeps", "create", str(path)],
                          capture_output=True, text=True, timeout=120)


def test_bad_input_there_is_the_same_one_line_error_here(tmp_path):
    res = _create(tmp_path, lambda x: x, {"x": [1, 2]}, {"method": "bogus"})
    assert res.returncode == 2, res.stderr
    with pytest.raises(UserInputError) as err:
        remote_sweeps.answer(res.stdout, res.stderr, res.returncode)
    assert err.value.exit_code == 2 and err.value.field == "method", err.value.one_line()
    assert "bogus" in err.value.one_line()


def test_a_call_that_cannot_load_there_is_one_line(tmp_path):
    path = tmp_path / "sweep.pkl"
    path.write_bytes(b"not a pickle")
    res = subprocess.run([sys.executable, "-m", "gpuhpc.remote.sweeps", "create", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    with pytest.raises(GpuhpcError, match="UnpicklingError"):
        remote_sweeps.answer(res.stdout, res.stderr, res.returncode)


def test_no_answer_line_names_the_last_error_line():
    with pytest.raises(GpuhpcError, match="/py.*No module named gpuhpc"):
        remote_sweeps.answer("", "Traceback\nModuleNotFoundError: No module named gpuhpc\n", 1, "/py")


def test_the_answer_line_gives_the_id():
    assert remote_sweeps.answer(f"note\n{remote_sweeps.ANSWER}{{\"sweep_id\": 12}}\n", "", 0) == 12


def test_the_driver_job_carries_the_sweep_id_not_the_sweep():
    """What submitit pickles, and runs again after a requeue: the id of a sweep made before."""
    d = cloudpickle.loads(cloudpickle.dumps(remote_sweeps.SweepDriver(7, {"GPUHPC_LEDGER": "off"})))
    assert (d.sweep_id, d.env) == (7, {"GPUHPC_LEDGER": "off"})
    assert not any(callable(v) for v in vars(d).values())     # no function: nothing to start a sweep with
