"""Which CPU graph ONNX Runtime runs fastest, and how accurate each INT8 scheme is: PyTorch FP32
eager and quantize_dynamic against the plain and fused FP32 graphs and INT8 variants of them,
timed in one process with interleaved repetitions (the CPU may be shared: read the ratios).

    python tools/cpu_variants.py --engines engines/ [--batch 1,32] [--threads 2,0] [--append docs/BENCHMARKS.md]

`--engines` holds `<name>.fp32.onnx` and `<name>.fp32.cpu.onnx` (`trt-seer export` writes both);
the INT8 variants are written to a temporary folder from them. Accuracy: embedding cosine to the
FP32 graph on the held-out corpus (160 sentences), as the `build --int8` gate measures it.
Threads 0 means ONNX Runtime's and PyTorch's default (one per core).
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trt_seer import data
from trt_seer.bench.host import machine_text
from trt_seer.bench.report import append_benchmark
from trt_seer.eval import evaluate
from trt_seer.export.families import ShapeProfile, resolve_model

SEQ = 128
HELD = 160


def ffn_down(model) -> list[str]:
    """MatMuls fed by GELU: the FFN down-projections, whose one-sided inputs INT8 handles worst."""
    prod = {o: n for n in model.graph.node for o in n.output}
    gelu = ("BiasGelu", "FastGelu", "Gelu", "Erf", "Mul")
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[0] in prod
            and prod[n.input[0]].op_type in gelu[:3]]


def dynamic(src: Path, dest: Path, ops=("MatMul",), exclude=(), per_channel=True) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dest), weight_type=QuantType.QInt8, per_channel=per_channel,
                     op_types_to_quantize=list(ops), nodes_to_exclude=list(exclude),
                     extra_options={"MatMulConstBOnly": True})
    return dest


def static(src: Path, dest: Path, calib: list[dict], act, exclude=()) -> Path:
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(calib)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dest), Reader(), quant_format=QuantFormat.QDQ, activation_type=act,
                    weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                    nodes_to_exclude=list(exclude),
                    extra_options={"MatMulConstBOnly": True, "ActivationSymmetric": act == QuantType.QInt8})
    return dest


def variants(engines: Path, name: str, work: Path, calib: list[dict]) -> dict[str, Path]:
    import onnx
    from onnxruntime.quantization import QuantType

    plain, fused = engines / f"{name}.fp32.onnx", engines / f"{name}.fp32.cpu.onnx"
    down = ffn_down(onnx.load(str(fused)))
    out = {"ORT FP32, plain graph": plain, "ORT FP32, fused graph": fused}
    if (engines / f"{name}.fp16.onnx").is_file():
        out["ORT FP16-typed graph"] = engines / f"{name}.fp16.onnx"
    steps = {
        "dyn INT8 on the plain graph": lambda d: dynamic(plain, d),
        "dyn INT8 fused, all GEMMs + QAttention (chosen)": lambda d: dynamic(fused, d, ("MatMul", "Attention")),
        "dyn INT8 fused, GEMMs only (attention FP32)": lambda d: dynamic(fused, d),
        "dyn INT8 fused + QAttention, FFN down FP32": lambda d: dynamic(fused, d, ("MatMul", "Attention"), down),
        "dyn INT8 fused + QAttention, per-tensor weights": lambda d: dynamic(fused, d, ("MatMul", "Attention"),
                                                                              per_channel=False),
        "static QDQ U8S8 fused (MinMax)": lambda d: static(fused, d, calib, QuantType.QUInt8),
        "static QDQ S8S8 fused (MinMax)": lambda d: static(fused, d, calib, QuantType.QInt8),
        "static QDQ U8S8 fused, FFN down FP32": lambda d: static(fused, d, calib, QuantType.QUInt8, down),
    }
    for i, (label, make) in enumerate(steps.items()):
        out[label] = make(work / f"v{i}.onnx")
    return out


def ort_call(path: Path, feeds: dict, threads: int, spin: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads, so.log_severity_level = threads, 1, 3
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    fd = {i.name: feeds[i.name] for i in s.get_inputs()}
    return lambda: s.run(None, fd)


def torch_calls(info, feeds: dict, threads: int) -> dict:
    import warnings

    import torch

    from trt_seer.export.checkpoint import load_model, wrap

    if threads:
        torch.set_num_threads(threads)
    args = [torch.from_numpy(feeds[n]) for n in info.inputs]
    fp32 = wrap(load_model(info), info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.ao.quantization.quantize_dynamic(wrap(load_model(info), info), {torch.nn.Linear}, dtype=torch.qint8)

    def call(m):
        def run():
            with torch.inference_mode():
                return m(*args)
        return run

    return {"PyTorch FP32 eager": call(fp32), "PyTorch quantize_dynamic INT8": call(q)}


def interleaved(calls: dict, reps: int) -> dict[str, tuple[float, float]]:
    """(median, min) ms per call, the calls taking turns so that load from other processes hits all
    alike; a pause before each lets the previous call's spinning threads go idle first."""
    for f in calls.values():
        f()
    times = {k: [] for k in calls}
    for _ in range(reps):
        for k, f in calls.items():
            time.sleep(0.05)
            t = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t) * 1e3)
    return {k: (float(np.median(v)), float(np.min(v))) for k, v in times.items()}


def accuracy(info, paths: dict, batches: list[dict], ref_path: Path) -> dict[str, tuple[float, float]]:
    ref = evaluate.run_batches(evaluate.session(ref_path), batches)
    out = {}
    for label, p in paths.items():
        m = evaluate.compare_onnx(info, ref, p, batches)
        out[label] = (m["mean_cosine"], m["min_cosine"])
    return out


def timing_feeds(info, batch: int) -> dict:
    texts = data.load_texts(data.default_corpus("heldout"))
    reps = (texts * (batch // len(texts) + 1))[:batch]
    (feeds,) = list(data.token_batches(info, reps, ShapeProfile((batch,) * 3, (SEQ, SEQ, SEQ)), batch))
    pad = SEQ - feeds["input_ids"].shape[1]  # pad to SEQ: every row is timed at seq 128
    return {k: np.pad(v, ((0, 0), (0, pad))) if pad > 0 else v for k, v in feeds.items()}


def table(rows: list[tuple], batches: list[int], threads: list[int]) -> str:
    cols = [f"b{b} t{t or 'all'}" for t in threads for b in batches]
    head = ["| variant | mean cosine | min cosine | " + " | ".join(f"{c} p50 ms | {c} vs PyTorch (p50 / min)"
                                                                   for c in cols) + " |",
            "|---|---:|---:|" + "---:|---:|" * len(cols)]
    return "\n".join(head + [f"| {r[0]} | {r[1]} | {r[2]} | " + " | ".join(r[3:]) + " |" for r in rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", type=Path, required=True)
    p.add_argument("--model", default=None, help="checkpoint (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--threads", default="2,0", help="intra-op threads to run at; 0 = one per core")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--append", type=Path, default=None)
    args = p.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)
    info = resolve_model(args.model, None)
    batches, threads = [int(b) for b in args.batch.split(",")], [int(t) for t in args.threads.split(",")]
    prof = ShapeProfile((1, 16, 32), (8, SEQ, 256))
    held = list(data.token_batches(info, data.load_texts(data.default_corpus("heldout"))[:HELD], prof, 16))
    calib = list(data.token_batches(info, data.load_texts(data.default_corpus("default"))[:128], prof, 16))
    with tempfile.TemporaryDirectory() as work:
        paths = variants(args.engines, info.name, Path(work), calib)
        acc = accuracy(info, paths, held, args.engines / f"{info.name}.fp32.onnx")
        ms = {}
        for t in threads:
            for b in batches:
                feeds = timing_feeds(info, b)
                calls = {**torch_calls(info, feeds, t), **{k: ort_call(v, feeds, t) for k, v in paths.items()},
                         "ORT FP32, fused graph, no spinning": ort_call(paths["ORT FP32, fused graph"], feeds, t, False)}
                ms[(b, t)] = interleaved(calls, args.reps if b > 1 else args.reps * 5)
                print(f"batch {b}, threads {t or 'all'}:", {k: v for k, v in ms[(b, t)].items()}, flush=True)
    rows = []
    for label in ms[(batches[0], threads[0])]:
        mean, worst = (f"{x:.4f}" for x in acc[label]) if label in acc else ("-", "-")
        cells = []
        for t in threads:
            for b in batches:
                (base, base_min), (p50, low) = ms[(b, t)]["PyTorch FP32 eager"], ms[(b, t)][label]
                cells += [f"{p50:.1f}", f"{base / p50:.2f}x / {base_min / low:.2f}x"]
        rows.append((label, mean, worst, *cells))
    body = table(rows, batches, threads)
    print(body)
    if args.append:
        cmd = "python tools/cpu_variants.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
        append_benchmark(args.append, f"CPU graphs and INT8 schemes, {info.name}, seq {SEQ}", cmd, machine_text(),
                         "Interleaved repetitions in one process; 'vs PyTorch' = PyTorch FP32 eager's median / "
                         "the row's median, and the same for the fastest run (min), at the same batch and threads. Cosine: sentence embedding "
                         f"vs the FP32 graph on {HELD} held-out sentences.\n\n" + body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
