"""Small file helpers: atomic writes (temp file + fsync + rename + directory fsync) and content
hashes."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
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
        _check_existing_dir(path)
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
    if path.exists():
        _check_existing_dir(path)
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create output directory {path}: {e.strerror}") from e
    _check_existing_dir(path)
    return path


def _check_existing_dir(path: Path) -> None:
    if not path.is_dir():
        raise InputError(f"output directory {path} is not a directory (a file of that name exists); "
                         "choose another --out")
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"output directory is not writable: {path}")


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


@contextmanager
def staging_dir(dest: Path):
    """Yields a hidden temp dir beside `dest` where a stage writes `dest`'s artifact under its own
    file name (an ONNX graph's external-data file keeps the name the graph refers to); the dir and
    whatever is left in it are removed on exit, Ctrl-C included."""
    dest = Path(dest)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    try:
        yield tmpdir
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)  # only our own temp dir; an error here hides nothing


def artifact_parts(path: Path) -> tuple[Path, Path]:
    """An artifact's files: the artifact and, for an ONNX graph, its external data `<file>.data`."""
    return Path(path), Path(str(path) + ".data")


def publish(staged: Path, dest: Path, write_record) -> None:
    """Moves a finished artifact from its staging dir to `dest` with its record, in the one order
    that never shows an artifact without its record: the old artifact goes first, then
    `write_record()` writes the new record (atomically), then the artifact is renamed in, its
    external data before it. An interruption in between leaves at most a record without its
    artifact, which every reader treats as nothing built."""
    for part in artifact_parts(dest):  # the graph before its data: never a graph without data
        part.unlink(missing_ok=True)
    fsync_dir(Path(dest).parent)
    write_record()
    for src, dst in reversed(list(zip(artifact_parts(staged), artifact_parts(dest)))):
        if src.exists():
            fsync_file(src)
            os.replace(src, dst)
    fsync_dir(Path(dest).parent)


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


def follow_umask(folder: Path) -> None:
    """Gives the files in `folder` the mode any new file gets (0644 under the usual umask): some
    writers (transformers' model.safetensors) stage through mkstemp and leave 0600."""
    mode = 0o666 & ~_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


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
