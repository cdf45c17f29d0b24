"""Image references, mounts and container fields: what pyxis takes, everything else exit 2."""
from __future__ import annotations

import pytest

from gpuhpc.containers.image import ImageRef, check_mount, parse_ref
from gpuhpc.errors import UserInputError
from gpuhpc.jobs.spec import JobSpec, Resources

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text, ref", [
    ("nvcr.io#nvidia/pytorch:24.05-py3", ImageRef("nvcr.io", "nvidia/pytorch", "24.05-py3")),
    ("127.0.0.1:5000#gpuhpc/test:1", ImageRef("127.0.0.1:5000", "gpuhpc/test", "1")),
    (f"127.0.0.1:5000#gpuhpc/test@{DIGEST}", ImageRef("127.0.0.1:5000", "gpuhpc/test", None, DIGEST)),
    (f"registry.example.org#a/b/c:v2@{DIGEST}", ImageRef("registry.example.org", "a/b/c", "v2", DIGEST)),
    ("ubuntu:22.04", ImageRef("docker.io", "ubuntu", "22.04")),
    ("library/debian", ImageRef("docker.io", "library/debian")),
])
def test_valid_refs(text, ref):
    assert parse_ref(text) == ref
    assert str(parse_ref(text)) == text


@pytest.mark.parametrize("text, words", [
    ("nvcr.io/nvidia/pytorch:24.05-py3", "write nvcr.io#nvidia/pytorch:24.05-py3"),
    ("localhost:5000/x:1", "pyxis wants '#'"),
    ("reg#UPPER/case:1", "not a repository"),
    ("reg#a/b:t@sha256:abc", "not a digest"),
    ("reg#a/b:bad!tag", "not an image tag"),
    ("bad host#a/b", "blanks"),
    ("reg#a/b:1,--container-mounts=/:/x", "commas"),
    ("reg#a/b\n", "control"),
    ("reg#a/b'", "quotes"),
    ("", "expected an image"),
    ("-x#a/b", "registry host"),
])
def test_invalid_refs_name_the_field(text, words):
    with pytest.raises(UserInputError) as e:
        parse_ref(text, "resources.image")
    assert e.value.exit_code == 2
    assert str(e.value).startswith("resources.image") and words in f"{e.value} {e.value.hint}"


def test_mounts():
    assert check_mount("/data:/data:ro") == "/data:/data:ro"
    assert check_mount("/a/b:/c") == "/a/b:/c"
    for bad in ("data:/x", "/a:b", "/a,/b:/c", "/a:/b:rx", "/a:/b:ro:x", "/a b:/c", "/a:/b\t", "/a/../etc:/x", "/a"):
        with pytest.raises(UserInputError) as e:
            check_mount(bad, "mounts[0]")
        assert str(e.value).startswith("mounts[0]")


def test_resources_fields():
    r = Resources(image="nvcr.io#nvidia/pytorch:24.05-py3", mounts=["/d:/d:ro"], container_workdir="/w")
    assert r.mounts == ("/d:/d:ro",)
    with pytest.raises(UserInputError, match="resources.mounts"):
        Resources(mounts=("/d:/d",))                   # no image
    with pytest.raises(UserInputError, match="resources.container_workdir"):
        Resources(image="a#b", container_workdir="rel")
    with pytest.raises(UserInputError, match="resources.image_python"):
        Resources(image="a#b", image_python="yes")


def test_job_file_container_section():
    spec = JobSpec.from_mapping({"command": ["true"], "container": {
        "image": f"reg:5000#x/y@{DIGEST}", "mounts": ["/ckpt:/ckpt"], "workdir": "/ws"}})
    assert spec.resources.image == f"reg:5000#x/y@{DIGEST}"
    assert spec.resources.mounts == ("/ckpt:/ckpt",) and spec.resources.container_workdir == "/ws"
    assert JobSpec.from_mapping({"command": ["true"], "container": "a#b:1"}).resources.image == "a#b:1"
    with pytest.raises(UserInputError, match="container.imag"):
        JobSpec.from_mapping({"command": ["true"], "container": {"imag": "a#b"}})
    with pytest.raises(UserInputError, match="container.image"):
        JobSpec.from_mapping({"command": ["true"], "container": {"mounts": ["/a:/b"]}})


def test_a_command_sweep_runs_in_an_image():
    from gpuhpc.sweeps.spec import SweepSpec

    spec = SweepSpec.from_mapping({"name": "s", "command": "python t.py --lr {lr}", "metric": {"name": "loss"},
                                   "method": "grid", "parameters": {"lr": {"values": [1, 2]}},
                                   "resources": {"image": "a#b:1", "mounts": ["/d:/d"]}})
    assert spec.res.image == "a#b:1" and spec.res.mounts == ("/d:/d",)


def test_a_python_sweep_runs_in_an_image_that_declares_its_python_with_the_sweep_directory_mounted(tmp_path):
    from gpuhpc.sweeps.planner import trial_container
    from gpuhpc.sweeps.spec import SweepSpec

    data = {"name": "s", "metric": {"name": "loss"}, "method": "grid", "parameters": {"lr": {"values": [1, 2]}},
            "resources": {"image": "a#b@sha256:" + "0" * 64, "mounts": ["/d:/d"]}}
    with pytest.raises(UserInputError, match="resources.image_python.*cloudpickle and gpuhpc"):
        SweepSpec.from_mapping(data, python=True)
    spec = SweepSpec.from_mapping({**data, "resources": {**data["resources"], "image_python": True}}, python=True)
    args = trial_container(spec, tmp_path, "python")
    assert args[1] == f"--container-mounts=/d:/d,{tmp_path}:{tmp_path}", args
    with pytest.raises(UserInputError, match="GPUHPC_DATA_DIR.*cannot be mounted"):
        trial_container(spec, tmp_path / "a,b", "python")
    command = SweepSpec.from_mapping({**data, "command": "echo {lr}"})
    assert trial_container(command, tmp_path / "a b", "command") == [f"--container-image={data['resources']['image']}",
                                                                   "--container-mounts=/d:/d"]
