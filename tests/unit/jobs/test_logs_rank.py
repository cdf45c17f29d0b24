"""``gpuhpc logs JOB --rank N`` without Slurm: the templates label each rank's lines, one rank's
lines are picked out (whole or chunk by chunk while following), the rank is checked against the
job's tasks, Python mode's per-task files are read."""
from __future__ import annotations

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs.logs import RankLines, RankLog, check_rank, filter_rank, labels, submitit_rank_path
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources

LOG = (b"gpuhpc[10:00:00]: job 7 restart 0 on n1; checkpoint dir /c; latest none\n"
       b"0: step 1 from rank 0\n"
       b"1: step 1 from rank 1\n"
       b"noise with no label\n"
       b"srun: error: n2: task 1: Exited with exit code 3\n"
       b"1: 2: a line of rank 1 that holds a label-like text\n")


@pytest.mark.parametrize("template", ["deepspeed", "mpi", "torchrun"])
def test_multi_rank_templates_label_each_line_with_its_task(template):
    text = render(JobSpec(command=("prog",), template=template, resources=Resources(nodes=2, gpus=2)))
    srun = [line for line in text.splitlines() if line.lstrip().startswith("setsid srun")]
    assert len(srun) == 1 and " --label " in srun[0], srun


def test_single_template_runs_no_labelled_step():
    text = render(JobSpec(command=("prog",), resources=Resources(gpus=1)))
    assert "--label" not in text


def test_one_rank_keeps_its_lines_without_the_label_and_gpuhpcs_own():
    assert filter_rank(LOG, 1) == (b"gpuhpc[10:00:00]: job 7 restart 0 on n1; checkpoint dir /c; latest none\n"
                                   b"step 1 from rank 1\n"
                                   b"srun: error: n2: task 1: Exited with exit code 3\n"
                                   b"2: a line of rank 1 that holds a label-like text\n")
    assert b"rank 1" not in filter_rank(LOG, 0) and b"step 1 from rank 0\n" in filter_rank(LOG, 0)
    assert labels(LOG) == {0, 1}


def test_padded_labels_of_ten_tasks_or_more():
    assert filter_rank(b" 3: three\n11: eleven\n", 3) == b"three\n"
    assert filter_rank(b" 3: three\n11: eleven\n", 11) == b"eleven\n"


def test_lines_cut_between_chunks_are_joined_before_filtering():
    f = RankLines(1)
    out = b""
    for i in range(0, len(LOG), 5):         # every line cut somewhere
        out += f.feed(LOG[i:i + 5])
    assert out + f.flush() == filter_rank(LOG, 1)
    g = RankLines(0)
    assert g.feed(b"0: no newline yet") == b"" and g.flush() == b"no newline yet"


@pytest.mark.parametrize("value, tasks, words", [
    ("-1", None, "'-1' is not a rank"), ("x", 4, "'x' is not a rank"), ("1.5", 4, "is not a rank"),
    ("4", 4, "rank 4 is past the job's 4 task(s)"), ("1", 1, "past the job's 1 task(s)"),
])
def test_bad_ranks_name_the_option(value, tasks, words):
    with pytest.raises(UserInputError) as err:
        check_rank(value, tasks)
    assert err.value.field == "--rank" and words in str(err.value)


def test_good_ranks():
    assert check_rank("0", 1) == 0 and check_rank(" 3 ", 4) == 3 and check_rank(7) == 7


def test_submitit_task_files():
    assert submitit_rank_path("/l/12_0_log.out", 3) == "/l/12_3_log.out"
    assert submitit_rank_path("/l/%j_%t_log.err", 2, "12") == "/l/12_2_log.err"
    assert submitit_rank_path("/l/job-12.out", 2) is None


class _Runner:
    def __init__(self, files):
        self.files = files

    def read_from(self, path, offset):
        return self.files.get(path, b"")[offset:]


class _Client:
    def __init__(self, rec, files):
        self.rec, self.runner = rec, _Runner(files)

    def show_job(self, job_id):
        return self.rec


class _Job:
    job_id = "7"

    def __init__(self, rec, files, path="/l/j-7.out", states=(True,)):
        self.client, self._path, self._states = _Client(rec, files), path, list(states)

    def log_path(self, rec=None):
        return self._path

    def done(self):
        return self._states.pop(0) if len(self._states) > 1 else self._states[0]


def test_rank_is_checked_against_slurms_task_count():
    job = _Job({"NumTasks": "4", "StdOut": "/l/j-7.out"}, {"/l/j-7.out": LOG})
    assert RankLog(job, "3").tasks == 4
    with pytest.raises(UserInputError, match="rank 4 is past the job's 4 task"):
        RankLog(job, "4")


def test_a_forgotten_job_counts_the_labels_in_its_log():
    job = _Job(None, {"/l/j-7.out": LOG})
    assert RankLog(job, 1).text() == filter_rank(LOG, 1)
    with pytest.raises(UserInputError, match="past the job's 2 task"):
        RankLog(job, 2)


def test_a_one_task_job_is_all_rank_0():
    job = _Job({"NumTasks": "1"}, {"/l/j-7.out": b"plain output\n"})
    assert RankLog(job, 0).text() == b"plain output\n"
    with pytest.raises(UserInputError, match="--rank|past"):
        RankLog(job, 1)


def test_python_mode_reads_the_tasks_own_file():
    job = _Job({"NumTasks": "2"}, {"/l/7_0_log.out": b"zero\n", "/l/7_1_log.out": b"one\n"}, path="/l/7_0_log.out")
    log = RankLog(job, 1)
    assert log.file == "/l/7_1_log.out" and log.text() == b"one\n"


def test_follow_reads_what_each_run_appends_until_the_job_is_finished():
    files = {"/l/j-7.out": b""}
    job = _Job({"NumTasks": "2"}, files, states=[False, False, False, True])
    runs = [b"gpuhpc[1]: job 7 restart 0\n0: a0\n1: a", b"1\n", b"gpuhpc[2]: job 7 restart 1\n1: b1\n0: b0\n"]
    got = []
    follow = RankLog(job, 1).follow(poll=0, check_every=-1)
    for data in runs:                      # each poll finds what one more run appended
        files["/l/j-7.out"] += data
        got.append(next(follow))
    got += list(follow)
    assert b"".join(got) == b"gpuhpc[1]: job 7 restart 0\na1\ngpuhpc[2]: job 7 restart 1\nb1\n"
