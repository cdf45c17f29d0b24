"""should_stop under torch.distributed (NCCL) all-reduces on the rank's own GPU, cuda:LOCAL_RANK,
not torch.cuda.current_device() (GPU 0 in a script that never called set_device). A stand-in
torch module records the tensor's device; no torch needed."""
from __future__ import annotations

import sys
import types

import pytest

from gpuhpc.jobs import coord


class _Device:
    def __init__(self, kind: str, index: int | None = None) -> None:
        self.kind, self.index = kind, index


def _fake_torch(monkeypatch, *, visible: int, seen: list):
    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    torch.device = _Device
    torch.int32 = "int32"
    torch.cuda = types.SimpleNamespace(device_count=lambda: visible, current_device=lambda: 0)

    class _Tensor:
        def __init__(self, data, dtype, device):
            self.data, self.device = data, device
            seen.append(device)

        def item(self):
            return self.data[0]

    torch.tensor = _Tensor
    dist.is_available = lambda: True
    dist.is_initialized = lambda: True
    dist.get_backend = lambda: "nccl"
    dist.ReduceOp = types.SimpleNamespace(MAX="max")
    def all_reduce(t, op, async_op=False):
        seen.append(("all_reduce", async_op))
        if async_op:
            return types.SimpleNamespace(wait=lambda timeout=None: seen.append(("wait", timeout)))
        return None

    dist.all_reduce = all_reduce
    torch.distributed = dist
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


@pytest.mark.parametrize("local_rank,visible,expected", [("5", 8, 5), ("5", 1, 0), ("", 8, 0)])
def test_all_reduce_on_the_ranks_own_device(tmp_path, monkeypatch, local_rank, visible, expected):
    seen: list = []
    _fake_torch(monkeypatch, visible=visible, seen=seen)
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    monkeypatch.setenv("GPUHPC_STOP_DIR", str(tmp_path / "stop"))
    c = coord.StopCoordinator(rank=5, world_size=8, directory=tmp_path / "stop")
    c._installed = True
    assert c.should_stop(1) is False
    assert [(d.kind, d.index) for d in seen if isinstance(d, _Device)] == [("cuda", expected)]


def test_only_the_stop_handshake_waits_the_short_timeout(tmp_path, monkeypatch):
    """should_stop's all-reduce runs under the process group's own (long) timeout while nothing
    was requested (a peer in a long evaluation is not a hang); once this rank asks to stop, it
    waits at most stop_timeout() (3/4 of the grace) for its peers."""
    import datetime

    seen: list = []
    _fake_torch(monkeypatch, visible=8, seen=seen)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("GPUHPC_STOP_COLLECTIVE_TIMEOUT_S", "45")
    monkeypatch.setenv("GPUHPC_STOP_DIR", str(tmp_path / "stop"))
    c = coord.StopCoordinator(rank=0, world_size=2, directory=tmp_path / "stop")
    c._installed = True
    assert c.should_stop(1) is False
    assert [x for x in seen if isinstance(x, tuple)] == [("all_reduce", False)]
    seen.clear()
    c.local = True                          # this rank got SIGUSR2
    assert c.should_stop(2) is True
    assert [x for x in seen if isinstance(x, tuple)] == [("all_reduce", True),
                                                        ("wait", datetime.timedelta(seconds=45))]
