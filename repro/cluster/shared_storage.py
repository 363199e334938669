"""Is the checkpoint folder one folder for every node? Checked at start, never assumed.

Checkpoints are written by the ranks (DeepSpeed writes each rank's shards) and by the driver
(the trainer state and the ``latest`` marker, written last), and a resume reads them all back
from the driver and every rank. That only works when every node sees the same folder. repro
supports exactly that mode: a path every node mounts (NFS, Lustre, a bucket mount...). A node
that cannot see it refuses the run before any worker builds a model, with one line naming the
node and the folder; a run that would silently write shards to local disks is never started.

The check is a round trip: the driver writes a marker with a fresh token, the first rank of
every node reads it and writes a reply named for its node, and the driver reads every reply.
A folder on a node's local disk fails in one of the two directions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from repro.cluster.placement import PlacementError

_PREFIX = ".repro_shared_"


class StorageError(PlacementError):
    """A folder the run writes is not shared by every node (a config error: the CLI exits 2)."""


def write_marker(folder: Path) -> str:
    """Driver side: create ``folder`` and a marker in it; returns the token."""
    folder.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    (folder / f"{_PREFIX}{token}").write_text(token)
    return token


def probe(folder: str, token: str, node_id: str) -> str | None:
    """Node side: read the driver's marker and answer with a reply of our own; None when it worked."""
    marker = Path(folder) / f"{_PREFIX}{token}"
    try:
        seen = marker.read_text()
    except OSError as e:
        return f"cannot read the driver's marker {marker} ({type(e).__name__})"
    if seen != token:
        return f"reads a different {marker}"
    try:
        (Path(folder) / f"{_PREFIX}{token}.{node_id}").write_text(node_id)
    except OSError as e:
        return f"cannot write to {folder} ({type(e).__name__}: {e})"
    return None


def check_shared(key: str, folder: Path, node_ids: Sequence[str],
                 run_probe: Callable[[str, str], list[str | None]]) -> None:
    """Round-trip a marker through ``folder`` on every node; ``StorageError`` naming the first that fails.

    ``run_probe(folder, token)`` runs :func:`probe` on the first rank of each node and returns
    the answers in the order of ``node_ids``.
    """
    folder = folder.resolve()
    token = write_marker(folder)
    try:
        answers = run_probe(str(folder), token)
        for node_id, answer in zip(node_ids, answers, strict=True):
            reply = folder / f"{_PREFIX}{token}.{node_id}"
            if answer is None and not (reply.is_file() and reply.read_text() == node_id):
                answer = f"wrote a reply the driver cannot see in {folder}"
            if answer is not None:
                raise StorageError(
                    f"{key}={folder} is not shared by every node: node {node_id[:12]} {answer}; put checkpoints "
                    "on a filesystem every node mounts at the same path (trainer.default_local_dir or "
                    "trainer.output_dir)"
                )
    finally:
        for path in folder.glob(f"{_PREFIX}{token}*"):
            path.unlink(missing_ok=True)
