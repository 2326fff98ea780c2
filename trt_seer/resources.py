"""What a build will need before it starts (disk under --out, memory), and what each stage took
(wall time, peak RSS, bytes written, peak disk under --out) while it runs.

    need = plan_decoder(weights, ["fp16", "int4"], keep=False)      # from safetensors headers
    check_room(need, Path("engines"))                               # InputError (exit 2) when short
    with StageMeter("fp16 engine", Path("engines")) as m: ...      # m.record(): the stage's figures

Sizes come from the checkpoint's safetensors headers (tensor names, shapes and dtypes; no tensor
is read), so the plan costs milliseconds even for a 13B checkpoint. Engines are counted at the
size of the graph they are built from, plus a margin (measured: FP16 and weight-only engines
within a few percent of their ONNX weights; docs/BENCHMARKS.md).
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from trt_seer.errors import InputError

GiB = 1 << 30
ENGINE_MARGIN = 1.05  # engine bytes per ONNX weight byte, with room for tactics' own tables
FIXED_MARGIN = 64 << 20  # records, tokenizer, timing cache, calibration cache
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class WeightSizes:
    """Element counts of a checkpoint's tensors, by role in a decoder."""

    gemm: int  # 2-D weights of the transformer blocks' GEMMs (what weight-only quantizes)
    embed: int  # token (and position) embeddings
    head: int  # the LM head (0 when tied to the embeddings)
    other: int  # norms, biases, anything else
    checkpoint_bytes: int
    tied: bool

    @property
    def fp16_bytes(self) -> int:
        """The FP16 graph's weights; a tied head is stored twice (Gather and MatMul)."""
        return 2 * (self.gemm + self.embed + self.other + (self.embed if self.tied else self.head))

    def quantized_bytes(self, bits: int, block: int, lm_head: bool) -> int:
        """A weight-only graph: GEMMs at `bits` with FP16 block scales (INT4), the rest FP16."""
        head = self.embed if self.tied else self.head
        q = self.gemm * bits // 8 + (self.gemm * 2 // block if bits == 4 else 0)
        return q + 2 * (self.embed + self.other) + (head * bits // 8 if lm_head else 2 * head)


def safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file: {name: {"dtype", "shape", "data_offsets"}}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def weight_sizes(ckpt: Path, config: dict) -> WeightSizes | None:
    """The checkpoint's tensors by role, from safetensors headers; None without safetensors."""
    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        return None
    counts = {"gemm": 0, "embed": 0, "head": 0, "other": 0}
    total = 0
    for f in files:
        for name, t in safetensors_header(f).items():
            n = 1
            for d in t["shape"]:
                n *= int(d)
            total += n * DTYPE_BYTES.get(t["dtype"], 2)
            counts[role(name, t["shape"])] += n
    tied = counts["head"] == 0 and bool(config.get("tie_word_embeddings", True))
    return WeightSizes(**counts, checkpoint_bytes=total, tied=tied)


def role(name: str, shape: list) -> str:
    if "lm_head" in name or name.endswith("embed_out.weight"):
        return "head"
    if "embed" in name or name.endswith(("wte.weight", "wpe.weight")):
        return "embed"
    return "gemm" if len(shape) == 2 else "other"


@dataclass
class Plan:
    """The artifacts a build writes and removes, in order, and what that needs at its peak."""

    steps: list = field(default_factory=list)  # (what, +bytes or -bytes)
    ram_bytes: int = 0
    notes: list = field(default_factory=list)

    def add(self, what: str, nbytes: int) -> None:
        self.steps.append((what, int(nbytes)))

    @property
    def peak_disk(self) -> int:
        level = peak = 0
        for _, b in self.steps:
            level += b
            peak = max(peak, level)
        return peak + FIXED_MARGIN

    @property
    def final_disk(self) -> int:
        return sum(b for _, b in self.steps) + FIXED_MARGIN

    def describe(self) -> str:
        lines = [f"  {'+' if b >= 0 else '-'}{abs(b) / GiB:8.2f} GiB  {what}" for what, b in self.steps]
        lines += [f"  peak disk under --out: {self.peak_disk / GiB:.2f} GiB; left at the end: "
                  f"{self.final_disk / GiB:.2f} GiB", f"  peak memory (estimate): {self.ram_bytes / GiB:.2f} GiB"]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def to_dict(self) -> dict:
        return {"steps": [[w, b] for w, b in self.steps], "peak_disk_bytes": self.peak_disk,
                "final_disk_bytes": self.final_disk, "ram_bytes": self.ram_bytes, "notes": list(self.notes)}


def free_bytes(out: Path) -> int:
    """Free bytes where `out` is or would be created (its nearest existing ancestor)."""
    p = Path(out).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check_room(plan: Plan, out: Path, already: int = 0) -> None:
    """InputError (exit 2, before anything is written) when --out cannot hold the plan's peak;
    `already`: bytes of artifacts the build will replace, freed as it goes."""
    need, free = plan.peak_disk - already, free_bytes(out)
    if need > free:
        raise InputError(f"{out} has {free / GiB:.2f} GiB free but this build needs {need / GiB:.2f} GiB at its peak "
                         "(see --dry-run); free space, choose another --out, or build fewer precisions")


def rss_bytes() -> int:
    """The process's resident memory now (Linux /proc; 0 where unavailable)."""
    return process_rss_bytes("self")


def child_pids(pid: str = "self") -> list[int]:
    """Every descendant of a process (Linux /proc/<pid>/task/*/children; [] where unavailable)."""
    found = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = [int(x) for x in children.read_text().split()]
        except (OSError, ValueError):
            continue  # the thread or process ended while we looked
        for kid in kids:
            found += [kid, *child_pids(str(kid))]
    return found


def process_rss_bytes(pid: int | str) -> int:
    """A process's resident memory now (Linux /proc/<pid>/statm; 0 where unavailable or ended)."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def written_bytes() -> int:
    """Bytes this process has written through write calls so far, its reaped worker processes'
    included (Linux /proc/self/io wchar)."""
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(": ") for line in f.read().splitlines())
        return int(fields["wchar"])
    except (OSError, KeyError, ValueError):
        return 0


def disk_usage(path: Path) -> int:
    """Bytes allocated to the files under `path` (temp dirs of staged writes included)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                continue  # a temp file renamed or removed between the listing and the stat
    return total


class StageMeter:
    """Samples RSS and disk under `out` every `interval` s while a stage runs; `.record()` gives
    {"stage", "seconds", "peak_rss_bytes", "written_bytes", "peak_disk_bytes"}."""

    def __init__(self, stage: str, out: Path, interval: float = 0.5):
        self.stage, self.out, self.interval = stage, Path(out), interval
        self._stop = threading.Event()
        self.peak_rss = self.peak_disk = 0

    def _sample(self) -> None:
        """This process and its workers (a stage may run part of its work in one: RSS adds up)."""
        kids = child_pids()
        self.peak_rss = max(self.peak_rss, rss_bytes() + sum(map(process_rss_bytes, kids)))
        self.peak_disk = max(self.peak_disk, disk_usage(self.out))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "StageMeter":
        self._t0, self._w0 = time.perf_counter(), written_bytes()
        self._sample()
        self._thread = threading.Thread(target=self._loop, name=f"meter-{self.stage}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.seconds = time.perf_counter() - self._t0
        self.written = written_bytes() - self._w0  # a reaped worker's writes count in its parent's

    def record(self) -> dict:
        return {"stage": self.stage, "seconds": round(self.seconds, 2), "peak_rss_bytes": self.peak_rss,
                "written_bytes": self.written, "peak_disk_bytes": self.peak_disk}


def release_memory() -> None:
    """Gives memory freed by a stage back to the system before the next: Python's garbage, then
    glibc's free lists (malloc_trim), which otherwise keep a stage's peak (a 7B export's tens of
    GiB) resident under the next stage's. A no-op where the C library has no malloc_trim."""
    import ctypes
    import gc

    gc.collect()
    process = ctypes.CDLL(None)  # the C library's symbols, without find_library's ldconfig run per stage
    if hasattr(process, "malloc_trim"):
        process.malloc_trim(0)


INTERRUPTED = threading.Event()  # Ctrl-C seen (set by `latch_interrupts`' handler), even where a library swallowed it


@contextlib.contextmanager
def latch_interrupts():
    """While open, Ctrl-C raises KeyboardInterrupt as usual and is also remembered, so that one a
    library swallows (a bare `except:` around its own work) still stops the build at the end of the
    stage (`Stages.run`). Main thread only (the only one that takes signals); the previous handler
    is back on exit."""
    import signal

    INTERRUPTED.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _remember_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _remember_interrupt(signum, frame):
    INTERRUPTED.set()
    raise KeyboardInterrupt


class Stages:
    """Runs a build's stages under a StageMeter each, logging and keeping their figures; memory
    freed by a stage is given back (`release_memory`) before the next starts. A Ctrl-C that a
    library swallowed during a stage stops the build once the stage is done."""

    def __init__(self, out: Path):
        self.out, self.records = Path(out), []

    def run(self, name: str, fn, *args, **kwargs):
        import logging

        with StageMeter(name, self.out) as meter:
            result = fn(*args, **kwargs)
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        release_memory()
        rec = {**meter.record(), "rss_after_bytes": rss_bytes()}
        self.records.append(rec)
        logging.getLogger(__name__).info(
            "stage %s: %.1f s, peak RSS %.2f GiB (%.2f GiB after), wrote %.2f GiB, disk under --out %.2f GiB", name,
            rec["seconds"], rec["peak_rss_bytes"] / GiB, rec["rss_after_bytes"] / GiB, rec["written_bytes"] / GiB,
            rec["peak_disk_bytes"] / GiB)
        return result
