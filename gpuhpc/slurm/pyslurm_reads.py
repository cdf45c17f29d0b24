"""The pyslurm transport: jobs, nodes, partitions and accounting read through Slurm's C API
in-process (pyslurm, built against the running Slurm), as the same records the text and JSON
parsers return. The only module that imports pyslurm; :class:`gpuhpc.slurm.client.SlurmClient`
calls it only after :func:`available_version` matched the running Slurm's major.minor.

pyslurm reads the process's ``SLURM_CONF`` when it is imported (one cluster per process)."""
from __future__ import annotations

import importlib.util
import re
import sys

_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def available_version() -> tuple[int, int, int] | None:
    """pyslurm's version when it is installed and imports (its major.minor is the Slurm API it
    was built for), else None. Costs nothing when it is not installed."""
    if "pyslurm" not in sys.modules and importlib.util.find_spec("pyslurm") is None:
        return None
    try:
        import pyslurm
    except Exception:                   # noqa: BLE001 - a libslurm it cannot load, no slurm.conf, ...
        return None
    m = _VERSION.search(str(getattr(pyslurm, "__version__", "") or pyslurm.version()))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None
