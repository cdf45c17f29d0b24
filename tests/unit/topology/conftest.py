from pathlib import Path

import pytest

from gpuhpc.cli.main import main


@pytest.fixture(scope="session")
def ndr_path(fixtures_dir) -> Path:
    return fixtures_dir / "ibnetdiscover" / "ndr-dgx-multirail.out"


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (rc, stdout, stderr)."""
    def run(*argv: str):
        rc = main(list(argv))
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run


@pytest.fixture
def write_spec(tmp_path):
    """A minimal cluster spec that ``gpuhpc conf validate`` accepts, with the given node groups
    (``dict``s of NodeGroup fields; sockets/cores/memory filled in) and one partition of ALL."""
    import yaml

    def write(*groups: dict, name: str = "cluster.yaml") -> Path:
        full = [{"sockets": 2, "cores_per_socket": 16, "memory_mb": 256000, **g} for g in groups]
        data = {"name": "t", "controller": {"hosts": ["ctl"]}, "node_groups": full,
                "partitions": [{"name": "all", "nodes": ["ALL"], "default": True}]}
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path
    return write
