"""A sweep started from a laptop: ``gpuhpc.sweep(fn, space, ..., cluster="NAME")``.

The sweep runs on the cluster, where its database, files and trial arrays are: one
Python-mode job over SSH (:func:`gpuhpc.jobs.api.submit` with ``cluster=``, the cluster's
Python checked first, the call and the code snapshot over SFTP) runs :class:`SweepDriver`,
which starts the sweep there (:func:`gpuhpc.sweeps.api.sweep`) and waits for it;
:class:`RemoteSweep` reads its outcome back. Above both jobs and sweeps: neither imports this.
"""
from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

from gpuhpc.errors import UserInputError


def sweep(fn: Callable[..., Any], space: Mapping[str, Any], *, cluster: str | None = None,
          driver_resources: Mapping[str, Any] | None = None, driver_env: Mapping[str, str] | None = None,
          **kwargs: Any) -> Any:
    """``gpuhpc.sweep``: :func:`gpuhpc.sweeps.api.sweep` (the same keyword arguments) here, or
    with ``cluster="NAME"`` (from a laptop) on that cluster profile through a driver job
    (``driver_resources``, default 12 h; ``driver_env`` for its environment), returning a
    :class:`RemoteSweep` (``wait``, ``best``, ``results``)."""
    from gpuhpc.sweeps.api import sweep as sweep_here

    inspect.signature(sweep_here).bind(fn, space, **kwargs)      # a wrong keyword: TypeError, here
    if cluster is None:
        if driver_resources is not None or driver_env is not None:
            raise UserInputError("driver_resources and driver_env are for a sweep on a cluster",
                                 field="cluster", hint='add cluster="NAME"')
        return sweep_here(fn, space, **kwargs)
    for name in ("client", "url"):
        if kwargs.get(name) is not None:
            raise UserInputError("a sweep on a cluster uses the cluster's own", field=name,
                                 hint=f"drop {name}=, or drop cluster=")
    return sweep_on_cluster(fn, space, cluster=cluster, driver_resources=driver_resources, env=driver_env,
                            kwargs=kwargs)


class SweepDriver:
    """Runs on the cluster as one Python-mode job: the sweep engine there, with a local runner
    (its files, database and trial arrays stay on the cluster), then waits for the sweep and
    returns its id, whether every trial completed, the best trial and the results."""

    def __init__(self, fn: Any, space: Any, kwargs: dict[str, Any], env: dict[str, str] | None = None) -> None:
        self.fn, self.space, self.kwargs, self.env = fn, space, kwargs, dict(env or {})

    def __call__(self) -> dict[str, Any]:
        os.environ.update(self.env)
        from gpuhpc.sweeps.api import sweep as sweep_here

        sw = sweep_here(self.fn, self.space, **self.kwargs)
        print(f"gpuhpc: sweep {sw.id} started", flush=True)
        ok = sw.wait()
        return {"sweep_id": sw.id, "all_completed": ok, "best": sw.best(), "results": sw.results()}


class RemoteSweep:
    """A sweep started from a laptop (``gpuhpc.sweep(..., cluster="NAME")``): its driver job
    runs on the cluster; ``wait``/``best``/``results`` read its outcome over SFTP."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self._out: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"RemoteSweep(driver job {self.job.job_id})"

    def _outcome(self, timeout: float | None = None) -> dict[str, Any]:
        if self._out is None:
            self._out = self.job.result(timeout)
        return self._out

    @property
    def id(self) -> int:
        """The sweep's id in the cluster's database (once the driver has finished)."""
        return self._outcome()["sweep_id"]

    def wait(self, timeout: float | None = None) -> bool:
        return self._outcome(timeout)["all_completed"]

    def best(self) -> dict[str, Any] | None:
        return self._outcome()["best"]

    def results(self) -> list[Any]:
        return self._outcome()["results"]

    def cancel(self) -> None:
        """Cancel the driver (its trials run on; cancel them on the cluster: gpuhpc sweep cancel ID)."""
        self.job.cancel()


def sweep_on_cluster(fn: Any, space: Any, *, cluster: str, kwargs: dict[str, Any],
                     driver_resources: Any = None, env: dict[str, str] | None = None) -> RemoteSweep:
    """Start a sweep on the cluster profile ``cluster`` through a driver job (Python mode over
    SSH: the cluster's Python is checked first, the call and the code snapshot go over SFTP)."""
    from gpuhpc.jobs.api import submit

    res = dict(driver_resources or {"time": "12h"})
    job = submit(SweepDriver(fn, space, kwargs, env), resources=res, cluster=cluster,
                 name=f"{kwargs.get('name') or getattr(fn, '__name__', 'sweep')}-driver".strip("<>").replace("<", ""))
    return RemoteSweep(job)
