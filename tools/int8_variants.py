"""Where INT8 helps on this GPU: builds Q/DQ variants of the INT8 graph, runs each engine through
trt_seer.runtime, and reports NaNs, cosine to PyTorch FP32, latency (end to end and device) and the
engine inspector's per-layer precisions.

    python tools/int8_variants.py --engines engines/ [--append docs/BENCHMARKS.md]

Variants, all from `<name>.int8.onnx` as `build --int8 --int8-mode w8a8` writes it (the default,
`auto`, is weight-only, which leaves the two variants the same):
  w8a8          the graph as built: INT8 weights and activations on the GEMMs
  weight-only   activation Q/DQ removed: INT8 weights, FP16 activations
Timing and loading are `trt-seer bench`'s own (trt_seer.bench.runners / measure). Needs torch with
CUDA and a TensorRT runtime that runs on the GPU.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

import numpy as np

from trt_seer.bench.host import engine_gpu_text, machine_text
from trt_seer.bench.measure import TimingSpec, measure, summarize_point
from trt_seer.bench.paths import PATH_BY_KEY
from trt_seer.bench.report import append_benchmark
from trt_seer.bench.runners import EngineRunner, torch_runner
from trt_seer.bench.worker import timing_feeds
from trt_seer.engine import manifest, trt
from trt_seer.engine.build import BuildSpec, engine_from_onnx
from trt_seer.eval.evaluate import EvalSpec, eval_batches
from trt_seer.eval.metrics import embedding_metrics
from trt_seer.export import onnxio
from trt_seer.export.families import ShapeProfile, resolve_model

SEQ = 128


def weight_only(model):
    """Removes activation QuantizeLinear/DequantizeLinear pairs (weight DQs stay)."""
    q_in = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    dq_src = {n.output[0]: q_in[n.input[0]] for n in model.graph.node
              if n.op_type == "DequantizeLinear" and n.input[0] in q_in}
    keep = [n for n in model.graph.node if not (n.op_type == "QuantizeLinear" or n.output[0] in dq_src)]
    for n in keep:
        n.input[:] = [dq_src.get(x, x) for x in n.input]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    return model


def layer_precisions(engine) -> dict:
    """Counts of engine layers by the data types the inspector reports for their inputs."""
    t = trt.load().trt
    info = json.loads(engine.create_engine_inspector().get_engine_information(t.LayerInformationFormat.JSON))
    counts: dict[str, int] = {}
    for layer in info.get("Layers", []):
        if isinstance(layer, str):
            return {"detail": "not available (engine built without detailed profiling)"}
        fmts = {str(i.get("Format/Datatype", "?")).split()[0] for i in layer.get("Inputs", [])}
        key = "+".join(sorted(fmts)) or "?"
        counts[key] = counts.get(key, 0) + 1
    return counts


VARIANTS = {"w8a8": lambda m: m, "weight-only": weight_only}


def embeddings(runner, batches) -> np.ndarray:
    return np.concatenate([runner.outputs(b)["sentence_embedding"] for b in batches])


def latency(runner, info, batch: int) -> dict:
    """End-to-end and device p50 at (batch, SEQ), timed as `trt-seer bench` times engines."""
    samples, _ = measure(runner.timer(timing_feeds(info, batch, SEQ)), TimingSpec(budget_s=2.0))
    return summarize_point(samples)


def evaluate(path: Path, info, batches, ref: np.ndarray) -> dict:
    runner = EngineRunner(path)
    emb = embeddings(runner, batches)
    ok = ~np.isnan(emb).any(axis=1)
    m = embedding_metrics(ref[ok], emb[ok]) if ok.sum() > 5 else {"mean_cosine": float("nan"), "min_cosine": float("nan")}
    b1, b32 = latency(runner, info, 1), latency(runner, info, 32)
    return {"nan_rows": int((~ok).sum()), "rows": len(emb), "mean_cosine": m["mean_cosine"],
            "min_cosine": m["min_cosine"], "e2e_b1": b1["p50_ms"], "device_b1": b1["device_p50_ms"],
            "e2e_b32": b32["p50_ms"], "device_b32": b32["device_p50_ms"],
            "layers": layer_precisions(runner.model.engine), "size_mib": path.stat().st_size / 2**20}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="engines")
    p.add_argument("--name", default="all-MiniLM-L6-v2")
    p.add_argument("--append", default=None, help="append the table to this Markdown file")
    args = p.parse_args(argv)
    d = Path(args.engines)
    man = manifest.read_engine_manifest(d / f"{args.name}.int8.manifest.json")
    info = resolve_model(man["source"]["checkpoint"], man["task"])
    batches = eval_batches(info, EvalSpec(samples=160, batch=16))
    ref = embeddings(torch_runner(PATH_BY_KEY["torch-fp32-gpu"], info), batches)
    results = {"fp16 (reference engine)": evaluate(d / f"{args.name}.fp16.engine", info, batches, ref)}
    profile = ShapeProfile.from_dict(man["profiles"][0])
    with tempfile.TemporaryDirectory() as tmp:
        for name, edit in VARIANTS.items():
            onnx_path = Path(tmp) / f"{args.name}.{name}.onnx"
            onnxio.save(edit(onnxio.load(d / f"{args.name}.int8.onnx")), onnx_path)
            engine = Path(tmp) / f"{args.name}.{name}.engine"
            engine_from_onnx(onnx_path, engine, BuildSpec(precision="int8", profile=profile, detailed=True))
            results[f"int8 {name}"] = evaluate(engine, info, batches, ref)
    text = table(results)
    print(text)
    if args.append:
        command = shlex.join(["python", "tools/int8_variants.py", *(sys.argv[1:] if argv is None else argv)])
        append_benchmark(args.append, "INT8 variants", command, machine_text(engine_gpu_text()), text)
    return 0


def table(results: dict) -> str:
    lines = [f"p50 ms per batch at seq {SEQ}: end to end (numpy in and out) and device (CUDA events around the "
             "engine); cosine vs PyTorch FP32 on held-out text.", "",
             "| engine | MiB | NaN rows | mean cos | min cos | e2e ms b1 | device ms b1 | e2e ms b32 | device ms b32 "
             "| layer input types (count) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        layers = ", ".join(f"{k}: {v}" for k, v in r["layers"].items())
        lines.append(f"| {name} | {r['size_mib']:.1f} | {r['nan_rows']}/{r['rows']} | {r['mean_cosine']:.5f} | "
                     f"{r['min_cosine']:.5f} | {r['e2e_b1']:.3f} | {r['device_b1']:.3f} | {r['e2e_b32']:.3f} | "
                     f"{r['device_b32']:.3f} | {layers} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
