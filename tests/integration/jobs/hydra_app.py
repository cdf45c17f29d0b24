"""A real Hydra app for the launcher test (test_hydra_launcher.py); run by hand as
``python hydra_app.py -m hydra/launcher=gpuhpc hydra.launcher.partition=cpu x=1,2,3 out=DIR``.
Each job writes its override and where it ran into ``out``/x-<x>.txt and returns 10 x."""
import os
from dataclasses import dataclass

import hydra
from hydra.core.config_store import ConfigStore


@dataclass
class AppConf:
    x: int = 0
    out: str = "."


ConfigStore.instance().store(name="hydra_app", node=AppConf)


def task(cfg) -> int:
    from hydra.core.hydra_config import HydraConfig

    job = HydraConfig.get().job
    with open(os.path.join(cfg.out, f"x-{cfg.x}.txt"), "w") as fh:
        fh.write(f"{cfg.x} {job.num} {job.id} {os.environ.get('SLURM_ARRAY_JOB_ID', '-')}\n")
    return cfg.x * 10


@hydra.main(version_base=None, config_name="hydra_app")
def main(cfg) -> int:
    return task(cfg)


if __name__ == "__main__":
    main()
