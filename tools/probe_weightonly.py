"""Which form of a weight-only GEMM stack does TensorRT make fast at decode size (one row per GEMM)?

    python tools/probe_weightonly.py [--hidden 4096 --layers 8] [--append docs/BENCHMARKS.md]

A stack of `--layers` MatMul + Relu (hidden x hidden, FP16 activations) with FP16 weights, and the
same stack through trt_seer's weight-only writer (INT8 per channel, INT4 in blocks of 128 along K),
with activations 3-D [batch, seq, hidden] (as in exported decoders) or 2-D [rows, hidden], and one
optimization profile or two (decode: one token per row; prefill: up to 1024 tokens, as decoder
engines have). Each engine runs one row (M = 1) with TensorRT-RTX's kernel specialization off and
no CUDA graph, then with eager specialization and its CUDA graph (how decode steps run). Device time
per stack from CUDA events over 200 back-to-back runs. Needs torch with CUDA and a TensorRT runtime.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp16", "int8", "int4")


def stack(hidden: int, layers: int, dims: int):
    """The FP16 ONNX stack; input x is [B, S, H] (dims 3) or [M, H] (dims 2)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float16)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"], name=f"linear_{i}"),
                  helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        x = f"r{i}"
    nodes[-1].output[0] = "y"
    shape = ["B", "S", hidden] if dims == 3 else ["M", hidden]
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def profiles(hidden: int, dims: int, count: int) -> list[tuple]:
    """(min, opt, max) of x: decode (one row per sequence) and prefill, or one profile spanning both."""
    if dims == 3:
        decode, prefill = ((1, 1, hidden), (1, 1, hidden), (8, 1, hidden)), ((1, 1, hidden), (1, 128, hidden), (8, 1024, hidden))
    else:
        decode, prefill = ((1, hidden), (1, hidden), (8, hidden)), ((1, hidden), (128, hidden), (8192, hidden))
    return [decode, prefill] if count == 2 else [(prefill[0], decode[1], prefill[2])]


def build(case: tuple) -> tuple:
    """(case, serialized engine or None, note); runs in a worker process."""
    precision, dims, count, hidden, layers = case
    from trt_seer.engine import trt as trt_adapter
    from trt_seer.quantize import weightonly

    trt = trt_adapter.load().trt
    model = stack(hidden, layers, dims)
    if precision != "fp16":
        spec = weightonly.WeightOnlySpec(bits=8 if precision == "int8" else 4)
        weightonly.weight_only_model(model, weightonly.find_targets(model, spec), spec)
    log = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(log)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log)
    if not parser.parse(model.SerializeToString()):
        return case, None, "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
    config = builder.create_builder_config()
    for lo, opt, hi in profiles(hidden, dims, count):
        profile = builder.create_optimization_profile()
        profile.set_shape("x", lo, opt, hi)
        config.add_optimization_profile(profile)
    start = time.perf_counter()
    blob = builder.build_serialized_network(network, config)
    return case, (bytes(blob) if blob is not None else None), f"built in {time.perf_counter() - start:.0f} s"


def time_one_row(blob: bytes, dims: int, hidden: int, specialize: str, graph: bool) -> float:
    """Device microseconds per run of the stack on one row."""
    import torch

    from trt_seer.engine import trt as trt_adapter

    trt = trt_adapter.load().trt
    engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(blob)
    config = engine.create_runtime_config() if hasattr(engine, "create_runtime_config") else None
    if config is not None:
        strategy = getattr(trt, "DynamicShapesKernelSpecializationStrategy", None)
        if strategy is not None:
            config.dynamic_shapes_kernel_specialization_strategy = getattr(strategy, specialize.upper())
        if graph and hasattr(config, "cuda_graph_strategy"):
            config.cuda_graph_strategy = trt.CudaGraphStrategy.WHOLE_GRAPH_CAPTURE
    ctx = engine.create_execution_context(config) if config is not None else engine.create_execution_context()
    shape = (1, 1, hidden) if dims == 3 else (1, hidden)
    x = torch.randn(*shape, device="cuda").half()
    y = torch.empty_like(x)
    ctx.set_input_shape("x", shape)
    ctx.set_tensor_address("x", x.data_ptr())
    ctx.set_tensor_address("y", y.data_ptr())
    stream = torch.cuda.Stream()
    for _ in range(30):
        ctx.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(200):
        ctx.execute_async_v3(stream.cuda_stream)
    end.record(stream)
    stream.synchronize()
    return start.elapsed_time(end) / 200 * 1e3


def table(results: dict, hidden: int, layers: int) -> str:
    mb = {"fp16": 2, "int8": 1, "int4": 0.5}
    lines = ["| weights | activations | profiles | run mode | us per stack | vs FP16 (same form) | weight GB/s |",
             "|---|---|---|---|---:|---:|---:|"]
    for (precision, dims, count, mode), us in results.items():
        base = results.get(("fp16", dims, count, mode))
        gbs = layers * hidden * hidden * mb[precision] / (us * 1e-6) / 1e9
        ratio = f"{base / us:.2f}x" if base else "n/a"  # the FP16 engine of that form did not build
        lines.append(f"| {precision.upper()} | {dims}-D | {count} | {mode} | {us:.1f} | {ratio} | {gbs:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=6, help="engines built in parallel")
    ap.add_argument("--append", type=Path)
    args = ap.parse_args(argv)
    cases = [(p, d, c, args.hidden, args.layers) for p, d, c in itertools.product(PRECISIONS, (3, 2), (2, 1))]
    with ProcessPoolExecutor(args.jobs) as pool:
        built = list(pool.map(build, cases))
    results = {}
    for (precision, dims, count, *_), blob, note in built:
        if blob is None:
            print(f"{precision} {dims}-D {count} profile(s): build failed: {note}", flush=True)
            continue
        for specialize, graph, mode in (("none", False, "no specialization"), ("eager", True, "eager + CUDA graph")):
            results[(precision, dims, count, mode)] = time_one_row(blob, dims, args.hidden, specialize, graph)
            print(precision, dims, count, mode, f"{results[(precision, dims, count, mode)]:.1f} us", flush=True)
    text = table(results, args.hidden, args.layers)
    print(text)
    if args.append:
        import torch

        from trt_seer.bench.host import machine_text
        from trt_seer.bench.report import append_benchmark
        from trt_seer.engine import trt as trt_adapter

        flavor = trt_adapter.load()
        body = (f"A stack of {args.layers} MatMul + Relu, {args.hidden} x {args.hidden}, one row (M = 1), "
                f"device time per stack; weights through trt_seer's weight-only writer.\n\n{text}\n")
        append_benchmark(args.append, "Weight-only GEMM forms at decode size", "python " + " ".join(sys.argv),
                         machine_text(f"{torch.cuda.get_device_name(0)}, {flavor.name} {flavor.version}"), body)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
