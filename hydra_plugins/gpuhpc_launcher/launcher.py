"""``hydra/launcher=gpuhpc``: each batch a Hydra sweeper asks for (the basic sweeper's whole
grid, or Optuna's next ``n_jobs`` trials) goes to the cluster as gpuhpc job arrays
(:func:`gpuhpc.map_array`: one array per MaxArraySize jobs, at most ``parallelism`` running,
the ledger's quota checked before anything is submitted); the launcher waits for them with one
shared watcher (:func:`gpuhpc.as_completed`) and hands Hydra one ``JobReturn`` per job, in the
order of the overrides.

Each job's configuration is composed here, before anything is submitted (a bad override fails
the multirun at once, nothing queued); on the node the job runs Hydra's ``run_job`` (its
``hydra.sweep.dir``/``hydra.sweep.subdir`` output directory, ``.hydra/`` and log, callbacks),
with ``hydra.job.id`` set to its Slurm job id. Preempted (or at its time limit) a job is
requeued up to ``max_requeues`` times and runs its task function again: resume from
``gpuhpc.jobs.checkpoint.latest_checkpoint()`` (a checkpoint directory per job,
docs/jobs.md). A job that Slurm ended without a result (cancelled, node failure, out of
memory) comes back as a FAILED ``JobReturn`` holding the error; the other jobs' results are kept.

Nothing here is imported from gpuhpc until a batch is launched (Hydra imports every plugin
module to discover plugins)."""
from __future__ import annotations

import logging
import copy
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from gpuhpc.jobs.checkpoint import Checkpointable

log = logging.getLogger(__name__)

_RESOURCE_FIELDS = ("partition", "nodes", "gpus", "gpu_type", "cpus_per_task", "mem", "time", "account", "qos",
                    "constraint")


class HydraJob(Checkpointable):
    """What runs on the cluster for one job of the multirun: its composed configuration, run
    by Hydra's ``run_job``. A :class:`~gpuhpc.jobs.checkpoint.Checkpointable`: at a preemption
    or the time limit it is requeued and runs again (the task function resumes from its own
    checkpoints)."""

    def __init__(self, hydra_context: HydraContext, task_function: TaskFunction,
                 singleton_state: Dict[Any, Any]) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.singleton_state = singleton_state

    def __call__(self, sweep_config: DictConfig) -> JobReturn:
        Singleton.set_state(self.singleton_state)
        setup_globals()
        env = os.environ
        job_id = (f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}" if env.get("SLURM_ARRAY_TASK_ID")
                  else env.get("SLURM_JOB_ID") or env.get("GPUHPC_JOB_ID") or "unknown")
        # a requeued run is handed the configuration its first run left read-only (run_job): a copy,
        # writable again
        sweep_config = copy.deepcopy(sweep_config)
        with read_write(sweep_config), open_dict(sweep_config.hydra.job):
            sweep_config.hydra.job.id = job_id
        return run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=sweep_config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")


class GpuhpcLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in params.items()}
        self.config: Optional[DictConfig] = None
        self.hydra_context: Optional[HydraContext] = None
        self.task_function: Optional[TaskFunction] = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def resources(self) -> Any:
        """The jobs' :class:`gpuhpc.Resources`; bad values raise ``UserInputError`` naming
        ``hydra.launcher.<field>`` (``hydra.launcher.resources.<field>`` for the others)."""
        import dataclasses

        from gpuhpc.errors import UserInputError
        from gpuhpc.jobs.spec import Resources

        p = self.params
        more = p.get("resources") or {}
        if not isinstance(more, dict):
            raise UserInputError("expected a mapping of Resources fields", field="hydra.launcher.resources")
        valid = {f.name for f in dataclasses.fields(Resources)}
        for key in sorted(more):
            if key in _RESOURCE_FIELDS:
                raise UserInputError(f"{key} is set twice", field=f"hydra.launcher.resources.{key}",
                                     hint=f"set hydra.launcher.{key} only")
            if key not in valid:
                raise UserInputError(f"unknown resource parameter {key!r}", field=f"hydra.launcher.resources.{key}",
                                     hint=f"valid: {', '.join(sorted(valid - set(_RESOURCE_FIELDS)))}")
        fields = {k: p[k] for k in _RESOURCE_FIELDS if p.get(k) is not None}
        if isinstance(more.get("extra"), list):
            more = {**more, "extra": tuple(more["extra"])}
        try:
            return Resources.from_mapping({**fields, **more}, prefix="hydra.launcher.")
        except UserInputError as exc:
            name = (exc.field or "").split(".")[-1]
            where = f"hydra.launcher.{name}" if name in _RESOURCE_FIELDS else f"hydra.launcher.resources.{name}"
            text = exc.message.split(": ", 1)[1] if exc.field and exc.message.startswith(exc.field) else exc.message
            raise UserInputError(text, field=where if name else None, hint=exc.hint) from None

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import gpuhpc

        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        setup_globals()
        p = self.params
        resources = self.resources()
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep and self.config.hydra.sweep.mode is not None:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        configs: List[DictConfig] = []
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg):
                cfg.hydra.job.num = idx
            configs.append(cfg)
        task = HydraJob(self.hydra_context, self.task_function, Singleton.get_state())
        jobs = gpuhpc.map_array(task, configs, resources=resources, name=str(p.get("name") or "hydra"),
                                parallelism=p.get("parallelism"), max_requeues=int(p.get("max_requeues", 10)),
                                requeue=bool(p.get("requeue", True)), grace=p.get("grace", 60),
                                folder=str(p.get("folder") or sweep_dir / ".gpuhpc" / "%j"))
        log.info(f"gpuhpc: {len(jobs)} jobs submitted ({jobs[0].job_id} ...); sweep output dir: {sweep_dir}")
        returns: List[Optional[JobReturn]] = [None] * len(jobs)
        order = {id(j): i for i, j in enumerate(jobs)}
        for job in gpuhpc.as_completed(jobs):
            i = order[id(job)]
            try:
                ret = job.result()
            except Exception as exc:  # Slurm ended the job without a result: that job fails, not the batch
                log.error(f"#{initial_job_idx + i} (job {job.job_id}): {exc}")
                ret = JobReturn(overrides=list(job_overrides[i]), cfg=configs[i], status=JobStatus.FAILED,
                                _return_value=exc)
            returns[i] = ret
        return [r for r in returns if r is not None]
