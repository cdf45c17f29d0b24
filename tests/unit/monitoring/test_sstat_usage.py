"""sstat rows -> per-job CPU seconds and peak RSS, and the Slurm exporter's per-job series."""
from gpuhpc.monitoring.slurm_exporter import samples
from gpuhpc.slurm.usage import cpu_seconds, parse_sstat, size_bytes, sstat

ROWS = "1625.batch|00:00:18|1|63868K\n1625.0|01:00.500|4|1.5G\n1626.extern|00:00:00|1|0\nbad line\n"


def test_parse_sstat_sums_steps_and_takes_the_largest_rss():
    got = parse_sstat(ROWS)
    assert got["1625"].cpu_seconds == 18 + 4 * 60.5 and got["1625"].max_rss_bytes == 1.5 * 2**30
    assert got["1626"].cpu_seconds == 0
    assert cpu_seconds("1-02:03:04") == 93784 and cpu_seconds("") is None
    assert size_bytes("63868K") == 63868 * 1024 and size_bytes("x") is None
    argv = sstat(["1", "2"])
    assert argv[0] == "sstat" and "--jobs=1,2" in argv and "--allsteps" in argv


def test_exporter_emits_job_cpu_and_memory():
    from gpuhpc.slurm.state import SlurmState

    class Row:
        job_id, user, account, partition, tres_per_node, nodes = "1625", "u", "a", "cpu", "N/A", 1
        state = SlurmState.parse("RUNNING")

    got = {(m, labels): v for m, labels, v in samples([], [Row()], parse_sstat(ROWS))}
    assert got[("gpuhpc_slurm_job_cpu_used_seconds", ("1625", "u", "a", "cpu"))] == 260.0
    assert got[("gpuhpc_slurm_job_memory_max_rss_bytes", ("1625", "u", "a", "cpu"))] == 1.5 * 2**30
