import random

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.topology.hostlist import compress, expand


@pytest.mark.parametrize("names,expr", [
    (["dgx01", "dgx02", "dgx03", "dgx04", "dgx07"], "dgx[01-04,07]"),
    (["n1", "n2", "n10"], "n[1-2,10]"),
    (["gpu-node1", "gpu-node2", "mig-node1", "cpu-node1"], "cpu-node1,gpu-node[1-2],mig-node1"),
    (["a08-p1-dgx-04-c01", "a08-p1-dgx-04-c02"], "a08-p1-dgx-04-c[01-02]"),
    (["ubuntu"], "ubuntu"),
    (["n099", "n100", "n101"], "n[099-101]"),
])
def test_compress(names, expr):
    assert compress(names) == expr
    assert sorted(expand(expr)) == sorted(set(names))


def test_round_trip_random():
    rng = random.Random(5)
    for _ in range(200):
        names = {f"{rng.choice(['gpu', 'dgx-a', 'x'])}{str(rng.randint(0, 300)).zfill(rng.choice([1, 3]))}"
                 for _ in range(rng.randint(1, 40))}
        assert set(expand(compress(names))) == names


def test_expand_errors():
    with pytest.raises(UserInputError):
        expand("gpu[1-")
    with pytest.raises(UserInputError):
        expand("gpu[5-2]")
