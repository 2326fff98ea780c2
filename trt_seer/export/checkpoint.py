"""Checkpoint -> verified FP32 ONNX.

    from trt_seer.export.families import resolve_model
    from trt_seer.export.checkpoint import onnx_from_checkpoint
    onnx_from_checkpoint(resolve_model("my-ckpt/"), Path("engines/my.fp32.onnx"))

Uses torch.onnx.export(dynamo=True): the TorchScript exporter produced a silently wrong MiniLM graph
with transformers 5.x. Every export is checked against PyTorch with ONNX Runtime at shapes that
differ from the traced one, padding included.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from trt_seer.export import onnxio
from trt_seer.logs import quieted
from trt_seer.export.tolerance import Tolerance  # noqa: F401  (export API: checkpoint.Tolerance)
from trt_seer.errors import ExportMismatchError, InputError, UnsupportedError
from trt_seer.export.failures import failure_line
from trt_seer.export.families import TASKS, ModelInfo

OPSET = 18
TRACE_SHAPE = (2, 16)  # (batch, seq) used for tracing
VERIFY_SHAPES = ((3, 23), (1, 61))  # differ from the traced shape in both axes




def load_model(info: ModelInfo):
    """The checkpoint as an eval-mode FP32 torch module of the task's auto class."""
    import torch
    import transformers

    auto = getattr(transformers, TASKS[info.task].auto_class)
    model = from_pretrained(auto, info.path, dtype=torch.float32)
    if info.family.kind == "decoder":
        model.config.use_cache = False
    return model.eval()


def from_pretrained(auto, path: Path, **kwargs):
    """`auto.from_pretrained(path)`; InputError when the checkpoint's weights cannot be loaded
    (missing, truncated or corrupt files, tensors that do not fit the config)."""
    from safetensors import SafetensorError

    try:
        return auto.from_pretrained(str(path), **kwargs)
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        raise InputError(f"cannot load the checkpoint in {path}: {type(e).__name__}: "
                         f"{str(e).strip().splitlines()[0] if str(e).strip() else 'no detail'}") from e


def wrap(model, info: ModelInfo):
    """A module whose forward takes the family's inputs positionally and returns the task's outputs."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            kwargs = dict(zip(info.inputs, args))
            if info.family.kind == "decoder":
                kwargs["use_cache"] = False
            out = self.model(**kwargs)
            if info.task != "feature-extraction":
                return out.logits
            hidden = out.last_hidden_state  # (batch, seq, hidden)
            return hidden, mean_pool(hidden, kwargs["attention_mask"])

    return Wrapper().eval()


def mean_pool(hidden, mask):
    """Mean over unmasked tokens, L2-normalised: sentence-transformers' embedding."""
    import torch

    m = mask.unsqueeze(-1).to(hidden.dtype)  # (batch, seq, 1)
    summed = (hidden * m).sum(dim=1)  # (batch, hidden)
    counts = m.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(summed / counts, p=2, dim=1)


def sample_inputs(info: ModelInfo, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random token ids (int64, as the graph takes them). The first row is padded on the right and,
    from batch 3, the last row on the left (as decoders are batched); padding holds the pad id."""
    rng = np.random.default_rng(seed)
    vocab = int(info.config.get("vocab_size", 1000))
    ids = rng.integers(5, max(6, vocab - 1), size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), dtype=np.int64)
    if seq > 2:
        mask[0, seq // 2:] = 0
        if batch >= 3:
            mask[-1, :seq // 3] = 0
    ids[mask == 0] = int(info.config.get("pad_token_id") or 0)
    feeds = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in info.inputs:
        types = int(info.config.get("type_vocab_size", 2) or 1)
        feeds["token_type_ids"] = rng.integers(0, types, size=(batch, seq), dtype=np.int64)
    return {k: feeds[k] for k in info.inputs}


def torch_outputs(wrapped, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import torch

    with torch.inference_mode():
        out = wrapped(*(torch.from_numpy(v) for v in feeds.values()))
    out = out if isinstance(out, tuple) else (out,)
    return [o.float().numpy() for o in out]


def _dynamic_shapes(info: ModelInfo):
    from torch.export import Dim

    batch, seq = Dim("batch", min=1, max=4096), Dim("seq", min=2, max=32768)
    return (tuple({0: batch, 1: seq} for _ in info.inputs),)  # one entry: forward(*args)


def _export(wrapped, info: ModelInfo, dest: Path) -> None:
    import torch

    feeds = sample_inputs(info, *TRACE_SHAPE, seed=1)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    with warnings.catch_warnings(), quieted("torch.onnx"):
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                wrapped, args, input_names=list(info.inputs), output_names=list(info.outputs),
                dynamic_shapes=_dynamic_shapes(info), dynamo=True, opset_version=OPSET, verbose=False,
            )
        except Exception as e:  # torch.export / ONNX translation: any op it cannot handle
            raise UnsupportedError(failure_line(info, "ONNX export", e)) from e
    large = sum(p.numel() * p.element_size() for p in wrapped.parameters()) > onnxio.EXTERNAL_DATA_THRESHOLD
    with onnxio.staged(dest) as tmp:
        program.save(str(tmp), external_data=large)


def defined_values(info: ModelInfo, name: str, out: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The values of output `name` that the inputs define: per-token outputs at unmasked tokens only.
    Outputs at padding are arbitrary (a left-padded token attends to nothing), so they are skipped."""
    if TASKS[info.task].outputs[name].get(1) != "seq":
        return out
    return out[mask.astype(bool)]  # (unmasked tokens, ...)


def verify(wrapped, info: ModelInfo, onnx_path: Path, tol: Tolerance = Tolerance()) -> dict:
    """Runs ONNX Runtime and PyTorch at VERIFY_SHAPES; raises ExportMismatchError above tolerance.

    Returns {"shapes": [[batch, seq], ...], "outputs": {name: {"max_abs_diff", "allowed"}}}, each
    output's entry taken at the shape where it came closest to its allowance."""
    session = _session(info, onnx_path)
    report = {"shapes": [list(s) for s in VERIFY_SHAPES], "outputs": {}}
    for i, (batch, seq) in enumerate(VERIFY_SHAPES):
        feeds = sample_inputs(info, batch, seq, seed=10 + i)
        try:
            got = session.run(list(info.outputs), feeds)
        except Exception as e:  # onnxruntime raises its own Fail/RuntimeException types
            raise ExportMismatchError(failure_line(info, f"ONNX Runtime at batch={batch} seq={seq}", e)) from e
        for name, g, r in zip(info.outputs, got, torch_outputs(wrapped, feeds)):
            where = f"at batch={batch} seq={seq}"
            delta, allowed = _compare(info, name, g, r, feeds["attention_mask"], tol, where)
            prev = report["outputs"].get(name)
            if prev is None or delta * prev["allowed"] >= prev["max_abs_diff"] * allowed:
                report["outputs"][name] = {"max_abs_diff": delta, "allowed": allowed}
    return report


def _session(info: ModelInfo, onnx_path: Path):
    from trt_seer.runtime.ort import create_session

    try:
        return create_session(onnx_path)
    except Exception as e:  # an exported graph ONNX Runtime rejects (type or shape inference, kernels)
        raise ExportMismatchError(failure_line(info, "loading the exported graph in ONNX Runtime", e)) from e


def _compare(info: ModelInfo, name: str, got, ref, mask, tol: Tolerance, where: str) -> tuple[float, float]:
    """(max |got - ref|, allowed) over the defined values; ExportMismatchError when over."""
    if got.shape != ref.shape:
        raise ExportMismatchError(f"ONNX output {name} has shape {got.shape}, PyTorch {ref.shape} {where}")
    got, ref = defined_values(info, name, got, mask), defined_values(info, name, ref, mask)
    delta = float(np.max(np.abs(got.astype(np.float64) - ref)))
    allowed = tol.atol + tol.rtol * float(np.max(np.abs(ref)))
    if not delta <= allowed:  # also catches NaN
        raise ExportMismatchError(f"ONNX export of {info.name} disagrees with PyTorch on {name}: "
                                  f"max |Δ| {delta:.3g} > {allowed:.3g} {where}")
    return delta, allowed


def onnx_from_checkpoint(info: ModelInfo, dest: Path, tol: Tolerance = Tolerance()) -> dict:
    """Exports `info`'s checkpoint to `dest` and verifies it. Returns the verification report."""
    if info.task not in TASKS:
        raise UnsupportedError(f"unknown task {info.task!r}")
    if info.task == "causal-lm":  # with a KV cache, for generation
        from trt_seer.export.decoder import onnx_from_decoder

        return onnx_from_decoder(info, dest, tol)
    wrapped = wrap(load_model(info), info)
    _export(wrapped, info, dest)
    try:
        return verify(wrapped, info, dest, tol)
    except ExportMismatchError:
        dest.unlink(missing_ok=True)
        onnxio.data_path(dest).unlink(missing_ok=True)
        raise
