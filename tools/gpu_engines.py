"""Run built engines on a GPU with plain TensorRT API code and compare with PyTorch.

    python tools/gpu_engines.py --engines engines/ [--append docs/BENCHMARKS.md]

For each `<name>.{fp32,fp16,int8}.engine` beside its manifest: deserialize with the installed
TensorRT flavor, run held-out text batches, compare sentence embeddings with PyTorch FP32 (cosine,
and the INT8 gate on the engine's real outputs), and time batch 1 / 8 / 32 x seq 128 with CUDA events
next to PyTorch eager FP32, TF32 and `.half()` on the same GPU. Needs torch with CUDA.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from trt_seer import data
from trt_seer.engine import manifest
from trt_seer.engine import trt
from trt_seer.eval.evaluate import EvalSpec, eval_batches
from trt_seer.export.checkpoint import load_model, wrap
from trt_seer.export.families import resolve_model
from trt_seer.eval.metrics import embedding_metrics

BATCHES = (1, 8, 32)
SEQ = 128


def run_engine(engine, context, feeds: dict[str, torch.Tensor], stream) -> dict[str, torch.Tensor]:
    """One inference with device tensors bound by address (plain TensorRT API)."""
    outs = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.load().trt.TensorIOMode.INPUT:
            context.set_input_shape(name, tuple(feeds[name].shape))
            context.set_tensor_address(name, feeds[name].data_ptr())
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.load().trt.TensorIOMode.OUTPUT:
            shape = tuple(context.get_tensor_shape(name))
            outs[name] = torch.empty(shape, dtype=torch.float32, device="cuda")
            context.set_tensor_address(name, outs[name].data_ptr())
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("execute_async_v3 failed")
    return outs


def time_cuda(fn, iters: int = 50) -> float:
    """Median ms per call with CUDA events after a warm-up."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def fixed_batch(info, batch: int) -> dict[str, torch.Tensor]:
    texts = data.load_texts(data.default_corpus("heldout"))
    ids = data.Tokenizer(info.path).encode(texts[:batch] * (1 + batch // len(texts)), SEQ)[:batch]
    feeds = data.pad_batch([(r + r * SEQ)[:SEQ] for r in ids], info.inputs, SEQ)
    return {k: torch.from_numpy(v).cuda() for k, v in feeds.items()}


def load_engine(path: Path):
    flavor = trt.load()
    runtime = flavor.trt.Runtime(flavor.trt.Logger(flavor.trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise RuntimeError(f"could not deserialize {path}")
    return runtime, engine, engine.create_execution_context()


def torch_embeddings(wrapped, batches) -> np.ndarray:
    with torch.inference_mode():
        return np.concatenate([wrapped(*(torch.from_numpy(b[k]).cuda() for k in b))[1].float().cpu().numpy()
                               for b in batches])


def engine_embeddings(engine, context, batches, stream) -> np.ndarray:
    out = []
    for b in batches:
        res = run_engine(engine, context, {k: torch.from_numpy(v).cuda() for k, v in b.items()}, stream)
        stream.synchronize()
        out.append(res["sentence_embedding"].cpu().numpy())
    return np.concatenate(out)


def torch_latency(info, dtype_mode: str) -> dict[int, float]:
    torch.backends.cuda.matmul.allow_tf32 = dtype_mode == "tf32"
    torch.backends.cudnn.allow_tf32 = dtype_mode == "tf32"
    m = wrap(load_model(info).cuda().eval(), info)
    if dtype_mode == "half":
        m = m.half()
    res = {}
    with torch.inference_mode():
        for b in BATCHES:
            feeds = tuple(fixed_batch(info, b).values())
            res[b] = time_cuda(lambda: m(*feeds))
    torch.backends.cuda.matmul.allow_tf32 = False
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="engines")
    p.add_argument("--name", default="all-MiniLM-L6-v2")
    p.add_argument("--append", default=None, help="append the tables to this Markdown file")
    args = p.parse_args(argv)
    rows, acc = {}, {}
    stream = torch.cuda.Stream()
    info = None
    for prec in ("fp32", "fp16", "int8"):
        path = Path(args.engines) / f"{args.name}.{prec}.engine"
        if not path.is_file():
            continue
        man = manifest.read_engine_manifest(manifest.engine_manifest_path(path))
        info = info or resolve_model(man["source"]["checkpoint"], man["task"])
        _rt, engine, context = load_engine(path)
        if prec == "fp32" or "ref" not in acc:
            wrapped = wrap(load_model(info).cuda().eval(), info)
            batches = eval_batches(info, EvalSpec(samples=160, batch=16))
            acc["ref"] = torch_embeddings(wrapped, batches)
            del wrapped
        acc[prec] = embedding_metrics(acc["ref"], engine_embeddings(engine, context, batches, stream))
        rows[f"TensorRT {prec} engine"] = {b: _engine_ms(engine, context, info, b, stream) for b in BATCHES}
    for mode in ("fp32", "tf32", "half"):
        rows[f"PyTorch eager {mode}"] = torch_latency(info, mode)
    report = format_report(rows, acc, args)
    print(report)
    if args.append:
        with open(args.append, "a") as f:
            f.write(report + "\n")
    return 0


def _engine_ms(engine, context, info, batch: int, stream) -> float:
    feeds = fixed_batch(info, batch)
    run_engine(engine, context, feeds, stream)
    with torch.cuda.stream(stream):
        def call():
            for name, t in feeds.items():
                context.set_input_shape(name, tuple(t.shape))
            context.execute_async_v3(stream.cuda_stream)
        for _ in range(5):
            call()
        stream.synchronize()
        times = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            call()
            b.record(stream)
            b.synchronize()
            times.append(a.elapsed_time(b))
    return float(np.median(times))


def format_report(rows: dict, acc: dict, args) -> str:
    gpu = torch.cuda.get_device_name(0)
    flavor = trt.load()
    lines = [f"\n### Engines vs PyTorch on {gpu} ({time.strftime('%Y-%m-%d')})", "",
             f"Machine: {gpu}, torch {torch.__version__}, {flavor.name} {flavor.version}, "
             f"Python {platform.python_version()}. Command: `python tools/gpu_engines.py "
             f"--engines {args.engines}`. Median ms per batch (CUDA events), seq {SEQ}.", "",
             "| path | " + " | ".join(f"batch {b}" for b in BATCHES) + " |",
             "|---|" + "---:|" * len(BATCHES)]
    for name, r in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{r[b]:.3f}" for b in BATCHES) + " |")
    lines += ["", "| engine | mean cosine vs PyTorch FP32 | min cosine | neighbour overlap@5 | samples |",
              "|---|---:|---:|---:|---:|"]
    for prec, m in acc.items():
        if prec != "ref":
            lines.append(f"| {prec} | {m['mean_cosine']:.5f} | {m['min_cosine']:.5f} | "
                         f"{m['neighbour_overlap@5']:.4f} | {m['samples']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
