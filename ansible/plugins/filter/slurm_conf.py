"""gpuhpc.cluster.slurm_conf_change: restart or `scontrol reconfigure` for a Slurm config change.

    applied_files | gpuhpc.cluster.slurm_conf_change(new_files)

Both arguments map a file name (slurm.conf, gres.conf, topology.conf, cgroup.conf) to its text;
``applied_files`` is what the running daemons were last (re)started or reconfigured with. The result:

    {"changed": bool,             # any file differs
     "restart": ["slurmctld", "slurmd"],   # daemons that need a restart (sorted, may be empty)
     "reconfigure": bool,         # changed, so `scontrol reconfigure` (or a restart) must follow
     "reasons": ["SelectType: slurmctld, slurmd", ...]}

The restart rules are the ones Slurm 22.05 documents (slurm.conf(5), gres.conf(5), scontrol(1)
"reconfigure"); everything else takes `scontrol reconfigure`. A few daemon-identity parameters
(pid files, spool directory, daemon users) are added: a reconfigure cannot move a running daemon.
Pure Python, no Ansible import: tests/unit/conf/test_slurm_conf_change.py loads this file directly.
"""
from __future__ import annotations

import re

CTLD = ("slurmctld",)
SLURMD = ("slurmd",)
BOTH = ("slurmctld", "slurmd")

# slurm.conf(5), 22.05: "A restart of ... is required for changes to this parameter to take effect"
RESTART = {
    # slurmctld and the slurmd daemons
    "authtype": BOTH,            # "All Slurm daemons and commands must be terminated ... and later restarted"
    "grestypes": BOTH,
    "plugindir": BOTH,
    "selecttype": BOTH,
    "switchtype": BOTH,          # "All Slurm daemons, commands and running jobs must be restarted"
    # gpuhpc's addition, seen on 22.05: slurmd loads the job_container plugin when it starts, and a
    # running slurmd without it fails every job ("container_p_join: open failed ... .ns")
    "jobcontainertype": BOTH,
    "prologflags": BOTH,
    # gpuhpc's addition, read in 22.05's source (src/common/slurm_cred.c): each daemon reads AuthInfo's
    # cred_expire once, when it starts; a reconfigure keeps the old credential window
    "authinfo": BOTH,
    # slurmd only
    "corespecplugin": SLURMD,
    # slurmctld only
    "accountingstorageenforce": CTLD,
    "credtype": CTLD,
    "maxjobcount": CTLD,
    "maxnodecount": CTLD,
    "powerplugin": CTLD,
    "proctracktype": CTLD,
    "schedulertype": CTLD,
    "selecttypeparameters": CTLD,
    "slurmctldhost": CTLD,
    "controlmachine": CTLD,      # the pre-SlurmctldHost spellings
    "controladdr": CTLD,
    "backupcontroller": CTLD,
    "backupaddr": CTLD,
    "slurmctldport": CTLD,
    "slurmdport": CTLD,
    "statesavelocation": CTLD,
    # gpuhpc's additions: where a daemon keeps its pid and spool, and the user it runs as
    "slurmctldpidfile": CTLD,
    "slurmuser": CTLD,
    "slurmdpidfile": SLURMD,
    "slurmdspooldir": SLURMD,
    "slurmduser": SLURMD,
}
# SlurmctldParameters options that need a slurmctld restart (the rest of the list reconfigures)
RESTART_CTLD_OPTIONS = frozenset({"enable_configless", "no_backup_scheduling"})
# parameters given on several lines, each adding a value (the controllers, primary first)
REPEATED_KEYS = frozenset({"slurmctldhost"})
# lines that hold several Key=Value pairs, keyed by their first value
RECORD_KEYS = frozenset({"nodename", "partitionname", "downnodes", "nodeset", "frontendname", "switchname"})

_PAIR = re.compile(r"""(\w+)=("[^"]*"|\S+)""")


def _records(text: str) -> tuple[dict[str, str], dict[tuple[str, str], dict[str, str]]]:
    """(single parameters {lowercased key: value}, records {(kind, name): {key: value}})."""
    params: dict[str, str] = {}
    records: dict[tuple[str, str], dict[str, str]] = {}
    for raw in (text or "").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        pairs = [(k.lower(), v) for k, v in _PAIR.findall(line)]
        if not pairs:
            params[line.split()[0].lower()] = line   # e.g. "Include file": compare the whole line
            continue
        kind, name = pairs[0]
        if kind in RECORD_KEYS:
            records[(kind, name)] = {k: v for k, v in pairs[1:]}
        else:
            for k, v in pairs:   # SlurmctldHost repeats (primary, backups): every line counts, in order
                params[k] = params[k] + " " + v if k in REPEATED_KEYS and k in params else v
    return params, records


def _options(value: str | None) -> set[str]:
    return {o.strip().split("=", 1)[0].lower() for o in (value or "").split(",") if o.strip()}


def _slurm_conf(old: str, new: str) -> dict[str, tuple[str, ...]]:
    """{reason: daemons to restart} for slurm.conf; reconfigure-only changes map to ()."""
    old_p, old_r = _records(old)
    new_p, new_r = _records(new)
    out: dict[str, tuple[str, ...]] = {}
    for key in sorted(old_p.keys() | new_p.keys()):
        if old_p.get(key) == new_p.get(key):
            continue
        if key == "slurmctldparameters":
            flipped = _options(old_p.get(key)) ^ _options(new_p.get(key))
            out[key] = CTLD if flipped & RESTART_CTLD_OPTIONS else ()
        else:
            out[key] = RESTART.get(key, ())
    for rec in sorted(old_r.keys() | new_r.keys()):
        if old_r.get(rec) == new_r.get(rec):
            continue
        kind, name = rec
        # scontrol(1): slurmctld and every slurmd restart when nodes are added or removed;
        # slurm.conf(5): "Changes in node configuration ... require restarting both"
        out[f"{kind}={name}"] = BOTH if kind in ("nodename", "frontendname") else ()
    return out


def _gres_conf(old: str, new: str) -> dict[str, tuple[str, ...]]:
    """gres.conf(5): a changed Type restarts both daemons, changed Cores restarts slurmctld."""
    def lines(text: str) -> dict[tuple[str, str, str], list[str]]:
        out: dict[tuple[str, str, str], list[str]] = {}
        for raw in (text or "").splitlines():
            line = raw.split("#", 1)[0].strip()
            pairs = {k.lower(): v for k, v in _PAIR.findall(line)}
            if "name" in pairs:
                key = (pairs.get("nodename", ""), pairs["name"], pairs.get("type", ""))
                out.setdefault(key, []).append(pairs.get("cores", ""))
        return {k: sorted(v) for k, v in out.items()}

    old_l, new_l = lines(old), lines(new)
    if old_l.keys() != new_l.keys():
        return {"gres.conf Type": BOTH}
    if old_l != new_l:
        return {"gres.conf Cores": CTLD}
    return {"gres.conf": ()} if (old or "") != (new or "") else {}


def slurm_conf_change(applied: dict[str, str | None], new: dict[str, str | None]) -> dict:
    applied = applied or {}
    new = new or {}
    reasons: dict[str, tuple[str, ...]] = {}
    for name in sorted(applied.keys() | new.keys()):
        old_text, new_text = applied.get(name) or "", new.get(name) or ""
        if old_text == new_text:
            continue
        if name == "slurm.conf":
            reasons.update(_slurm_conf(old_text, new_text))
        elif name == "gres.conf":
            reasons.update(_gres_conf(old_text, new_text))
        else:   # topology.conf, cgroup.conf: re-read on reconfigure
            reasons[name] = ()
    restart = sorted({d for daemons in reasons.values() for d in daemons})
    return {
        "changed": bool(reasons),
        "restart": restart,
        "reconfigure": bool(reasons),
        "reasons": [f"{r}: {', '.join(d) if d else 'reconfigure'}" for r, d in reasons.items()],
    }


class FilterModule:
    """gpuhpc.cluster filters."""

    def filters(self):
        return {"slurm_conf_change": slurm_conf_change}
