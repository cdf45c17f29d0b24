"""gpuhpc.containers.gpus: a job's GPUs (Slurm's GRES indices) as NVML UUIDs for the enroot GPU hook,
through the device files' minor numbers (issue 39.2: on HGX boards GRES and NVML indices differ)."""
from __future__ import annotations

import pytest

from gpuhpc.containers import gpus
from gpuhpc.errors import GpuhpcError
from gpuhpc.hostlist import expand

GRES = """# gres.conf
AutoDetect=off
NodeName=gpu-node[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-7
NodeName=gpu-node[1-2] Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=8-15
NodeName=odd Name=gpu File=/dev/nvidia3,/dev/nvidia1
NodeName=odd Name=nic File=/dev/infiniband/uverbs0
"""


@pytest.mark.parametrize("text", ["gpu-node[1-2]", "/dev/nvidia[0-3]", "n[01-03,7],cpu1", "r[1-2]-n[08-10]", "a,b", "x"])
def test_bracket_expansion_is_the_hostlist_ones(text):
    assert gpus.expand_brackets(text) == expand(text)


def test_gres_files_are_the_nodes_gpu_files_in_gres_conf_order():
    assert gpus.gres_gpu_files(GRES, "gpu-node2") == [f"/dev/nvidia{i}" for i in range(8)]
    assert gpus.gres_gpu_files(GRES, "odd") == ["/dev/nvidia3", "/dev/nvidia1"]     # the file's order, not sorted
    assert gpus.gres_gpu_files(GRES, "cpu-node1") == []


def test_autodetect_nvml_means_nvml_order():
    assert gpus.gres_gpu_files("AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-1]\n", "n1") is None
    assert gpus.gres_gpu_files("NodeName=n1 AutoDetect=nvml\n", "n1") is None
    assert gpus.gres_gpu_files("NodeName=n2 AutoDetect=nvml\nName=gpu File=/dev/nvidia0\n", "n1") == ["/dev/nvidia0"]


def test_uuids_go_through_the_device_minor_not_the_index():
    # /dev/null is 1:3 and /dev/zero 1:5: Slurm's GPU 0 is minor 3, GPU 1 minor 5; NVML lists minor 5 first
    nvml = [(5, "GPU-five"), (3, "GPU-three")]
    assert gpus.uuids([0, 1], ["/dev/null", "/dev/zero"], nvml) == ["GPU-three", "GPU-five"]
    assert gpus.uuids([1], ["/dev/null", "/dev/zero"], nvml) == ["GPU-five"]
    assert gpus.uuids([0], None, nvml) == ["GPU-five"]                 # AutoDetect=nvml: NVML's index


def test_a_gpu_that_cannot_be_mapped_is_an_error_naming_it(tmp_path):
    with pytest.raises(GpuhpcError, match=r"minor 3\) is none of NVML's GPUs \(minors \[5\]\)"):
        gpus.uuids([0], ["/dev/null"], [(5, "GPU-five")])
    with pytest.raises(GpuhpcError, match="GPU 2 has no device file"):
        gpus.uuids([2], ["/dev/null"], [(3, "GPU-three")])
    (tmp_path / "plain").write_text("")
    with pytest.raises(GpuhpcError, match="is not a character device"):
        gpus.uuids([0], [str(tmp_path / "plain")], [(3, "GPU-three")])
    with pytest.raises(GpuhpcError, match="among NVML's 1 GPUs"):
        gpus.uuids([1], None, [(3, "GPU-three")])


SMI_Q = """
==============NVSMI LOG==============
Attached GPUs                             : 2
GPU 00000000:18:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    GPU UUID                              : GPU-aaaa
    Minor Number                          : 2
    VBIOS Version                         : 96.00.74.00.0D
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    GPU UUID                              : GPU-bbbb
    Minor Number                          : 0
"""


def test_nvidia_smi_q_gives_minor_and_uuid_in_its_order():
    assert gpus.smi_devices(SMI_Q) == [(2, "GPU-aaaa"), (0, "GPU-bbbb")]


def test_job_gpu_uuids_reads_gres_conf_beside_slurm_conf_and_the_nvml_file(tmp_path):
    (tmp_path / "gres.conf").write_text("NodeName=n1 Name=gpu File=/dev/zero,/dev/null\n")
    nvml = tmp_path / "nv.py"
    nvml.write_text("D = [(3, 'GPU-three'), (5, 'GPU-five')]\n"
                    "def nvmlInit(): pass\n"
                    "def nvmlShutdown(): pass\n"
                    "def nvmlDeviceGetCount(): return len(D)\n"
                    "def nvmlDeviceGetHandleByIndex(i): return D[i]\n"
                    "def nvmlDeviceGetMinorNumber(h): return h[0]\n"
                    "def nvmlDeviceGetUUID(h): return h[1].encode()\n")
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf"), "SLURMD_NODENAME": "n1", "GPUHPC_NVML_MODULE": str(nvml)}
    assert gpus.job_gpu_uuids("1,0", env) == ["GPU-three", "GPU-five"]
    with pytest.raises(GpuhpcError, match="not a list of Slurm GPU indices"):
        gpus.job_gpu_uuids("GPU-x", env)
