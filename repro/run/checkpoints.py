"""The one checkpoint bookkeeping layer: step folders, manifest, ``latest`` marker, verification, pruning.

A store is a folder of step checkpoints (verl's names by default)::

    global_step_8.tmp/      a save in progress (never loaded; cleared by the next save of step 8)
    global_step_8/          a checkpoint: whatever the savers wrote, then manifest.json
      manifest.json         every other file with its size and blake2b checksum, written last
    global_step_6.damaged/  a checkpoint that failed verification on resume (kept, never deleted)
    latest_checkpointed_iteration.txt   "8": verl's marker, rewritten after each commit

A save is ``begin(step)`` (a fresh staging folder), the savers write into it (every rank, then
the driver), and ``commit(step)`` after all of them finished: the manifest is written last and
atomically inside the staging folder, the folder is renamed to its final name, then the marker
moves. A checkpoint without a manifest, or whose files do not match it, is not complete.

``resume()`` verifies checkpoints in reverse commit order and returns the first intact one; each damaged
one is renamed ``<name>.damaged`` with the bad files named in ``Resume.notes``. The marker is
verl's record, not the authority: an empty or wrong marker is reported and the newest intact
checkpoint is used (every file of a committed checkpoint is checked, the marker adds nothing).

Pruning keeps, per part (a top-level subfolder such as ``actor`` or ``critic``), the newest
``keep[part]`` checkpoints by commit order; a part beyond its limit is removed and the manifest
says so (that checkpoint can no longer be resumed); a folder whose parts are all gone is removed.
Pruning runs only inside ``commit``, after the new checkpoint is complete, so the checkpoint a
run resumed from is never removed before a newer one exists. Depends on nothing in repro.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MARKER = "latest_checkpointed_iteration.txt"
STEP_FORMAT = "global_step_{}"
DAMAGED = "damaged"
_CHUNK = 1 << 20


def file_digest(path: Path) -> str:
    """blake2b of a file's bytes, read in 1 MiB chunks (checkpoint shards can be gigabytes)."""
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    """``path`` holds either its old content or all of ``data``, never a part (tmp + fsync + rename)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _set_aside(path: Path, label: str) -> Path:
    """Rename ``path`` to ``<path>.<label>`` (``.<label>.1`` ... when taken); never deletes."""
    target, k = path.with_name(f"{path.name}.{label}"), 1
    while target.exists():
        target, k = path.with_name(f"{path.name}.{label}.{k}"), k + 1
    os.replace(path, target)
    return target


@dataclass
class Resume:
    """What ``resume`` chose: the intact checkpoint (or None) and what it found wrong on the way."""

    path: Path | None
    step: int
    notes: list[str] = field(default_factory=list)
    set_aside: list[Path] = field(default_factory=list)


class CheckpointStore:
    """Step checkpoints under ``root`` (module docstring); every method is for one process (rank 0/driver)."""

    def __init__(self, root: str | os.PathLike, step_format: str = STEP_FORMAT, marker: str = MARKER) -> None:
        self.root = Path(root)
        self.step_format = step_format
        self.marker = self.root / marker
        head, _, tail = step_format.partition("{}")
        self._pattern = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))

    # ---- names -------------------------------------------------------------------------------
    def path(self, step: int) -> Path:
        return self.root / self.step_format.format(step)

    def staging(self, step: int) -> Path:
        return self.root / (self.step_format.format(step) + ".tmp")

    def step_folders(self) -> dict[int, Path]:
        """Every final-named step folder (complete or not), by step."""
        if not self.root.is_dir():
            return {}
        found = {}
        for child in self.root.iterdir():
            m = self._pattern.fullmatch(child.name)
            if m and child.is_dir():
                found[int(m.group(1))] = child
        return found

    # ---- saving ------------------------------------------------------------------------------
    def begin(self, step: int) -> Path:
        """A fresh, empty staging folder for ``step`` (the debris of an interrupted save is cleared)."""
        stage = self.staging(step)
        if stage.exists():
            shutil.rmtree(stage)  # never committed, so never a checkpoint
        stage.mkdir(parents=True)
        return stage

    def commit(self, step: int, keep: Mapping[str, int | None] | None = None, **info: Any) -> Path:
        """Seal the staging folder of ``step`` (manifest last), rename it, move the marker, prune."""
        stage, final = self.staging(step), self.path(step)
        files = {}
        for path in sorted(p for p in stage.rglob("*") if p.is_file()):
            rel = path.relative_to(stage).as_posix()
            files[rel] = {"size": path.stat().st_size, "blake2b": file_digest(path)}
        seq = 1 + max((m.get("seq", 0) for _, _, m in self._committed()), default=0)
        manifest = {"format": 1, "step": step, "seq": seq, "committed_at": time.time(), "files": files,
                    "pruned": [], **info}
        write_json_atomic(stage / MANIFEST, manifest)
        if final.exists():
            _set_aside(final, "superseded")  # e.g. an abandoned timeline's step after resume_path
        os.replace(stage, final)
        tmp = self.marker.with_name(f".{self.marker.name}.tmp")
        tmp.write_text(f"{step}\n")
        os.replace(tmp, self.marker)
        if keep:
            self.prune(keep)
        return final

    # ---- reading -----------------------------------------------------------------------------
    @staticmethod
    def manifest(folder: Path) -> dict[str, Any] | None:
        try:
            data = json.loads((folder / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else None

    def _committed(self) -> list[tuple[int, Path, dict[str, Any]]]:
        """(step, folder, manifest) of every folder with a readable manifest, newest commit first."""
        held = []
        for step, folder in self.step_folders().items():
            man = self.manifest(folder)
            if man is not None:
                held.append((step, folder, man))
        return sorted(held, key=lambda h: (h[2].get("seq", 0), h[0]), reverse=True)

    def complete_steps(self) -> list[int]:
        """Steps whose folder has a manifest and no pruned part (resumable unless damaged), ascending."""
        out = []
        for step, folder in self.step_folders().items():
            man = self.manifest(folder)
            if man is not None and not man.get("pruned"):
                out.append(step)
        return sorted(out)

    def latest(self) -> tuple[Path, int] | None:
        """The last committed complete checkpoint, by its manifest, without reading its files (cheap)."""
        for step, folder, man in self._committed():
            if not man.get("pruned"):
                return folder, step
        return None

    def verify(self, folder: Path) -> list[str]:
        """Names of the bad files of a checkpoint folder ("" list: intact), each with what is wrong."""
        man = self.manifest(folder)
        if man is None:
            state = "unreadable" if (folder / MANIFEST).exists() else "missing"
            return [f"{MANIFEST} ({state})"]
        if man.get("pruned"):
            return [f"{part}/ (pruned)" for part in man["pruned"]]
        bad = []
        for rel, want in sorted(man["files"].items()):
            path = folder / rel
            if not path.is_file():
                bad.append(f"{rel} (missing)")
            elif path.stat().st_size != want["size"]:
                bad.append(f"{rel} (size {path.stat().st_size}, expected {want['size']})")
            elif file_digest(path) != want["blake2b"]:
                bad.append(f"{rel} (checksum differs)")
        return bad

    def _marker_note(self) -> str | None:
        if not self.marker.exists():
            return None
        text = self.marker.read_text().strip()
        if not text.isdigit():
            return f"{self.marker} is {'empty' if not text else 'not a step number: ' + repr(text[:40])}; ignored"
        if not (self.path(int(text)) / MANIFEST).is_file():
            return f"{self.marker} names step {text}, which has no complete checkpoint; ignored"
        return None

    def resume(self) -> Resume:
        """The newest intact checkpoint; each newer damaged or incomplete one is renamed ``.damaged``."""
        result = Resume(path=None, step=0)
        note = self._marker_note()
        if note:
            result.notes.append(note)
        committed = self._committed()
        named = {folder for _, folder, _ in committed}
        # Folders without a readable manifest were never sealed (or lost their seal): damaged.
        unsealed = [(step, folder) for step, folder in sorted(self.step_folders().items(), reverse=True)
                    if folder not in named]
        in_commit_order = [(step, folder) for step, folder, man in committed if not man.get("pruned")]
        for n, (step, folder) in enumerate(unsealed + in_commit_order):
            bad = self.verify(folder)
            if not bad and n >= len(unsealed):
                result.path, result.step = folder, step
                break
            moved = _set_aside(folder, DAMAGED)
            result.set_aside.append(moved)
            result.notes.append(f"checkpoint {folder.name} is damaged: {', '.join(bad)}; kept as {moved.name}")
        if result.notes:
            chosen = result.path.name if result.path else "none (starting from step 0)"
            result.notes.append(f"resuming from {chosen}")
        return result

    def check(self, folder: Path) -> None:
        """``ValueError`` naming the bad files unless ``folder`` is an intact checkpoint (explicit resume)."""
        bad = self.verify(folder)
        if bad:
            raise ValueError(f"checkpoint {folder} is damaged or incomplete: {', '.join(bad)}")

    # ---- pruning -----------------------------------------------------------------------------
    def prune(self, keep: Mapping[str, int | None]) -> list[str]:
        """Apply ``keep`` (part -> newest checkpoints kept; None or 0 keeps all); returns what was removed."""
        held = self._committed()
        removed = []
        for part, limit in keep.items():
            if not limit or limit < 0:
                continue
            having = [h for h in held if (h[1] / part).is_dir() and part not in h[2]["pruned"]]
            for _, folder, man in having[limit:]:
                shutil.rmtree(folder / part)
                man["files"] = {k: v for k, v in man["files"].items() if not k.startswith(part + "/")}
                man["pruned"] = sorted(set(man["pruned"]) | {part})
                write_json_atomic(folder / MANIFEST, man)
                removed.append(f"{folder.name}/{part}")
        for _, folder, man in held:
            parts = {p.name for p in folder.iterdir() if p.is_dir()}
            if man["pruned"] and not parts:
                shutil.rmtree(folder)
                removed.append(folder.name)
        return removed
