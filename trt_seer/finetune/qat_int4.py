"""`finetune --task causal-lm --qat int4`: block-wise INT4 weight-only quantization-aware training,
for `build --int4`.

    python -m trt_seer finetune --task causal-lm --model lm/ --qat int4 --int4-block 128 --out lm-qat/
    python -m trt_seer build --model lm-qat/ --int4 --int4-block 128     # RTN, no AWQ (qat_ranges.json)

Placement comes from the graph `build` writes: the starting model is exported as build exports it
(FP32 ONNX with a KV cache) and `quantize.weightonly.find_targets` picks the GEMMs `build --int4`
quantizes (every constant-weight MatMul whose K is a multiple of the block, the LM head excluded);
each is matched to its nn.Linear by weight values (`quantize.qat_ranges.linear_nodes`). Each such
Linear computes with its weight fake-quantized exactly as build rounds it
(`fakequant.fake_quant_int4_blocks`: FP16, symmetric, scale = block amax / 7 of the current
weights), straight-through gradients, on the task loss (or `--qat-loss distill`). The checkpoint holds
the trained FP32 weights (`--qat-weights latent`, build recomputes the scales from them) or the
INT4 values they round to (`rounded`: the checkpoint is the quantized model itself, so the gate's
FP16 reference is too); beside it, qat_ranges.json names the block and the Linears. Build rounds
to nearest without AWQ, whose rescaling would change the rounding the weights were trained for.
"""
from __future__ import annotations

import functools
import logging
import tempfile
from pathlib import Path
from types import SimpleNamespace

log = logging.getLogger(__name__)
BLOCK_ATTR = "_trt_seer_qat_int4_block"  # on each fake-quantized nn.Linear while training


def targets(model, tokenizer, block: int) -> list[str]:
    """The nn.Linear names whose weights `build --int4 --int4-block block` quantizes, found in the
    starting model's exported FP32 graph. InputError when a quantized GEMM matches no Linear."""
    from trt_seer.errors import InputError
    from trt_seer.export import onnxio
    from trt_seer.export.checkpoint import onnx_from_checkpoint
    from trt_seer.export.families import resolve_model
    import trt_seer.finetune.checkpoint as checkpoint
    from trt_seer.finetune.qat import linear_weights
    from trt_seer.quantize import qat_ranges, weightonly

    with tempfile.TemporaryDirectory(prefix="trt_seer_qat4_") as tmp:
        ckpt, onnx_path = Path(tmp) / "start", Path(tmp) / "start.fp32.onnx"
        checkpoint.save(model, tokenizer, ckpt)
        log.info("exporting the starting model to find the GEMMs build --int4 quantizes ...")
        onnx_from_checkpoint(resolve_model(ckpt, "causal-lm"), onnx_path)
        graph = onnxio.load(onnx_path)
    found = weightonly.find_targets(graph, weightonly.WeightOnlySpec(4, block))
    gemms = [SimpleNamespace(node=t.node, weight=1) for t in found]  # weightonly's weight is input 1
    names = qat_ranges.linear_nodes(graph, linear_weights(model), gemms)
    missing = [t.node for t in found if t.node not in names]
    if missing:
        raise InputError(f"{len(missing)} INT4 GEMMs match no nn.Linear (e.g. {missing[0]})")
    return [names[t.node] for t in found]


def _forward(module, x):
    import torch

    from trt_seer.finetune.fakequant import fake_quant_int4_blocks

    w = fake_quant_int4_blocks(module.weight, getattr(module, BLOCK_ATTR))
    return torch.nn.functional.linear(x, w, module.bias)


def prepare(model, tokenizer, block: int) -> list[str]:
    """Puts fake INT4 on the weights build quantizes; returns their module names."""
    names = targets(model, tokenizer, block)
    modules = dict(model.named_modules())
    for name in names:
        m = modules[name]
        setattr(m, BLOCK_ATTR, block)
        m.forward = functools.partial(_forward, m)
    log.info("QAT: %d Linears with block-wise INT4 weights (blocks of %d input channels, round-to-nearest)",
             len(names), block)
    return names


def save(model, dest: Path, spec) -> Path:
    """Takes the fake quantization off `model` (--qat-weights rounded: leaves each weight at the
    INT4 values it rounds to) and writes dest/qat_ranges.json (mode int4)."""
    import torch

    from trt_seer.finetune.fakequant import fake_quant_int4_blocks
    from trt_seer.quantize import qat_ranges

    names = []
    for name, m in model.named_modules():
        if hasattr(m, BLOCK_ATTR):
            if spec.weights == "rounded":
                with torch.no_grad():
                    m.weight.copy_(fake_quant_int4_blocks(m.weight, spec.block))
            delattr(m, BLOCK_ATTR)
            m.__dict__.pop("forward", None)
            names.append(name)
    return qat_ranges.write_int4(dest, spec.block, names, {"trained": spec.train, "loss": spec.loss,
                                                           "weights": spec.weights})
