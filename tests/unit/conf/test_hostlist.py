from __future__ import annotations

import pytest

from gpuhpc.spec import hostlist


@pytest.mark.parametrize(("expr", "names"), [
    ("gpu-node1", ["gpu-node1"]),
    ("gpu-node[1-3]", ["gpu-node1", "gpu-node2", "gpu-node3"]),
    ("dgx[001-003,7]", ["dgx001", "dgx002", "dgx003", "dgx7"]),
    ("a[1-2],b1", ["a1", "a2", "b1"]),
])
def test_expand(expr, names):
    assert hostlist.expand(expr) == names


@pytest.mark.parametrize(("names", "expr"), [
    (["gpu-node1", "gpu-node2", "mig-node1"], "gpu-node[1-2],mig-node1"),
    ([f"dgx{i:03d}" for i in range(1, 31)], "dgx[001-030]"),
    (["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"], "/dev/nvidia[0-1,3]"),
    (["login"], "login"),
])
def test_compress_round_trip(names, expr):
    assert hostlist.compress(names) == expr
    assert hostlist.expand(expr) == names


@pytest.mark.parametrize("bad", ["n[1-", "n[3-1]", "n[a-b]", "n]1["])
def test_expand_rejects(bad):
    with pytest.raises(ValueError):
        hostlist.expand(bad)


def test_parse_ranges():
    assert hostlist.parse_ranges("0-3,8") == [0, 1, 2, 3, 8]
