"""Ranges trained by `finetune --qat int8`, and how `build --int8 --int8-mode w8a8` uses them.

    finetune --qat int8 --out ckpt/   ->  ckpt/model.safetensors + ckpt/qat_ranges.json
    build --int8 --int8-mode w8a8 --model ckpt/   ->  Q/DQ scales = trained amax / 127, no calibration

The file holds one activation amax per quantized GEMM input, keyed by the nn.Linear module whose
input it is (stable across exports) and by the ONNX tensor it was calibrated on (informative):

    {"schema": 1, "mode": "w8a8", "ranges_trained": "learned",
     "ranges": [{"tensor": "layer_norm", "modules": ["bert.encoder.layer.0.attention.self.query", ...],
                 "amax": 3.21, "initial_amax": 3.05}, ...]}

`finetune --task causal-lm --qat int4` writes the same file with "mode": "int4" and no ranges:
the block size and the Linears whose weights were trained for build's block-wise round-to-nearest
(`Int4Qat`, `int4_for_build`); `build --int4` then skips AWQ and needs the same --int4-block.

    {"schema": 1, "mode": "int4", "bits": 4, "block": 128, "lm_head": false,
     "modules": ["model.layers.0.self_attn.q_proj", ...], "trained": "all", "loss": "labels"}

Attention BMM inputs (`--int8-attention`) are keyed `<attention module>#q|k|p|v` and matched by
order: the k-th QK^T / PV MatMul pair of the graph belongs to the k-th of "attention_modules".

The dynamo exporter names folded weights `val_50`, not after modules, so modules and ONNX GEMMs are
matched by weight values: a Linear's weight W (out, in) is the MatMul initializer W^T, or the Gemm
initializer W under transB.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.errors import InputError
from trt_seer.quantize.spec import QuantStageSpec

RANGES_FILE = "qat_ranges.json"
SCHEMA = 1
INT4_MODE = "int4"


@dataclass(frozen=True)
class QatRanges:
    """A checkpoint's trained ranges: module name -> activation amax."""

    path: Path
    amax: dict
    trained: str  # "learned" | "frozen"
    attention_modules: list  # in call order: one QK^T / PV MatMul pair each (empty: no BMM ranges)
    smooth_alpha: float  # the SmoothQuant strength the ranges were trained under (build must match)
    smoothing: dict = None  # module name -> learned SmoothQuant s (finetune --qat-smoothing learned); {} if not

    def fingerprint(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def _digest(arr: np.ndarray) -> tuple:
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    return arr.shape, hashlib.sha1(arr.tobytes()).hexdigest()


def linear_nodes(model, weights: dict[str, np.ndarray], targets) -> dict[str, str]:
    """ONNX GEMM node name -> module name, for every target with a constant weight that one of
    `weights` ({module name: (out, in) weight}) is. InputError when a weight matches two modules."""
    by_value: dict[tuple, list[str]] = {}
    for name, w in weights.items():
        if w.ndim == 2:
            for key in {_digest(w), _digest(w.T)}:  # one key for a symmetric matrix
                by_value.setdefault(key, []).append(name)
    from onnx import numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    found = {}
    for t in targets:
        if t.weight is None:
            continue
        names = sorted(set(by_value.get(_digest(numpy_helper.to_array(inits[nodes[t.node].input[t.weight]])), [])))
        if len(names) > 1:
            raise InputError(f"GEMM {t.node}'s weight equals the weights of {', '.join(names)}; cannot tell "
                             "which module it is")
        if names:
            found[t.node] = names[0]
    return found


def target_keys(linear: dict[str, str], targets, attention_modules: list[str]) -> dict[str, str]:
    """Node -> range key: the Linear's module name, or `<attention module>#qk` / `#pv` for the
    k-th pair of attention BMMs in graph order (QK^T, then probabilities x V, per attention module)."""
    keys = dict(linear)
    bmm = [t.node for t in targets if t.weight is None]
    if len(bmm) != 2 * len(attention_modules) and bmm:
        raise InputError(f"the graph has {len(bmm)} attention batched matmuls, the ranges "
                         f"{2 * len(attention_modules)} (2 per attention module); train with --int8-attention")
    keys.update({node: f"{attention_modules[j // 2]}#{('qk', 'pv')[j % 2]}" for j, node in enumerate(bmm)})
    unmatched = [t.node for t in targets if t.node not in keys]
    if unmatched:
        raise InputError(f"{len(unmatched)} quantized GEMMs match no nn.Linear (e.g. {unmatched[0]})")
    return keys


def input_key(key: str, index: int) -> str:
    """The range key of input `index` of the GEMM keyed `key`: the Linear itself, or one BMM input
    (`#q`, `#k` of QK^T; `#p`, `#v` of probabilities x V)."""
    name, _, pair = key.partition("#")
    return f"{name}#{pair[index]}" if pair else name


def checkpoint_weights(ckpt: Path) -> dict[str, np.ndarray]:
    """{module name: weight} of every 2-D `*.weight` in the checkpoint's safetensors files."""
    from safetensors.numpy import load_file

    files = sorted(Path(ckpt).glob("*.safetensors"))
    if not files:
        raise InputError(f"{ckpt} has {RANGES_FILE} but no .safetensors weights to match it to the graph")
    out = {}
    for f in files:
        for k, v in load_file(str(f)).items():
            if k.endswith(".weight") and v.ndim == 2:
                out[k.removesuffix(".weight")] = v.astype(np.float32)
    return out


def find(ckpt: Path | None) -> QatRanges | None:
    """The checkpoint's qat_ranges.json, or None when it has none. InputError when it is malformed."""
    path = Path(ckpt) / RANGES_FILE if ckpt is not None else None
    if path is None or not path.is_file():
        return None
    doc = _read(path)
    if doc.get("mode") == INT4_MODE:
        return None  # weight-only INT4 (int4_for_build): no activation ranges
    try:
        amax = {m: float(r["amax"]) for r in doc["ranges"] for m in r["modules"]}
        ok = doc.get("schema") == SCHEMA and doc.get("mode") == "w8a8"
        attention = [str(m) for m in doc.get("attention_modules", [])]
        alpha = float(doc.get("smooth_alpha", 0.0))
        smoothing = {m: np.asarray(e["s"], np.float32) for e in doc.get("smoothing", []) for m in e["modules"]}
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"malformed {path}: {e!r}; rerun finetune --qat int8 or delete the file") from e
    if not ok or not amax or not all(np.isfinite(v) and v > 0 for v in amax.values()):
        raise InputError(f"{path} is not a schema-{SCHEMA} w8a8 ranges file with positive finite amax values")
    if not all(s.ndim == 1 and np.isfinite(s).all() and (s > 0).all() for s in smoothing.values()):
        raise InputError(f"{path}: smoothing scales must be 1-D, finite and positive")
    return QatRanges(path, amax, str(doc.get("ranges_trained", "?")), attention, alpha, smoothing)


def _read(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except ValueError as e:
        raise InputError(f"malformed {path}: {e!r}; rerun finetune --qat or delete the file") from e
    if not isinstance(doc, dict):
        raise InputError(f"malformed {path}: not a JSON object; rerun finetune --qat or delete the file")
    return doc


@dataclass(frozen=True)
class Int4Qat:
    """A checkpoint whose weights `finetune --qat int4` trained for build's block-wise INT4."""

    path: Path
    block: int
    modules: tuple
    lm_head: bool
    weights: str = "latent"  # "rounded": the checkpoint holds the INT4 values themselves

    def fingerprint(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def find_int4(ckpt: Path | None) -> Int4Qat | None:
    """The checkpoint's INT4 QAT file, or None without one (or with a w8a8 one)."""
    path = Path(ckpt) / RANGES_FILE if ckpt is not None else None
    if path is None or not path.is_file():
        return None
    doc = _read(path)
    if doc.get("mode") != INT4_MODE:
        return None
    try:
        qat = Int4Qat(path, int(doc["block"]), tuple(str(m) for m in doc["modules"]), bool(doc.get("lm_head")),
                      str(doc.get("weights", "latent")))
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"malformed {path}: {e!r}; rerun finetune --qat int4 or delete the file") from e
    if doc.get("schema") != SCHEMA or doc.get("bits") != 4 or not qat.modules:
        raise InputError(f"{path} is not a schema-{SCHEMA} INT4 QAT file with quantized modules")
    return qat


def int4_for_build(ckpt: Path | None, quant: QuantStageSpec) -> Int4Qat | None:
    """The INT4 QAT file `build --int4` honours; InputError when the build's INT4 differs from
    what the weights were trained for (block size, LM head)."""
    qat = find_int4(ckpt)
    if qat is None:
        return None
    if qat.block != quant.int4_block:
        raise InputError(f"{qat.path} was trained for INT4 blocks of {qat.block}; build with --int4-block "
                         f"{qat.block} (got {quant.int4_block})")
    if quant.quantize_lm_head and not qat.lm_head:
        raise InputError(f"{qat.path} was trained with the LM head in FP16; drop --quantize-lm-head")
    return qat


def write_int4(dest: Path, block: int, modules: list[str], meta: dict) -> Path:
    from trt_seer.files import atomic_write_json

    if not modules:
        raise InputError("no INT4 fake-quantized Linear left to record")
    return atomic_write_json(Path(dest) / RANGES_FILE, {"schema": SCHEMA, "mode": INT4_MODE, "bits": 4, "block": block,
                                                        "lm_head": False, **meta, "modules": modules})


def tensor_amax(qat: QatRanges, modules: dict[str, str], targets, tensors: dict) -> dict[str, float]:
    """{activation tensor: trained amax} for `tensors` ((node, input) -> tensor, as
    `qdq.activation_tensors` gives), GEMM nodes named as `modules` (`linear_nodes`) maps them;
    InputError for a quantized input the ranges do not cover."""
    keys = target_keys(modules, targets, qat.attention_modules)
    out: dict[str, float] = {}
    for (node, i), tensor in tensors.items():
        key = input_key(keys[node], i)
        if key not in qat.amax:
            raise InputError(f"{qat.path} has no range for {key}; train with the same quantization placement "
                             "(finetune --qat int8 [--int8-attention]) or delete the file to calibrate")
        out[tensor] = max(out.get(tensor, 0.0), qat.amax[key])
    return out


def write(dest: Path, ranges: list[dict], meta: dict) -> Path:
    from trt_seer.files import atomic_write_json

    return atomic_write_json(Path(dest) / RANGES_FILE, {"schema": SCHEMA, "mode": "w8a8", **meta, "ranges": ranges})


def for_build(ckpt: Path | None, mode: str, quant: QuantStageSpec) -> QatRanges | None:
    """The ranges `build --int8` uses instead of calibrating: the checkpoint's file in w8a8 mode."""
    import logging

    qat = find(ckpt)
    if qat is None:
        return None
    if mode != "w8a8":
        logging.getLogger(__name__).info("%s ignored: %s INT8 quantizes no activations", qat.path, mode)
        return None
    if quant.from_cache:
        raise InputError(f"--from-cache and {qat.path} both give activation ranges; drop one")
    if qat.smooth_alpha != quant.smooth_alpha:
        raise InputError(f"{qat.path} was trained with SmoothQuant alpha {qat.smooth_alpha:g}; build with "
                         f"--smooth-alpha {qat.smooth_alpha:g}")
    return qat


def build_modules(fp32_path: Path, targets, ckpt: Path) -> dict[str, str]:
    """GEMM node of the build's FP32 graph -> the checkpoint's module name (`linear_nodes`): loads
    the graph and the weights once per build, for `smooth_scales` and `build_amax` alike."""
    from trt_seer.export import onnxio

    return linear_nodes(onnxio.load(fp32_path), checkpoint_weights(ckpt), targets)


def smooth_scales(qat: QatRanges, modules: dict[str, str], xs: dict) -> dict:
    """{activation tensor of the build's FP32 graph: learned s} for the smoothing groups `xs`
    ({tensor: GEMM nodes reading it}, smooth.groups), GEMMs named as `build_modules` maps them.
    InputError for a group the file does not cover, or whose GEMMs disagree."""
    out = {}
    for x, gemms in xs.items():
        found = [qat.smoothing.get(modules.get(g.name)) for g in gemms]
        if any(s is None for s in found) or any(s.shape != found[0].shape or (s != found[0]).any() for s in found):
            raise InputError(f"{qat.path} has no single learned smoothing for the GEMMs reading {x}; retrain with "
                             "the same placement or delete the file to calibrate")
        out[x] = found[0]
    return out


def build_amax(qat: QatRanges, modules: dict[str, str], targets, tensors: dict) -> dict[str, float]:
    """`tensor_amax` for `tensors` (of the smoothed graph, if any), GEMMs matched to modules on the
    build's unsmoothed FP32 graph (`build_modules`)."""
    import logging

    logging.getLogger(__name__).info("activation ranges from %s (trained by finetune --qat, %s), not calibrated",
                                     qat.path, qat.trained)
    return tensor_amax(qat, modules, targets, tensors)


def fingerprint(ckpt: Path | None) -> str | None:
    """sha256 of the checkpoint's ranges file (part of build's INT8 cache key), None without one."""
    path = Path(ckpt) / RANGES_FILE if ckpt is not None else None
    return hashlib.sha256(path.read_bytes()).hexdigest() if path is not None and path.is_file() else None
