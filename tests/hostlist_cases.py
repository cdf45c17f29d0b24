"""Hostlist cases shared by the unit tests (tests/unit/topology/test_hostlist.py) and the check
against scontrol (tests/integration/topology/test_hostlist_scontrol.py)."""
# (names, compressed): names in the order given, compressed as gpuhpc writes it
COMPRESS = [
    (["n09", "n10"], "n[09-10]"),
    (["dgx01", "dgx02", "dgx03", "dgx04", "dgx07"], "dgx[01-04,07]"),
    (["n1", "n2", "n10"], "n[1-2,10]"),
    (["gpu-node1", "gpu-node2", "mig-node1", "cpu-node1"], "gpu-node[1-2],mig-node1,cpu-node1"),
    (["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"], "rack[1-2]-n[1-2]"),
    (["a08-p1-dgx-04-c01", "a08-p1-dgx-04-c02"], "a08-p1-dgx-04-c[01-02]"),
    (["ubuntu"], "ubuntu"),
    (["n099", "n100", "n101"], "n[099-101]"),
    ([f"dgx{i:03d}" for i in range(1, 31)], "dgx[001-030]"),
    (["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"], "/dev/nvidia[0-1,3]"),
    (["gpu1-ib", "gpu2-ib"], "gpu1-ib,gpu2-ib"),      # Slurm allows no text after the last bracket
    (["r1-n1", "r2-n1", "r1-n2", "r2-n2"], "r[1-2]-n[1-2]"),
]

EXPAND = [
    ("gpu-node1", ["gpu-node1"]),
    ("gpu-node[1-3]", ["gpu-node1", "gpu-node2", "gpu-node3"]),
    ("dgx[001-003,7]", ["dgx001", "dgx002", "dgx003", "dgx7"]),
    ("a[1-2],b1", ["a1", "a2", "b1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("n[1-2],n1", ["n1", "n2", "n1"]),          # scontrol keeps duplicates
    ("a, b", ["a", "b"]),
    ("", []),
]

# Slurm (22.05) rejects these (text after the last bracket, bad ranges) and so does gpuhpc
INVALID = ["n[3-1]", "n[a-b]", "gpu[5-2]", "gpu[1-2]-ib", "x[001-003,010]y", "n[1-2]1"]
# unbalanced brackets: gpuhpc rejects them, scontrol prints garbage (`n[1-` -> `n]`)
UNBALANCED = ["n[1-", "n]1["]
