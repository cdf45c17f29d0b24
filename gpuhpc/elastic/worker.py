"""The detached half of the power programs: provider calls and node updates for a plan file
(``python -m gpuhpc.elastic.worker PLANFILE``, started by :func:`gpuhpc.elastic.power.spawn_worker`).

A launch that fails for capacity (or any provider error) sets its nodes DOWN at once with the
code, so Slurm requeues the job without waiting for ResumeTimeout, and cools the pool down: its
other powered-down nodes go DOWN with the same reason until the reconciler ends the cooldown, so
the requeued job runs in the next price tier.

A batched launch of single-node jobs (``Plan.each``) that gets fewer instances than nodes keeps
what it got: those nodes boot, the rest go DOWN with the code and the pool cools down.

A launch past the pool's ``max_nodes`` (refused by the resume program, under the records' lock)
sets its nodes DOWN with the reason ``gpuhpc max_nodes pool P: ...`` (the job requeues, and its
nodes show why), and the pool's idle powered-down nodes with it; the reconciler returns them as
room frees up."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from gpuhpc import hostlist
from gpuhpc.elastic import journal
from gpuhpc.elastic.config import ElasticConfig, load_config
from gpuhpc.elastic.power import Plan, cap_reason
from gpuhpc.elastic.providers import provider_for
from gpuhpc.elastic.providers.base import PartialLaunch, ProviderError, ThrottledError
from gpuhpc.elastic.reconcile import COOLDOWN_REASON, PROTECTED_REASON, instance_of
from gpuhpc.elastic.store import Store
from gpuhpc.slurm.power import PowerSlurm

log = logging.getLogger("gpuhpc.elastic")



def cool_down(config: ElasticConfig, slurm: PowerSlurm, store: Store, pool_name: str, nodes: tuple[str, ...],
              code: str, now: float, *, pool_wide: bool = True) -> None:
    """Nodes DOWN with ``code`` now; the pool's idle powered-down nodes DOWN until its cooldown ends.
    ``pool_wide=False`` (throttling, not capacity): only ``nodes``, and a cooldown that has already
    ended, so the reconciler's next pass returns them and the pool stays open meanwhile."""
    pool = config.pool(pool_name)
    until = now + (pool.capacity_cooldown if pool_wide else 0)
    reason = f"{COOLDOWN_REASON} {code} pool {pool_name} until {time.strftime('%H:%M:%S', time.localtime(until))}"
    with store.update() as state:
        earlier = state.cooldowns.get(pool_name)
        if earlier and earlier["until"] > now:        # already cooling: keep the first cause and end
            until, code = earlier["until"], earlier["code"]
            reason = f"{COOLDOWN_REASON} {code} pool {pool_name} until {time.strftime('%H:%M:%S', time.localtime(until))}"
        state.cooldowns[pool_name] = {"until": until, "code": code, "since": now}
        for n in nodes:
            state.nodes.pop(n, None)
    if nodes:
        slurm.down(hostlist.compress(nodes), reason)
    if not pool_wide:
        return
    spare = [n.name for n in slurm.nodes(hostlist.compress(pool.nodes))
             if "POWERED_DOWN" in n.flags and "DOWN" not in n.flags and n.name not in nodes]
    if spare:
        slurm.down(hostlist.compress(spare), reason)


def protect(config: ElasticConfig, slurm: PowerSlurm, store: Store, pool_name: str, nodes: tuple[str, ...],
            now: float) -> bool:
    """Count a boot failure of ``pool_name``; at ``config.protect_after`` in a row the pool is
    protected: every node of it that is not running a job goes DOWN with a reason naming the way
    out, and nothing launches there until ``gpuhpc power unprotect POOL`` (a cooldown's end does
    not return it). Returns whether the pool is protected."""
    pool = config.pool(pool_name)
    with store.update() as state:
        n = state.boot_failures.get(pool_name, 0) + 1
        state.boot_failures[pool_name] = n
        if n < config.protect_after:
            return False
        state.protected.setdefault(pool_name, {"since": now, "failures": n})
    reason = (f"{PROTECTED_REASON} pool {pool_name}: {n} boot failures in a row; "
              f"gpuhpc power unprotect {pool_name}")
    down = [x.name for x in slurm.nodes(hostlist.compress(pool.nodes))
            if not x.flags & {"ALLOCATED", "MIXED", "COMPLETING"} or x.name in nodes]
    if down:
        slurm.down(hostlist.compress(down), reason)
    log.warning("pool %s protected after %d boot failures in a row", pool_name, n)
    return True


def launch(config: ElasticConfig, slurm: PowerSlurm, store: Store, plan: Plan, now: float, *,
           provider=None) -> None:
    pool = config.pool(plan.pool)
    before = store.read()                 # one read of the records for both checks (2,000 nodes: a big file)
    if pool.name in before.protected:
        slurm.down(hostlist.compress(plan.nodes), f"{PROTECTED_REASON} pool {pool.name}; gpuhpc power unprotect {pool.name}")
        with store.update() as state:
            for n in plan.nodes:
                state.nodes.pop(n, None)
        return
    cooldown = before.cooldowns.get(pool.name)
    if cooldown and cooldown["until"] > now:
        cool_down(config, slurm, store, pool.name, plan.nodes, f"{cooldown['code']}(cooling)", now)
        return
    provider = provider or provider_for(pool.provider, config)
    try:
        if plan.each:
            instances = provider.launch(pool, list(plan.nodes), plan.token, each=True)
        else:
            instances = provider.launch(pool, list(plan.nodes), plan.token)
    except PartialLaunch as exc:
        # a batch of single-node jobs got fewer instances than nodes: the first ones run, the
        # rest go DOWN with the code (their jobs requeue) and the pool cools down
        instances = exc.instances
        rest = plan.nodes[len(instances):]
        log.warning("launch %s on %s got %d of %d: %s", hostlist.compress(plan.nodes), pool.name, len(instances),
                    len(plan.nodes), exc)
        journal.append(config.state_dir, {"event": "launch_failed", "cluster": config.cluster, "pool": pool.name,
                                          "code": exc.code, "nodes": list(rest), "at": time.time()})
        cool_down(config, slurm, store, pool.name, rest, exc.code, time.time())
    except ProviderError as exc:
        log.warning("launch %s on %s failed: %s", plan.nodes, pool.name, exc)
        journal.append(config.state_dir, {"event": "launch_failed", "cluster": config.cluster, "pool": pool.name,
                                          "code": exc.code, "nodes": list(plan.nodes), "at": time.time()})
        # a capacity error cools the pool; throttling only sends this launch's jobs back to the queue
        cool_down(config, slurm, store, pool.name, plan.nodes, exc.code, time.time(),
                  pool_wide=not isinstance(exc, ThrottledError))
        return
    prices: dict[str, str | None] = {}            # per hour at launch: the provider's spot price where it has one
    for inst in instances:
        if inst.instance_type not in prices:
            prices[inst.instance_type] = provider.price(pool, inst.instance_type) if hasattr(provider, "price") else None
    journal.append(config.state_dir, *(journal.launch_event(config, pool, inst, prices[inst.instance_type])
                                       for inst in instances))
    with store.update() as state:
        for node, inst in zip(plan.nodes, instances):
            rec = state.nodes.get(node)
            if rec is not None and rec.token == plan.token:
                rec.instance_id, rec.launched_at = inst.id, inst.launched_at
    for node, inst in zip(plan.nodes, instances):
        fields = {"Comment": f"gpuhpc instance {inst.id} pool {pool.name} type {inst.instance_type}"}
        if inst.addr:                       # cloud names need not resolve (docs/elastic.md)
            fields["NodeAddr"] = inst.addr
        slurm.update(node, **fields)


def refuse(config: ElasticConfig, slurm: PowerSlurm, store: Store, plan: Plan, now: float, *,
           provider=None) -> None:
    """A launch past ``max_nodes``: its nodes DOWN with the reason (the job requeues at once, as on
    a capacity error), and the pool's idle powered-down nodes too, so Slurm does not try them one
    by one; the reconciler returns them when the pool has room (:func:`gpuhpc.elastic.reconcile.decide`)."""
    pool = config.pool(plan.pool)
    log.warning("launch %s on %s refused: %s", plan.nodes, pool.name, plan.reason)
    journal.append(config.state_dir, {"event": "launch_refused", "cluster": config.cluster, "pool": pool.name,
                                      "code": "MaxNodes", "nodes": list(plan.nodes), "at": now})
    slurm.down(hostlist.compress(plan.nodes), plan.reason)
    spare = [n.name for n in slurm.nodes(hostlist.compress(pool.nodes))
             if "POWERED_DOWN" in n.flags and not n.flags & {"DOWN", "POWERING_UP"} and n.name not in plan.nodes]
    if spare:
        slurm.down(hostlist.compress(spare), plan.reason)


def pool_full(config: ElasticConfig, store: Store, pool_name: str) -> str | None:
    """The max_nodes reason when ``pool_name`` has no room left (None: room, or no cap)."""
    pool = config.pool(pool_name)
    if not pool.max_nodes:
        return None
    in_use = sum(1 for r in store.read().nodes.values() if r.pool == pool_name)
    return cap_reason(pool_name, in_use, pool.max_nodes, 0) if in_use >= pool.max_nodes else None


def release(config: ElasticConfig, slurm: PowerSlurm, store: Store, plan: Plan, now: float, *,
            provider=None) -> None:
    pool = config.pool(plan.pool)
    if plan.instance_ids:
        # the tails for the ledger: registration (SlurmdStartTime) and last job (LastBusyTime)
        seen = {instance_of(n.comment): n for n in slurm.nodes(hostlist.compress(plan.nodes))}
        failed = plan.op == "failed"
        journal.append(config.state_dir, *(
            journal.end_event(config, iid, now, "boot-failed" if failed else "suspend",
                              registered_at=None if failed or iid not in seen else seen[iid].slurmd_start,
                              last_busy=seen[iid].last_busy if iid in seen else None,
                              suspend_at=None if failed else now)
            for iid in plan.instance_ids))
        (provider or provider_for(pool.provider, config)).terminate(list(plan.instance_ids))
        with store.update() as state:
            for iid in plan.instance_ids:
                state.releasing.pop(iid, None)
    if plan.op == "failed":
        if plan.instance_ids:       # a boot that failed
            cool_down(config, slurm, store, pool.name, plan.nodes, "boot-timeout", now)
            protect(config, slurm, store, pool.name, plan.nodes, now)
        elif (cd := store.read().cooldowns.get(pool.name)) and cd["until"] > now:
            # a launch a capacity error refused: Slurm has just set it DOWN ("ResumeTimeout
            # reached"); the cooldown that holds the pool takes it back (its cause and end kept)
            cool_down(config, slurm, store, pool.name, plan.nodes, cd["code"], now)
        elif full := pool_full(config, store, pool.name):
            # a launch max_nodes refused, and the pool is still full: DOWN with the cap's reason
            # again (the reconciler returns it when there is room)
            slurm.down(hostlist.compress(plan.nodes), full)
        else:
            # ... and that cooldown is over already: the node is back in the pool
            slurm.resume(hostlist.compress(plan.nodes))


LAUNCHES_AT_ONCE = 16     # plans carried out side by side (a CreateFleet takes seconds: 500 jobs one by one, minutes)


def run_plans(config: ElasticConfig, plans: list[Plan], slurm: PowerSlurm | None = None,
              at_once: int = LAUNCHES_AT_ONCE) -> None:
    """Carry out the plans, up to ``at_once`` side by side (threads: the provider calls wait on
    the network). Records and the journal are changed under their file locks; each provider is
    made once, before the threads start (boto3's default session is not thread-safe)."""
    slurm = slurm or PowerSlurm()
    store = Store(config.state_dir)
    providers: dict[str, object] = {}
    for plan in plans:
        name = config.pool(plan.pool).provider
        if plan.op in ("launch", "terminate", "failed") and name not in providers:
            try:
                providers[name] = provider_for(name, config)
            except Exception:                   # the plan itself reports it (its own provider_for)
                log.exception("provider %s", name)

    def one(plan: Plan) -> None:
        try:
            step = {"launch": launch, "refuse": refuse}.get(plan.op, release)
            step(config, slurm, store, plan, time.time(), provider=providers.get(config.pool(plan.pool).provider))
        except Exception:                       # one plan's failure must not stop the others
            log.exception("plan %s for %s failed", plan.op, plan.nodes)

    if len(plans) <= 1 or at_once <= 1:
        for plan in plans:
            one(plan)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(at_once, len(plans)), thread_name_prefix="gpuhpc-plan") as ex:
        list(ex.map(one, plans))


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(process)d %(message)s")
    path = Path(argv[0])
    data = json.loads(path.read_text())
    config = load_config(data.get("config"))
    plans = [Plan(**{**p, "nodes": tuple(p["nodes"]), "instance_ids": tuple(p["instance_ids"])}) for p in data["plans"]]
    run_plans(config, plans)
    path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
