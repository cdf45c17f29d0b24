"""When is a checkpoint that a framework saved *complete*? (stdlib only, no torch.)

Each framework marks the end of its own save; a checkpoint cut off at the deadline lacks the
mark, and :func:`gpuhpc.jobs.checkpoint.latest_checkpoint` (the resume path) and the S3
uploader (``gpuhpc.staging.job``) skip it:

* **torch DCP** (``torch.distributed.checkpoint.save`` with its ``FileSystemWriter``): every
  rank writes ``__<rank>_<n>.distcp`` files, then the coordinator writes ``.metadata`` (under a
  temporary name, renamed last). Complete when ``.metadata`` exists and no ``.distcp`` file is
  newer than it (a save over an older one in the same directory).
* **DeepSpeed** (``engine.save_checkpoint(save_dir, tag)``): every rank writes its
  ``*model_states.pt`` / ``*optim_states.pt`` into ``save_dir/<tag>/``; rank 0 then writes the
  tag into the file ``save_dir/latest``. A tag directory is complete when ``latest`` names it;
  any other tag directory (``global_step<N>`` or holding DeepSpeed's files) is not, and in a
  directory with a ``latest`` file (or the ``zero_to_fp32.py`` it copies there before
  ``latest``) only the tag ``latest`` names is a checkpoint (not ``zero_to_fp32.py``).
* **Hugging Face Trainer** (``output_dir/checkpoint-<step>/``): the weights, optimizer,
  scheduler and RNG states first, ``trainer_state.json`` last. Complete when
  ``trainer_state.json`` exists; ``tmp-checkpoint-<step>`` (the Trainer's temporary name in
  some versions) never is, and in an output directory with ``checkpoint-<step>`` directories
  only those are checkpoints (not the final model files or ``runs/`` beside them).
* **anything else**: :func:`gpuhpc.commit(dir) <gpuhpc.jobs.checkpoint.commit>` after the save
  writes ``.gpuhpc-committed`` into the directory. A directory with that marker is complete
  whatever its layout, and once one directory of a checkpoint directory is committed, entries
  there without a mark are not checkpoints. Elsewhere a directory with none of these marks is
  complete unless it is empty (gpuhpc's behaviour before the framework rules).

gpuhpc's own saves (``save_atomic``: a rename; ``save_shard``: a manifest) are judged in
:mod:`gpuhpc.jobs.checkpoint`; this module only reads directories.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

COMMITTED = ".gpuhpc-committed"    # gpuhpc.commit(dir)'s marker
DCP_METADATA = ".metadata"          # torch.distributed.checkpoint's FileSystemWriter, written last
DCP_SUFFIX = ".distcp"
HF_STATE = "trainer_state.json"     # transformers.Trainer, written last into checkpoint-<step>/
DS_LATEST = "latest"                # DeepSpeed: a file holding the newest complete tag
DS_SCRIPT = "zero_to_fp32.py"       # DeepSpeed copies it beside its tags (ZeRO saves), before `latest`

_HF_NAME = re.compile(r"checkpoint-\d+")
_HF_TMP_NAME = re.compile(r"tmp-checkpoint-\d+")
_DS_NAME = re.compile(r"global_step\d+")
_DS_FILES = ("model_states.pt", "optim_states.pt")


@dataclass(frozen=True)
class SaveDir:
    """What a checkpoint directory (the parent of the checkpoints) says about its layout."""

    deepspeed_tag: str | None      # the tag DeepSpeed's ``latest`` file names (None: no such file)
    deepspeed: bool                # a ``latest`` regular file or zero_to_fp32.py: DeepSpeed saves here
    huggingface: bool              # ``checkpoint-<step>`` directories are there: a Trainer's output_dir
    committed: bool = False        # a directory there was gpuhpc.commit-ed: only marked ones count

    @classmethod
    def of(cls, directory: str | os.PathLike[str]) -> "SaveDir":
        d = Path(directory)
        latest = d / DS_LATEST
        tag = None
        ds = latest.is_file() and not latest.is_symlink()   # gpuhpc's former pointer was a symlink
        if ds:
            try:
                tag = latest.read_text(errors="replace").strip() or None
            except OSError:
                tag = None
        ds = ds or (d / DS_SCRIPT).is_file()
        hf = committed = False
        try:
            with os.scandir(d) as it:
                for e in it:
                    if e.name.startswith(".") or not e.is_dir():
                        continue
                    hf = hf or bool(_HF_NAME.fullmatch(e.name) or _HF_TMP_NAME.fullmatch(e.name))
                    committed = committed or os.path.isfile(os.path.join(e.path, COMMITTED))
        except OSError:
            pass
        return cls(deepspeed_tag=tag, deepspeed=ds, huggingface=hf, committed=committed)


@dataclass(frozen=True)
class Verdict:
    """``kind``: committed, dcp, deepspeed, huggingface, plain (no framework's mark), empty,
    or other (not a checkpoint: a file beside a framework's checkpoints); ``complete``; ``done_at``:
    when the save completed (the mark's mtime, ns; the entry's own for plain ones)."""

    kind: str
    complete: bool
    done_at: int = 0

    @property
    def marked(self) -> bool:
        """Completed by a framework's (or gpuhpc.commit's) own mark, not judged by shape."""
        return self.complete and self.kind in ("committed", "dcp", "deepspeed", "huggingface")


def _mtime(p: Path) -> int:
    try:
        return p.stat().st_mtime_ns
    except OSError:
        return 0


def _is_deepspeed_shaped(p: Path, names: list[str]) -> bool:
    return bool(_DS_NAME.fullmatch(p.name)) or any(n.endswith(_DS_FILES) for n in names)


def classify(path: str | os.PathLike[str], save_dir: SaveDir | None = None) -> Verdict:
    """Judge one entry of a checkpoint directory by the framework rules above (``save_dir``:
    :meth:`SaveDir.of` its parent, computed when not given)."""
    p = Path(path)
    if not p.exists():
        return Verdict("missing", False)
    ctx = save_dir if save_dir is not None else SaveDir.of(p.parent)
    if not p.is_dir():
        if ctx.deepspeed or ctx.huggingface or ctx.committed:
            return Verdict("other", False)
        return Verdict("plain", True, _mtime(p))
    marker = p / COMMITTED
    if marker.is_file():
        return Verdict("committed", True, _mtime(marker))
    try:
        names = os.listdir(p)
    except OSError:
        return Verdict("other", False)
    if ctx.deepspeed:
        if p.name == ctx.deepspeed_tag:
            return Verdict("deepspeed", True, _mtime(p.parent / DS_LATEST))
        return Verdict("deepspeed" if _is_deepspeed_shaped(p, names) else "other", False)
    if _HF_TMP_NAME.fullmatch(p.name):
        return Verdict("huggingface", False)
    if _HF_NAME.fullmatch(p.name):
        state = p / HF_STATE
        return Verdict("huggingface", True, _mtime(state)) if state.is_file() else Verdict("huggingface", False)
    if ctx.huggingface:
        return Verdict("other", False)
    if DCP_METADATA in names or any(n.endswith(DCP_SUFFIX) for n in names):
        meta = _mtime(p / DCP_METADATA)
        if not meta or any(n.endswith(DCP_SUFFIX) and _mtime(p / n) > meta for n in names):
            return Verdict("dcp", False)
        return Verdict("dcp", True, meta)
    if _is_deepspeed_shaped(p, names):
        return Verdict("deepspeed", False)       # no `latest` names it: its save never finished
    if not names:
        return Verdict("empty", False)
    if ctx.committed:
        return Verdict("plain", False)           # not committed (yet) where saves are committed
    return Verdict("plain", True, _mtime(p))
