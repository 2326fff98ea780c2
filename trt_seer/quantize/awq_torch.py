"""AWQ (awq.py) with PyTorch: activation statistics from forward hooks on the checkpoint's own
Linear layers, and the scale search, on the GPU when PyTorch has one.

    modules = target_modules(targets, fp16_record["weights_from_checkpoint"])  # {Linear: activation}
    stats = activation_stats(info, calib_batches, modules, "cuda")            # {activation: ActStats}
    choice = search(stats[x], [w_up, w_gate], WeightOnlySpec(bits=4), "cuda")

The ONNX Runtime path (awq.activation_stats on the FP16 graph) runs on the CPU with FP32 copies of
every weight: hours and twice the weights' memory at 7B. Here the checkpoint runs in FP16 on the
GPU and each GEMM's input is read where the Linear layer receives it: the same tensor the graph's
GEMM reads (the export's weight map says which Linear each GEMM's weight is), the same statistics
(mean |x| per input channel over unpadded tokens, and a sample of token rows), the same search
(awq.search's grid, objective and tie rule), with the weights' fake quantization in PyTorch.
"""
from __future__ import annotations

import logging

import numpy as np

from trt_seer.quantize.awq import ALPHAS, MAX_ROWS, ActStats, Choice, scales_for
from trt_seer.quantize.weightonly import WeightOnlySpec, fake_quant_tensor, torch_device

log = logging.getLogger(__name__)


def gpu() -> str | None:
    """"cuda" when PyTorch sees a GPU, else None (the CPU path is ONNX Runtime's, awq.py)."""
    device = torch_device()
    return None if device == "cpu" else device


def target_modules(targets: list, wmap: dict) -> dict[str, str] | None:
    """{Linear module name: the activation its GEMM reads} for every target, or None when a
    target's weight is not a Linear's weight of the checkpoint (stored transposed in the graph)."""
    out = {}
    for t in targets:
        m = wmap.get(t.weight)
        if not m or not m["transposed"] or not m["tensor"].endswith(".weight"):
            return None
        out[m["tensor"][:-len(".weight")]] = t.activation
    return out


def activation_stats(info, batches: list[dict], modules: dict[str, str], device: str,
                     max_rows: int = MAX_ROWS, seed: int = 0) -> dict[str, ActStats]:
    """awq.activation_stats's statistics from the checkpoint in FP16 on `device`: one prefill
    pass per batch of `batches` (input_ids, attention_mask; positions counted over real tokens)."""
    import torch
    from tqdm import tqdm

    from trt_seer.decoder_io import position_ids
    from trt_seer.export.decoder import load_decoder

    model = load_decoder(info, "float16").to(device)
    rng = np.random.default_rng(seed)
    per_batch = -(-max_rows // max(1, len(batches)))
    sums, counts, samples = {}, {}, {a: [] for a in modules.values()}
    seen, mask = set(), {}

    def hook(activation: str):
        def pre(_module, args):
            if activation in seen:  # q/k/v (gate/up) read one activation: count it once per batch
                return
            seen.add(activation)
            x = args[0].float()
            m = mask["now"]
            rows = x[m] if x.ndim == 3 and tuple(m.shape) == tuple(x.shape[:2]) else x.reshape(-1, x.shape[-1])
            sums[activation] = sums.get(activation, 0) + rows.abs().sum(dim=0)
            counts[activation] = counts.get(activation, 0) + rows.shape[0]
            pick = rng.choice(rows.shape[0], size=min(per_batch, rows.shape[0]), replace=False)
            samples[activation].append(rows[torch.from_numpy(pick).to(rows.device)].cpu().numpy())
        return pre

    named = dict(model.named_modules())
    missing = sorted(set(modules) - set(named))
    if missing:
        raise ValueError(f"the checkpoint has no module {missing[0]} (weight map out of date?)")
    handles = [named[n].register_forward_pre_hook(hook(a)) for n, a in modules.items()]
    try:
        with torch.inference_mode():
            for b in tqdm(batches, desc=f"activation statistics (PyTorch, {device})", unit="batch"):
                seen.clear()
                ids, am = b["input_ids"], b["attention_mask"]
                mask["now"] = torch.from_numpy(am.astype(bool)).to(device)
                model(input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(am).to(device),
                      position_ids=torch.from_numpy(position_ids(am)).to(device), use_cache=False)
    finally:
        for h in handles:
            h.remove()
        del model
    return {a: ActStats((sums[a] / max(counts[a], 1)).cpu().numpy().astype(np.float32),
                        np.concatenate(samples[a])[:max_rows]) for a in samples}


def search(stats: ActStats, weights: list[np.ndarray], spec: WeightOnlySpec, device: str,
           alphas=ALPHAS) -> Choice:
    """awq.search on `device`: the alpha (and its s) minimising the output error of the GEMMs that
    read one activation; ties go to the smaller alpha (s = 1, round-to-nearest, unless scaling helps)."""
    import torch

    with torch.inference_mode():
        x = torch.from_numpy(np.require(stats.sample, np.float32, ("C", "W"))).to(device)
        ws = [torch.from_numpy(np.require(w, None, ("C", "W"))).to(device).float() for w in weights]

        def error(s: np.ndarray) -> float:
            st = torch.from_numpy(s).to(device)
            xs = x / st
            return sum(float(((x @ w - xs @ fake_quant_tensor(w * st[:, None], spec.bits, spec.block_size))
                              .double() ** 2).sum()) for w in ws)

        ref = sum(float(((x @ w).double() ** 2).sum()) for w in ws)
        ones = np.ones(x.shape[1], np.float32)
        rtn = error(ones)
        best = Choice(0.0, ones, rtn, rtn, ref)
        for a in alphas:
            if a == 0:
                continue
            s = scales_for(stats.mean_abs, a)
            err = error(s)
            if err < best.error:
                best = Choice(a, s, err, rtn, ref)
    return best
