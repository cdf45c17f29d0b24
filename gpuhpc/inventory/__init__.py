"""GPU node inventory: nvidia-smi parsers (:mod:`.smi`), gres.conf lines and node sizing (:mod:`.gres`).

Pure: text in, records out. The caller fetches the text, from capture files or by running
:data:`LIVE_COMMANDS` (then :data:`MIG_COMMANDS` when :func:`has_mig` says so) through a
runner, locally or over SSH (``gpuhpc node inventory`` does, in :mod:`gpuhpc.cli.node`).
"""
from __future__ import annotations

from collections.abc import Mapping

from gpuhpc.errors import GpuhpcError
from gpuhpc.inventory import smi
from gpuhpc.inventory.gres import Inventory, build

__all__ = ["Inventory", "LIVE_COMMANDS", "MIG_COMMANDS", "KINDS", "collect", "build", "clique", "has_mig", "smi"]

# kind -> the nvidia-smi command whose output it is; ``texts`` below is keyed by kind
LIVE_COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("xml", ("nvidia-smi", "-q", "-x")),       # -q -x, or -q text (sniffed)
    ("topo", ("nvidia-smi", "topo", "-m")),
    ("list", ("nvidia-smi", "-L")),
)
MIG_COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lgi", ("nvidia-smi", "mig", "-lgi")),
    ("lgip", ("nvidia-smi", "mig", "-lgip")),
)
KINDS = tuple(k for k, _ in LIVE_COMMANDS + MIG_COMMANDS)

# kind -> (text, source name for error messages)
Texts = Mapping[str, tuple[str, str]]


def has_mig(list_text: str) -> bool:
    """Whether ``nvidia-smi -L`` output shows MIG devices (then the MIG listings are worth asking for)."""
    return "MIG" in list_text


def collect(texts: Texts, *, node: str | None = None, cpus: int | None = None, type_style: str = "short",
            type_override: str | None = None) -> Inventory:
    """nvidia-smi outputs (by kind, see :data:`KINDS`) -> gres.conf lines and a sizing report."""
    unknown = set(texts) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown capture kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    query = listing = topo = lgi = lgip = None
    if "xml" in texts:
        query = _query(*texts["xml"])
    if "topo" in texts:
        topo = smi.parse_topo(*texts["topo"])
    if "list" in texts:
        listing = smi.parse_list(*texts["list"])
    if "lgi" in texts:
        lgi = smi.parse_mig_lgi(*texts["lgi"])
    if "lgip" in texts:
        lgip = smi.parse_mig_lgip(*texts["lgip"])
    return build(query=query, listing=listing, topo=topo, lgi=lgi, lgip=lgip, node=node, cpus=cpus,
                 type_style=type_style, type_override=type_override)


def clique(text: str, source: str = "nvidia-smi -q -x") -> str | None:
    """A node's NVLink domain as ``<ClusterUUID>.<CliqueId>`` (GB200/NVL systems), from
    ``nvidia-smi -q -x`` (or ``-q`` text); None when the driver reports none."""
    q = _query(text, source)
    ids = {(g.cluster_uuid or "", g.clique_id) for g in q.gpus if g.clique_id}
    if not ids:
        return None
    if len(ids) > 1:
        raise GpuhpcError(f"GPUs of one node report different NVLink cliques: {sorted(ids)}")
    cluster, cid = ids.pop()
    return f"{cluster}.{cid}" if cluster else cid


def _query(text: str, source: str) -> smi.SmiQuery:
    return smi.parse_query_text(text, source) if smi.sniff(text) == "query" else smi.parse_query_xml(text, source)
