"""``hydra/launcher=gpuhpc``'s settings (registered in Hydra's ConfigStore; every field can be
overridden as ``hydra.launcher.<field>=...``). The resource fields are
:class:`gpuhpc.Resources`'s, with the same names and meaning; ``resources`` takes any other
Resources field (``{nodelist: gpu-node1, extra: [--mail-type=END]}``)."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from hydra.core.config_store import ConfigStore


@dataclass
class GpuhpcLauncherConf:
    _target_: str = "hydra_plugins.gpuhpc_launcher.launcher.GpuhpcLauncher"

    # gpuhpc.Resources, per job of the multirun (gpus: per node)
    partition: Optional[str] = None
    nodes: int = 1
    gpus: int = 0
    gpu_type: Optional[str] = None
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    time: str = "1h"
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    resources: Dict[str, Any] = field(default_factory=dict)

    # the Slurm job name of the array(s)
    name: str = "${hydra.job.name}"
    # jobs of one batch running at once (null: all); arrays are split at the cluster's MaxArraySize
    parallelism: Optional[int] = None
    # preemptions (and time limits) a job is requeued after; it restarts its task function,
    # which resumes from $GPUHPC_LATEST_CHECKPOINT (docs/jobs.md)
    max_requeues: int = 10
    requeue: bool = True
    # seconds between the warning (SIGUSR2) and the end of a run
    grace: int = 60
    # submitit's pickles and each job's log (%j: the job id)
    folder: str = "${hydra.sweep.dir}/.gpuhpc/%j"


ConfigStore.instance().store(group="hydra/launcher", name="gpuhpc", node=GpuhpcLauncherConf, provider="gpuhpc")
