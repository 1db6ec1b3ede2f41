"""Per-file checksums of a checkpoint directory, recorded in its COMPLETE marker and verified before loading.

A checkpoint whose bytes changed after commit (disk fault, partial copy, a hand edit) must never load silently:
`file_checksums` hashes every file at commit (blake2b, streamed in 1 MiB chunks, so memory stays flat whatever the
shard size), and `verify_checkpoint` re-hashes and returns one line per problem, each naming the file and what
differs (missing, size, checksum). Markers written before checksums existed carry none; they verify as "unchecked"
(the caller warns) rather than being refused, so older runs stay resumable.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from hybridrl.config.errors import RunStopError

__all__ = ["CHECKSUM_ALGORITHM", "CheckpointCorruptError", "file_digest", "file_checksums", "verify_checkpoint"]

CHECKSUM_ALGORITHM = "blake2b"
_CHUNK = 1 << 20


class CheckpointCorruptError(RuntimeError, RunStopError):
    """A checkpoint's files do not match the checksums its COMPLETE marker recorded."""


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_checksums(root: str | os.PathLike, skip: tuple[str, ...] = ()) -> dict[str, list]:
    """{relative posix path: [size in bytes, hex digest]} for every file under root except the names in `skip`."""
    root = Path(root)
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel not in skip:
                out[rel] = [path.stat().st_size, file_digest(path)]
    return dict(sorted(out.items()))


def verify_checkpoint(path: str | os.PathLike, marker_name: str) -> list[str] | None:
    """Problems found in checkpoint `path` (empty = verified), or None if its marker records no checksums."""
    path = Path(path)
    try:
        marker = json.loads((path / marker_name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return [f"{path / marker_name}: unreadable marker ({type(e).__name__}: {e})"]
    recorded = marker.get("checksums") if isinstance(marker, dict) else None
    if recorded is None:
        return None
    problems = []
    for rel, (size, digest) in recorded.items():
        file = path / rel
        if not file.is_file():
            problems.append(f"{file}: missing (recorded {size} bytes)")
            continue
        actual = file.stat().st_size
        if actual != size:
            problems.append(f"{file}: {actual} bytes, {size} recorded (truncated or overwritten)")
        elif file_digest(file) != digest:
            problems.append(f"{file}: {CHECKSUM_ALGORITHM} checksum differs from the recorded one (bytes changed)")
    return problems
