"""The Hydra launcher plugin (hydra_plugins/gpuhpc_launcher) without a cluster: Hydra finds it
as ``hydra/launcher=gpuhpc``; a multirun hands gpuhpc.map_array one composed configuration per
job with the launcher's resources; the JobReturns come back in the order of the overrides
whatever order the jobs finish in, a job Slurm ended without a result is one FAILED JobReturn;
bad launcher settings fail naming the field, before anything is submitted. (On the cluster:
tests/integration/jobs/test_hydra_launcher.py.)"""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobStatus

import gpuhpc
from gpuhpc.errors import UserInputError

APP = '''
from dataclasses import dataclass
import hydra
from hydra.core.config_store import ConfigStore

@dataclass
class AppConf:
    x: int = 0

ConfigStore.instance().store(name="app", node=AppConf)

@hydra.main(version_base=None, config_name="app")
def main(cfg):
    return cfg.x

main()
'''


@dataclass
class UnitAppConf:
    x: int = 0


def task(cfg) -> int:
    if cfg.x < 0:
        raise ValueError("negative")
    return cfg.x * 10


def test_hydra_finds_the_launcher(tmp_path):
    (tmp_path / "app.py").write_text(APP)
    res = subprocess.run([sys.executable, "app.py", "hydra/launcher=gpuhpc", "hydra.launcher.partition=cpu",
                          "--cfg", "hydra", "-p", "hydra.launcher"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    assert "_target_: hydra_plugins.gpuhpc_launcher.launcher.GpuhpcLauncher" in res.stdout
    assert "partition: cpu" in res.stdout


class FakeJob:
    def __init__(self, n: int, fn, cfg, seen: list) -> None:
        self.job_id, self.fn, self.cfg, self.seen = f"900_{n}", fn, cfg, seen

    def result(self):
        self.seen.append(self.cfg.x)
        if self.cfg.x == 99:
            from gpuhpc.errors import JobFailed

            raise JobFailed(f"job {self.job_id} ended CANCELLED")
        return self.fn(self.cfg)


@pytest.fixture
def fake_cluster(monkeypatch):
    """gpuhpc.map_array runs each job here, when its result is asked for; as_completed yields
    the jobs last first."""
    calls: list[dict] = []
    seen: list[int] = []

    def map_array(fn, configs, **kw):
        calls.append(kw)
        return [FakeJob(i, fn, cfg, seen) for i, cfg in enumerate(configs)]

    monkeypatch.setattr(gpuhpc, "map_array", map_array, raising=False)
    monkeypatch.setattr(gpuhpc, "as_completed", lambda jobs: reversed(list(jobs)), raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "900")
    return calls, seen


def _multirun(runner, tmp_path, *overrides):
    ConfigStore.instance().store(name="unit_app", node=UnitAppConf)
    return runner(calling_file=__file__, calling_module=None, task_function=task, config_path=None,
                  config_name="unit_app", temp_dir=tmp_path / "sweep",
                  overrides=["hydra/launcher=gpuhpc", "hydra.launcher.partition=cpu", "hydra.job.chdir=false",
                             *overrides])


def test_the_returns_follow_the_overrides_whatever_order_jobs_end_in(tmp_path, fake_cluster, hydra_sweep_runner,
                                                                     hydra_restore_singletons):
    calls, seen = fake_cluster
    with _multirun(hydra_sweep_runner, tmp_path, "hydra.launcher.parallelism=2", "x=1,2,3") as sweep:
        returns = sweep.returns[0]
        assert seen == [3, 2, 1]                                          # they ended last first
        assert [r.overrides for r in returns] == [[f"x={x}"] for x in (1, 2, 3)]
        assert [r.status for r in returns] == [JobStatus.COMPLETED] * 3
        assert [r.return_value for r in returns] == [10, 20, 30]
        assert [r.hydra_cfg.hydra.job.num for r in returns] == [0, 1, 2]
        assert (tmp_path / "sweep" / "2" / ".hydra" / "overrides.yaml").read_text().strip() == "- x=3"
    (kw,) = calls
    assert kw["resources"] == gpuhpc.Resources(partition="cpu", time="1h")
    assert kw["parallelism"] == 2 and kw["max_requeues"] == 10 and kw["name"] == Path(__file__).stem
    assert kw["folder"] == f"{tmp_path / 'sweep'}/.gpuhpc/%j"


def test_a_job_slurm_ended_without_a_result_fails_alone(tmp_path, fake_cluster, hydra_sweep_runner,
                                                       hydra_restore_singletons):
    """Its JobReturn is FAILED holding the error (Hydra's sweeper then raises it, as it does a
    task's exception); the other jobs' results are still collected and their runs complete."""
    from gpuhpc.errors import JobFailed

    calls, seen = fake_cluster
    with pytest.raises(JobFailed, match="job 900_1 ended CANCELLED"):
        with _multirun(hydra_sweep_runner, tmp_path, "x=1,99,3"):
            pass
    assert seen == [3, 99, 1]
    for num, x in ((0, 1), (2, 3)):
        assert (tmp_path / "sweep" / str(num) / ".hydra" / "overrides.yaml").read_text().strip() == f"- x={x}"


@pytest.mark.parametrize("override, field", [
    ("+hydra.launcher.resources.bogus=1", "hydra.launcher.resources.bogus"),
    ("+hydra.launcher.resources.partition=gpu", "hydra.launcher.resources.partition"),
    ("hydra.launcher.nodes=0", "hydra.launcher.nodes"),
])
def test_bad_launcher_settings_name_the_field_and_submit_nothing(tmp_path, fake_cluster, hydra_sweep_runner,
                                                                 hydra_restore_singletons, override, field):
    with pytest.raises(UserInputError) as exc:
        with _multirun(hydra_sweep_runner, tmp_path, override, "x=1,2"):
            pass
    assert exc.value.field == field
    assert fake_cluster == ([], [])
