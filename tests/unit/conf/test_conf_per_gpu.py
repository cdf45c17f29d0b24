"""DefCpuPerGPU / DefMemPerGPU per GPU partition, from the node sizing (issue 15)."""
from __future__ import annotations

from gpuhpc.conf.context import build_context
from gpuhpc.spec.cluster import load_spec

from .conftest import EXAMPLES


def _parts(spec) -> dict:
    return {p["name"]: p for p in build_context(spec)["partitions"]}


def test_gpu_partitions_get_their_nodes_share_per_gpu():
    parts = _parts(load_spec(EXAMPLES / "local.yaml"))
    assert (parts["gpu"]["def_cpu_per_gpu"], parts["gpu"]["def_mem_per_gpu"]) == (2, 8000)   # 16 CPUs, 64000 MB, 8 GPUs
    assert parts["mig"]["def_cpu_per_gpu"] == 1                    # 9 MIG instances share the node
    assert parts["cpu"]["def_cpu_per_gpu"] is None and parts["all"]["def_cpu_per_gpu"] is None   # not all GPU nodes
    dgx = _parts(load_spec(EXAMPLES / "dgx-h100-pod.yaml"))
    assert dgx["batch"]["def_cpu_per_gpu"] == 28


def test_a_partition_may_set_its_own(local_data, write_spec):
    for p in local_data["partitions"]:
        if p["name"] == "gpu":
            p["def_cpu_per_gpu"], p["def_mem_per_gpu_mb"] = 1, 4000
    parts = _parts(load_spec(write_spec(local_data)))
    assert (parts["gpu"]["def_cpu_per_gpu"], parts["gpu"]["def_mem_per_gpu"]) == (1, 4000)
