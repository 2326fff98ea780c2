"""Quantization-aware training (`finetune --qat int8`): fake INT8 on exactly the tensors that
`build --int8 --int8-mode w8a8` quantizes, so the model learns to tolerate them.

    python -m trt_seer finetune --model clf/ --qat int8 --max-steps 300 --out clf-qat/
    python -m trt_seer build --model clf-qat/ --int8 --int8-mode w8a8      # uses clf-qat/qat_ranges.json

Placement comes from the graph `build` writes: the starting model is exported to FP32 ONNX and
`quantize.qdq.find_targets` picks the GEMMs; each is matched to its nn.Linear by weight values
(`quantize.qat_ranges.linear_nodes`). On each such Linear:
- input: per-tensor symmetric INT8 fake quantization, clamp(round(x / s), -128, 127) * s as ONNX
  QuantizeLinear does, s = amax / 127; amax starts at the entropy calibration of that ONNX tensor
  (`quantize.calibrate`, as `build` does) or at a TensorRT calibration cache's (`--from-calib`).
  Linears fed by one tensor (Q, K, V) share one range, as they share one calibrated tensor.
- weight: per-output-channel symmetric INT8 with amax = max |W| of the current weights, the scale
  `build` recomputes from the final weights.
- with --int8-attention, the four inputs of each attention's two batched matmuls
  (finetune/qat_attention.py), matched to the graph's QK^T / PV MatMul pairs by order.
Gradients are straight-through (finetune/fakequant.py, torch's fake-quantize ops). Ranges are
frozen or learned LSQ-style as log(amax) with their own learning rate (docs/DESIGN.md).
"""
from __future__ import annotations

import functools
import logging
import math
import tempfile
from pathlib import Path

from trt_seer.errors import InputError
from trt_seer.finetune.spec import QatSpec

log = logging.getLogger(__name__)
PARAM = "qat_log_amax"  # on each quantized nn.Linear while training; removed before saving
SMOOTH = "qat_smooth"  # SmoothQuant's s on a smoothed Linear while training (a non-persistent buffer)
LOG_SMOOTH = "qat_log_smooth"  # --qat-smoothing learned: log s, a parameter shared by the Linears of one input
ATTENTION_ATTR = "_trt_seer_qat_attention"  # {"previous": implementation, "modules": [names]}
CALIB_SAMPLES, CALIB_BATCH = 256, 16  # build's defaults (--calib-samples, --calib-batch)


def teacher(model, spec: QatSpec):
    """`--qat-loss distill`: a frozen FP32 copy of the starting model, whose class distribution the
    fake-quantized model learns to match (train.distill_sum); None for the task loss."""
    import copy

    if spec.loss != "distill":
        return None
    t = copy.deepcopy(model).eval()
    t.requires_grad_(False)
    return t


def ranges_only(model) -> None:
    """`--qat-train ranges`: freezes every weight (the checkpoint's FP32 stays the starting model,
    which is what build's gate compares the INT8 graph with) and turns dropout off (the student
    then computes what the teacher computes, up to the fake quantization)."""
    import torch

    for name, p in model.named_parameters():
        p.requires_grad_(name.rsplit(".", 1)[-1].startswith("qat_"))
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0


def calibration_examples(tokenizer, max_seq: int):
    """`--qat-data calib` (the default with --qat-train ranges): build's calibration corpus
    (calib/default.txt, all of it; the gate's calib/heldout.txt is disjoint), encoded with a
    placeholder label that the distillation loss never reads."""
    from trt_seer import data
    from trt_seer.finetune.data import Example, encode

    texts = data.load_texts(data.default_corpus("default"))
    log.info("QAT: distilling on %d calibration texts (calib/default.txt)", len(texts))
    return encode([Example(t, 0) for t in texts], tokenizer, max_seq)


def check(spec: QatSpec) -> None:
    """Reads --from-calib before any slow work: InputError when it is missing or malformed."""
    from trt_seer.quantize import calibrate

    if spec.from_calib is not None:
        if not Path(spec.from_calib).is_file():
            raise InputError(f"--from-calib {spec.from_calib} not found")
        calibrate.read_cache(Path(spec.from_calib))


def _qat_forward(module, x):
    import torch

    from trt_seer.finetune.fakequant import fake_quant_input, fake_quant_weight

    w, s = module.weight, getattr(module, SMOOTH, None)
    log_s = getattr(module, LOG_SMOOTH, None)  # registered only as a parameter (attach)
    learned = log_s is not None
    if learned:
        s = log_s.exp()
    if s is not None:  # (x / s) @ (W * s)^T: the smoothed graph's Mul and scaled weights
        x, w = x / s.to(x.dtype), w * s
    return torch.nn.functional.linear(fake_quant_input(x, getattr(module, PARAM)), fake_quant_weight(w, learned),
                                      module.bias)


def attach(model, groups: dict[str, list[str]], amax: dict[str, float], spec: QatSpec,
           scales: dict | None = None) -> int:
    """Puts fake quantization where `groups` ({tensor: keys}) says: a key is an nn.Linear's name
    (its input and weight) or `<attention module>#<q|k|p|v>` (a BMM input, qat_attention.py). One
    range per tensor, initialised to `amax[tensor]`; `scales` ({module: s}) are SmoothQuant's.
    Returns the number of quantized Linears."""
    import torch

    from trt_seer.finetune.fakequant import make_range

    modules = dict(model.named_modules())
    count = 0
    for tensor, keys in groups.items():
        p = make_range(amax[tensor], spec.ranges == "learned", spec.range_lr, tensor)
        shared = _smoothing_param(keys, scales, spec, tensor)
        for key in keys:
            name, _, bmm_input = key.partition("#")
            m = modules[name]
            if bmm_input:
                m.register_parameter(f"qat_bmm_{bmm_input}", p)
                continue
            if not isinstance(m, torch.nn.Linear):
                raise InputError(f"{name} is a {type(m).__name__}, not an nn.Linear; cannot train its quantization")
            m.register_parameter(PARAM, p)
            if shared is not None:
                m.register_parameter(LOG_SMOOTH, shared)
            elif name in (scales or {}):  # SmoothQuant's per-input-channel s (not saved with the weights)
                m.register_buffer(SMOOTH, torch.from_numpy(scales[name]), persistent=False)
            m.forward = functools.partial(_qat_forward, m)
            count += 1
    return count


def _smoothing_param(keys: list[str], scales: dict | None, spec: QatSpec, tensor: str):
    """--qat-smoothing learned: one parameter log(s) for the Linears reading `tensor` (they share
    one smoothed input in build's graph), initialised at SmoothQuant's s; None otherwise."""
    import numpy as np
    import torch

    smoothed = [k for k in keys if k in (scales or {})]
    if spec.smoothing != "learned" or not smoothed:
        return None
    p = torch.nn.Parameter(torch.from_numpy(np.log(scales[smoothed[0]]).astype(np.float32)))
    p.range_lr, p.tensor, p.initial_s = spec.range_lr, tensor, scales[smoothed[0]].tolist()
    return p


def detach(model) -> tuple[list[dict], list[dict]]:
    """Removes the fake quantization; returns the ranges, one entry per tensor, and the learned
    smoothing scales, one entry per smoothed input (qat_ranges.json)."""
    by_param: dict[int, dict] = {}
    smoothing: dict[int, dict] = {}
    for name, m in model.named_modules():
        own = list(m.named_parameters(recurse=False, remove_duplicate=False))
        for pname, p in [(k, v) for k, v in own if k.startswith("qat_")]:
            delattr(m, pname)
            if pname == LOG_SMOOTH:
                entry = smoothing.setdefault(id(p), {"tensor": p.tensor, "modules": [],
                                                     "s": p.detach().exp().tolist(), "initial_s": p.initial_s})
                entry["modules"].append(name)
                continue
            key = name if pname == PARAM else f"{name}#{pname.removeprefix('qat_bmm_')}"
            entry = by_param.setdefault(id(p), {"tensor": p.tensor, "modules": [], "amax": math.exp(float(p.detach())),
                                                "initial_amax": p.initial_amax})
            entry["modules"].append(key)
        if any(b == SMOOTH for b, _ in m.named_buffers(recurse=False, remove_duplicate=False)):
            delattr(m, SMOOTH)
        m.__dict__.pop("forward", None)
    return list(by_param.values()), list(smoothing.values())


def save_ranges(model, dest: Path, spec: QatSpec) -> Path:
    """Detaches the fake quantization from `model` and writes dest/qat_ranges.json."""
    from trt_seer.quantize import qat_ranges

    ranges, smoothing = detach(model)
    if not ranges:
        raise InputError("no quantized Linear left to save ranges for")
    attention = getattr(model, ATTENTION_ATTR, None)
    if attention is not None:  # back to the checkpoint's own attention implementation
        model.set_attn_implementation(attention["previous"])
        delattr(model, ATTENTION_ATTR)
    init = f"TensorRT calibration cache {spec.from_calib}" if spec.from_calib else "entropy calibration"
    return qat_ranges.write(dest, ranges, {"ranges_trained": spec.ranges, "trained": spec.train,
                                           "initialised_from": init, "loss": spec.loss,
                                           "smooth_alpha": spec.smooth_alpha, "smoothing": smoothing,
                                           "attention_modules": attention["modules"] if attention else []})


def linear_weights(model) -> dict:
    import torch

    return {n: m.weight.detach().float().cpu().numpy() for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)}


def prepare(model, tokenizer, spec: QatSpec, task: str = "text-classification") -> int:
    """Exports `model` (+ tokenizer) as `task` to FP32 ONNX (a classifier's logits, or an embedding
    model's token states and sentence embedding), finds build's W8A8 targets there, smooths them
    as build does (SmoothQuant), initialises their ranges and attaches fake quantization. Returns
    the number of quantized Linears."""
    from trt_seer.export import onnxio
    from trt_seer.export.checkpoint import onnx_from_checkpoint
    from trt_seer.export.families import resolve_model
    import trt_seer.finetune.checkpoint as checkpoint
    from trt_seer.quantize import qat_ranges, qdq

    with tempfile.TemporaryDirectory(prefix="trt_seer_qat_") as tmp:
        ckpt, onnx_path = Path(tmp) / "start", Path(tmp) / "start.fp32.onnx"
        checkpoint.save(model, tokenizer, ckpt)
        info = resolve_model(ckpt, task)
        log.info("exporting the starting model to find the GEMMs build quantizes ...")
        onnx_from_checkpoint(info, onnx_path)
        graph = onnxio.load(onnx_path)
        targets = qdq.find_targets(graph, qdq.QuantSpec(spec.attention), info.task)
        keys = _target_keys(model, graph, targets)
        batches = calibration_batches(info) if spec.from_calib is None or spec.smooth_alpha > 0 else []
        smoothed, scales = _smoothed(onnx_path, graph, targets, keys, batches, spec.smooth_alpha, Path(tmp))
        tensors = qdq.activation_tensors(onnxio.load(smoothed, False), targets)
        amax = initial_amax(smoothed, sorted(set(tensors.values())), batches, spec)
    groups: dict[str, list[str]] = {}
    for (node, i), tensor in tensors.items():
        groups.setdefault(tensor, []).append(qat_ranges.input_key(keys[node], i))
    count = attach(model, groups, amax, spec, scales)
    log.info("QAT: %d Linears with INT8 inputs and weights, %d activation ranges (%s)", count, len(groups), spec.ranges)
    return count


def _smoothed(onnx_path: Path, graph, targets, keys: dict, batches: list, alpha: float, tmp: Path):
    """SmoothQuant as `build` applies it (quantize/smooth.py, its first 8 calibration batches):
    (the smoothed FP32 ONNX, {module name: s}); the Linear computes (x / s) @ (W * s)."""
    import numpy as np

    from trt_seer.export import onnxio
    from trt_seer.quantize import smooth

    if alpha <= 0:
        return onnx_path, {}
    nodes = [t.node for t in targets]
    xs = list(smooth.groups(graph, nodes))
    smooth.smooth_model(graph, smooth.channel_absmax(onnx_path, batches[:8], xs), alpha, nodes)
    from onnx import numpy_helper

    inits = {t.name: t for t in graph.graph.initializer}

    scales = {}
    for x, gemms in smooth.groups(onnxio.load(onnx_path, False), nodes).items():
        s = 1.0 / numpy_helper.to_array(inits[f"{x}__smooth_inv"]).astype(np.float64)
        scales.update({keys[g.name]: s.astype(np.float32) for g in gemms})
    return onnxio.save(graph, tmp / "start.smooth.fp32.onnx"), scales


def calibration_batches(info) -> list:
    """build's default calibration data: calib/default.txt, 256 samples, batches of 16."""
    from trt_seer import data
    from trt_seer.export.families import ShapeProfile, max_positions

    if not data.has_tokenizer(info):
        raise InputError("QAT calibration needs the model's fast tokenizer (tokenizer.json); or pass --from-calib "
                         "with --smooth-alpha 0")
    texts = data.load_texts(data.default_corpus("default"))[:CALIB_SAMPLES]
    longest = min(256, max_positions(info) or 256)  # build's default profile, within the model's positions
    return list(data.token_batches(info, texts, ShapeProfile(seq=(8, min(128, longest), longest)), CALIB_BATCH))


def _target_keys(model, graph, targets) -> dict[str, str]:
    """ONNX GEMM node -> range key (qat_ranges.target_keys); with attention BMMs among `targets`,
    switches `model` to the fake-quantizing attention (qat_attention.py)."""
    import trt_seer.finetune.qat_attention as qat_attention
    from trt_seer.quantize import qat_ranges

    modules: list[str] = []
    if any(t.weight is None for t in targets):
        previous, modules = qat_attention.attention_modules(model)
        setattr(model, ATTENTION_ATTR, {"previous": previous, "modules": modules})
    return qat_ranges.target_keys(qat_ranges.linear_nodes(graph, linear_weights(model), targets), targets, modules)


def initial_amax(onnx_path: Path, names: list[str], batches: list, spec: QatSpec) -> dict[str, float]:
    """amax per ONNX tensor: from --from-calib, else entropy calibration on `batches` (build's defaults)."""
    from trt_seer.quantize import calibrate

    if spec.from_calib is not None:
        scales = calibrate.read_cache(Path(spec.from_calib))
        missing = [n for n in names if n not in scales]
        if missing:
            raise InputError(f"--from-calib {spec.from_calib} lacks {len(missing)} of {len(names)} tensors "
                             f"(e.g. {missing[0]}); write it with build --int8 --int8-mode w8a8 --smooth-alpha "
                             f"{spec.smooth_alpha:g} on this checkpoint")
        return {n: scales[n] * calibrate.INT8_MAX for n in names}
    log.info("calibrating %d activation tensors on %d batches (entropy) ...", len(names), len(batches))
    return calibrate.collect_ranges(onnx_path, batches, names, calibrate.CalibSpec(method="entropy"))
