"""gpuhpc's settings: one site config and one user config, both TOML, read on demand.

=========  ==================================  ==========================================
file       default path                        override (tests, unusual installs)
=========  ==================================  ==========================================
site       ``/etc/gpuhpc/config.toml``         ``GPUHPC_SITE_CONFIG=/path/to/config.toml`` (*)
user       ``~/.config/gpuhpc/config.toml``    ``GPUHPC_CONFIG=/path/to/config.toml``
           (platformdirs ``user_config_dir``)
=========  ==================================  ==========================================

(*) For a user other than root, ``/etc/gpuhpc/config.toml``'s ``[cmdserver] allowed = false``
still holds: the override can add that veto, never lift it.

A missing file is an empty one. Keys (every key a file may hold is in :data:`SCHEMA`; any
other key, a value of the wrong type or a file that is not TOML is a ``UserInputError``
naming the file and the key)::

    # user config
    [cmdserver]
    enabled = true      # turn the command server on (default: false)

    # site config
    [cmdserver]
    allowed = false     # forbid the command server to every user (default: true); wins
    [site]
    cluster_name = "dgxpod"    # the cluster spec's name (gpuhpc_login writes this file)
    [ledger]
    db_url = "postgresql+psycopg://gpuhpc_reader@db/gpuhpc"   # when GPUHPC_DB_URL is unset
    timezone = "Europe/Berlin" # accounting periods begin at local midnight here (default UTC)
    alert_mail = "smtp://localhost:25"   # budget alerts to mailto: contacts (or "sendmail")
    alert_from = "hpc-accounting@example.org"

``GPUHPC_CMDSERVER=off`` (also ``0``/``no``) turns the command server off whatever the files
say.

Cluster profiles (user config; ``[cluster.NAME]`` is read the same)::

    [clusters.big]
    host = "login.big.example.org"   # or a Host alias of ~/.ssh/config (HostName, User, Port,
    user = "alice"                   #   IdentityFile, ProxyJump and UserKnownHostsFile honoured;
    port = 22                        #   what the profile says wins)
    key = "~/.ssh/id_ed25519"
    jump = "alice@bastion.example.org:22"   # optional jump host (like ssh -J)

``gpuhpc --cluster big CMD`` or ``GPUHPC_CLUSTER=big`` selects one (:func:`cluster_profile`);
``GPUHPC_SSH_HOST=[user@]host[:port]`` remains a shorthand for an unnamed one.

Nothing is read at import and nothing is cached in the module: callers ask when they need a
setting (a command server worker may only be reused by commands that leave no module state
behind). This module is on the CLI's start-up path: stdlib only, tomllib imported only when
a file exists.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhpc.errors import UserInputError

SITE_CONFIG = "/etc/gpuhpc/config.toml"

# scope -> section -> key -> (type, default, help). A later settings group (cluster
# profiles, ...) adds its section here; a key valid in one scope only is refused in the other.
SCHEMA: dict[str, dict[str, dict[str, tuple[type, Any, str]]]] = {
    "site": {
        "cmdserver": {
            "allowed": (bool, True, "false forbids the command server to every user of this machine"),
        },
        # written by the gpuhpc_login role from the cluster spec and the inventory
        "site": {
            "cluster_name": (str, "", "the Slurm cluster this machine belongs to (the cluster spec's name)"),
        },
        "ledger": {
            "db_url": (str, "", "the ledger database users' commands use when GPUHPC_DB_URL is unset "
                                "(a reader role's URL: the file is world-readable)"),
            "timezone": (str, "UTC", "the IANA time zone of accounting periods: where quota and report days, "
                                     "weeks and months begin (gpuhpc.ledger.periods; default UTC)"),
            # budget alerts (gpuhpc.ledger.alerts, `gpuhpc ledger alerts`)
            "alert_mail": (str, "smtp://localhost:25", "how budget alerts to mailto: contacts go: smtp://HOST:PORT "
                                                      "or sendmail (the local sendmail -t)"),
            "alert_from": (str, "", "the From address of budget alert mail (default gpuhpc@ this host's name)"),
        },
        # container images (gpuhpc.containers.image.policy_from checks the entries)
        "containers": {
            "allowed_registries": (list, [], "registries jobs may pull images from (empty: any)"),
            "require_digest_partitions": (list, [], "partitions that run only images pinned by digest (* = all)"),
            # the node image cache (gpuhpc.containers.cache checks the values)
            "node_cache_dir": (str, "", "node-local directory where pinned images are kept once per node and user "
                                        "(empty: no cache)"),
            "node_cache_limit_gb": (int, 0, "size limit of each user's node image cache, least recently used "
                                                "evicted (0: none)"),
            "node_cache_shared": (bool, False, "root's imports (gpuhpc image prefetch as root) serve every user "
                                               "from node_cache_dir/shared"),
        },
    },
    "user": {
        "cmdserver": {
            "enabled": (bool, False, "true turns the command server on (gpuhpc cmdserver install-client)"),
        },
    },
}

# [clusters.NAME] keys -> (type, help); every profile is a table of these (``host`` required).
PROFILE_KEYS: dict[str, tuple[type, str]] = {
    "host": (str, "login node: a host name, address or ~/.ssh/config Host alias"),
    "user": (str, "remote user (default: ~/.ssh/config's User, else yours)"),
    "port": (int, "SSH port (default: ~/.ssh/config's Port, else 22)"),
    "key": (str, "private key file (default: ~/.ssh/config's IdentityFile, the agent, ~/.ssh/id_*)"),
    "jump": (str, "jump host [user@]host[:port] (default: ~/.ssh/config's ProxyJump)"),
    "known_hosts": (str, "known_hosts file that gpuhpc checks and `gpuhpc cluster trust` writes "
                         "(default ~/.ssh/known_hosts)"),
    "slurm_conf": (str, "SLURM_CONF for the remote Slurm commands"),
    "remote_dir": (str, "where code snapshots and pickled calls go on the cluster "
                        "(default .cache/gpuhpc under the remote home; must be on a shared file system)"),
    "python": (str, "the cluster's Python for Python-mode jobs (default python3)"),
    "snapshot_max_mb": (int, "refuse code snapshots larger than this (default 100)"),
}
_PROFILE_SECTIONS = ("clusters", "cluster")

_OFF = ("off", "0", "no")           # as client.c reads GPUHPC_CMDSERVER


def site_config_path(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return getenv("GPUHPC_SITE_CONFIG", env) or SITE_CONFIG


def user_config_path(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if getenv("GPUHPC_CONFIG", env):
        return getenv("GPUHPC_CONFIG", env)
    from platformdirs import user_config_dir

    return os.path.join(user_config_dir("gpuhpc"), "config.toml")


def config_paths(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(site, user): the files whose change can change a setting."""
    return site_config_path(env), user_config_path(env)


def read_file(path: str, scope: str) -> dict[str, dict[str, Any]]:
    """The settings in ``path`` (``scope`` "site" or "user"), checked against
    :data:`SCHEMA`: {section: {key: value}}. A missing file gives {}."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UserInputError(f"cannot read the {scope} config: {exc.strerror}", field=path) from exc
    import tomllib

    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserInputError(f"not a valid TOML file: {exc}", field=path,
                             hint="see docs/cmdserver.md for the keys") from exc
    return _check(path, scope, data)


def _check(path: str, scope: str, data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    schema = SCHEMA[scope]
    other = "user" if scope == "site" else "site"

    def valid(section: str | None = None) -> str:
        if section is None:
            return ", ".join(f"[{s}]" for s in schema) or "none"
        return ", ".join(f"{section}.{k}" for k in schema[section])

    out: dict[str, dict[str, Any]] = {}
    for section, table in data.items():
        if section in _PROFILE_SECTIONS and scope == "user":
            _check_profiles(path, section, table, out.setdefault("clusters", {}))
            continue
        if section not in schema:
            raise UserInputError(f"unknown section [{section}] in the {scope} config",
                                 field=path, hint=f"valid: {valid()}")
        if not isinstance(table, dict):
            raise UserInputError(f"{section} must be a table ([{section}])", field=path)
        for key, value in table.items():
            name = f"{section}.{key}"
            if key not in schema[section]:
                elsewhere = key in SCHEMA[other].get(section, {})
                raise UserInputError(
                    f"{name} belongs in the {other} config" if elsewhere
                    else f"unknown key {name} in the {scope} config",
                    field=path, hint=f"valid here: {valid(section)}")
            kind = schema[section][key][0]
            if type(value) is not kind:
                raise UserInputError(f"{name} must be {_type_name(kind)}, not {value!r}", field=path)
        out[section] = dict(table)
    return out


def _check_profiles(path: str, section: str, table: Any, out: dict[str, Any]) -> None:
    if not isinstance(table, dict):
        raise UserInputError(f"{section} must hold tables ([{section}.NAME])", field=path)
    for name, profile in table.items():
        where = f"{section}.{name}"
        if not isinstance(profile, dict):
            raise UserInputError(f"{where} must be a table ([{where}])", field=path)
        if not _PROFILE_NAME_OK(name):
            raise UserInputError(f"invalid cluster profile name {name!r}", field=path,
                                 hint="use letters, digits, '.', '_' and '-'")
        for key, value in profile.items():
            if key not in PROFILE_KEYS:
                raise UserInputError(f"unknown key {where}.{key} in the user config", field=path,
                                     hint=f"valid: {', '.join(PROFILE_KEYS)}")
            kind = PROFILE_KEYS[key][0]
            if type(value) is not kind:
                raise UserInputError(f"{where}.{key} must be {_type_name(kind)}, not {value!r}", field=path)
            if kind is str and (not value or any(ord(c) < 32 for c in value)
                                or key in ("host", "user", "jump") and any(c.isspace() for c in value)):
                raise UserInputError(f"{where}.{key} {value!r} is empty or has blanks or control characters",
                                     field=path)
        if "host" not in profile:
            raise UserInputError(f"{where} has no host", field=path, hint=f'add host = "login.example.org" to [{where}]')
        if name in out:
            raise UserInputError(f"cluster profile {name!r} is defined twice", field=path)
        out[name] = dict(profile)


def _PROFILE_NAME_OK(name: str) -> bool:
    return bool(name) and len(name) <= 64 and all(c.isalnum() or c in "._-" for c in name)


def cluster_profiles(env: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The user config's cluster profiles: {name: {key: value}} (checked against
    :data:`PROFILE_KEYS`)."""
    return read_file(user_config_path(env), "user").get("clusters", {})


def cluster_profile(name: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The profile ``name``; an unknown name is a UserInputError listing the profiles."""
    profiles = cluster_profiles(env)
    if name not in profiles:
        path = user_config_path(env)
        raise UserInputError(
            f"no cluster profile {name!r} in {path}", field="--cluster",
            hint=f"profiles: {', '.join(sorted(profiles))}" if profiles
            else f'add [clusters.{name}] with host = "..." to {path}')
    return {"name": name, **profiles[name]}


def _type_name(kind: type) -> str:
    return {bool: "true or false", int: "an integer", str: "a string", list: "a list",
            float: "a number"}.get(kind, kind.__name__)


def _value(data: dict[str, dict[str, Any]], scope: str, section: str, key: str) -> Any:
    return data.get(section, {}).get(key, SCHEMA[scope][section][key][1])


@dataclass(frozen=True)
class CmdserverSetting:
    """Whether the command server may run for this user, and why (for messages)."""

    enabled: bool
    reason: str
    hint: str = ""


def cmdserver(env: Mapping[str, str] | None = None) -> CmdserverSetting:
    """The command server setting: off unless the user config enables it; the site config's
    ``allowed = false`` and ``GPUHPC_CMDSERVER=off`` turn it off regardless. Raises
    UserInputError for a malformed file."""
    env = os.environ if env is None else env
    site_path, user_path = config_paths(env)
    if getenv("GPUHPC_CMDSERVER", env) in _OFF:
        return CmdserverSetting(False, f"GPUHPC_CMDSERVER={env['GPUHPC_CMDSERVER']}",
                                "unset GPUHPC_CMDSERVER to use the config files")
    # GPUHPC_SITE_CONFIG may add a veto, never lift the site's: a user's own file does not
    # replace /etc/gpuhpc/config.toml (root may point elsewhere: it can edit /etc anyway)
    for path in dict.fromkeys((site_path, *([SITE_CONFIG] if os.geteuid() != 0 else []))):
        if not _value(read_file(path, "site"), "site", "cmdserver", "allowed"):
            return CmdserverSetting(False, f"forbidden by the site config {path} "
                                           "([cmdserver] allowed = false)", "ask the site's administrators")
    if not _value(read_file(user_path, "user"), "user", "cmdserver", "enabled"):
        return CmdserverSetting(False, f"off (the default); {user_path} does not set "
                                       "[cmdserver] enabled = true",
                                f"add '[cmdserver]' and 'enabled = true' to {user_path}")
    return CmdserverSetting(True, f"enabled in {user_path}")


def site_setting(section: str, key: str, env: Mapping[str, str] | None = None) -> Any:
    """One key of the site config (its default when the file or the key is absent)."""
    return _value(read_file(site_config_path(env), "site"), "site", section, key)


# ------------------------------------------------------------------ environment variables
@dataclass(frozen=True)
class EnvVar:
    """One ``GPUHPC_*`` environment variable: its type, its value when unset (None: no value,
    the reader decides what follows, as ``doc`` says) and one line of doc. A variable gpuhpc sets
    in a job's environment says so in ``doc`` ("set by gpuhpc for the job")."""

    name: str
    type: type
    default: Any
    doc: str


_JOB = "set by gpuhpc for the job: "
_TEST = "test services (scripts/services, scripts/test.sh): "

#: every ``GPUHPC_*`` variable gpuhpc, its job templates and its scripts read or set, by name
#: (``tests/unit/test_config_env.py`` finds every name in the code here; docs/configuration.md's
#: table is generated from it: ``python -m gpuhpc.config --env-table``)
ENV: dict[str, EnvVar] = {v.name: v for v in (
    # -- where gpuhpc runs and what it talks to
    EnvVar("GPUHPC_CLUSTER", str, None, "the cluster profile ([clusters.NAME] in the user config) commands run on over SSH "
                                        "(gpuhpc --cluster NAME sets it)"),
    EnvVar("GPUHPC_SSH_HOST", str, None, "[user@]host[:port]: run Slurm commands over SSH on this login node "
                                         "(an unnamed profile)"),
    EnvVar("GPUHPC_SSH_KEY", str, None, "private key file for GPUHPC_SSH_HOST (default: the agent, ~/.ssh/id_*)"),
    EnvVar("GPUHPC_SSH_KNOWN_HOSTS", str, None, "known_hosts file for GPUHPC_SSH_HOST (default ~/.ssh/known_hosts)"),
    EnvVar("GPUHPC_SSH_JUMP", str, None, "jump host [user@]host[:port] for GPUHPC_SSH_HOST (like ssh -J)"),
    EnvVar("GPUHPC_SSH_SLURM_CONF", str, None, "SLURM_CONF for the Slurm commands run over GPUHPC_SSH_HOST"),
    EnvVar("GPUHPC_SSH_ACCEPT_NEW", str, None, "1: accept unknown SSH host keys for this process only (tests, "
                                               "throwaway hosts)"),
    EnvVar("GPUHPC_SSH_CONFIG", str, None, "the OpenSSH client config whose Host entries fill in a profile "
                                           "(default ~/.ssh/config)"),
    EnvVar("GPUHPC_SLURM_TRANSPORT", str, "auto", "how SlurmClient reads Slurm: auto, pyslurm, json or cli"),
    EnvVar("GPUHPC_DB_URL", str, None, "the gpuhpc database (ledger, sweeps) as an SQLAlchemy URL (default: the site "
                                       "config's [ledger] db_url, else SQLite in the data directory)"),
    EnvVar("GPUHPC_LEDGER", str, None, "off (also 0, false, no): submit without the ledger's quota hold"),
    EnvVar("GPUHPC_PROMETHEUS_URL", str, "http://127.0.0.1:9090", "the Prometheus that efficiency reports and "
                                                                  "notifications query"),
    EnvVar("GPUHPC_S3_ENDPOINT_URL", str, None, "the S3 endpoint for staging (default AWS_ENDPOINT_URL, else AWS)"),
    # -- files and directories
    EnvVar("GPUHPC_CONFIG", str, None, "the user config file (default ~/.config/gpuhpc/config.toml)"),
    EnvVar("GPUHPC_SITE_CONFIG", str, "/etc/gpuhpc/config.toml", "the site config file (for a user other than root "
                                                                 "it can add vetoes, never lift them)"),
    EnvVar("GPUHPC_DATA_DIR", str, None, "gpuhpc's data directory: logs, checkpoints, SQLite database, sweeps "
                                         "(default ~/.local/share/gpuhpc)"),
    EnvVar("GPUHPC_CACHE_DIR", str, None, "gpuhpc's cache directory (default ~/.cache/gpuhpc)"),
    EnvVar("GPUHPC_LOG_DIR", str, None, "where job logs go (default <data dir>/logs)"),
    EnvVar("GPUHPC_CHECKPOINT_ROOT", str, None, "the parent of each job's checkpoint directory, <root>/<job id> "
                                                "(default <data dir>/checkpoints)"),
    EnvVar("GPUHPC_TEMPLATE_DIR", str, None, "the directory of the sbatch job templates (default job-templates/)"),
    EnvVar("GPUHPC_SLURM_CONF_DIR", str, None, "the directory of the slurm.conf templates (default slurm-conf/)"),
    EnvVar("GPUHPC_METRICS_DIR", str, None, "where gpuhpc.report() writes a plain job's metrics (default <data dir>/metrics)"),
    EnvVar("GPUHPC_SWEEP_ROOT", str, None, "where sweep directories are made, on a shared file system (default "
                                           "<data dir>/sweeps)"),
    EnvVar("GPUHPC_REMOTE_DIR", str, ".cache/gpuhpc", "where code snapshots and pickled calls go on the cluster "
                                                      "(under the remote home)"),
    EnvVar("GPUHPC_RUNTIME_DIR", str, None, "where the command server's sockets live (default $XDG_RUNTIME_DIR/gpuhpc)"),
    EnvVar("GPUHPC_BILLING_FILE", str, "/etc/gpuhpc/billing.json", "the site's billing weights file"),
    EnvVar("GPUHPC_BUDGET_SNAPSHOT", str, None, "the published budget snapshot users without ledger access read "
                                                "(default gpuhpc-budgets.txt beside slurm.conf)"),
    EnvVar("GPUHPC_ELASTIC_CONFIG", str, "/etc/gpuhpc/elastic.json", "the elastic (cloud nodes) config"),
    EnvVar("GPUHPC_HEALTH_SPEC", str, None, "the node health spec YAML the checks and hooks read"),
    EnvVar("GPUHPC_HOOKS_ENV", str, "/etc/gpuhpc/hooks.env", "the environment file the prolog/epilog/health hooks "
                                                             "source"),
    EnvVar("GPUHPC_PROLOG_D", str, "/etc/gpuhpc/prolog.d", "extra executables the prolog hook runs"),
    EnvVar("GPUHPC_JOBMAP_DIR", str, "/run/gpuhpc/jobmap", "where the prolog records which job holds which GPU "
                                                           "(the GPU exporter reads it)"),
    EnvVar("GPUHPC_DEEP_RESULTS", str, None, "the directory deep node checks write their results to"),
    EnvVar("GPUHPC_DEEP_SLOTS", str, "/var/lib/gpuhpc/deep-slots", "the lock files that cap concurrent deep checks"),
    EnvVar("GPUHPC_NCCL_PROFILE", str, "/etc/gpuhpc/nccl.env", "the node's NCCL/IB profile a Python-mode job sources"),
    EnvVar("GPUHPC_NODE_CACHE_ROOT", str, None, "the root of the node-local S3 data cache (default GPUHPC_SCRATCH_ROOT)"),
    EnvVar("GPUHPC_SCRATCH_ROOT", str, "/tmp", "the node-local scratch root (each job gets <root>/gpuhpc-<job id>)"),
    # -- numbers and switches
    EnvVar("GPUHPC_DEBUG", str, None, "any value: print tracebacks (as --debug)"),
    EnvVar("GPUHPC_CMDSERVER", str, None, "off (also 0, no): never use the command server; noautostart: never start "
                                          "one"),
    EnvVar("GPUHPC_CMDSERVER_IDLE", float, 900.0, "seconds an idle command server waits before it exits"),
    EnvVar("GPUHPC_SNAPSHOT_MAX_MB", int, 100, "refuse code snapshots larger than this"),
    EnvVar("GPUHPC_IDLE_THRESHOLD", float, None, "GPU utilisation (%) below which a GPU counts as idle in reports"),
    EnvVar("GPUHPC_CACHE_VERIFY", str, "stat", "how the node cache checks an entry: stat or full (sha256)"),
    EnvVar("GPUHPC_NODE_CACHE_MAX_GB", float, None, "the node cache's size limit (default 80% of its file system)"),
    EnvVar("GPUHPC_CHECKPOINT_SYNC_S", float, 2.0, "seconds between the S3 checkpoint uploader's scans"),
    EnvVar("GPUHPC_KEEP_CHECKPOINTS", int, None, "how many checkpoints a save keeps (default: the job's "
                                                 "keep_checkpoints)"),
    EnvVar("GPUHPC_SHARD_TIMEOUT", float, None, "seconds rank 0 waits for every shard of a sharded checkpoint"),
    EnvVar("GPUHPC_STOP_TIMEOUT", float, 120.0, "seconds the stop handshake waits for its peers"),
    EnvVar("GPUHPC_DEEP_CAP", int, 1, "how many deep node checks may run at once"),
    EnvVar("GPUHPC_BEST_WAIT_S", float, 300.0, "seconds a job after a sweep waits for every trial to be final in "
                                               "Slurm's accounting"),
    EnvVar("GPUHPC_SWEEP_DB_RETRY", float, 300.0, "seconds a sweep command retries an unreachable state database"),
    EnvVar("GPUHPC_SWEEP_DRIVER_GIVE_UP", float, 1800.0, "seconds a sweep driver retries failing rounds before it "
                                                         "gives up"),
    EnvVar("GPUHPC_SWEEP_DRIVER_POLL", float, 10.0, "seconds between a sweep driver's rounds"),
    EnvVar("GPUHPC_SWEEP_LIMITS_TTL", float, 60.0, "seconds a sweep driver keeps Slurm's limits before asking again"),
    EnvVar("GPUHPC_SLURMDBD_STORAGE_PASS", str, None, "slurmdbd.conf's StoragePass for gpuhpc conf render "
                                                      "(a placeholder otherwise)"),
    EnvVar("GPUHPC_ELASTIC_HOST", str, None, "this controller's SlurmctldHost name where gethostname() differs"),
    EnvVar("GPUHPC_NVML_MODULE", str, None, "the NVML module, a module name or a .py file (default pynvml; tests: "
                                            "standins.nvml_standin)"),
    EnvVar("GPUHPC_TORCHRUN", str, "torchrun", "the launcher the torchrun template runs (tests: a stand-in)"),
    EnvVar("GPUHPC_MASTER_PORT", int, None, "the rendezvous port of a multi-node job (default: a free port)"),
    EnvVar("GPUHPC_GPU_BIND", str, None, "srun's --gpu-bind for the job's steps"),
    EnvVar("GPUHPC_MAX_PREEMPT_REQUEUES", int, None, "requeues after preemptions without progress before a job "
                                                     "fails (default 5 x max_requeues)"),
    EnvVar("GPUHPC_PYTHON", str, None, "the Python of the gpuhpc install (sys.executable); set by gpuhpc for the job "
                                       "and the hooks"),
    EnvVar("GPUHPC_SERVER_ID", str, None, "12 hex digits naming this install's command server socket (build time)"),
    # -- set by gpuhpc for the job
    EnvVar("GPUHPC_JOB_ID", str, None, _JOB + "its Slurm job id"),
    EnvVar("GPUHPC_RUN_ID", str, None, _JOB + "the same in every run of the job (its id) or sweep trial"),
    EnvVar("GPUHPC_RESTART_COUNT", int, 0, _JOB + "how many times it was requeued"),
    EnvVar("GPUHPC_SCRATCH", str, None, _JOB + "its node-local scratch directory, removed at its end"),
    EnvVar("GPUHPC_CHECKPOINT_DIR", str, None, _JOB + "its checkpoint directory, the same across requeues"),
    EnvVar("GPUHPC_LATEST_CHECKPOINT", str, None, _JOB + "the newest complete checkpoint to resume from"),
    EnvVar("GPUHPC_STOP_DIR", str, None, _JOB + "where the ranks agree to stop and save (the stop handshake)"),
    EnvVar("GPUHPC_COLLECTIVE_TIMEOUT_S", int, None, _JOB + "the run's collective timeout in seconds"),
    EnvVar("GPUHPC_STOP_COLLECTIVE_TIMEOUT_S", int, None, _JOB + "the stop handshake's collective timeout in seconds"),
    EnvVar("GPUHPC_GRACE_S", int, None, _JOB + "seconds between the stop signal and the time limit"),
    EnvVar("GPUHPC_MAX_REQUEUES", int, None, _JOB + "its requeue cap"),
    EnvVar("GPUHPC_NPROC_PER_NODE", int, None, _JOB + "processes per node (torchrun template)"),
    EnvVar("GPUHPC_LOCAL_RANK", int, None, _JOB + "the rank on its node (deepspeed template)"),
    EnvVar("GPUHPC_SETUP", str, None, _JOB + "its setup lines, one per line, run before the program"),
    EnvVar("GPUHPC_SNAPSHOT", str, None, _JOB + "where its code snapshot is on the cluster"),
    EnvVar("GPUHPC_PROFILE", str, None, _JOB + "the profiler wrapping it: nsys or torch"),
    EnvVar("GPUHPC_PROFILE_STEPS", str, "10-20", _JOB + "the profiled steps START-STOP"),
    EnvVar("GPUHPC_PROFILE_OUTPUT", str, None, _JOB + "where the profile trace goes"),
    EnvVar("GPUHPC_SWEEP_ID", str, None, _JOB + "the sweep a trial belongs to"),
    EnvVar("GPUHPC_TRIAL_ID", str, None, _JOB + "a sweep trial's number"),
    EnvVar("GPUHPC_PARAMS_JSON", str, None, _JOB + "a sweep trial's parameters (JSON)"),
    EnvVar("GPUHPC_TRIAL_DIR", str, None, _JOB + "a sweep trial's directory"),
    EnvVar("GPUHPC_METRICS_FILE", str, None, _JOB + "where gpuhpc.report() writes a sweep trial's metrics"),
    EnvVar("GPUHPC_TRIAL_IN_IMAGE", str, None, _JOB + "1 when a sweep trial runs inside its container image"),
    EnvVar("GPUHPC_BEST_PARAMS", str, None, _JOB + "a job after a sweep: the best trial's parameters (JSON)"),
    EnvVar("GPUHPC_BEST_PARAMS_FILE", str, None, _JOB + "a job after a sweep: the same JSON in a file"),
    EnvVar("GPUHPC_BEST_TRIAL", str, None, _JOB + "a job after a sweep: the best trial's number"),
    EnvVar("GPUHPC_BEST_OBJECTIVE", str, None, _JOB + "a job after a sweep: the best trial's metric"),
    EnvVar("GPUHPC_AFTER_SWEEP", str, None, _JOB + "a job after a sweep: the sweep's id"),
    # -- tests, the lab and build scripts
    EnvVar("GPUHPC_NVML_STANDIN", str, None, _TEST + "the NVML stand-in's state file"),
    EnvVar("GPUHPC_NVML_STATE_DIR", str, None, _TEST + "the NVML stand-ins' state directory"),
    EnvVar("GPUHPC_ALERTMANAGER_URL", str, None, _TEST + "the test Alertmanager's URL"),
    EnvVar("GPUHPC_ALERT_WEBHOOK_PORT", int, None, _TEST + "the port of the test alert webhook"),
    EnvVar("GPUHPC_ALERT_PROBE_FILE", str, None, _TEST + "the probe targets file of the test Prometheus"),
    EnvVar("GPUHPC_TEST_PG_URL", str, None, _TEST + "the test PostgreSQL's URL"),
    EnvVar("GPUHPC_TEST_IMAGE", str, None, _TEST + "a container image in the test registry"),
    EnvVar("GPUHPC_TEST_S3_USER_ACCESS_KEY_ID", str, None, _TEST + "the S3 user's access key id"),
    EnvVar("GPUHPC_TEST_S3_USER_SECRET_ACCESS_KEY", str, None, _TEST + "the S3 user's secret key"),
    EnvVar("GPUHPC_TEST_S3_USER_BUCKET", str, None, _TEST + "the S3 user's bucket"),
    EnvVar("GPUHPC_TEST_SSH_HOST", str, None, _TEST + "the test sshd as root@127.0.0.1:PORT"),
    EnvVar("GPUHPC_TEST_SSH_KEY", str, None, _TEST + "root's key for the test sshd"),
    EnvVar("GPUHPC_TEST_SSH_KNOWN_HOSTS", str, None, _TEST + "the test sshd's known_hosts"),
    EnvVar("GPUHPC_TEST_SSH_USER", str, None, _TEST + "an ordinary user of the test sshd"),
    EnvVar("GPUHPC_TEST_SSH_USER_KEY", str, None, _TEST + "that user's key"),
    EnvVar("GPUHPC_TEST_SSH_USER_HOME", str, None, _TEST + "that user's home"),
    EnvVar("GPUHPC_TEST_SSH_USER_PYTHON", str, None, _TEST + "that user's Python with gpuhpc"),
    EnvVar("GPUHPC_VENDOR_DIR", str, None, "scripts: sources mirrored for offline builds: Slurm, pyxis, enroot "
                                           "(default ../shared/vendor beside the checkout)"),
    EnvVar("GPUHPC_SLURM_VERSION", str, "25.11.7", "scripts/slurm_build.sh: the Slurm version to build"),
    EnvVar("GPUHPC_PYSLURM_VERSION", str, "25.11.2", "scripts/slurm_build.sh: the pyslurm version to build"),
    EnvVar("GPUHPC_SLURM_URL_SHA256", str, None, "scripts/slurm_build.sh: the Slurm source archive's URL and sha256"),
    EnvVar("GPUHPC_SLURM_BUILD_CACHE", str, None, "scripts/slurm_build.sh: where built packages are kept "
                                                  "(default ~/.cache/gpuhpc/slurm-build)"),
    EnvVar("GPUHPC_REQUIRE_SLURM25", bool, False, "scripts/test.sh (stage s25): a missing Slurm 25.11 build fails "
                                                  "tests/integration/slurm25 instead of skipping it"),
    EnvVar("GPUHPC_LAB_DIR", str, "/var/tmp/gpuhpc-lab", "scripts/lab.sh: the lab's directory"),
    EnvVar("GPUHPC_LAB_SUITE", str, "trixie", "scripts/lab.sh: the lab hosts' Debian release"),
    EnvVar("GPUHPC_LAB_CPUS", str, None, "scripts/lab.sh: the CPUs the lab is pinned to"),
)}

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def getenv(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The registered variable ``name`` from ``environ`` (this process's environment by
    default) as its type: its :attr:`EnvVar.default` when unset or blank; a value that is not
    of the type is a UserInputError naming the variable. An unregistered name is a KeyError
    (register it in :data:`ENV`)."""
    var = ENV[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return var.default
    raw = raw.strip() if var.type is not str else raw
    if var.type is str:
        return raw
    try:
        if var.type is bool:
            if raw.lower() in _TRUE:
                return True
            if raw.lower() in _FALSE:
                return False
            raise ValueError(raw)
        return var.type(raw)
    except ValueError:
        raise UserInputError(f"{name}={raw!r} is not {_type_name(var.type)}", field=name,
                             hint=f"unset it or give {_type_name(var.type)}: {var.doc}") from None


def env_table() -> str:
    """The Markdown table of :data:`ENV` (docs/configuration.md holds it; a unit test keeps
    them in step)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| variable | type | default | what it is |", "|---|---|---|---|"]
    for var in sorted(ENV.values(), key=lambda v: v.name):
        default = "" if var.default is None else f"`{var.default}`"
        rows.append(f"| `{var.name}` | {var.type.__name__} | {cell(default)} | {cell(var.doc)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":          # python -m gpuhpc.config --env-table
    import sys

    if sys.argv[1:] != ["--env-table"]:
        sys.exit("usage: python -m gpuhpc.config --env-table")
    sys.stdout.write(env_table())
