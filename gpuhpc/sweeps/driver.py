"""The sweep driver: ``python -m gpuhpc.sweeps.driver SWEEP_ID``, run as a small requeueable
job on the CPU partition (:func:`gpuhpc.sweeps.engine.start_driver`).

A loop with a sleep: bring the trials up to date from Slurm's accounting, submit the waiting
trials the limits allow now (a chunk at a time), and for ``tpe`` ask Optuna for new trials in
batches of ``parallelism`` (told the finished ones' objectives). It exits when every trial is
finished or the sweep was cancelled. All its state is in the database, so after its own
requeue, preemption or a slurmctld restart it simply starts the loop again; a chunk it was
submitting when it was stopped is found again by name (:func:`~gpuhpc.sweeps.engine.recover`).
"""
from __future__ import annotations

import json
import os
import sys
import time


def _log(msg: str) -> None:
    sys.stderr.write(f"gpuhpc sweep driver[{time.strftime('%H:%M:%S')}]: {msg}\n")
    sys.stderr.flush()


def _tpe_ask(sid: int, spec, url: str | None) -> int:
    """Ask Optuna (TPE, seeded) for up to ``parallelism`` new trials, telling it every finished
    one first (the study is rebuilt from the database each time: nothing else to keep)."""
    import optuna
    from sqlalchemy import func, insert

    from gpuhpc.sweeps import engine
    from gpuhpc.sweeps.models import SweepTrial, TrialState

    rows = engine.trial_rows(sid, url=url)
    active = [r for r in rows if not TrialState(r["state"]).is_terminal]
    room = min(spec.parallelism - len(active), spec.n_trials - len(rows))
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
    study = optuna.create_study(direction=spec.metric.goal, sampler=optuna.samplers.TPESampler(seed=spec.seed))
    for r in rows:
        if r["state"] == TrialState.COMPLETED.value and r["objective"] is not None:
            study.add_trial(optuna.trial.create_trial(params=r["params"], distributions=dists, value=r["objective"]))
    new = [study.ask(dists).params for _ in range(room)]
    with engine._session(url) as s:
        start = (s.query(func.max(SweepTrial.number)).filter_by(sweep_id=sid).scalar() or -1) + 1
        t = engine.now()
        s.execute(insert(SweepTrial), [dict(sweep_id=sid, number=start + i, params=json.dumps(p, sort_keys=True),
                                             state=TrialState.WAITING.value, attempts=0, restarts=0, gpu_hours=0,
                                             updated_at=t) for i, p in enumerate(new)])
    return len(new)


def run(sid: int, *, url: str | None = None, poll: float | None = None, once: bool = False) -> int:
    from gpuhpc.errors import GpuhpcError, QuotaExceeded
    from gpuhpc.sweeps import engine
    from gpuhpc.sweeps.models import Sweep, SweepStatus, TrialState

    poll = poll if poll is not None else float(os.environ.get("GPUHPC_SWEEP_DRIVER_POLL", "10"))
    client = engine._client()
    _log(f"sweep {sid}: starting (restart {os.environ.get('SLURM_RESTART_COUNT', '0')})")
    engine.recover(sid, client=client, url=url)
    while True:
        try:
            counts = engine.refresh(sid, client=client, url=url)
            with engine._session(url) as s:
                sw = s.get(Sweep, sid)
                status, n_trials = sw.status, sw.n_trials
                spec = engine.spec_from_json(sw.spec)
            if status == SweepStatus.CANCELLED.value:
                _log("cancelled: exiting")
                return 0
            if spec.method == "tpe" and status == SweepStatus.RUNNING.value:
                if _tpe_ask(sid, spec, url):
                    counts = engine.refresh(sid, client=client, url=url)
            waiting = counts.get(TrialState.WAITING.value, 0)
            created = sum(counts.values())
            if waiting and status == SweepStatus.RUNNING.value:
                queued = sum(counts.get(st.value, 0) for st in (TrialState.PENDING, TrialState.RUNNING,
                                                                 TrialState.REQUEUED))
                plan = engine.plan_submission(spec, client, len_waiting=waiting, queued_by_sweep=queued,
                                              fresh=True)
                n = min(plan.now, plan.chunk)
                if n > 0:
                    try:
                        engine.check_quota(spec, n, "default" if not sw.cluster else sw.cluster, url)
                        ids = engine.submit_waiting(sid, client=client, url=url, limit=n)
                        _log(f"submitted {n} trial(s) as {', '.join(ids)}")
                    except QuotaExceeded as exc:
                        with engine._session(url) as s:
                            sw2 = s.get(Sweep, sid)
                            sw2.status, sw2.message = SweepStatus.BLOCKED.value, exc.one_line()
                        _log(f"blocked: {exc.one_line()}")
                        return 0
            terminal = sum(counts.get(st.value, 0) for st in TrialState if st.is_terminal)
            if created >= n_trials and terminal == created:
                _log(f"all {created} trials finished: {json.dumps(counts, sort_keys=True)}")
                return 0
        except GpuhpcError as exc:     # slurmctld restarting, database busy...: try again
            _log(f"{exc.one_line()}; retrying")
        if once:
            return 0
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        sys.stderr.write("usage: python -m gpuhpc.sweeps.driver SWEEP_ID\n")
        return 2
    return run(int(args[0]))


if __name__ == "__main__":
    sys.exit(main())
