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


class _Runner:
    """A runner whose files and commands are canned; ``is_local`` as given."""

    def __init__(self, is_local: bool, files: dict[str, str]) -> None:
        self.is_local, self.files, self.calls = is_local, files, []

    def getenv(self, key):
        return None

    def read_file(self, path):
        from gpuhpc.errors import TransportError

        if path not in self.files:
            raise TransportError(f"cannot read {path}")
        return self.files[path]

    def run(self, argv, *, input=None, timeout=None, env=None):
        from gpuhpc.transport import CommandResult

        self.calls.append(argv)
        return CommandResult(tuple(argv), 0, "Configuration data as of 2026\nClusterName             = Remote\n", "")


def test_cluster_name_reads_slurm_conf_only_where_commands_run_here():
    from gpuhpc.slurm import SlurmClient

    conf = {"/etc/slurm/slurm.conf": "ClusterName=Local\n"}
    local = _Runner(True, conf)
    assert SlurmClient(local).cluster_name() == "local" and local.calls == []
    remote = _Runner(False, conf)        # an SSH runner: this host's slurm.conf is not the cluster's
    assert SlurmClient(remote).cluster_name() == "Remote" and remote.calls == [["scontrol", "show", "config"]]
    configless = _Runner(True, {})
    assert SlurmClient(configless).cluster_name() == "Remote"


def test_parse_show_config():
    from gpuhpc.slurm.parsers import parse_show_config

    text = "Configuration data as of 2026-11-30T13:00:00\nAccountingStorageType   = accounting_storage/slurmdbd\n" \
           "ClusterName             = local\n\nCgroup Support Configuration:\nAllowedRAMSpace         = 100.0%\n"
    cfg = parse_show_config(text)
    assert cfg["ClusterName"] == "local" and cfg["AllowedRAMSpace"] == "100.0%" and len(cfg) == 3
