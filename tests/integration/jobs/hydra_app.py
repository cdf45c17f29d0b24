"""A real Hydra app for the launcher test (test_hydra_launcher.py); run by hand as
``python hydra_app.py -m hydra/launcher=gpuhpc hydra.launcher.partition=cpu x=1,2,3 out=DIR``.
Each job writes its override and where it ran into ``out``/x-<x>.txt and returns 10 x. With
``slow=X`` the job of that ``x`` notes each run's start (``out``/x-<x>.runs: one line per run, its restart
count), and its first run waits to be preempted; the run after the requeue returns at once."""
import os
from dataclasses import dataclass

import hydra
from hydra.core.config_store import ConfigStore


@dataclass
class AppConf:
    x: int = 0
    out: str = "."
    slow: int = 0


ConfigStore.instance().store(name="hydra_app", node=AppConf)


def task(cfg) -> int:
    from hydra.core.hydra_config import HydraConfig

    job = HydraConfig.get().job
    if cfg.slow and cfg.x == cfg.slow:
        import time

        from gpuhpc.jobs import checkpoint

        with open(os.path.join(cfg.out, f"x-{cfg.x}.runs"), "a") as fh:
            fh.write(f"{checkpoint.restart_count()}\n")
        if checkpoint.restart_count() == 0:
            time.sleep(240)                   # preempted meanwhile: the test's signal
    with open(os.path.join(cfg.out, f"x-{cfg.x}.txt"), "w") as fh:
        fh.write(f"{cfg.x} {job.num} {job.id} {os.environ.get('SLURM_ARRAY_JOB_ID', '-')}\n")
    return cfg.x * 10


@hydra.main(version_base=None, config_name="hydra_app")
def main(cfg) -> int:
    return task(cfg)


if __name__ == "__main__":
    main()
