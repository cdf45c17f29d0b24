"""slurm_conf_value: what SlurmClient.cluster_name reads instead of ``scontrol show config``."""
from gpuhpc.slurm.parsers import slurm_conf_value


def test_key_is_case_insensitive_and_comments_are_ignored():
    text = "# ClusterName=commented\nclustername = Alpha  # trailing\nSlurmctldPort=6817\n"
    assert slurm_conf_value(text, "ClusterName") == "Alpha"


def test_missing_key_and_include_mean_unknown():
    assert slurm_conf_value("SlurmctldPort=6817\n", "ClusterName") is None
    assert slurm_conf_value("ClusterName=a\nInclude /etc/slurm/more.conf\n", "ClusterName") is None


def test_last_assignment_wins():
    assert slurm_conf_value("ClusterName=a\nClusterName=b\n", "ClusterName") == "b"
