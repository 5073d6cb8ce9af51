"""Files written whole or not at all, and the lock that holds a run directory: the run directory's IO
(`pipeline/rundir.py`), which the stages, the checkpoints and the verification engine's VNN-COMP files use too.

A write goes to a temp file beside its destination and is renamed over it (`os.replace`), so a reader sees the old
or the new content, never a part; a killed writer leaves a hidden temp name that no one reads. A run directory is
held by one process at a time with an flock (`hold`, `release`), which the kernel drops when its holder dies.
"""

from __future__ import annotations

import csv
import errno
import fcntl
import io
import json
import os
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import RunDirError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()  # what open() would give a new file (0644 under the usual umask 022)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old or the new content, never a part (temp file + rename);
    created with the user's umask like open(), not mkstemp's owner-only 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_write_csv(path: Path, rows: list[dict[str, Any]], fieldnames: list[str] | None = None) -> None:
    buf = io.StringIO()
    fieldnames = fieldnames or list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(buf, fieldnames=fieldnames, extrasaction="raise")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """For writers that want a filename (torch.save, onnx.save): write a temp file, then rename.

    The temp file has the destination's own name, in a private temp folder beside it: torch.save writes
    the file's name into every zip entry (`best/data.pkl`), so a temp name holding a pid would make two
    identical runs in two processes write different bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    tmp = folder / path.name
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
        folder.rmdir()


LOCK = ".lock"  # in a run directory: flock-ed by the process running it, and holding that process's pid and host
_held: dict[Path, int] = {}  # the run directories this process holds: resolved path -> the lock file's descriptor


def hold(path: str | Path) -> None:
    """Hold the run directory `path` for this process until `release(path)` or the process's end: a second
    process is refused with the first one's pid. An flock, which the kernel drops when its holder dies (even
    by SIGKILL), so a killed run leaves nothing stale behind. Holding it again from the same process is a no-op.
    Also the first write of a resume, so an unwritable run directory is reported here, before any work."""
    key = Path(path).resolve()
    if key in _held:
        return
    try:
        fd = os.open(key / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise RunDirError(f"cannot write to {path} ({exc.strerror}); make it writable, or copy the run directory "
                          f"somewhere writable and resume the copy") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 256, 0).decode(errors="replace").split()
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise RunDirError(f"cannot lock {key / LOCK} ({exc.strerror}); the file system must support flock") from None
        pid = holder[0] if holder else "unknown"
        host = f" on {holder[1]}" if len(holder) > 1 and holder[1] != socket.gethostname() else ""
        raise RunDirError(f"{path} is in use by another pipeline process (pid {pid}{host}); wait for it to end, "
                          f"or stop it and resume with `pipeline run --resume {path}`") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[key] = fd


def release(path: str | Path) -> None:
    """Let go of a run directory this process holds (closing the descriptor drops the flock); no-op otherwise."""
    fd = _held.pop(Path(path).resolve(), None)
    if fd is not None:
        os.close(fd)


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
