"""The spec's slurmdbd record retention (issue 36.3): ``purge_*_after`` in Slurm's purge forms and
``archive_*``, checked at the spec's edge (one-line SpecError naming the field and the fix) and
rendered into slurmdbd.conf as ``Purge*After``/``Archive*`` lines; none by default."""
from __future__ import annotations

import pytest

from gpuhpc.cli.main import main
from gpuhpc.conf.render import render_spec
from gpuhpc.errors import SpecError
from gpuhpc.spec.cluster import load_spec, spec_from_data

PURGES = ("event", "job", "resv", "step", "suspend", "txn", "usage")
ARCHIVES = ("events", "jobs", "resvs", "steps", "suspend", "txn", "usage")


def _slurmdbd_conf(data: dict) -> list[str]:
    files, _ = render_spec(spec_from_data(data), storage_pass="pw-12345678")
    return files["slurmdbd.conf"].splitlines()


@pytest.mark.parametrize(("value", "rendered"), [
    ("12month", "12month"), ("12months", "12month"), ("12mo", "12month"), ("12MONTH", "12month"),
    ("12", "12month"), (12, "12month"),                       # a bare number is months, as in Slurm
    ("90days", "90days"), ("90day", "90days"), ("90d", "90days"), ("90Days", "90days"),
    ("720hours", "720hours"), ("720h", "720hours"), ("1hour", "1hours"), ("65535days", "65535days"),
])
def test_slurm_purge_forms_are_accepted_and_written_one_way(local_data, value, rendered):
    local_data["slurmdbd"]["purge_job_after"] = value
    assert spec_from_data(local_data).slurmdbd.purge_job_after == rendered
    assert f"PurgeJobAfter={rendered}" in _slurmdbd_conf(local_data)


@pytest.mark.parametrize(("value", "words"), [
    ("12 months", "e.g. 12month, 90days or 720hours"),
    ("12weeks", "unknown unit 'weeks'"),
    ("12minutes", "unknown unit 'minutes'"),
    ("12m", "ambiguous (Slurm reads months, not minutes); write 12month"),
    ("0days", "the count must be 1 to 65535"),
    ("65536hours", "the count must be 1 to 65535"),
    ("-3month", "e.g. 12month, 90days or 720hours"),
    ("month", "e.g. 12month, 90days or 720hours"),
    ("", "e.g. 12month, 90days or 720hours"),
    (True, "e.g. 12month, 90days or 720hours"),
    (1.5, "e.g. 12month, 90days or 720hours"),
])
def test_bad_purge_value_is_a_spec_error_naming_field_and_fix(local_data, value, words):
    local_data["slurmdbd"]["purge_step_after"] = value
    with pytest.raises(SpecError) as err:
        spec_from_data(local_data)
    line = err.value.one_line()
    assert line.startswith("slurmdbd.purge_step_after: "), line
    assert words in line, line


def test_bad_purge_value_exits_2_in_one_line_and_renders_nothing(capsys, tmp_path, local_data, write_spec):
    local_data["slurmdbd"]["purge_usage_after"] = "3 years"
    spec = write_spec(local_data)
    out = tmp_path / "out"
    assert main(["conf", "render", str(spec), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: slurmdbd.purge_usage_after: '3 years'"), err
    assert "12month, 90days or 720hours" in err, err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize(("settings", "words"), [
    ({"archive_jobs": True, "archive_dir": "/var/lib/slurm/archive"},
     "archive_jobs: Slurm archives jobs only when it purges them; set purge_job_after too"),
    ({"archive_txn": True, "purge_job_after": "12month", "archive_dir": "/a"},
     "archive_txn: Slurm archives txn only when it purges them; set purge_txn_after too"),
    ({"archive_steps": True, "purge_step_after": "3month"}, "archive_steps: set archive_dir"),
    ({"archive_dir": "/var/lib/slurm/archive"}, "nothing is archived; set archive_jobs"),
    ({"archive_dir": "relative/dir"}, "must be an absolute path"),
])
def test_archive_settings_that_cannot_work_are_refused(local_data, settings, words):
    local_data["slurmdbd"].update(settings)
    with pytest.raises(SpecError) as err:
        spec_from_data(local_data)
    line = err.value.one_line()
    assert line.startswith("slurmdbd"), line
    assert words in line, line


def test_default_sets_no_retention_line(repo_root):
    """Unset, Slurm keeps every record: nothing is written (the local cluster's slurmdbd.conf unchanged)."""
    files, _ = render_spec(load_spec(repo_root / "examples" / "clusters" / "local.yaml"), storage_pass="pw-12345678")
    conf = files["slurmdbd.conf"]
    assert "Purge" not in conf and "Archive" not in conf and "retention" not in conf, conf


def test_every_setting_renders_under_slurms_name_in_man_page_order(local_data):
    local_data["slurmdbd"].update({f"purge_{p}_after": f"{n}month" for n, p in enumerate(PURGES, start=1)})
    local_data["slurmdbd"].update({f"archive_{a}": True for a in ARCHIVES})
    local_data["slurmdbd"].update({"archive_dir": "/srv/slurm-archive", "archive_script": "/usr/local/sbin/archive.sh"})
    conf = _slurmdbd_conf(local_data)
    start = next(i for i, line in enumerate(conf) if line.startswith("# record retention"))
    assert conf[start + 1:] == [
        "ArchiveDir=/srv/slurm-archive", "ArchiveScript=/usr/local/sbin/archive.sh",
        "ArchiveEvents=yes", "ArchiveJobs=yes", "ArchiveResvs=yes", "ArchiveSteps=yes", "ArchiveSuspend=yes",
        "ArchiveTXN=yes", "ArchiveUsage=yes",
        "PurgeEventAfter=1month", "PurgeJobAfter=2month", "PurgeResvAfter=3month", "PurgeStepAfter=4month",
        "PurgeSuspendAfter=5month", "PurgeTXNAfter=6month", "PurgeUsageAfter=7month",
    ]


def test_archive_off_is_not_written(local_data):
    """archive_* false is Slurm's default (no): only the ones turned on are written."""
    local_data["slurmdbd"].update({"purge_job_after": "24month", "purge_step_after": "3month", "archive_jobs": True,
                                   "archive_steps": False, "archive_dir": "/srv/a"})
    conf = _slurmdbd_conf(local_data)
    assert [line for line in conf if line.startswith(("Archive", "Purge"))] == [
        "ArchiveDir=/srv/a", "ArchiveJobs=yes", "PurgeJobAfter=24month", "PurgeStepAfter=3month"]
