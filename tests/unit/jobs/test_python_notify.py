"""``gpuhpc.submit(fn, ..., notify=...)`` (issue 33.8): a Python call takes a job file's
``notify:``, checked alike (exit 2 naming ``notify.*``, nothing submitted); its mail reaches the
sbatch script submitit writes, its webhooks are registered for the notifier. submitit runs a
stand-in ``sbatch`` (first on PATH) that keeps the script it was given."""
from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs import api
from gpuhpc.jobs.spec import JobSpec, Notify, Resources
from gpuhpc.transport.local import LocalRunner


class _Client:
    """What submit_callable asks of a SlurmClient here: its runner and the nodes (none listed:
    sbatch decides)."""

    runner = LocalRunner()

    def nodes(self):
        return []


@pytest.fixture
def sbatch(tmp_path, monkeypatch):
    """A stand-in sbatch that copies each script it is given to ``scripts/<n>.sh`` and answers as
    sbatch does; returns the directory (empty while nothing was submitted)."""
    bindir, kept = tmp_path / "bin", tmp_path / "scripts"
    bindir.mkdir()
    kept.mkdir()
    (bindir / "sbatch").write_text(
        f"#!{sys.executable}\nimport os, shutil, sys\n"
        f"n = len(os.listdir({str(kept)!r}))\n"
        f"shutil.copy(sys.argv[-1], os.path.join({str(kept)!r}, f'{{n}}.sh'))\n"
        "print(f'Submitted batch job {4200 + n}')\n")
    (bindir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUHPC_LEDGER", "off")
    monkeypatch.setenv("GPUHPC_LOG_DIR", str(tmp_path / "logs"))
    return kept


def _submit(**kw):
    return api.submit(abs, -1, resources=Resources(partition="cpu", time="10m"), name="notify-py", client=_Client(), **kw)


def test_mail_reaches_the_sbatch_script(sbatch):
    job = _submit(notify={"mail": "me@example.org", "events": ["fail", "requeue_cap"]})
    assert job.job_id == "4200"
    script = (sbatch / "0.sh").read_text()
    assert "#SBATCH --mail-type=FAIL\n" in script and "#SBATCH --mail-user=me@example.org\n" in script
    _submit(notify=Notify(mail="alice"))                   # a Notify as well as a mapping
    assert "#SBATCH --mail-type=END,FAIL\n" in (sbatch / "1.sh").read_text()
    _submit()
    assert "--mail-" not in (sbatch / "2.sh").read_text()


def test_webhooks_are_registered_for_the_notifier(sbatch, tmp_path):
    job = _submit(notify={"webhook": "https://hooks.example.org/x", "events": ["end"]})
    reg = tmp_path / "data" / "notify" / f"{job.job_id}.json"
    assert stat.S_IMODE(reg.stat().st_mode) == 0o600
    rec = json.loads(reg.read_text())
    assert (rec["job_id"], rec["name"], rec["events"], rec["webhooks"]) == (
        job.job_id, "notify-py", ["end"], ["https://hooks.example.org/x"])
    assert "--mail-" not in (sbatch / "0.sh").read_text()


@pytest.mark.parametrize("value, field", [
    ({"webhook": "file:///etc/passwd"}, "notify.webhook[0]"),
    ({"webhooks": ["https://ok.example.org", "http://a b"]}, "notify.webhook[1]"),
    ({"mail": "a@b.org; rm -rf ~"}, "notify.mail"),
    ({"mail": "a@b.org", "events": ["end", "begin"]}, "notify.events[1]"),
    ({"events": ["end"]}, "notify"),
    ({"mail": "a@b.org", "sms": "1"}, "notify.sms"),
    ("me@example.org", "notify"),
])
def test_bad_notify_names_the_field_and_submits_nothing(sbatch, tmp_path, value, field):
    with pytest.raises(UserInputError) as err:
        _submit(notify=value)
    assert err.value.exit_code == 2 and err.value.field == field
    assert len(err.value.one_line().splitlines()) == 1
    assert list(sbatch.iterdir()) == [] and not (tmp_path / "data" / "notify").exists()


def test_mail_twice_and_batch_blocks_are_refused(sbatch):
    with pytest.raises(UserInputError) as err:
        api.submit(abs, -1, resources=Resources(partition="cpu", time="10m", extra=("--mail-user=x",)),
                   client=_Client(), notify={"mail": "a@b.org"})
    assert err.value.field == "notify.mail"
    with pytest.raises(UserInputError) as err:
        with api.batch():
            _submit(notify={"mail": "a@b.org"})
    assert err.value.field == "notify"
    assert list(sbatch.iterdir()) == []


def test_a_jobspec_takes_notify_once(monkeypatch):
    seen = []
    monkeypatch.setattr(api, "submit_spec", lambda spec, client=None: seen.append(spec))
    api.submit(JobSpec(command=("true",)), notify={"mail": "a@b.org"})
    assert seen[0].notify == Notify(mail="a@b.org")
    with pytest.raises(UserInputError) as err:
        api.submit(JobSpec(command=("true",), notify={"mail": "a@b.org"}), notify={"mail": "c@d.org"})
    assert err.value.field == "notify"
    with pytest.raises(UserInputError) as err:            # JobSpec's own check: no webhooks for an array
        api.submit(JobSpec(command=("true",), array="0-3"), notify={"webhook": "https://h.example.org/x"})
    assert err.value.field == "notify.webhook"
    assert len(seen) == 1
