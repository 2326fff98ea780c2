"""FP16 decoder graph -> weight-only INT8 (per output channel) or INT4 (block-wise) Q/DQ graph.

    from trt_seer.quantize.weightonly import WeightOnlySpec, find_targets, weight_only_model
    model = onnxio.load(Path("m.fp16.onnx"))
    targets = find_targets(model, WeightOnlySpec(bits=4))
    weight_only_model(model, targets, WeightOnlySpec(bits=4), awq_scales={})

Decoding multiplies 1-16 rows by each weight, so a GEMM is bound by reading its weight: storing it
in INT8 or INT4 and dequantizing inside the GEMM is what pays (docs/DESIGN.md, "Weight-only
quantization for decoders"). The patterns TensorRT-RTX fuses into one GEMM:

    INT8: int8 W [K, N] -> DequantizeLinear(axis=1, fp16 scale [N])                 -> MatMul
    INT4: int4 W [K, N] -> DequantizeLinear(axis=0, block_size=B, fp16 scale [K/B, N]) -> MatMul

Every MatMul/Gemm with a constant 2-D weight is a target (attention q/k/v/o, MLP up/gate/down;
GPT-2's Conv1D exports as Gemm with a [K, N] weight, Llama's Linear as MatMul with the transposed
[K, N] initializer); the LM head (the GEMM nearest `logits`) stays FP16 unless asked. Symmetric
quantization, zero point 0. An INT4 GEMM whose K is not a multiple of the block stays FP16
(padding K would change the activation's shape too). Activation-aware scales (AWQ, awq.py) arrive
as one vector s per activation: W becomes s * W (rows), the activation is divided by s, folded
into the preceding constant Mul (RMSNorm/LayerNorm weight) when only these GEMMs read it, else an
explicit Mul on the GEMM branch (as smooth.py does).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trt_seer.errors import InputError

OPSET = 21  # DequantizeLinear with block_size and INT4
IR_VERSION = 10  # INT4 tensors
INT8_OPSET, INT8_IR_VERSION = 19, 9  # per-channel INT8 with FP16 scales needs no more, as in the encoder graphs
GEMM_OPS = ("MatMul", "Gemm")
INT4_MIN, INT4_MAX = -8, 7
INT8_MAX = 127
BLOCK_SIZES = (16, 32, 64, 128, 256)  # INT4 blocks TensorRT-RTX 1.7 builds (8 too); 128 is the one measured fast
LOGITS = "logits"


@dataclass(frozen=True)
class WeightOnlySpec:
    bits: int = 8  # 8: per-output-channel INT8, 4: block-wise INT4
    block_size: int = 128
    lm_head: bool = False  # quantize the LM head too
    exclude: frozenset = field(default_factory=frozenset)  # GEMM node names kept in FP16

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise InputError(f"weight-only quantization takes 8 or 4 bits, got {self.bits}")
        if self.bits == 4 and self.block_size not in BLOCK_SIZES:
            raise InputError(f"INT4 block size {self.block_size} is not one TensorRT accepts; "
                             f"choose one of {', '.join(map(str, BLOCK_SIZES))}")


@dataclass(frozen=True)
class Target:
    """One GEMM to quantize: node name, activation input, weight initializer, K and N."""

    node: str
    activation: str
    weight: str
    k: int
    n: int


def _weight_kn(node, inits: dict) -> tuple[str, bool] | None:
    """(weight name, stored transposed) for a GEMM whose input 1 is a constant 2-D weight."""
    if len(node.input) < 2 or node.input[1] not in inits or len(inits[node.input[1]].dims) != 2:
        return None
    if node.op_type == "Gemm":
        attrs = {a.name: a for a in node.attribute}
        if attrs.get("transA") and attrs["transA"].i or attrs.get("alpha") and attrs["alpha"].f != 1.0:
            return None
        return node.input[1], bool(attrs.get("transB") and attrs["transB"].i)
    return node.input[1], False


def lm_head(model) -> str | None:
    """The GEMM nearest the `logits` output (the LM head), or None."""
    from trt_seer.quantize.qdq import nearest_gemms

    heads = sorted(nearest_gemms(model, LOGITS))
    return heads[0] if heads else None


def find_targets(model, spec: WeightOnlySpec) -> list[Target]:
    """GEMMs with a constant weight to quantize, in graph order (Gemm with transB is skipped:
    dynamo exports none; its weight would need a transpose first)."""
    inits = {t.name: t for t in model.graph.initializer}
    head = None if spec.lm_head else lm_head(model)
    out = []
    for n in model.graph.node:
        if n.op_type not in GEMM_OPS or n.name in spec.exclude or n.name == head:
            continue
        found = _weight_kn(n, inits)
        if found is None or found[1]:
            continue
        k, nn = inits[found[0]].dims
        if spec.bits == 4 and k % spec.block_size:
            continue  # stays FP16: see the module docstring
        out.append(Target(n.name, n.input[0], found[0], int(k), int(nn)))
    return out


def unfit_int4(model, spec: WeightOnlySpec) -> list[str]:
    """GEMMs that INT4 leaves in FP16 because K is not a multiple of the block."""
    eight = find_targets(model, WeightOnlySpec(8, lm_head=spec.lm_head, exclude=spec.exclude))
    return [t.node for t in eight if t.k % spec.block_size]


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W [K, N] -> (int8 [K, N], float32 scale [N]), symmetric per output channel."""
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / INT8_MAX, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -INT8_MAX, INT8_MAX).astype(np.int8), scale


def quantize_int4(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """W [K, N] -> (int values in [-8, 7] as int8 [K, N], float32 scale [K / block, N]): one scale
    per `block` consecutive input channels of each output channel, amax / 7 (symmetric)."""
    k, n = w.shape
    blocks = w.reshape(k // block, block, n)  # (blocks, block, N)
    amax = np.abs(blocks).max(axis=1)  # (blocks, N)
    scale = np.where(amax > 0, amax / INT4_MAX, 1.0).astype(np.float32)
    q = np.clip(np.rint(blocks / scale[:, None, :]), INT4_MIN, INT4_MAX).astype(np.int8)
    return q.reshape(k, n), scale


def quantize(w: np.ndarray, bits: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_int8 (bits 8) or quantize_int4 (bits 4) of W [K, N] (float16 or float32), the same
    values, computed with PyTorch: on the GPU when it has one, else on every CPU core (numpy runs
    one core: a 7B model's GEMM weights took minutes that way)."""
    import torch

    with torch.inference_mode():
        t = torch.from_numpy(np.require(w, requirements=("C", "W"))).to(torch_device())  # read-only arrays are copied
        q, scale = quantize_tensor(t, bits, block)
        return q.cpu().numpy(), scale.cpu().numpy()


def quantize_tensor(t, bits: int, block: int):
    """quantize on a torch tensor W [K, N], on its device: (int8 [K, N], float32 scale [N] or [K / block, N])."""
    import torch

    t = t.float()
    k, n = t.shape
    groups = t.reshape(1, k, n) if bits == 8 else t.reshape(k // block, block, n)
    amax = groups.abs().amax(dim=1)
    top = INT8_MAX if bits == 8 else INT4_MAX
    scale = torch.where(amax > 0, amax / top, torch.ones_like(amax))
    low = -INT8_MAX if bits == 8 else INT4_MIN
    q = torch.clamp(torch.round(groups / scale[:, None, :]), low, top).to(torch.int8).reshape(k, n)
    return q, (scale[0] if bits == 8 else scale)


def fake_quant_tensor(t, bits: int, block: int):
    """fake_quant on a torch tensor W [K, N], on its device."""
    q, scale = quantize_tensor(t, bits, block)
    return q.float() * (scale if bits == 8 else scale.repeat_interleave(block, dim=0))


def torch_device() -> str:
    """Where the PyTorch passes over weights run: "cuda" when PyTorch sees a GPU, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def initializer_value(t, read=None) -> np.ndarray:
    """An initializer's value as stored: `read(name)` (e.g. from the checkpoint) where it gives one,
    else the value the graph holds."""
    from onnx import numpy_helper

    a = read(t.name) if read else None
    return numpy_helper.to_array(t) if a is None else a


def dequantize(q: np.ndarray, scale: np.ndarray, block: int | None) -> np.ndarray:
    """The float weight a DequantizeLinear of `q` computes (block None: per output channel)."""
    if block is None:
        return q.astype(np.float32) * scale
    return q.astype(np.float32) * np.repeat(scale, block, axis=0)


def int4_tensor(q: np.ndarray, name: str):
    """An INT4 TensorProto of `q` (int8 values in [-8, 7]) packed into raw_data, two values per byte
    with the first in the low nibble (the ONNX layout): a quarter of the bytes `make_tensor` writes
    as int32_data, and movable to external data (raw_data only) when the graph is saved."""
    from onnx import TensorProto

    u = (q.reshape(-1) & 0x0F).astype(np.uint8)
    if u.size % 2:
        u = np.append(u, np.uint8(0))
    packed = u[0::2] | (u[1::2] << 4)
    return TensorProto(name=name, data_type=TensorProto.INT4, dims=list(q.shape), raw_data=packed.tobytes())


def fake_quant(w: np.ndarray, bits: int, block: int) -> np.ndarray:
    """Quantize-dequantize round trip of a float32 [K, N] weight."""
    if bits == 8:
        return dequantize(*quantize_int8(w), None)
    return dequantize(*quantize_int4(w, block), block)


class _Writer:
    """Accumulates new initializers and nodes for one rewrite."""

    def __init__(self, model, read=None):
        from onnx import TensorProto, helper, numpy_helper

        self.model, self.helper, self.nh, self.tp = model, helper, numpy_helper, TensorProto
        self.inits = {t.name: t for t in model.graph.initializer}
        self.new_inits, self.before = [], {}  # before: node name -> nodes to insert ahead of it
        self.done: dict[str, str] = {}
        self.read = read  # name -> array, or None where the graph holds the value itself

    def weight(self, name: str) -> np.ndarray:
        """The initializer's value as stored (float16 in FP16 graphs)."""
        return initializer_value(self.inits[name], self.read)

    def dtype(self, name: str):
        return np.float16 if self.inits[name].data_type == self.tp.FLOAT16 else np.float32

    def weight_dq(self, t: Target, spec: WeightOnlySpec, s: np.ndarray | None) -> str:
        """The DQ output that replaces `t.weight` (s: AWQ row scales folded into the weight)."""
        key = f"{t.weight}|{t.activation if s is not None else ''}"  # s is one vector per activation
        if key in self.done:
            return self.done[key]
        w = self.weight(t.weight) if s is None else self.weight(t.weight).astype(np.float32) * s[:, None]
        tag = f"{t.node}__w{spec.bits}"
        q, scale = quantize(w, spec.bits, spec.block_size)
        if spec.bits == 8:
            qt = self.nh.from_array(q, f"{tag}_q")
            attrs = {"axis": 1}
        else:
            qt = int4_tensor(q, f"{tag}_q")
            attrs = {"axis": 0, "block_size": spec.block_size}
        st = self.nh.from_array(scale.astype(self.dtype(t.weight)), f"{tag}_scale")
        self.new_inits += [qt, st]
        out = f"{tag}_dq"
        self.before.setdefault(t.node, []).append(
            self.helper.make_node("DequantizeLinear", [qt.name, st.name], [out], name=f"{tag}_DQ", **attrs))
        self.done[key] = out
        return out


def _consumers(model) -> dict[str, list]:
    out = {}
    for n in model.graph.node:
        for x in n.input:
            out.setdefault(x, []).append(n)
    return out


def _fold_or_mul(model, w: _Writer, x: str, inv: np.ndarray, group: list) -> str:
    """Divides activation `x` by s for the GEMMs in `group`; returns the tensor they now read."""
    producer = {o: n for n in model.graph.node for o in n.output}
    p = producer.get(x)
    only_group = {c.name for c in _consumers(model).get(x, [])} <= {g.name for g in group}
    const = [i for i, y in enumerate(p.input) if y in w.inits] if p is not None and p.op_type == "Mul" else []
    if only_group and len(const) == 1 and list(w.inits[p.input[const[0]]].dims) == [inv.size]:
        src = p.input[const[0]]
        folded = w.nh.from_array((w.weight(src).astype(np.float32) * inv).astype(w.dtype(src)), f"{x}__awq_folded")
        w.new_inits.append(folded)
        p.input[const[0]] = folded.name  # a private copy: the original may be shared
        return x
    dtype = np.float16 if any(w.inits[g.input[1]].data_type == w.tp.FLOAT16 for g in group) else np.float32
    c = w.nh.from_array(inv.astype(dtype), f"{x}__awq_inv")
    w.new_inits.append(c)
    w.before.setdefault(group[0].name, []).insert(0, w.helper.make_node("Mul", [x, c.name], [f"{x}__awq"],
                                                                          name=f"{x}_awq"))
    return f"{x}__awq"


def weight_only_model(model, targets: list[Target], spec: WeightOnlySpec, awq_scales: dict | None = None,
                      read=None):
    """Rewrites `model` (FP16-typed) in place: DQ'd INT8/INT4 weights for `targets`; `awq_scales`
    maps an activation tensor to its s vector. `read(name)` gives a weight the graph holds no value
    for (a weightless skeleton's: read tensor by tensor from the checkpoint), None for the others.
    Raises opset to 21 and IR version to 10 for INT4, to 19 and 9 for INT8."""
    w = _Writer(model, read)
    nodes = {n.name: n for n in model.graph.node}
    reads = {}
    for t in targets:
        reads.setdefault(t.activation, []).append(nodes[t.node])
    renamed = {}
    for x, s in (awq_scales or {}).items():
        if x in reads:
            renamed[x] = _fold_or_mul(model, w, x, (1.0 / s).astype(np.float32), reads[x])
    for t in targets:
        n = nodes[t.node]
        s = (awq_scales or {}).get(t.activation)
        n.input[1] = w.weight_dq(t, spec, s)
        n.input[0] = renamed.get(t.activation, n.input[0])
    _finish(model, w, (OPSET, IR_VERSION) if spec.bits == 4 else (INT8_OPSET, INT8_IR_VERSION))
    return model


def _finish(model, w: _Writer, versions: tuple[int, int]) -> None:
    ordered = []
    for n in model.graph.node:
        ordered.extend(w.before.get(n.name, []))
        ordered.append(n)
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    used = {x for n in ordered for x in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep + [t for t in w.new_inits if t.name in used])
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            op.version = max(op.version, versions[0])
    model.ir_version = max(model.ir_version, versions[1])


def summary(model) -> dict:
    """Counts of DequantizeLinear weights by type, for records and tests."""
    from onnx import TensorProto

    inits = {t.name: t.data_type for t in model.graph.initializer}
    kinds = [inits.get(n.input[0]) for n in model.graph.node if n.op_type == "DequantizeLinear"]
    return {"int8": kinds.count(TensorProto.INT8), "int4": kinds.count(TensorProto.INT4)}
