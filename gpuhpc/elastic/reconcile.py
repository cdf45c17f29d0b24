"""The reconciler (``gpuhpc power reconcile``, every minute from a timer, as slurm-gcp's
slurmsync): :func:`decide` is a pure function from (nodes, instances, records, now) to actions;
:func:`apply` carries them out. It is the only thing that ends instances no node owns.

The decision table (first match per node; orphans per instance):

================================  =====================================================
what it sees                      what it does
================================  =====================================================
a node up (not powered down) with adopt it: record that instance for the node (Slurm is the
a live instance in its Comment    truth; a failover to a controller whose state_dir never
(else: the one live instance      saw the launch, or a lost or stale state.json, loses no
tagged with its name) and no      record and ends nothing)
record, or a record whose
instance is gone
an instance of ours that no node  after ``orphan_grace`` from its launch: terminate it
record names (orphan)             (never before: a launch in flight is not yet recorded; nor
                                  while a suspend's worker is ending it: ``releasing``)
a record whose instance is gone   DOWN (its job requeues now), then POWER_DOWN; forget it
(not listed, or terminated)       (not while the record's launch is younger than the
                                  pool's boot timeout: the worker may still be at it)
a record with no instance after   DOWN ("stuck powering up"), POWER_DOWN, forget it
resume_timeout (launch lost)
a spot interruption notice        drain and signal the job (checkpoint) first; after
                                  ``checkpoint_window`` s: DOWN (requeue at once), POWER_DOWN,
                                  terminate
a job on a node set DOWN above    hold it (``Priority=0``, the reason in its AdminComment) when
that has been requeued its pool's it was already requeued ``restart_budget`` times: requeued
``restart_budget`` times          once more it would loop, not run
a pool with boot failures counted reset the count (``boot_ok``): a node of it is up
and a node of it up (registered)
a protected pool (protect_after   nothing: its nodes stay DOWN and its cooldown does not end
boot failures in a row)           until ``gpuhpc power unprotect POOL`` (:func:`unprotect`)
a pool whose cooldown ended       its nodes DOWN for that cooldown: back to the pool
                                  (POWER_DOWN, or RESUME when already powered down);
                                  not while one of them is still POWERING_UP (Slurm's
                                  ResumeTimeout and resume-fail come first)
a pool with room under max_nodes  as many of its nodes DOWN for ``max_nodes`` as there is
                                  room: back to the pool (not while cooling or protected)
================================  =====================================================

:func:`reconcile_once` acts only on the controller in charge (:mod:`gpuhpc.elastic.ha`): on a
standby it returns one ``standby`` action and touches nothing.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field

from gpuhpc import hostlist
from gpuhpc.elastic import ha, journal
from gpuhpc.elastic.config import ElasticConfig
from gpuhpc.elastic.power import CAP_REASON
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.elastic.store import NodeRecord, State, Store
from gpuhpc.slurm.power import PowerNode, PowerSlurm

COOLDOWN_REASON = "gpuhpc cooldown"      # the prefix gpuhpc.elastic.worker writes
PROTECTED_REASON = "gpuhpc protected"    # a pool after protect_after boot failures in a row
CHECKPOINT_WINDOW = 30                   # seconds between the checkpoint signal and DOWN on a reclaim
CHECKPOINT_SIGNAL = "USR2"               # gpuhpc jobs checkpoint on it (docs/jobs.md)
ADOPTED_TOKEN = "adopted"                # the token of a record taken from Slurm's Comment / the tags

log = logging.getLogger("gpuhpc.elastic")


@dataclass(frozen=True)
class Action:
    kind: str           # terminate | down | power_down | resume | drain | signal | forget | end_cooldown |
                        # note_interrupt | hold | boot_ok | adopt | standby
    target: str         # instance id, node name, job id or pool name (adopt: the node; standby: the
                        # controller in charge)
    reason: str = ""    # adopt: the instance id
    at: float | None = None     # adopt: the instance's launch time
    was: str | None = None      # adopt: the instance the node's record named when the pass read it


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)

    def add(self, kind: str, target: str, reason: str = "", at: float | None = None,
            was: str | None = None) -> None:
        self.actions.append(Action(kind, target, reason, at, was))

    def kinds(self, target: str) -> list[str]:
        return [a.kind for a in self.actions if a.target == target]


def instance_of(comment: str) -> str | None:
    """The instance id in a node's Comment (``gpuhpc instance <id> pool ...``, written at launch)."""
    words = comment.split()
    return words[2] if words[:2] == ["gpuhpc", "instance"] and len(words) > 2 else None


def adoptions(config: ElasticConfig, nodes: list[PowerNode], instances: list[Instance], state: State,
              now: float) -> dict[str, Instance]:
    """Node -> the live instance Slurm says it has, for the nodes whose record is missing or names
    an instance that is gone:

    - the live instance the node's Comment names (the worker writes it at launch): a record lost,
      or made stale by the other controller relaunching the node;
    - with no record and no Comment naming another instance (a launch whose Comment was not
      written yet), the one live instance tagged with the node's name. Not for a record whose
      instance is gone: that node lost its machine (DOWN, its job requeues), and a tagged stray
      is an orphan, not its replacement.

    Never for a node powered down or powering down (its Comment is the last instance's), a node
    whose launch is in flight (a record with no instance yet), an instance another record holds
    or a suspend is ending, or an instance tagged for another node or pool."""
    live = {i.id: i for i in instances if i.state != "terminated"}
    taken = {r.instance_id for r in state.nodes.values() if r.instance_id in live}
    taken |= {i for i, t in state.releasing.items() if now - t < config.orphan_grace}
    tagged: dict[str, list[Instance]] = {}
    for i in live.values():
        if i.node:
            tagged.setdefault(i.node, []).append(i)
    out: dict[str, Instance] = {}
    pool_by_node = config.pool_by_node
    for n in nodes:
        pool = pool_by_node.get(n.name)
        if pool is None or n.flags & {"POWERED_DOWN", "POWERING_DOWN"}:
            continue
        rec = state.nodes.get(n.name)
        if rec is not None and (rec.instance_id is None or rec.instance_id in live):
            continue
        named = instance_of(n.comment)
        if named in live:
            inst = live[named]
        elif rec is None and named is None and len(tagged.get(n.name, [])) == 1:
            inst = tagged[n.name][0]
        else:
            continue
        if inst.id in taken or inst.node not in (None, n.name) or inst.pool not in (None, pool.name):
            continue
        out[n.name] = dataclasses.replace(inst, pool=pool.name)
        taken.add(inst.id)
    return out


def decide(config: ElasticConfig, nodes: list[PowerNode], instances: list[Instance], state: State,
           now: float, jobs_on: dict[str, list[str]] | None = None,
           checkpoint_window: float = CHECKPOINT_WINDOW, restarts: dict[str, int] | None = None) -> list[Action]:
    """Pure: the actions that bring nodes, instances and records back in line. ``jobs_on``: the
    jobs on each node whose instance is gone or interrupted; ``restarts``: their requeue counts."""
    d = Decision()
    jobs_on = jobs_on or {}
    restarts = restarts or {}

    def budget(name: str, why: str) -> None:
        pool = config.pool_of(name)
        for job in jobs_on.get(name, []):
            spent = restarts.get(job, 0)
            if pool is not None and spent >= pool.restart_budget:
                d.add("hold", job, f"gpuhpc: restart budget {pool.restart_budget} spent ({spent} requeues, "
                                   f"then {why} of {name}); scontrol release {job} runs it again")
    by_node = {n.name: n for n in nodes}
    live = {i.id: i for i in instances if i.state != "terminated"}
    # Slurm is the truth of which instance a node has: a record lost or stale is taken from there
    adopted = adoptions(config, nodes, instances, state, now)
    records = dict(state.nodes)
    for name, inst in sorted(adopted.items()):
        stale = state.nodes.get(name)
        d.add("adopt", name, inst.id, inst.launched_at, was=stale.instance_id if stale is not None else None)
        records[name] = NodeRecord(node=name, pool=inst.pool or "", token=ADOPTED_TOKEN,
                                   requested_at=inst.launched_at, instance_id=inst.id,
                                   launched_at=inst.launched_at, job_started=True)
    recorded = {r.instance_id for r in records.values() if r.instance_id}
    # suspend and resume-fail forget a node before their worker ends its instance: not an orphan
    # meanwhile (for at most orphan_grace: a worker that died leaves it to the orphan rule)
    recorded |= {i for i, t in state.releasing.items() if now - t < config.orphan_grace}

    # orphans: ours, named by no record
    for inst in instances:
        if inst.state == "terminated" or inst.id in recorded:
            continue
        age = now - inst.launched_at
        if age >= config.orphan_grace:
            d.add("terminate", inst.id, f"orphan for {int(age)}s (grace {config.orphan_grace}s)")

    for name, rec in sorted(records.items()):
        pool = config.pool_of(name)
        boot = (pool.boot_timeout if pool and pool.boot_timeout else config.resume_timeout)
        node = by_node.get(name)
        flags = node.flags if node else frozenset()
        if rec.instance_id is None:
            if now - rec.requested_at > config.resume_timeout:
                d.add("down", name, "gpuhpc: stuck powering up (no instance was launched)")
                d.add("power_down", name)
                d.add("forget", name)
            continue
        inst = live.get(rec.instance_id)
        if inst is None:
            if now - (rec.launched_at or rec.requested_at) < min(boot, config.resume_timeout) and "POWERING_UP" in flags:
                continue                        # just launched: the provider may not list it yet
            if "POWERED_DOWN" in flags or "POWERING_DOWN" in flags:
                d.add("forget", name)
                continue
            d.add("down", name, f"gpuhpc: instance {rec.instance_id} is gone")
            d.add("power_down", name)
            d.add("forget", name)
            budget(name, f"the loss of {rec.instance_id}")
            continue
        if inst.interrupted_at is not None:
            noticed = state.interrupted.get(name)
            if noticed is None:
                d.add("drain", name, f"gpuhpc: spot interruption of {inst.id}")
                for job in jobs_on.get(name, []):
                    d.add("signal", job, CHECKPOINT_SIGNAL)
                d.add("note_interrupt", name)
            elif now - noticed >= checkpoint_window:
                d.add("down", name, f"gpuhpc: spot reclaim of {inst.id}")
                d.add("power_down", name)
                d.add("terminate", inst.id, "spot reclaim")
                d.add("forget", name)
                budget(name, f"the spot reclaim of {inst.id}")
        elif inst.impaired and not flags & {"POWERED_DOWN", "POWERING_DOWN"}:
            # failed EC2 status checks (a hardware or host fault): replaced as a reclaim is, the
            # job requeues and Slurm resumes the node on a new instance (ParallelCluster does the same)
            d.add("down", name, f"gpuhpc: instance {inst.id} failed EC2 {inst.impaired} status checks")
            d.add("power_down", name)
            d.add("terminate", inst.id, f"failed {inst.impaired} status checks")
            d.add("forget", name)
            budget(name, f"the failed status checks of {inst.id}")

    for pool_name in sorted(state.boot_failures):
        pool = config.pool_by_name.get(pool_name)
        if pool is None or pool_name in state.protected or not state.boot_failures[pool_name]:
            continue
        if any(records.get(n) is not None and records[n].instance_id in live and n in by_node
               and not by_node[n].flags & {"POWERING_UP", "POWERED_DOWN", "DOWN", "NOT_RESPONDING"} for n in pool.nodes):
            d.add("boot_ok", pool_name)

    for pool_name, cd in sorted(state.cooldowns.items()):
        if cd["until"] > now or pool_name in state.protected:
            continue
        pool = config.pool_by_name.get(pool_name)
        cooled = [by_node[n] for n in (pool.nodes if pool else ()) if n in by_node
                  and "DOWN" in by_node[n].flags and by_node[n].reason.startswith(COOLDOWN_REASON)]
        # Slurm still waits for ResumeTimeout on a node whose launch failed (DOWN does not clear
        # POWERING_UP) and then runs resume-fail: end the cooldown after that, not before
        if any("POWERING_UP" in n.flags for n in cooled):
            continue
        d.add("end_cooldown", pool_name)
        for node in cooled:
            d.add("resume" if "POWERED_DOWN" in node.flags else "power_down", node.name, "cooldown over")

    gone = {a.target for a in d.actions if a.kind == "forget"}
    for pool in config.pools:
        if not pool.max_nodes or pool.name in state.protected or \
                (pool.name in state.cooldowns and state.cooldowns[pool.name]["until"] > now):
            continue
        capped = [by_node[n] for n in pool.nodes if n in by_node and "DOWN" in by_node[n].flags
                  and "POWERING_UP" not in by_node[n].flags and by_node[n].reason.startswith(CAP_REASON)]
        room = pool.max_nodes - sum(1 for n, r in records.items() if r.pool == pool.name and n not in gone)
        for node in capped[:max(room, 0)]:
            d.add("resume" if "POWERED_DOWN" in node.flags else "power_down", node.name, "room under max_nodes")
    return d.actions


REASONS_MAX = 20            # distinct DOWN/DRAIN reasons of one kind a pass sets one by one
_INSTANCE_WORD = re.compile(r"(?<=\s)(?:i-[0-9a-zA-Z]+|local-\S+)(?=\s|$)")


def generic_reason(reason: str) -> str:
    """``reason`` without its instance id (``gpuhpc: instance i-0abc is gone`` -> ``gpuhpc:
    instance (see Comment) is gone``): one reason for many nodes, one scontrol call."""
    return _INSTANCE_WORD.sub("(see Comment)", reason)


def apply(config: ElasticConfig, actions: list[Action], slurm: PowerSlurm, store: Store, providers: dict,
          now: float) -> None:
    """Carry out :func:`decide`'s actions: node updates batched per kind and reason, instance ends
    per provider (``providers``: pool provider name -> Provider), records under the store's lock."""
    batches: dict[tuple[str, str], list[str]] = {}
    ends: list[str] = []
    signals: dict[str, list[str]] = {}
    # a reason naming its node's instance makes one scontrol call per node: past REASONS_MAX of
    # one kind in a pass (a reclaim wave), the instance leaves the reason (the Comment names it)
    reasons: dict[str, set[str]] = {}
    for a in actions:
        if a.kind in ("down", "drain"):
            reasons.setdefault(a.kind, set()).add(a.reason)
    for a in actions:
        if a.kind in ("down", "drain", "power_down", "resume"):
            reason = generic_reason(a.reason) if len(reasons.get(a.kind, ())) > REASONS_MAX else a.reason
            batches.setdefault((a.kind, reason), []).append(a.target)
        elif a.kind == "signal":
            signals.setdefault(a.reason, []).append(a.target)
        elif a.kind == "terminate":
            ends.append(a.target)
    for sig, jobs in signals.items():           # one scancel for every job of a signal
        slurm.signal_jobs(jobs, sig)
    order = ("drain", "down", "power_down", "resume")
    for kind in order:
        for (k, reason), names in batches.items():
            if k != kind:
                continue
            expr = hostlist.compress(names)
            if kind == "down":
                slurm.down(expr, reason)
            elif kind == "drain":
                slurm.drain(expr, reason)
            elif kind == "power_down":
                slurm.power_down(expr)
            else:
                slurm.resume(expr)
    for a in actions:
        if a.kind == "hold":      # after DOWN: the job was requeued; it may be COMPLETING a moment
            for _ in range(20):
                if slurm.hold_job(a.target, a.reason):
                    break
                time.sleep(0.25)
    for provider in providers.values():
        if ends:
            provider.terminate(ends)
    with store.update() as state:
        for a in actions:
            if a.kind == "adopt":
                cur = state.nodes.get(a.target)
                # only over the very record the pass saw (none, or one naming a gone instance): a
                # record a resume or launch wrote since names the node's new instance, which would
                # otherwise be named by no record and ended as an orphan
                if (cur.instance_id if cur is not None else None) == a.was and (cur is None) == (a.was is None):
                    state.nodes[a.target] = NodeRecord(
                        node=a.target, pool=getattr(config.pool_of(a.target), "name", ""), token=ADOPTED_TOKEN,
                        requested_at=a.at if a.at is not None else now, instance_id=a.reason,
                        launched_at=a.at, job_started=True)
            elif a.kind == "forget":
                state.nodes.pop(a.target, None)
                state.interrupted.pop(a.target, None)
            elif a.kind == "note_interrupt":
                state.interrupted[a.target] = now
            elif a.kind == "end_cooldown":
                state.cooldowns.pop(a.target, None)
            elif a.kind == "boot_ok":
                state.boot_failures.pop(a.target, None)
        for iid, t in list(state.releasing.items()):
            if now - t >= config.orphan_grace:
                state.releasing.pop(iid, None)


def reconcile_once(config: ElasticConfig, slurm: PowerSlurm | None = None, providers: dict | None = None,
                   now: float | None = None, host: str | None = None) -> list[Action]:
    """One pass: read nodes, instances (every provider the pools use) and records; decide; apply.
    Only on the controller in charge (``scontrol ping``; ``host``: this controller's name, default
    :func:`gpuhpc.elastic.ha.this_host`): elsewhere one ``standby`` action and nothing done."""
    from gpuhpc.elastic.providers import provider_for

    slurm = slurm or PowerSlurm()
    verdict = ha.verdict(slurm.controllers(), host or ha.this_host())
    if not verdict.acts:
        log.info("reconcile: standby: %s", verdict.reason)
        return [Action("standby", verdict.in_charge or "-", verdict.reason)]
    now = time.time() if now is None else now
    if providers is None:
        providers = {p.provider: provider_for(p.provider, config) for p in config.pools}
    store = Store(config.state_dir)
    nodes = slurm.nodes(config.nodes_expr)
    instances = [i for prov in providers.values() for i in prov.instances()]
    state = store.read()
    live = {i.id for i in instances if i.state != "terminated"}
    noticed = {i.id for i in instances if i.interrupted_at or i.impaired}
    # the nodes whose jobs matter: an interruption notice, failed status checks, or the instance gone
    watched = [r.node for r in state.nodes.values()
               if r.instance_id and (r.instance_id in noticed or r.instance_id not in live)]
    jobs_on: dict[str, list[str]] = {}
    if watched:
        for job, nodelist in slurm.jobs_on(hostlist.compress(watched)):
            for n in hostlist.expand(nodelist):
                if n in watched:
                    jobs_on.setdefault(n, []).append(job)
    briefs = slurm.job_briefs([job for jobs in jobs_on.values() for job in jobs]) if jobs_on else {}
    restarts = {job: b.restarts for job, b in briefs.items()}
    actions = decide(config, nodes, instances, state, now, jobs_on, restarts=restarts)
    apply(config, actions, slurm, store, providers, now)
    journal.append(config.state_dir, *end_events(config, actions, nodes, instances, state, now))
    journal.append(config.state_dir, *job_starts(config, slurm, store, nodes, live))
    return actions


def job_starts(config: ElasticConfig, slurm: PowerSlurm, store: Store, nodes: list[PowerNode],
               live: set[str]) -> list[dict]:
    """Submit -> running of the jobs that resumed a node (the resume file's job), once each, when
    their node is up and the job has started: ``job_start`` events for the monitoring."""
    by_node = {n.name: n for n in nodes}
    up = {name: rec for name, rec in store.read().nodes.items()
          if not rec.job_started and rec.instance_id in live and name in by_node
          and not by_node[name].flags & {"POWERING_UP", "POWERED_DOWN", "NOT_RESPONDING"}}
    if not up:
        return []
    waiting: dict[str, list[str]] = {}
    # the resume file's job where Slurm gave one, else the jobs on the node now
    on = {}
    if any(rec.job_id is None for rec in up.values()):
        for job, nodelist in slurm.jobs_on(hostlist.compress([n for n, r in up.items() if r.job_id is None])):
            for n in hostlist.expand(nodelist):
                on.setdefault(n, job)
    for name, rec in up.items():
        job = rec.job_id or on.get(name)
        if job:
            waiting.setdefault(job, []).append(name)
    out, done = [], set()
    briefs = slurm.job_briefs(list(waiting)) if waiting else {}      # one squeue, not a show job each
    for job, names in waiting.items():
        info = briefs.get(job)
        submit, start = (info.submit, info.start) if info else (None, None)
        state = info.state if info else ""
        if state in ("RUNNING", "COMPLETING", "COMPLETED") and submit is not None and start is not None:
            pool = config.pool_of(names[0])
            out.append({"event": "job_start", "cluster": config.cluster, "job": job, "pool": pool.name if pool else "",
                        "submit_at": submit, "start_at": start, "nodes": names})
        elif info and state in ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING"):
            continue                    # not started yet: the next pass asks again
        done.add(job)                   # started, or ended (or forgotten) without: never asked again
    if done:
        noted = {n for job in done for n in waiting[job]}
        with store.update() as state:
            for name, rec in state.nodes.items():
                if rec.job_id in done or name in noted:
                    rec.job_started = True
    return out


def end_events(config: ElasticConfig, actions: list[Action], nodes: list[PowerNode], instances: list[Instance],
               state: State, now: float) -> list[dict]:
    """The ledger's journal entries for the instances this pass ended or found gone."""
    by_node = {n.name: n for n in nodes}
    by_id = {i.id: i for i in instances}
    out = []
    for a in actions:
        if a.kind == "terminate" and a.reason.startswith("orphan"):
            inst = by_id.get(a.target)
            pool = config.pool_by_name.get(inst.pool) if inst and inst.pool else None
            out.append(journal.end_event(config, a.target, now, "orphan", orphan=inst, pool=pool))
        elif a.kind == "down" and a.target in state.nodes and state.nodes[a.target].instance_id:
            why = ("reclaim" if "spot reclaim" in a.reason else "gone" if "is gone" in a.reason
                   else "impaired" if "status checks" in a.reason else None)
            node = by_node.get(a.target)
            if why:
                out.append(journal.end_event(config, state.nodes[a.target].instance_id, now, why,
                                             registered_at=node.slurmd_start if node else None))
    return out


def unprotect(config: ElasticConfig, pool_name: str, slurm: PowerSlurm | None = None) -> list[str]:
    """``gpuhpc power unprotect POOL``: forget the pool's boot failures, protection and cooldown,
    and return its nodes that protection or the cooldown set DOWN. Returns those nodes."""
    pool = config.pool(pool_name)
    slurm = slurm or PowerSlurm()
    with Store(config.state_dir).update() as state:
        state.protected.pop(pool_name, None)
        state.boot_failures.pop(pool_name, None)
        state.cooldowns.pop(pool_name, None)
    nodes = [n for n in slurm.nodes(hostlist.compress(pool.nodes))
             if "DOWN" in n.flags and n.reason.startswith((PROTECTED_REASON, COOLDOWN_REASON))]
    for kind in ("resume", "power_down"):
        names = [n.name for n in nodes if ("POWERED_DOWN" in n.flags) == (kind == "resume")]
        if names:
            (slurm.resume if kind == "resume" else slurm.power_down)(hostlist.compress(names))
    return [n.name for n in nodes]

