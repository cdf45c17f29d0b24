"""The sweep driver: ``python -m gpuhpc.sweeps.driver SWEEP_ID``, run as a small requeueable
job on the CPU partition (:func:`gpuhpc.sweeps.submission.start_driver`).

A loop with a sleep: bring the trials up to date from Slurm's accounting, submit the waiting
trials the limits allow now (a chunk at a time), and for ``tpe`` ask Optuna for new trials in
batches of ``parallelism`` (told the finished ones' objectives); with a ``pruner`` it stops the
trials the pruner names, with ``fail_fast`` it stops the sweep after that many failures. It exits when every trial is
finished or the sweep was cancelled. All its state is in the database, so after its own
requeue, preemption or a slurmctld restart it simply starts the loop again; a chunk it was
submitting when it was stopped is found again by name (:func:`~gpuhpc.sweeps.submission.recover`).
"""
from __future__ import annotations

import json
import os
import sys
import time


# a fatal error (one the loop does not retry) requeues the driver's job, this many times at most
MAX_FATAL_REQUEUES = 10


def _log(msg: str) -> None:
    sys.stderr.write(f"gpuhpc sweep driver[{time.strftime('%H:%M:%S')}]: {msg}\n")
    sys.stderr.flush()


def _tpe_ask(sid: int, spec, url: str | None, free: int) -> int:
    """Ask Optuna's TPE for a new trial for every free slot, telling it every finished one
    first and registering the running ones (so it does not propose them again). The study is
    rebuilt from the database each round, its sampler seeded with the sweep's seed and the
    number of trials so far: each round draws afresh, and the same sweep always proposes the
    same sequence."""
    import optuna

    from gpuhpc.sweeps import queries, store
    from gpuhpc.sweeps.state import TrialState

    rows = store.trial_rows(sid, url=url)
    active = [r for r in rows if not TrialState(r["state"]).is_terminal]
    room = min(free, spec.parallelism - len(active), spec.n_trials - len(rows))
    if room <= 0:
        return 0
    dists = {}
    for name, p in spec.parameters.items():
        if p.kind == "values":
            dists[name] = optuna.distributions.CategoricalDistribution(list(p.values))
        elif p.kind == "int":
            dists[name] = optuna.distributions.IntDistribution(int(p.low), int(p.high))
        else:
            dists[name] = optuna.distributions.FloatDistribution(p.low, p.high, log=p.kind == "loguniform")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=(spec.seed * 1_000_003 + len(rows)) % 2**32, constant_liar=True)
    study = optuna.create_study(direction=spec.metric.goal, sampler=sampler)
    for r in rows:
        if r["state"] == TrialState.COMPLETED.value and r["objective"] is not None:
            study.add_trial(optuna.trial.create_trial(params=r["params"], distributions=dists, value=r["objective"]))
        elif not TrialState(r["state"]).is_terminal:
            study.add_trial(optuna.trial.create_trial(params=r["params"], distributions=dists,
                                                      state=optuna.trial.TrialState.RUNNING))
    seen = {json.dumps(r["params"], sort_keys=True) for r in rows}
    new: list[dict] = []
    for _ in range(room * 20):              # a repeat (small discrete spaces) is asked again
        t = study.ask(dists)
        key = json.dumps(t.params, sort_keys=True)
        if key not in seen:
            seen.add(key)
            new.append(t.params)
            if len(new) == room:
                break
    if not new:
        return 0
    with store.transaction(url) as tx:
        last = queries.last_trial_number(tx, sid)
        queries.add_trials(tx, sid, (last if last is not None else -1) + 1, new, store.now())
    return len(new)


def _step(sid: int, client, url: str | None, limits: dict) -> bool:
    """One round: refresh, hand freed slots on (:func:`~gpuhpc.sweeps.submission.balance`), ask TPE,
    submit what fits. True when the driver is done (every trial finished, cancelled, blocked)."""
    from gpuhpc.errors import QuotaExceeded, SlurmError
    from gpuhpc.sweeps import control, holds, planner, store, submission
    from gpuhpc.sweeps.state import SweepStatus, TrialState
    from gpuhpc.sweeps.refresh import refresh
    from gpuhpc.sweeps.spec import spec_from_json

    counts = refresh(sid, client=client, url=url)
    sw = store.sweep_record(sid, url)
    status, n_trials, cluster = sw.status, sw.n_trials, sw.cluster
    spec = spec_from_json(sw.spec)
    # a pruner and fail_fast read the trials' progress every round: no longer pauses for them
    limits["paced"] = spec.pruner is None and spec.fail_fast is None
    if status == SweepStatus.CANCELLED.value:
        _log("cancelled: exiting")
        return True
    if status != SweepStatus.RUNNING.value:         # done (every trial finished), or blocked
        _log(f"sweep {status}: {json.dumps(counts, sort_keys=True)}; exiting")
        return True
    stopped = control.check_fail_fast(sid, client=client, url=url)
    if stopped:
        _log(f"sweep failed: {stopped}; exiting")
        return True
    pruned = control.prune(sid, client=client, url=url)
    if pruned:
        _log(f"pruned trial(s) {', '.join(map(str, pruned))}")
    free = submission.balance(sid, client=client, url=url)
    if spec.method == "tpe" and free > 0:
        if _tpe_ask(sid, spec, url, free):
            counts = refresh(sid, client=client, url=url)
    waiting = counts.get(TrialState.WAITING.value, 0)
    created = sum(counts.values())
    if waiting and free > 0:
        queued = store.queued_now(sid, url)
        fresh = _stale(limits, queued)
        for attempt in (1, 2):
            plan = planner.plan_submission(spec, client, len_waiting=waiting, queued_by_sweep=queued, fresh=fresh)
            n = min(plan.now, plan.chunk)
            if n <= 0:
                break
            try:
                holds.check_quota(spec, n, cluster or "default", url, holds.share_of(spec, client))
                ids = submission.submit_waiting(sid, client=client, url=url, limit=n)
                if ids:
                    _log(f"submitted {n} trial(s) as {', '.join(ids)}")
                break
            except SlurmError as exc:
                if "policy" not in (exc.one_line() + str(getattr(exc, "stderr", ""))).lower():
                    raise
                # the user's submit limit moved under us (other jobs, or a task that ended between
                # our refresh and slurmctld's count): ask afresh and try again now, not a round later
                limits["at"], fresh = (time.monotonic() if attempt == 1 else -1e9), True
                _log(f"slurmctld refused {n} more trial(s) (submit limit); "
                     f"{'asking the limits again' if attempt == 1 else 'again next round'}")
            except QuotaExceeded as exc:
                store.set_sweep(sid, url, status=SweepStatus.BLOCKED.value, message=exc.one_line())
                _log(f"blocked: {exc.one_line()}")
                return True
    terminal = sum(counts.get(st.value, 0) for st in TrialState if st.is_terminal)
    if created >= n_trials and terminal == created:
        _log(f"all {created} trials finished: {json.dumps(counts, sort_keys=True)}")
        return True
    return False


def _stale(limits: dict, queued: int) -> bool:
    """Ask slurmctld its limits (``scontrol show config``, ``show assoc_mgr``, the job record
    count) again at most once a minute; between, the cached answer stands."""
    t = time.monotonic()
    from gpuhpc.config import getenv

    if t - limits.get("at", -1e9) > getenv("GPUHPC_SWEEP_LIMITS_TTL"):
        limits["at"] = t
        return True
    return False


def run(sid: int, *, url: str | None = None, poll: float | None = None, once: bool = False) -> int:
    """The driver's loop. Any error (Slurm, the database, the file system) is logged and the
    round retried with a growing pause (up to 5 min); after ``GPUHPC_SWEEP_DRIVER_GIVE_UP``
    seconds (default 30 min) of nothing but errors it requeues its own job (a fresh start on
    perhaps another node) or, outside Slurm, exits 1."""
    from gpuhpc.sweeps import pacing, store, submission
    from gpuhpc.sweeps.refresh import pace_of

    from gpuhpc.config import getenv

    poll = poll if poll is not None else getenv("GPUHPC_SWEEP_DRIVER_POLL")
    give_up = getenv("GPUHPC_SWEEP_DRIVER_GIVE_UP")
    client = store.slurm_client()
    _log(f"sweep {sid}: starting (restart {os.environ.get('SLURM_RESTART_COUNT', '0')})")
    memo: dict = {}         # between rounds: the limits' age (_stale), whether to pace (_step)
    recovered = False
    failing_since: float | None = None
    pause = poll
    while True:
        try:
            if not recovered:
                submission.recover(sid, client=client, url=url)
                recovered = True
            if _step(sid, client, url, memo):
                return 0
            failing_since = None
            # by expectation, not by clock: the next round when a running trial is expected to end
            # (the run times seen so far), never sooner than a poll, or a couple of seconds while an
            # array runs its last wave with trials waiting for its slots (each freed slot handed on
            # soon); never later while a pruner or fail_fast follows the trials' progress
            floor = min(poll, 2.0) if store.draining(sid, url) else poll
            pause = pacing.pause(pace_of(sid), poll, floor=floor, most=None if memo.get("paced") else floor)
        except Exception as exc:       # slurmctld restarting, database gone, disk full...: again
            from gpuhpc.errors import GpuhpcError

            msg = exc.one_line() if isinstance(exc, GpuhpcError) else f"{type(exc).__name__}: {exc}"
            t = time.monotonic()
            failing_since = failing_since if failing_since is not None else t
            if t - failing_since > give_up:
                return _give_up(client, msg)
            pause = min(300.0, pause * 2)
            _log(f"{' '.join(msg.split())[:300]}; retrying in {pause:.0f}s")
        if once:
            return 0
        time.sleep(pause)


def _give_up(client, msg: str, why: str = "failing for too long") -> int:
    job = os.environ.get("SLURM_JOB_ID")
    _log(f"{why} ({msg[:200]}): {'requeueing job ' + job if job else 'exiting'}")
    if job:
        try:
            if client is None:
                from gpuhpc.sweeps import store

                client = store.slurm_client()
            client.requeue(job)
            return 0
        except Exception as exc:       # the requeue failed too: the job ends, `sweep wait` says so
            _log(f"requeue failed: {exc}")
    return 1


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.stderr.write("usage: python -m gpuhpc.sweeps.driver SWEEP_ID\n")
        return 2
    try:
        return run(int(args[0]))
    except Exception as exc:            # fatal: outside the loop's retries (start-up, a bug)
        if int(os.environ.get("SLURM_RESTART_COUNT") or 0) >= MAX_FATAL_REQUEUES:
            _log(f"fatal error after {MAX_FATAL_REQUEUES} requeues, exiting: {type(exc).__name__}: {exc}")
            return 1                    # `sweep wait` and `status` then say how to restart it
        return _give_up(None, f"{type(exc).__name__}: {exc}", "fatal error")


if __name__ == "__main__":
    sys.exit(main())
