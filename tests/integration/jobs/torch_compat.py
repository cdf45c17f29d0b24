"""Real torch for the jobs tests: Debian 12's python3-torch (1.13, CPU, gloo), which
scripts/bootstrap.sh installs. It is built for Debian's own Python (``/usr/bin/python3``, 3.11),
not for the project's venv: the venv's numpy 2 cannot load a torch built against numpy 1.24, so the
job programs (``torch_*_train.py``) run under ``TORCH_PYTHON`` and find gpuhpc's job-side modules
(``gpuhpc.jobs.checkpoint``: stdlib only) in the checkout (:func:`add_checkout_to_path`).

Two things differ from torch 2.x, handled here:

* torch 1.13 predates Python 3.11: importing its distributed checkpoint (DCP) fails on 3.11's
  dataclass check (``ShardedTensorMetadata.tensor_properties = field(default=TensorProperties())``,
  a mutable default), and torchrun fails at start (``Std.from_str("0")`` is None: 3.11's Flag
  iteration skips ``Std.NONE``). :func:`install` rewrites those lines as torch 2.0 has them
  while the modules load (``_FIXES``); nothing else is changed. torchrun itself is
  torch_torchrun.py.
* DCP is ``torch.distributed._shard.checkpoint`` in 1.13 and ``torch.distributed.checkpoint``
  from 2.0: :func:`dcp` returns whichever this torch has (both write ``__<rank>_<n>.distcp``
  files, then ``.metadata`` under ``.metadata.tmp`` renamed last).

The tests call :func:`require_torch` (in the pytest process, which does not import torch): a
missing torch fails the test, naming the package, rather than skipping it."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import subprocess
import sys
from pathlib import Path

TORCH_PYTHON = "/usr/bin/python3"          # Debian's, where python3-torch installs torch
CHECKOUT = Path(__file__).resolve().parents[3]

# module -> (text, replacement): torch 2.0's lines for what Python 3.11 broke in torch 1.13
_FIXES = {
    "torch.distributed._shard.sharded_tensor.metadata":
        (b"field(default=TensorProperties())", b"field(default_factory=TensorProperties)"),
    "torch.distributed.elastic.multiprocessing.api":       # Std.from_str("0") was None: 3.11's
        (b"for s in Std:\n                if s == v:\n                    return s",   # Flag iteration
         b"return Std(v)"),                                                          # skips NONE, ALL
}


def require_torch() -> None:
    """Fail (not skip) when ``TORCH_PYTHON`` cannot import torch with gloo."""
    probe = "import torch, torch.distributed as d; assert d.is_gloo_available(); print(torch.__version__)"
    try:
        res = subprocess.run([TORCH_PYTHON, "-c", probe], capture_output=True, text=True, timeout=120)
    except OSError as exc:
        raise AssertionError(f"{TORCH_PYTHON}: {exc}; install python3-torch (scripts/bootstrap.sh)") from exc
    assert res.returncode == 0, (f"{TORCH_PYTHON} has no torch with gloo: install python3-torch "
                                 f"(scripts/bootstrap.sh does): {res.stderr[-500:]}")


def add_checkout_to_path() -> None:
    """gpuhpc's job-side modules from this checkout (the venv's site-packages are not on Debian's path)."""
    if str(CHECKOUT) not in sys.path:
        sys.path.insert(0, str(CHECKOUT))


class _Loader(importlib.machinery.SourceFileLoader):
    def get_data(self, path):
        data = super().get_data(path)
        old, new = _FIXES[self.name]
        return data.replace(old, new) if str(path).endswith(".py") else data

    def get_code(self, fullname):          # from the rewritten source, never a cached .pyc
        return self.source_to_code(self.get_data(self.path), self.path)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _FIXES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.origin and spec.origin.endswith(".py"):
            spec.loader = _Loader(fullname, spec.origin)
        return spec


def install() -> None:
    """Before importing torch.distributed's checkpoint or torchrun on torch 1.13 with Python 3.11."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def dcp():
    """torch's distributed checkpoint module (2.x name first, then 1.13's)."""
    install()
    try:
        import torch.distributed.checkpoint as mod
    except ImportError:
        import torch.distributed._shard.checkpoint as mod
    return mod
