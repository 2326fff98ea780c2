"""How does TensorRT run decode attention over a KV cache, in three ONNX forms?

    python tools/probe_attention.py [--layers 22] [--append docs/BENCHMARKS.md]

A stack of `--layers` attention blocks with the 1.1B Llama shape's heads (32 query heads, 4 key/value
heads, head size 64), one new token per row, FP16; each block's query is the previous block's output.
- "exported": the form trt_seer's decoder export has today: Concat(past, new) along the sequence
  (the engine writes `present`, window + 1 positions), grouped heads expanded, MatMul / Softmax /
  MatMul with an additive mask.
- "in place": ONNX opset 24 TensorScatter writes the new position into the cache (TensorRT parses it
  as its KV-cache update layer: the output shares the input's memory) and the Attention op reads it
  with a boolean mask: the cache is held once.
- "chunked": in place, then attention by hand with the window cut into 256-position chunks (one
  batched GEMM over all chunks, one softmax across them, one GEMM and a sum over chunks), so the
  work spreads over the GPU instead of one block per head.
Each form runs at windows 256 and 4,096 with 200 and 3,840 positions in use, batch 1 and 8. Device
time per step is the sum of its kernels (CUDA profiler, 50 runs); every output is checked against
the exported form's, and the in-place forms' caches are checked to hold the new position and their
old contents. Needs torch with CUDA and a TensorRT runtime.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HQ, HK, D = 32, 4, 64
CASES = ((256, 200), (4096, 3840), (4096, 200))  # (window, positions in use)
CHUNK = 256


def _graph(kind: str, batch: int, window: int, layers: int, dtype=np.float16):
    """The ONNX stack; inputs q, k, v (the new token), the mask and per-layer caches pk{i}, pv{i};
    outputs y (the last block's) and per-layer ck{i}, cv{i} (present). `dtype`: of the tensors."""
    from onnx import TensorProto as T, helper, numpy_helper

    elem = T.FLOAT16 if dtype == np.float16 else T.FLOAT

    def io(name, shape, dtype=elem):
        return helper.make_tensor_value_info(name, dtype, shape)

    def const(name, value):
        nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value))))

    nodes, outs = [], []
    ins = [io("q", [batch, HQ, 1, D]), io("k", [batch, HK, 1, D]), io("v", [batch, HK, 1, D])]
    cache = window if kind != "exported" else window + 1  # positions of present
    if kind == "exported":
        ins.append(io("mask", [batch, 1, 1, cache]))
        const("shape5", np.array([batch, HK, 1, cache, D], np.int64))
        const("expand5", np.array([batch, HK, HQ // HK, cache, D], np.int64))
        const("shape4", np.array([batch, HQ, cache, D], np.int64))
    else:
        ins += [io("idx", [batch], T.INT64), io("mask", [batch, 1, 1, window], T.BOOL)]
    if kind == "chunked":
        chunks = max(1, window // CHUNK)
        const("qs", np.array([batch, HK, 1, HQ // HK, D], np.int64))
        const("ks", np.array([batch, HK, chunks, window // chunks, D], np.int64))
        const("ms", np.array([batch, 1, chunks, 1, window // chunks], np.int64))
        const("os", np.array([batch, HQ, 1, D], np.int64))
        const("lowest", np.array(-65504.0, dtype))
        const("zero", np.array(0.0, dtype))
        const("ax24", np.array([2, 4], np.int64))
        const("ax2", np.array([2], np.int64))
        nodes += [helper.make_node("Reshape", ["mask", "ms"], ["m5"]),
                  helper.make_node("Where", ["m5", "zero", "lowest"], ["bias"])]
    const("scale", np.array(1 / np.sqrt(D), dtype))
    q = "q"
    for i in range(layers):
        ins += [io(f"pk{i}", [batch, HK, window, D]), io(f"pv{i}", [batch, HK, window, D])]
        outs += [io(f"ck{i}", [batch, HK, cache, D]), io(f"cv{i}", [batch, HK, cache, D])]
        nodes += _block(kind, i, q)
        q = f"y{i}"
    nodes.append(helper.make_node("Identity", [q], ["y"]))
    graph = helper.make_graph(nodes, "attention", ins, [io("y", [batch, HQ, 1, D]), *outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18 if kind == "exported" else 24)])


def _block(kind: str, i: int, q: str) -> list:
    from onnx import helper

    n = helper.make_node
    if kind == "exported":
        nodes = []
        for t in "kv":
            nodes += [n("Concat", [f"p{t}{i}", t], [f"c{t}{i}"], axis=2), n("Reshape", [f"c{t}{i}", "shape5"], [f"r{t}{i}"]),
                      n("Expand", [f"r{t}{i}", "expand5"], [f"x{t}{i}"]), n("Reshape", [f"x{t}{i}", "shape4"], [f"g{t}{i}"])]
        return nodes + [n("Transpose", [f"gk{i}"], [f"kt{i}"], perm=[0, 1, 3, 2]), n("MatMul", [q, f"kt{i}"], [f"s{i}"]),
                        n("Mul", [f"s{i}", "scale"], [f"ss{i}"]), n("Add", [f"ss{i}", "mask"], [f"sm{i}"]),
                        n("Softmax", [f"sm{i}"], [f"p{i}"], axis=-1), n("MatMul", [f"p{i}", f"gv{i}"], [f"y{i}"])]
    nodes = [n("TensorScatter", [f"pk{i}", "k", "idx"], [f"ck{i}"], axis=2),
             n("TensorScatter", [f"pv{i}", "v", "idx"], [f"cv{i}"], axis=2)]
    if kind == "in place":
        return nodes + [n("Attention", [q, f"ck{i}", f"cv{i}", "mask"], [f"y{i}"], q_num_heads=HQ, kv_num_heads=HK)]
    return nodes + [  # chunked: scores [B, HK, C, G, chunk], softmax over (C, chunk), P.V summed over C
        n("Reshape", [q, "qs"], [f"q5{i}"]), n("Reshape", [f"ck{i}", "ks"], [f"k5{i}"]),
        n("Reshape", [f"cv{i}", "ks"], [f"v5{i}"]), n("Transpose", [f"k5{i}"], [f"kt{i}"], perm=[0, 1, 2, 4, 3]),
        n("MatMul", [f"q5{i}", f"kt{i}"], [f"s{i}"]), n("Mul", [f"s{i}", "scale"], [f"ss{i}"]),
        n("Add", [f"ss{i}", "bias"], [f"sm{i}"]), n("ReduceMax", [f"sm{i}", "ax24"], [f"mx{i}"], keepdims=1),
        n("Sub", [f"sm{i}", f"mx{i}"], [f"sd{i}"]), n("Exp", [f"sd{i}"], [f"e{i}"]),
        n("ReduceSum", [f"e{i}", "ax24"], [f"den{i}"], keepdims=1), n("MatMul", [f"e{i}", f"v5{i}"], [f"pv_{i}"]),
        n("ReduceSum", [f"pv_{i}", "ax2"], [f"acc{i}"], keepdims=1), n("Div", [f"acc{i}", f"den{i}"], [f"o5{i}"]),
        n("Reshape", [f"o5{i}", "os"], [f"y{i}"])]


def _build(trt, model) -> bytes:
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        raise RuntimeError("; ".join(str(parser.get_error(i)) for i in range(parser.num_errors)))
    blob = builder.build_serialized_network(network, builder.create_builder_config())
    if blob is None:
        raise RuntimeError("the engine did not build")
    return bytes(blob)


def run_case(trt, kind: str, batch: int, window: int, used: int, layers: int, runs: int = 50) -> dict:
    """Device time per step and the outputs of one form at one shape."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    engine = trt.Runtime(trt.Logger(trt.Logger.ERROR)).deserialize_cuda_engine(_build(trt, _graph(kind, batch, window, layers)))
    ctx = engine.create_execution_context()
    gen = torch.Generator().manual_seed(0)
    new = {t: torch.randn(batch, heads, 1, D, generator=gen).half().cuda() for t, heads in (("q", HQ), ("k", HK), ("v", HK))}
    full = [torch.randn(batch, HK, 4096, D, generator=gen).half() for _ in range(2 * layers)]
    caches = [c[:, :, :window].contiguous().cuda() for c in full]  # the same numbers for every form
    bufs = dict(new, y=torch.empty(batch, HQ, 1, D, dtype=torch.float16, device="cuda"))
    if kind == "exported":  # slots [0, used) and the new position (the last) count
        mask = torch.full((batch, 1, 1, window + 1), -65504.0, dtype=torch.float16, device="cuda")
        mask[..., :used] = 0
        mask[..., window] = 0
    else:  # the new position is written at slot `used`
        mask = torch.zeros(batch, 1, 1, window, dtype=torch.bool, device="cuda")
        mask[..., :used + 1] = True
        bufs["idx"] = torch.full((batch,), used, dtype=torch.int64, device="cuda")
    bufs["mask"] = mask
    for i in range(layers):
        bufs[f"pk{i}"], bufs[f"pv{i}"] = caches[2 * i], caches[2 * i + 1]
        if kind == "exported":
            bufs[f"ck{i}"], bufs[f"cv{i}"] = (torch.empty(batch, HK, window + 1, D, dtype=torch.float16, device="cuda")
                                              for _ in range(2))
        else:  # in place: present is the past's own memory
            bufs[f"ck{i}"], bufs[f"cv{i}"] = caches[2 * i], caches[2 * i + 1]
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        ctx.set_tensor_address(name, bufs[name].data_ptr())
    stream = torch.cuda.Stream()
    for _ in range(5):
        ctx.execute_async_v3(stream.cuda_stream)
    stream.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            ctx.execute_async_v3(stream.cuda_stream)
        stream.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    row = {"form": kind, "batch": batch, "window": window, "used": used,
           "device_us": sum(e.device_time for e in kernels) / runs, "launches": len(kernels) / runs,
           "y": bufs["y"].float().cpu().numpy()}
    if kind != "exported":
        row["in_place"] = bool(torch.equal(caches[0][:, :, used], new["k"][:, :, 0])
                               and torch.equal(caches[-1][:, :, used], new["v"][:, :, 0])
                               and torch.equal(caches[0][:, :, :used].cpu(), full[0][:, :, :used]))
    return row


def table(rows: list[dict]) -> str:
    lines = ["| batch | window | positions in use | form | device us / step | us / layer | launches / step | "
             "vs exported | max abs diff vs exported | cache written in place |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    base = {(r["batch"], r["window"], r["used"]): r for r in rows if r["form"] == "exported"}
    for r in rows:
        ref = base[(r["batch"], r["window"], r["used"])]
        lines.append(f"| {r['batch']} | {r['window']:,} | {r['used']:,} | {r['form']} | {r['device_us']:,.1f} | "
                     f"{r['device_us'] / r['layers']:.1f} | {r['launches']:.0f} | {ref['device_us'] / r['device_us']:.2f}x | "
                     f"{r['diff']:.1e} | {'yes' if r.get('in_place') else 'n/a' if r['form'] == 'exported' else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--append", type=Path)
    args = ap.parse_args(argv)
    from trt_seer.engine import trt as trt_adapter

    flavor = trt_adapter.load()
    rows = []
    for batch in (1, 8):
        for window, used in CASES:
            ref = None
            for kind in ("exported", "in place", "chunked"):
                row = run_case(flavor.trt, kind, batch, window, used, args.layers)
                ref = row["y"] if ref is None else ref
                row["diff"], row["layers"] = float(np.abs(row.pop("y") - ref).max()), args.layers
                rows.append(row)
                print(json.dumps(row), flush=True)
    text = table(rows)
    print(text)
    if args.append:
        from trt_seer.bench.host import engine_gpu_text, machine_text
        from trt_seer.bench.report import append_benchmark

        body = (f"A stack of {args.layers} attention blocks (32 query heads, 4 key/value heads, head size 64: the "
                f"1.1B Llama shape), one new token per row, FP16; forms as in `tools/probe_attention.py`. Device "
                f"time per step = the sum of its kernels over 50 runs (CUDA profiler), no CUDA graph.\n\n{text}\n")
        append_benchmark(args.append, "Decode attention forms on TensorRT", "python " + " ".join(sys.argv),
                         machine_text(engine_gpu_text()), body)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
