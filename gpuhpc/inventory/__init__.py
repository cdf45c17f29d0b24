"""GPU node inventory: nvidia-smi parsers (:mod:`.smi`), gres.conf lines and node sizing (:mod:`.gres`).

``collect()`` reads captures from files, or runs nvidia-smi on this node when no file is given.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.inventory import smi
from gpuhpc.inventory.gres import Inventory, build

__all__ = ["Inventory", "Sources", "collect", "build", "clique", "smi"]


@dataclass
class Sources:
    smi_xml: str | None = None       # nvidia-smi -q -x (or -q text: sniffed)
    topo: str | None = None          # nvidia-smi topo -m
    listing: str | None = None       # nvidia-smi -L
    mig_lgi: str | None = None       # nvidia-smi mig -lgi
    mig_lgip: str | None = None      # nvidia-smi mig -lgip

    def any(self) -> bool:
        return any((self.smi_xml, self.topo, self.listing, self.mig_lgi, self.mig_lgip))


def _read(path: str, opt: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise UserInputError(f"no such file: {path}", field=opt) from None


def _live(runner=None) -> dict[str, tuple[str, str]]:
    """Run nvidia-smi here; returns {kind: (text, source)}."""
    import shutil

    from gpuhpc.transport import default_runner

    if not shutil.which("nvidia-smi"):
        raise UserInputError("nvidia-smi not found on this host",
                             hint="pass captures instead: --smi-xml F --topo F --list F --mig-lgi F")
    run = (runner or default_runner()).run
    out: dict[str, tuple[str, str]] = {}
    for kind, argv in (("xml", ["nvidia-smi", "-q", "-x"]), ("topo", ["nvidia-smi", "topo", "-m"]),
                       ("list", ["nvidia-smi", "-L"])):
        res = run(argv, timeout=60)
        if not res.ok:
            raise GpuhpcError(f"{' '.join(argv)} failed (exit {res.returncode}): {res.stderr.strip()[:200]}")
        out[kind] = (res.stdout, " ".join(argv))
    if "MIG" in out["list"][0]:
        for kind, argv in (("lgi", ["nvidia-smi", "mig", "-lgi"]), ("lgip", ["nvidia-smi", "mig", "-lgip"])):
            res = run(argv, timeout=60)
            if res.ok:
                out[kind] = (res.stdout, " ".join(argv))
    return out


def collect(src: Sources, *, node: str | None = None, cpus: int | None = None, type_style: str = "short",
            type_override: str | None = None, runner=None) -> Inventory:
    texts: dict[str, tuple[str, str]] = {}
    if src.any():
        for kind, path, opt in (("xml", src.smi_xml, "--smi-xml"), ("topo", src.topo, "--topo"),
                                ("list", src.listing, "--list"), ("lgi", src.mig_lgi, "--mig-lgi"),
                                ("lgip", src.mig_lgip, "--mig-lgip")):
            if path:
                texts[kind] = (_read(path, opt), path)
    else:
        texts = _live(runner)
        if cpus is None:
            import os

            cpus = os.cpu_count()
        if node is None:
            import socket

            node = socket.gethostname().split(".")[0]
    query = listing = topo = lgi = lgip = None
    if "xml" in texts:
        text, source = texts["xml"]
        kind = smi.sniff(text)
        query = smi.parse_query_text(text, source) if kind == "query" else smi.parse_query_xml(text, source)
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


def clique(smi_xml: str | None = None, *, runner=None) -> str | None:
    """This node's NVLink domain as ``<ClusterUUID>.<CliqueId>`` (GB200/NVL systems), from
    ``nvidia-smi -q -x`` (or ``-q`` text); None when the driver reports none."""
    if smi_xml:
        text, source = _read(smi_xml, "--smi-xml"), smi_xml
    else:
        import shutil

        from gpuhpc.transport import default_runner

        if not shutil.which("nvidia-smi"):
            raise UserInputError("nvidia-smi not found on this host", hint="pass --smi-xml F")
        res = (runner or default_runner()).run(["nvidia-smi", "-q", "-x"], timeout=60)
        if not res.ok:
            raise GpuhpcError(f"nvidia-smi -q -x failed (exit {res.returncode}): {res.stderr.strip()[:200]}")
        text, source = res.stdout, "nvidia-smi -q -x"
    q = smi.parse_query_text(text, source) if smi.sniff(text) == "query" else smi.parse_query_xml(text, source)
    ids = {(g.cluster_uuid or "", g.clique_id) for g in q.gpus if g.clique_id}
    if not ids:
        return None
    if len(ids) > 1:
        raise GpuhpcError(f"GPUs of one node report different NVLink cliques: {sorted(ids)}")
    cluster, cid = ids.pop()
    return f"{cluster}.{cid}" if cluster else cid
