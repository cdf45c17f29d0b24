"""A ``torch`` stand-in: the subset of PyTorch that ``gpuhpc.jobs.profile`` calls (``torch.profiler``
and ``torch.cuda``), so that its runtime path (start the profiler at the window's first step, stop
it and write this rank's Chrome trace at its last, or at exit inside the window) runs where torch
is not installed. Test machinery, not part of the package: a test puts
``tests/standins/torch_profiler`` first on a subprocess's ``PYTHONPATH`` (it shadows a real torch
there). As real torch does, a ``torch.profiler.record_function(name)`` range inside an active
profiler becomes a complete ("X") event named ``name`` in the exported trace; outside one it
records nothing. No CUDA: ``torch.cuda.is_available()`` is False."""
from __future__ import annotations

import enum
import json
import os
import threading
import time
from types import SimpleNamespace

_active: list["_Profile"] = []


class ProfilerActivity(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


class _Profile:
    def __init__(self, activities=None, **_ignored) -> None:
        self.activities = list(activities or [ProfilerActivity.CPU])
        self.events: list[dict] = []
        self.running = False

    def __enter__(self):
        if self.running:
            raise RuntimeError("torch stand-in: profiler already started")
        self.running = True
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        if not self.running:
            raise RuntimeError("torch stand-in: profiler not started")
        self.running = False
        _active.remove(self)

    def export_chrome_trace(self, path: str) -> None:
        if self.running:
            raise RuntimeError("torch stand-in: export_chrome_trace while the profiler runs")
        with open(path, "w") as fh:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, fh)


class _RecordFunction:
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self):
        self.t0 = time.perf_counter_ns()
        return self

    def __exit__(self, *exc) -> None:
        t1 = time.perf_counter_ns()
        for prof in _active:
            prof.events.append({"ph": "X", "cat": "user_annotation", "name": self.name, "pid": os.getpid(),
                                "tid": threading.get_ident(), "ts": self.t0 / 1000, "dur": (t1 - self.t0) / 1000})


profiler = SimpleNamespace(ProfilerActivity=ProfilerActivity, profile=_Profile, record_function=_RecordFunction)


def _no_cuda(*_a, **_k):
    raise RuntimeError("torch stand-in: no CUDA here")


cuda = SimpleNamespace(is_available=lambda: False, cudart=_no_cuda)
