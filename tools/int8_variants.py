"""Where INT8 helps on this GPU: builds Q/DQ variants of the INT8 graph, runs each engine, and
reports NaNs, cosine to PyTorch FP32, latency and the engine inspector's per-layer precisions.

    python tools/int8_variants.py --engines engines/ [--append docs/BENCHMARKS.md]

Variants, all from `<name>.int8.onnx` as `build --int8 --int8-mode w8a8` writes it (the default,
`auto`, is weight-only, which leaves the two variants the same):
  w8a8          the graph as built: INT8 weights and activations on the GEMMs
  weight-only   activation Q/DQ removed: INT8 weights, FP16 activations
Needs torch with CUDA and a TensorRT runtime that runs on the GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_engines as ge  # noqa: E402

from trt_seer.engine import manifest  # noqa: E402
from trt_seer.export import onnxio  # noqa: E402
from trt_seer.engine import trt  # noqa: E402
from trt_seer.engine.build import BuildSpec, engine_from_onnx  # noqa: E402
from trt_seer.eval.evaluate import EvalSpec, eval_batches  # noqa: E402
from trt_seer.export.checkpoint import load_model, wrap  # noqa: E402
from trt_seer.export.families import ShapeProfile, resolve_model  # noqa: E402
from trt_seer.eval.metrics import embedding_metrics  # noqa: E402


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


def measure(path: Path, info, batches, ref: np.ndarray, stream) -> dict:
    _rt, engine, context = ge.load_engine(path)
    emb = ge.engine_embeddings(engine, context, batches, stream)
    nan_rows = int(np.isnan(emb).any(axis=1).sum())
    ok = ~np.isnan(emb).any(axis=1)
    m = embedding_metrics(ref[ok], emb[ok]) if ok.sum() > 5 else {"mean_cosine": float("nan"), "min_cosine": float("nan")}
    return {"nan_rows": nan_rows, "rows": len(emb), "mean_cosine": m["mean_cosine"], "min_cosine": m["min_cosine"],
            "ms_b1": ge._engine_ms(engine, context, info, 1, stream),
            "ms_b32": ge._engine_ms(engine, context, info, 32, stream), "layers": layer_precisions(engine),
            "size_mib": path.stat().st_size / 2**20}


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="engines")
    p.add_argument("--name", default="all-MiniLM-L6-v2")
    p.add_argument("--append", default=None)
    args = p.parse_args(argv)
    d = Path(args.engines)
    man = manifest.read_engine_manifest(d / f"{args.name}.int8.manifest.json")
    info = resolve_model(man["source"]["checkpoint"], man["task"])
    batches = eval_batches(info, EvalSpec(samples=160, batch=16))
    ref = ge.torch_embeddings(wrap(load_model(info).cuda().eval(), info), batches)
    stream = torch.cuda.Stream()
    results = {"fp16 (reference engine)": measure(d / f"{args.name}.fp16.engine", info, batches, ref, stream)}
    profile = ShapeProfile.from_dict(man["profiles"][0])
    with tempfile.TemporaryDirectory() as tmp:
        for name, edit in VARIANTS.items():
            onnx_path = Path(tmp) / f"{args.name}.{name}.onnx"
            onnxio.save(edit(onnxio.load(d / f"{args.name}.int8.onnx")), onnx_path)
            engine = Path(tmp) / f"{args.name}.{name}.engine"
            engine_from_onnx(onnx_path, engine, BuildSpec(precision="int8", profile=profile, detailed=True))
            results[f"int8 {name}"] = measure(engine, info, batches, ref, stream)
    text = report(results, args)
    print(text)
    if args.append:
        with open(args.append, "a") as f:
            f.write(text + "\n")
    return 0


def report(results: dict, args) -> str:
    import time

    import torch

    flavor = trt.load()
    lines = [f"\n### INT8 variants on {torch.cuda.get_device_name(0)} ({time.strftime('%Y-%m-%d')})", "",
             f"{flavor.name} {flavor.version}. Command: `python tools/int8_variants.py --engines {args.engines}`. "
             "Median ms per batch (CUDA events), seq 128; cosine vs PyTorch FP32 on held-out text.", "",
             "| engine | MiB | NaN rows | mean cos | min cos | ms b1 | ms b32 | layer input types (count) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in results.items():
        layers = ", ".join(f"{k}: {v}" for k, v in r["layers"].items())
        lines.append(f"| {name} | {r['size_mib']:.1f} | {r['nan_rows']}/{r['rows']} | {r['mean_cosine']:.5f} | "
                     f"{r['min_cosine']:.5f} | {r['ms_b1']:.3f} | {r['ms_b32']:.3f} | {layers} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
