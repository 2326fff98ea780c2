"""The next-token sampler as a graph of its own, for the device: a decoder engine's logits in, the
sampled token out, so that sampling, like greedy decoding, brings only ids back to the host.

    from trt_seer.export.sampler import sampler_onnx
    sampler_onnx(Path("engines/my-llm.sampler.float16.onnx"), vocab=32000, logits_dtype="float16")

I/O: `logits` [batch, 1, vocab] (the decoder engine's output buffer, read where it lies), `uniforms`
[batch, DRAWS] float32 in [0, 1), `settings` [batch, 2] float32 (1 / temperature, top_p) in;
`next_token` [batch, 1] int64 out. The draw is runtime/sampling.nucleus_draw's, so a seed gives the
host's tokens (up to float32 rounding): candidates by inverse CDF over the vocabulary in id order,
the first inside the nucleus, else the inverse CDF over the nucleus at u_0. Without a sort, the
nucleus's boundary (the highest scaled logit whose tokens at or above it hold top_p of the mass) is
found by bisection: `PASSES` rounds, each weighing the mass above `THRESHOLDS` evenly spaced
thresholds at once, narrow it to (SPAN / THRESHOLDS ** PASSES) = 1.3e-4 of a logit over temperature;
tokens within that of the boundary count as inside. Top-k is not in the graph (the host does it).
Opset 18, operators that TensorRT and ONNX Runtime both run.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from trt_seer.runtime.sampling import DRAWS

BLOCK = 1024  # tokens per block of the running weight (the host uses smaller blocks: the sums differ by float32 rounding)
THRESHOLDS, PASSES = 8, 6  # 48 masses per row and token in all: the sampler's main cost on the device
SPAN = 32.0  # scaled logits more than SPAN below the best weigh < 1e-13 each: the bisection starts there
INPUTS = ("logits", "uniforms", "settings")
OUTPUT = "next_token"


def sampler_onnx(dest: Path, vocab: int, logits_dtype: str = "float16") -> Path:
    """Writes the sampler graph for `vocab` tokens and `logits_dtype` logits to `dest`."""
    import onnx

    from trt_seer.export import onnxio

    model = sampler_model(vocab, logits_dtype)
    onnx.checker.check_model(model)
    with onnxio.staged(Path(dest)) as tmp:
        onnx.save(model, str(tmp))
    return Path(dest)


def sampler_model(vocab: int, logits_dtype: str = "float16"):
    """The sampler as an onnx.ModelProto (module docstring)."""
    from onnx import TensorProto, helper

    g = _Graph()
    x = g.op("Cast", "logits", to=TensorProto.FLOAT)  # (batch, 1, vocab)
    inverse = g.op("Unsqueeze", g.op("Slice", "settings", g.const([0]), g.const([1]), g.const([1])), g.const([2]))
    top_p = g.op("Unsqueeze", g.op("Slice", "settings", g.const([1]), g.const([2]), g.const([1])), g.const([2]))
    z = g.op("Mul", g.op("Sub", x, g.op("ReduceMax", x, g.const([2]), keepdims=1)), inverse)  # <= 0
    e = g.op("Exp", z)
    need = g.op("Mul", top_p, g.op("ReduceSum", e, g.const([2]), keepdims=1))  # (batch, 1, 1)
    cut = _bisect(g, z, e, need)
    ids = _invert(g, e, g.op("Unsqueeze", "uniforms", g.const([2])), vocab)  # (batch, DRAWS) int64
    inside = g.op("GreaterOrEqual", g.op("GatherElements", g.op("Squeeze", z, g.const([1])), ids, axis=1),
                  g.op("Squeeze", cut, g.const([2])))
    inside = g.op("Or", inside, g.op("GreaterOrEqual", g.op("Squeeze", top_p, g.const([2])), g.const(1.0)))
    found = g.op("Cast", inside, to=TensorProto.FLOAT)
    first = g.op("GatherElements", ids, g.op("ArgMax", found, axis=1, keepdims=1), axis=1)  # (batch, 1)
    kept = g.op("Where", g.op("GreaterOrEqual", z, cut), e, g.const(0.0))
    u0 = g.op("Unsqueeze", g.op("Slice", "uniforms", g.const([0]), g.const([1]), g.const([1])), g.const([2]))
    fallback = _invert(g, kept, u0, vocab)  # (batch, 1)
    any_inside = g.op("Greater", g.op("ReduceMax", found, g.const([1]), keepdims=1), g.const(0.5))
    g.op("Where", any_inside, first, fallback, out=OUTPUT)
    dtype = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT, "bfloat16": TensorProto.BFLOAT16}[logits_dtype]
    inputs = [helper.make_tensor_value_info("logits", dtype, ["batch", 1, vocab]),
              helper.make_tensor_value_info("uniforms", TensorProto.FLOAT, ["batch", DRAWS]),
              helper.make_tensor_value_info("settings", TensorProto.FLOAT, ["batch", 2])]
    outputs = [helper.make_tensor_value_info(OUTPUT, TensorProto.INT64, ["batch", 1])]
    graph = helper.make_graph(g.nodes, "sampler", inputs, outputs, g.inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="trt_seer")


def _bisect(g: "_Graph", z: str, e: str, need: str) -> str:
    """The nucleus's boundary on z (batch, 1, 1): the bracket [lo, hi) keeps mass(z >= lo) >= need
    and mass(z >= hi) < need; each pass splits it in THRESHOLDS and keeps the piece that crosses."""
    from onnx import TensorProto

    steps = g.const(np.arange(THRESHOLDS, dtype=np.float32).reshape(1, THRESHOLDS, 1))
    lo = g.op("Max", g.op("ReduceMin", z, g.const([2]), keepdims=1), g.const(-SPAN))
    width = g.op("Sub", g.const(2.0 ** -10), lo)  # hi starts above the best (z = 0): nothing is there
    for _ in range(PASSES):
        width = g.op("Div", width, g.const(float(THRESHOLDS)))
        at = g.op("Add", lo, g.op("Mul", steps, width))  # (batch, THRESHOLDS, 1)
        mass = g.op("ReduceSum", g.op("Where", g.op("GreaterOrEqual", z, at), e, g.const(0.0)), g.const([2]), keepdims=1)
        holds = g.op("ReduceSum", g.op("Cast", g.op("GreaterOrEqual", mass, need), to=TensorProto.FLOAT),
                     g.const([1]), keepdims=1)  # thresholds whose mass still reaches top_p: a prefix
        lo = g.op("Add", lo, g.op("Mul", g.op("Max", g.op("Sub", holds, g.const(1.0)), g.const(0.0)), width))
    return lo


def _invert(g: "_Graph", weights: str, u: str, vocab: int) -> str:
    """Per row and uniform u (batch, n, 1): the first token whose running weight (id order)
    exceeds u times the row's weight; (batch, n) int64. The running weight is summed as the host
    sums it, within blocks plus the blocks before (float32 error stays a block's); the host's
    blocks are smaller, so the two differ by float32 rounding only."""
    from onnx import TensorProto

    blocks = -(-vocab // BLOCK)
    padded = g.op("Pad", weights, g.const([0, 0, 0, 0, 0, blocks * BLOCK - vocab]))  # zeros weigh nothing
    inner = g.op("CumSum", g.op("Reshape", padded, g.const([0, blocks, BLOCK])), g.const(np.array(2, np.int64)))
    sums = g.op("Slice", inner, g.const([-1]), g.const([BLOCK]), g.const([2]))  # (batch, blocks, 1)
    before = g.op("Sub", g.op("CumSum", sums, g.const(np.array(1, np.int64))), sums)
    running = g.op("Reshape", g.op("Add", inner, before), g.const([0, 1, blocks * BLOCK]))  # (batch, 1, padded)
    total = g.op("Slice", running, g.const([-1]), g.const([blocks * BLOCK]), g.const([2]))
    below = g.op("LessOrEqual", running, g.op("Mul", u, total))  # (batch, n, padded)
    count = g.op("ReduceSum", g.op("Cast", below, to=TensorProto.FLOAT), g.const([2]), keepdims=0)
    return g.op("Cast", g.op("Min", count, g.const(float(vocab - 1))), to=TensorProto.INT64)


class _Graph:
    """Nodes and constants of a graph under construction, with generated names."""

    def __init__(self):
        self.nodes, self.inits, self._n = [], [], 0

    def _name(self, kind: str) -> str:
        self._n += 1
        return f"{kind}_{self._n}"

    def const(self, value) -> str:
        from onnx import numpy_helper

        array = np.asarray(value, dtype=np.int64 if isinstance(value, list) else None)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        name = self._name("c")
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def op(self, kind: str, *inputs, out: str | None = None, **attrs) -> str:
        from onnx import helper

        out = out or self._name(kind.lower())
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out
