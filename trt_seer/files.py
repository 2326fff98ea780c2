"""Small file helpers: atomic writes (temp file + fsync + rename + directory fsync) and content
hashes."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from trt_seer.errors import InputError


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_json(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def check_out_dir(path: Path) -> None:
    """InputError unless `path` is, or can be created as, a writable directory; creates nothing."""
    path = Path(path).absolute()
    if path.exists():
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise InputError(f"output directory is not writable: {path}")
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"cannot create output directory {path}: "
                         f"{parent} is {'not writable' if parent.is_dir() else 'not a directory'}")


def ensure_out_dir(path: Path) -> Path:
    """Creates `path` if needed and checks it is writable; InputError otherwise."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create output directory {path}: {e.strerror}") from e
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"output directory is not writable: {path}")
    return path


@contextmanager
def atomic_path(dest: Path):
    """Yields a temp path beside `dest`; if the block succeeds, flushes it to disk and renames it
    over `dest`, then flushes the directory, so after a crash `dest` is the old file or the whole
    new one, never a torn one. The temp file is removed on any failure (Ctrl-C included)."""
    dest = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the result should read like any file
    try:
        yield Path(tmp)
        fsync_file(Path(tmp))
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def fsync_file(path: Path) -> None:
    """Flushes a file written by path (e.g. by a library) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flushes a directory's entries (a rename into it) to disk; a no-op where directories cannot be
    opened (Windows)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(dest: Path, data: bytes) -> Path:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)
    return Path(dest)


def atomic_write_text(dest: Path, text: str) -> Path:
    return atomic_write_bytes(dest, text.encode())


def atomic_write_json(dest: Path, obj) -> Path:
    return atomic_write_text(dest, json.dumps(obj, indent=2, sort_keys=False) + "\n")
