"""gpuhpc.hostlist: the one hostlist helper (tests/integration/topology/test_hostlist_scontrol.py
checks the same tables against ``scontrol show hostnames`` / ``show hostlist``)."""
from __future__ import annotations

import random

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.hostlist import compress, compress_ranges, compress_terms, expand, expand_ranges, natural_key
from hostlist_cases import COMPRESS, EXPAND, INVALID, UNBALANCED


@pytest.mark.parametrize(("names", "expr"), COMPRESS)
def test_compress(names, expr):
    assert compress(names) == expr
    assert sorted(expand(expr)) == sorted(set(names))


@pytest.mark.parametrize(("expr", "names"), EXPAND)
def test_expand(expr, names):
    assert expand(expr) == names


def test_compress_keeps_term_order_and_drops_duplicates():
    assert compress(["login", "n2", "n1", "n2"]) == "login,n[1-2]"
    assert compress_terms(["gpu-node1", "gpu-node2", "login"]) == ["gpu-node[1-2]", "login"]
    assert compress([]) == ""


def test_round_trip_random():
    rng = random.Random(5)
    for _ in range(200):
        names = {f"{rng.choice(['gpu', 'dgx-a', 'x'])}{str(rng.randint(0, 300)).zfill(rng.choice([1, 3]))}"
                 for _ in range(rng.randint(1, 40))}
        assert set(expand(compress(names))) == names


@pytest.mark.parametrize("bad", INVALID + UNBALANCED)
def test_expand_rejects(bad):
    with pytest.raises(UserInputError) as exc:
        expand(bad, field="partitions[0].nodes")
    assert exc.value.exit_code == 2 and exc.value.field == "partitions[0].nodes"
    assert "\n" not in exc.value.one_line()


def test_ranges():
    assert expand_ranges("0-3,8") == [0, 1, 2, 3, 8]
    assert expand_ranges("48-49,176-177") == [48, 49, 176, 177]
    assert expand_ranges("") == []
    assert compress_ranges([5, 0, 1, 2, 9, 10, 11]) == "0-2,5,9-11"
    assert compress_ranges([7]) == "7" and compress_ranges([]) == ""
    for bad in ("0-", "3-1", "a", "0-2;4"):
        with pytest.raises(UserInputError):
            expand_ranges(bad)


def test_natural_key():
    assert sorted(["n10", "n2", "n1"], key=natural_key) == ["n1", "n2", "n10"]
