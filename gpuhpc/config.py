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
    return env.get("GPUHPC_SITE_CONFIG") or SITE_CONFIG


def user_config_path(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if env.get("GPUHPC_CONFIG"):
        return env["GPUHPC_CONFIG"]
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
    return {bool: "true or false", int: "an integer", str: "a string", list: "a list"}.get(kind, kind.__name__)


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
    if env.get("GPUHPC_CMDSERVER") in _OFF:
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
