"""Latency of the runtime: what a service pays per `infer` call.

    python tools/bench_runtime.py                       # engines/ and ONNX files of the default model
    python tools/bench_runtime.py --dir /tmp/eng --cpu-iters 3 --no-append

On a GPU (TensorRT + cuda-python): end-to-end `infer` latency with numpy in and out against the
engine's own GPU time (CUDA events), at batch 1/8/32 x seq 128, with and without CUDA graphs; the
difference is the host overhead per call. Also pinned vs pageable host<->device copy bandwidth.
On CPU: the ONNX Runtime backend (FP32, plus FP16/INT8 files if present) against PyTorch FP32
and PyTorch `quantize_dynamic` INT8. Inputs are random token ids without padding.
Prints a Markdown table and appends it to docs/BENCHMARKS.md with date, machine and command.
"""
from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trt_seer.bench import cpu_name  # noqa: E402
from trt_seer.runtime import cuda, load, tensorrt_unavailable_reason  # noqa: E402


def token_feeds(input_names, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {"input_ids": rng.integers(1000, 20000, size=(batch, seq), dtype=np.int64),
             "attention_mask": np.ones((batch, seq), dtype=np.int64),
             "token_type_ids": np.zeros((batch, seq), dtype=np.int64)}
    return {k: feeds[k] for k in input_names}


def timed(fn, iters: int, warmup: int) -> list[float]:
    """Wall milliseconds of `iters` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


# --- GPU -----------------------------------------------------------------------------------------

def bench_engine(path: Path, graphs: bool, batches, seq: int, iters: int, warmup: int) -> list[dict]:
    rows = []
    with load(path, backend="tensorrt", use_cuda_graph=graphs) as m:
        for batch in batches:
            feeds = token_feeds(m.input_names, batch, seq)
            gpu: list[float] = []

            def call():
                m.infer(feeds)
                gpu.append(m.last_gpu_ms)

            wall = timed(call, iters, warmup)
            engine_ms = statistics.median(gpu[warmup:])
            rows.append({"artifact": path.name, "backend": "TensorRT" + (" + CUDA graph" if graphs else ""),
                         "batch": batch, "seq": seq, "p50_ms": p(wall, 50), "p99_ms": p(wall, 99),
                         "gpu_ms": engine_ms, "host_ms": p(wall, 50) - engine_ms})
    return rows


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 10) -> list[dict]:
    """GB/s of host->device and device->host copies from pinned and from pageable memory."""
    rows = []
    with cuda.Stream() as s, cuda.HostDeviceBuffer(nbytes) as pinned:
        pageable = np.ones(nbytes, dtype=np.uint8)
        for kind, host in (("pinned", pinned.host_ptr), ("pageable", pageable.ctypes.data)):
            for direction in ("HostToDevice", "DeviceToHost"):
                src, dst = (host, pinned.device_ptr) if direction == "HostToDevice" else (pinned.device_ptr, host)
                start, end = cuda.Event(), cuda.Event()
                start.record(s)
                for _ in range(reps):
                    cuda.copy_async(dst, src, nbytes, direction, s)
                end.record(s)
                end.synchronize()
                gbs = nbytes * reps / (end.elapsed_ms(start) / 1e3) / 1e9
                rows.append({"memory": kind, "direction": direction, "GB/s": gbs})
    return rows


def gpu_section(engines: list[Path], args) -> list[str]:
    lines = [f"GPU: {cuda.device_info(0).name}", "",
             "| artifact | backend | batch x seq | p50 ms | p99 ms | engine GPU ms | host overhead ms |",
             "|---|---|---|---|---|---|---|"]
    for path in engines:
        for graphs in (False, True):
            for r in bench_engine(path, graphs, args.batches, args.seq, args.iters, args.warmup):
                lines.append(f"| {r['artifact']} | {r['backend']} | {r['batch']}x{r['seq']} | {r['p50_ms']:.3f} | "
                             f"{r['p99_ms']:.3f} | {r['gpu_ms']:.3f} | {r['host_ms']:.3f} |")
    return lines + [""] + bandwidth_section()


def bandwidth_section() -> list[str]:
    lines = [f"Copies of 256 MiB on {cuda.device_info(0).name}:", "",
             "| host memory | direction | GB/s |", "|---|---|---|"]
    return lines + [f"| {r['memory']} | {r['direction']} | {r['GB/s']:.1f} |" for r in copy_bandwidth()]


# --- CPU -----------------------------------------------------------------------------------------

def torch_models(checkpoint: Path):
    """The checkpoint as FP32 and dynamically quantized INT8 torch modules (same outputs as ONNX)."""
    import torch

    from trt_seer.export.checkpoint import load_model, wrap
    from trt_seer.export.families import resolve_model

    info = resolve_model(checkpoint)
    fp32 = wrap(load_model(info), info)
    int8 = torch.ao.quantization.quantize_dynamic(wrap(load_model(info), info), {torch.nn.Linear}, torch.qint8)
    return info.inputs, {"PyTorch FP32": fp32, "PyTorch quantize_dynamic INT8": int8}


def bench_torch(name: str, module, inputs, batches, seq: int, iters: int) -> list[dict]:
    import torch

    rows = []
    for batch in batches:
        args = tuple(torch.from_numpy(v) for v in token_feeds(inputs, batch, seq).values())
        with torch.inference_mode():
            wall = timed(lambda: module(*args), iters, 1)
        rows.append({"artifact": "checkpoint", "backend": name, "batch": batch, "seq": seq,
                     "p50_ms": p(wall, 50), "p99_ms": p(wall, 99)})
    return rows


def bench_ort(path: Path, batches, seq: int, iters: int, threads: int) -> list[dict]:
    rows = []
    with load(path, threads=threads) as m:
        for batch in batches:
            feeds = token_feeds(m.input_names, batch, seq)
            wall = timed(lambda: m.infer(feeds), iters, 1)
            rows.append({"artifact": path.name, "backend": "ONNX Runtime CPU", "batch": batch, "seq": seq,
                         "p50_ms": p(wall, 50), "p99_ms": p(wall, 99)})
    return rows


def cpu_section(onnx_files: list[Path], checkpoint: Path | None, args) -> list[str]:
    import torch

    threads = args.threads or os.cpu_count()
    torch.set_num_threads(threads)
    rows = []
    for path in onnx_files:
        rows += bench_ort(path, args.batches, args.seq, args.cpu_iters, threads)
    if checkpoint is not None:
        inputs, modules = torch_models(checkpoint)
        for name, module in modules.items():
            rows += bench_torch(name, module, inputs, args.batches, args.seq, args.cpu_iters)
    lines = [f"CPU: {cpu_name()}, {threads} threads", "",
             "| artifact | backend | batch x seq | p50 ms | p99 ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['artifact']} | {r['backend']} | {r['batch']}x{r['seq']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
              for r in sorted(rows, key=lambda r: (r["batch"], r["p50_ms"]))]
    return lines


# --- main ----------------------------------------------------------------------------------------

def artifacts(args) -> tuple[list[Path], list[Path], Path | None]:
    d = Path(args.dir)
    engines = [d / f"{args.name}.{p}.engine" for p in ("fp32", "fp16", "int8")]
    onnx = [d / f"{args.name}.{p}.onnx" for p in ("fp32", "fp16", "int8")]
    checkpoint = None
    if not args.no_torch:
        from trt_seer.engine import manifest

        record = manifest.read_if_exists(manifest.record_path(d / f"{args.name}.fp32.onnx")) or {}
        ckpt = (record.get("source") or {}).get("checkpoint")
        checkpoint = Path(ckpt) if ckpt and Path(ckpt).is_dir() else None
    return [e for e in engines if e.is_file()], [o for o in onnx if o.is_file()], checkpoint


def machine() -> str:
    """CPU model and cores, GPU (if any), OS and Python: enough to compare runs."""
    gpu = "no GPU" if cuda.gpu_unavailable_reason() else cuda.device_info(0).name
    return (f"{cpu_name()}, {os.cpu_count()} cores; {gpu}; {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def append_report(lines: list[str], path: Path) -> None:
    header = [f"## Runtime latency, {time.strftime('%Y-%m-%d %H:%M %Z')}", "",
              f"Machine: {machine()}.", "",
              f"Command: `python {shlex.join(['tools/bench_runtime.py', *sys.argv[1:]])}`", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text() if path.is_file() else "# Benchmarks\n"
    path.write_text(existing.rstrip("\n") + "\n\n" + "\n".join(header + lines) + "\n")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=str(ROOT / "engines"), help="where the artifacts are (default engines/)")
    ap.add_argument("--name", default="all-MiniLM-L6-v2", help="artifact name (default all-MiniLM-L6-v2)")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--iters", type=int, default=200, help="timed GPU calls per point (default 200)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--cpu-iters", type=int, default=5, help="timed CPU calls per point (default 5)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (default: all cores)")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU section")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch rows of the CPU section")
    ap.add_argument("--report", default=str(ROOT / "docs" / "BENCHMARKS.md"),
                    help="Markdown file the results are appended to (default docs/BENCHMARKS.md)")
    ap.add_argument("--no-append", action="store_true", help="print only; append nothing")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    engines, onnx_files, checkpoint = artifacts(args)
    lines = []
    reason = tensorrt_unavailable_reason()
    if engines and reason is None:
        lines += gpu_section(engines, args) + [""]
    elif engines:
        lines += [f"Engine rows skipped: {reason}.", ""]
    if cuda.gpu_unavailable_reason() is None and not (engines and reason is None):
        lines += bandwidth_section() + [""]
    if not args.no_cpu and (onnx_files or checkpoint):
        lines += cpu_section(onnx_files, checkpoint, args)
    if not lines:
        print(f"nothing to benchmark in {args.dir} (build with python -m trt_seer build)", file=sys.stderr)
        return 2
    print("\n".join(lines))
    if not args.no_append:
        append_report(lines, Path(args.report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
