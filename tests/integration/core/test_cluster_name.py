"""SlurmClient.cluster_name (read from slurm.conf) agrees with ``scontrol show config``."""
import pytest

from gpuhpc.slurm.client import SlurmClient

pytestmark = pytest.mark.integration


def test_cluster_name_matches_scontrol():
    client = SlurmClient()
    assert client.cluster_name() == client.config()["ClusterName"] != ""
