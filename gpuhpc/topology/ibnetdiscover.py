"""Parser for ``ibnetdiscover`` output (infiniband-diags), the default (non ``-p``) format.

What a dump looks like::

    vendid=0x2c9
    devid=0xd2f2
    sysimgguid=0x2c5eab0300b87b40
    switchguid=0x2c5eab0300b87b40(2c5eab0300b87b40)
    Switch	65 "S-2c5eab0300b87b40"		# "MF0;A09-P1-IBLEAF-04-04:MQM9701/U1" enhanced port 0 lid 73 lmc 0
    [1]	"H-e09d7303007a4bd8"[1](e09d7303007a4bd8) 		# "a08-p1-dgx-04-c01 mlx5_5" lid 647 4xNDR
    [35]	"S-2c5eab0300c26280"[32]		# "MF0;A10-P1-IBSPINE-02:MQM9701/U1" lid 236 4xNDR

    vendid=0x2c9
    devid=0x1021
    sysimgguid=0xe09d7303007a4bd8
    caguid=0xe09d7303007a4bd8
    Ca	1 "H-e09d7303007a4bd8"		# "a08-p1-dgx-04-c01 mlx5_5"
    [1](e09d7303007a4bd8) 	"S-2c5eab0300b87b40"[1]		# lid 647 lmc 0 "MF0;A09-..." lid 73 4xNDR

Every link is printed from both ends; :func:`parse` keeps one :class:`Link` per cable.
Anything that is not one of these line forms is an error naming ``SOURCE:LINE``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpuhpc.errors import UserInputError

_NODE = re.compile(
    r'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-([0-9a-fA-F]{1,16})"\s*(?:#\s*"(.*)"(.*))?$')
_PORT = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s+'
    r'"([SHR])-([0-9a-fA-F]{1,16})"\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s*'
    r'(?:#(.*))?$')
_HEADER = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)=0x[0-9a-fA-F]+(\([0-9a-fA-F]+\))?$")
_WIDTH_SPEED = re.compile(r"\blid\s+\d+\s+(\d+)x(\S+)(?:\s.*)?$")
_DESC = re.compile(r'"(.*)"')

KINDS = {"Switch": "switch", "Ca": "ca", "Rt": "router"}


@dataclass(slots=True)
class IbNode:
    id: str          # "S-2c5eab0300b87b40" as printed by ibnetdiscover
    kind: str        # switch | ca | router
    nports: int
    desc: str        # NodeDesc, without quotes
    line: int


@dataclass(slots=True, frozen=True)
class Link:
    a: str
    a_port: int
    b: str
    b_port: int
    width: str       # "4x" ("" when the dump does not say)
    speed: str       # "NDR"
    line: int        # first line that printed this cable


@dataclass
class Dump:
    source: str
    nodes: dict[str, IbNode] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    one_sided: list[Link] = field(default_factory=list)   # cables printed from one end only
    lines: int = 0

    def switches(self) -> list[IbNode]:
        return [n for n in self.nodes.values() if n.kind == "switch"]

    def cas(self) -> list[IbNode]:
        return [n for n in self.nodes.values() if n.kind == "ca"]


def _err(source: str, lineno: int, msg: str, hint: str | None = None) -> UserInputError:
    return UserInputError(msg, field=f"{source}:{lineno}", hint=hint)


def parse(text: str, source: str = "<stdin>") -> Dump:
    """Parse a whole dump. Raises :class:`UserInputError` (exit 2) naming ``source:line``
    for garbage, binary data and truncated files."""
    if "\x00" in text:
        pos = text.index("\x00")
        raise _err(source, text.count("\n", 0, pos) + 1, "binary data (NUL byte), not ibnetdiscover output")
    dump = Dump(source)
    nodes = dump.nodes
    # cable key -> [link, sides mentioned (bitmask: 1 = lower end, 2 = higher end)]
    cables: dict[tuple, list] = {}
    refs: dict[str, int] = {}          # node id referenced by a port line -> first line
    cur: IbNode | None = None
    pending_header: int | None = None  # line of a header not yet followed by its node line
    last_node: IbNode | None = None
    lines = text.splitlines()
    dump.lines = len(lines)
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            cur = None
            continue
        c = line[0]
        if c == "#":
            continue
        if c == "[":
            m = _PORT.match(line)
            if not m:
                raise _err(source, lineno, f"malformed port line {line[:80]!r}",
                           "truncated or edited dump? re-run ibnetdiscover")
            if cur is None:
                raise _err(source, lineno, "port line outside a Switch/Ca block")
            port = int(m.group(1))
            rid = f"{m.group(3)}-{m.group(4).lower()}"
            rport = int(m.group(5))
            comment = m.group(7) or ""
            ws = _WIDTH_SPEED.search(comment)
            width, speed = (ws.group(1) + "x", ws.group(2)) if ws else ("", "")
            refs.setdefault(rid, lineno)
            end_a, end_b = (cur.id, port), (rid, rport)
            if end_a <= end_b:
                key, side = (end_a, end_b), 1
            else:
                key, side = (end_b, end_a), 2
            entry = cables.get(key)
            if entry is None:
                cables[key] = [Link(key[0][0], key[0][1], key[1][0], key[1][1], width, speed, lineno), side]
            else:
                entry[1] |= side
            continue
        if c in "SCR" and (line.startswith("Switch") or line.startswith("Ca") or line.startswith("Rt")):
            m = _NODE.match(line)
            if not m:
                raise _err(source, lineno, f"malformed node line {line[:80]!r}")
            nid = f"{m.group(3)}-{m.group(4).lower()}"
            if nid in nodes:
                raise _err(source, lineno, f"node {nid} is listed twice (first at line {nodes[nid].line})")
            cur = IbNode(nid, KINDS[m.group(1)], int(m.group(2)), m.group(5) or "", lineno)
            nodes[nid] = cur
            last_node = cur
            pending_header = None
            continue
        if _HEADER.match(line):
            if pending_header is None:
                pending_header = lineno
            cur = None
            continue
        raise _err(source, lineno, f"not ibnetdiscover output: {line[:80]!r}",
                   "pass the output of `ibnetdiscover` (without -p/-g)")
    if not nodes:
        raise _err(source, max(dump.lines, 1), "no Switch or Ca found", "is this ibnetdiscover output?")
    if pending_header is not None:
        raise _err(source, pending_header, "node header without its Switch/Ca line: the dump is truncated")
    for rid, lineno in refs.items():
        if rid not in nodes:
            raise _err(source, lineno, f"port line refers to {rid}, which the dump never lists: truncated dump?")
    last_id = last_node.id if last_node else None
    links = dump.links
    for (end_a, end_b), (link, sides) in cables.items():
        links.append(link)
        if sides != 3:
            # the end that did not print this cable
            missing = end_b[0] if sides == 1 else end_a[0]
            if missing == last_id:
                raise _err(source, dump.lines, f"{missing} (the last block) stops before port "
                           f"{end_b[1] if sides == 1 else end_a[1]}: the dump is truncated")
            dump.one_sided.append(link)
    return dump


def switch_label(desc: str) -> tuple[str, str]:
    """``MF0;A09-P1-IBLEAF-04-04:MQM9701/U1`` -> (``A09-P1-IBLEAF-04-04``, ``MQM9701``).

    A director's ASICs (``MF0;core1:CS8500/L05/U1``) get the line/spine card appended
    (``core1-L05``); anything else is returned as is with an empty model."""
    d = desc.strip()
    if d.startswith("MF0;") and ":" in d:
        name, _, rest = d[4:].partition(":")
        segs = rest.split("/")
        extra = [s for s in segs[1:] if s and s != "U1"]
        return "-".join([name, *extra]), segs[0]
    return d, ""
