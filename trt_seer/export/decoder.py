"""Causal-LM checkpoint -> verified FP32 ONNX with a KV cache (the graph `generate` steps through).

    from trt_seer.export.families import resolve_model
    from trt_seer.export.decoder import onnx_from_decoder
    onnx_from_decoder(resolve_model("my-llama/"), Path("engines/my-llama.fp32.onnx"))

I/O (the names Optimum and onnxruntime-genai use): input_ids, attention_mask [batch, past+seq],
position_ids, past_key_values.{i}.key/value [batch, kv_heads, past, head_dim] in; logits of the
last position [batch, 1, vocab] and present.{i}.key/value [batch, kv_heads, past+seq, head_dim] out,
then next_token [batch, 1] (ArgMax of the logits: greedy decoding brings back only the ids).
Grouped-query attention keeps its kv_heads. The cache is a transformers DynamicCache built from the
past tensors inside the traced forward, so the model's own attention and mask code is exported.
Verified with ONNX Runtime against PyTorch at shapes other than the traced one, with past lengths
0 and > 0 and left padding.
"""
from __future__ import annotations

import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trt_seer.errors import ExportMismatchError, UnsupportedError
from trt_seer.export import onnxio
from trt_seer.logs import quieted
from trt_seer.export.failures import failure_line
from trt_seer.export.tolerance import Tolerance
from trt_seer.decoder_io import NEXT_TOKEN, PRESENT_PREFIX, decoder_io, exported_outputs, position_ids
from trt_seer.export.families import ModelInfo, attention_heads, num_layers
from trt_seer.export.rotary import stacked_rotary

TRACE_CASE = (2, 5, 3)  # (batch, seq, past_seq) used for tracing; no axis of size 0 or 1
VERIFY_CASES = ((3, 7, 0), (2, 1, 9), (1, 4, 6), (4, 1, 0))  # prefill, decode, chunked prefill
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")
VOCAB_FILES = {"tokenizer.json", "vocab.json", "tokenizer.model"}  # without one there is no tokenizer


@dataclass(frozen=True)
class DecoderShape:
    """What the cache of one checkpoint looks like."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int


def decoder_shape(config: dict) -> DecoderShape:
    heads, kv_heads = attention_heads(config)
    hidden = int(config.get("hidden_size") or config["n_embd"])
    return DecoderShape(num_layers(config), kv_heads, int(config.get("head_dim") or hidden // heads),
                        int(config["vocab_size"]))


def load_decoder(info: ModelInfo, dtype: str = "float32"):
    """The checkpoint as an eval-mode causal LM of `dtype` with eager attention (plain MatMul/Softmax
    in the graph; fully padded rows stay finite), or export/attention.py's chunked form of it when
    `info.attention` is "chunked"."""
    import torch
    import transformers

    from trt_seer.export import attention

    name = "eager"
    if info.attention == "chunked":
        attention.register()
        name = attention.NAME
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(info.path), dtype=getattr(torch, dtype), attn_implementation=name, low_cpu_mem_usage=True)
    return model.eval()


def cache_keyword(model) -> str:
    """The forward argument that takes the KV cache: `cache` in newer transformers releases,
    `past_key_values` before (an unknown keyword would be swallowed and the past silently dropped)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def wrap_decoder(model, shape: DecoderShape):
    """forward(input_ids, attention_mask, position_ids, *past) -> (logits[:, -1:], *presents, next_token)."""
    import torch
    from transformers import DynamicCache

    cache_kw = cache_keyword(model)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            input_ids, attention_mask, position_ids, past = args[0], args[1], args[2], args[3:]
            pairs = [(past[2 * i], past[2 * i + 1]) for i in range(shape.num_layers)]
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, logits_to_keep=1, **{cache_kw: DynamicCache(ddp_cache_data=pairs)})
            presents = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            # (batch, 1, vocab), (batch, kv_heads, past+seq, head_dim)..., (batch, 1)
            return (out.logits, *presents, out.logits[:, -1].argmax(dim=-1, keepdim=True))

    return Step().eval()


def sample_feeds(shape: DecoderShape, batch: int, seq: int, past: int, seed: int = 0,
                 pad_id: int = 0, kv_dtype=np.float32) -> dict[str, np.ndarray]:
    """Random ids and cache; from batch 2 the last row is left-padded (over the past when there is one)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + seq), dtype=np.int64)
    if batch >= 2:
        mask[-1, :max(1, (past + seq) // 3)] = 0
    ids = rng.integers(3, max(4, shape.vocab_size), size=(batch, seq), dtype=np.int64)
    ids[mask[:, past:] == 0] = pad_id
    feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": position_ids(mask, seq)}
    inputs, _ = decoder_io(shape.num_layers)
    kv = (batch, shape.num_kv_heads, past, shape.head_dim)
    feeds.update({name: rng.standard_normal(kv).astype(kv_dtype) for name in inputs[3:]})
    return feeds


def _dynamic_shapes(shape: DecoderShape):
    from torch.export import Dim

    batch, seq = Dim("batch", min=1, max=4096), Dim("seq", min=1, max=32768)
    past, total = Dim("past_seq", min=0, max=32768), Dim("total_seq", min=1, max=65536)
    kv = [{0: batch, 2: past} for _ in range(2 * shape.num_layers)]
    return (({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, *kv),)  # forward(*args)


def export_cases(info: ModelInfo) -> tuple[tuple[int, int, int], tuple[tuple[int, int, int], ...]]:
    """(trace case, verification cases) for `info`'s attention form: TRACE_CASE and VERIFY_CASES,
    or export/attention.py's for the chunked form."""
    from trt_seer.export import attention

    return attention.export_cases(TRACE_CASE, VERIFY_CASES) if info.attention == "chunked" \
        else (TRACE_CASE, VERIFY_CASES)


def verification_feeds(shape: DecoderShape, where, kv_dtype) -> list[dict]:
    """The check's feeds, one per (batch, seq, past) of `where`."""
    return [sample_feeds(shape, b, s, p, seed=10 + i, kv_dtype=kv_dtype) for i, (b, s, p) in enumerate(where)]


def _export(info: ModelInfo, step, shape: DecoderShape, dest: Path, kv_dtype=np.float32, external: bool = False,
            trace=TRACE_CASE) -> None:
    """`step` traced at `trace` to `dest`; a model the exporter cannot take is UnsupportedError."""
    import torch

    feeds = sample_feeds(shape, *trace, seed=1, kv_dtype=kv_dtype)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    inputs, _ = decoder_io(shape.num_layers)
    with warnings.catch_warnings(), quieted("torch.onnx"), stacked_rotary(step.model):
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(step, args, input_names=list(inputs), output_names=list(exported_outputs(
                shape.num_layers)), dynamic_shapes=_dynamic_shapes(shape), dynamo=True, opset_version=18, verbose=False)
        except Exception as e:  # torch.export / ONNX translation: any op or form it cannot handle
            raise UnsupportedError(failure_line(info, "ONNX export", e, type(step.model).__module__)) from e
    large = sum(p.numel() * p.element_size() for p in step.parameters()) > onnxio.EXTERNAL_DATA_THRESHOLD
    with onnxio.staged(dest) as tmp:
        program.save(str(tmp), external_data=large or external)


def defined(name: str, value: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Logits of the rows that end with a real token, or the cache at unmasked positions only. A row of
    padding alone has no next token: its logits depend on how a kernel rounds a softmax over masked
    scores only (FP16 attention forms differ), so compare_cases only requires them to be finite."""
    if name == "logits":
        return value[mask[:, -1].astype(bool)]
    return value.transpose(0, 2, 1, 3)[mask.astype(bool)]  # (unmasked positions, kv_heads, head_dim)


def _run_torch(step, feeds: dict) -> list[np.ndarray]:
    import torch

    with torch.inference_mode():
        return [t.float().numpy() for t in step(*(torch.from_numpy(v) for v in feeds.values()))]


def verify_decoder(step, shape: DecoderShape, onnx_path: Path, name: str, tol, kv_dtype=np.float32,
                   where=VERIFY_CASES) -> dict:
    """ONNX Runtime vs PyTorch at the (batch, seq, past) of `where`; ExportMismatchError above `tol`
    (a checkpoint.Tolerance).

    Returns {"cases": [[batch, seq, past], ...], "outputs": {"logits"|"present": {max_abs_diff, allowed}}}."""
    cases = verification_feeds(shape, where, kv_dtype)
    return compare_cases(cases, [_run_torch(step, f) for f in cases], shape, onnx_path, name, tol, where)


def compare_cases(cases: list[dict], refs: list[list], shape: DecoderShape, onnx_path: Path, name: str, tol,
                  at=VERIFY_CASES) -> dict:
    """ONNX Runtime's outputs on each feed of `cases` (made at the (batch, seq, past) of `at`)
    against `refs` (PyTorch's, computed before);
    `next_token`, where the graph has it, must be the argmax of ONNX Runtime's own logits."""
    from trt_seer.runtime.ort import OrtOptions, create_session

    session = create_session(onnx_path, OrtOptions(lean=True))  # weights held once, even at 7B
    _, outputs = decoder_io(shape.num_layers)
    has_next = NEXT_TOKEN in {o.name for o in session.get_outputs()}
    report = {"cases": [list(c) for c in at], "outputs": {}}
    for (batch, seq, past), feeds, ref in zip(at, cases, refs, strict=True):
        got = session.run(list(outputs) + ([NEXT_TOKEN] if has_next else []), feeds)
        if has_next:
            _check_next_token(got.pop(), got[0], f"batch={batch} seq={seq} past={past}")
        for out, g, r in zip(outputs, got, ref):
            where = f"{out} at batch={batch} seq={seq} past={past}"
            if g.shape != r.shape:
                raise ExportMismatchError(f"ONNX output {where} has shape {g.shape}, PyTorch {r.shape}")
            if out.startswith(PRESENT_PREFIX) and g.shape[2] != past + seq:
                raise ExportMismatchError(f"{where} holds {g.shape[2]} positions, not past + seq = {past + seq}: "
                                          "the past keys/values did not reach the model")
            if out == "logits" and not np.isfinite(g).all():
                raise ExportMismatchError(f"ONNX output {where} is not finite")
            g, r = defined(out, g, feeds["attention_mask"]), defined(out, r, feeds["attention_mask"])
            delta = float(np.max(np.abs(g.astype(np.float64) - r)))
            allowed = tol.atol + tol.rtol * float(np.max(np.abs(r)))
            if not delta <= allowed:  # also catches NaN
                raise ExportMismatchError(f"ONNX export of {name} disagrees with PyTorch on {where}: "
                                          f"max |Δ| {delta:.3g} > {allowed:.3g}")
            key = "logits" if out == "logits" else "present"
            prev = report["outputs"].get(key)
            if prev is None or delta * prev["allowed"] >= prev["max_abs_diff"] * allowed:
                report["outputs"][key] = {"max_abs_diff": delta, "allowed": allowed}
    return report


def _check_next_token(next_token: np.ndarray, logits: np.ndarray, where: str) -> None:
    """The graph's next_token against the argmax of its logits (the first of equal scores)."""
    want = logits[:, -1].argmax(axis=-1)[:, None]
    if next_token.shape != want.shape or not np.array_equal(next_token, want):
        raise ExportMismatchError(f"ONNX output {NEXT_TOKEN} at {where} is not the argmax of the logits: "
                                  f"{next_token.ravel()[:8].tolist()} vs {want.ravel()[:8].tolist()}")


def onnx_from_decoder(info: ModelInfo, dest: Path, tol=None) -> dict:
    """Exports `info`'s causal LM with a KV cache to `dest` and verifies it; returns the report."""
    tol = tol or Tolerance()
    shape = decoder_shape(info.config)
    step = wrap_decoder(load_decoder(info), shape)
    trace, where = export_cases(info)
    _export(info, step, shape, dest, trace=trace)
    try:
        return verify_decoder(step, shape, dest, info.name, tol, where=where)
    except ExportMismatchError:
        dest.unlink(missing_ok=True)
        onnxio.data_path(dest).unlink(missing_ok=True)
        raise


FP16_TOL = Tolerance(atol=1e-3, rtol=1e-2)  # FP16 kernels of ONNX Runtime vs PyTorch's, both on the CPU


ISOLATE_BYTES = 1 << 30  # checkpoints from this size export in a worker process (fp16_onnx_from_decoder)


def fp16_onnx_from_decoder(info: ModelInfo, dest: Path, tol=None, isolate: bool | None = None) -> tuple[dict, dict]:
    """Exports `info`'s causal LM in FP16 straight from the checkpoint (no FP32 copy of the
    weights on disk or in memory) and verifies it against PyTorch FP16 on the same feeds.
    Returns (report, weight map: export/weights.py). The PyTorch side (load, export, reference
    outputs) is done before ONNX Runtime loads the graph, so the two never hold the weights at once.
    `isolate` (default: checkpoints of ISOLATE_BYTES and more) runs the PyTorch side in a worker
    process: PyTorch's exporter keeps every weight of the model alive after the export (a full
    FP16 copy, 13.7 GiB at 7B, held through every later stage), and only the end of the process
    that ran it gives that memory back."""
    tol = tol or FP16_TOL
    shape = decoder_shape(info.config)
    if isolate is None:
        isolate = checkpoint_bytes(info.path) >= ISOLATE_BYTES
    trace, where = export_cases(info)
    if isolate:
        cases, refs, params = in_worker(_torch_side, info, dest, trace, where)
    else:
        cases, refs, params = _torch_side(info, dest, trace, where)
    try:
        report = compare_cases(cases, refs, shape, dest, info.name, tol, where)
    except ExportMismatchError:
        dest.unlink(missing_ok=True)
        onnxio.data_path(dest).unlink(missing_ok=True)
        raise
    from trt_seer.export import weights

    wmap = weights.weight_map(params, dest) if onnxio.data_path(dest).exists() else {}
    return {**report, "reference": "PyTorch float16, CPU"}, wmap


def in_worker(fn, *args):
    """fn(*args) in a fresh Python process (this interpreter, this sys.path); returns its result or
    raises its exception. The arguments and the result travel pickled through a temporary file;
    the worker's stderr (progress, warnings) is this process's."""
    import os
    import pickle
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="trt-seer-worker-") as tmp:
        job = Path(tmp) / "job.pickle"
        job.write_bytes(pickle.dumps((fn, args)))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        code = "import sys; from trt_seer.export.decoder import worker_main; worker_main(sys.argv[1])"
        done = subprocess.run([sys.executable, "-c", code, str(job)], env=env, stdout=subprocess.DEVNULL)
        if done.returncode != 0 or not job.is_file():
            from trt_seer.errors import BuildError

            signal = -done.returncode
            why = f" (killed by signal {signal}{'; out of memory?' if signal == 9 else ''})" if signal > 0 else ""
            raise BuildError(f"the export's worker process ended with exit code {done.returncode}{why}")
        ok, value = pickle.loads(job.read_bytes())
    if not ok:
        raise value
    return value


def worker_main(job: str) -> None:
    """The worker side of `in_worker`: runs the pickled call, writes back (ok, result or exception)."""
    import pickle

    fn, args = pickle.loads(Path(job).read_bytes())
    try:
        out = (True, fn(*args))
    except Exception as e:  # noqa: BLE001 - handed back to the caller, who raises it
        out = (False, e)
    try:
        data = pickle.dumps(out)
    except Exception as e:  # noqa: BLE001 - an exception pickle cannot carry goes back as its message
        from trt_seer.errors import BuildError

        failed = out[1] if not out[0] else e
        message = (str(failed).strip().splitlines() or [""])[0]
        data = pickle.dumps((False, BuildError(f"{type(failed).__name__}: {message}")))
    Path(job).write_bytes(data)


def checkpoint_bytes(path: Path) -> int:
    """Bytes of the checkpoint's weight files (the suffixes its fingerprint reads)."""
    from trt_seer.records import WEIGHT_SUFFIXES

    return sum(f.stat().st_size for f in Path(path).iterdir() if f.suffix in WEIGHT_SUFFIXES)


def _torch_side(info: ModelInfo, dest: Path, trace, where) -> tuple[list, list, dict]:
    """The FP16 graph traced at `trace` and exported to `dest` (weights as external data, streamed
    by later stages) and (the verification feeds at `where`, PyTorch FP16's outputs on them, the
    parameters' fingerprints)."""
    import gc

    from trt_seer.export import weights

    shape = decoder_shape(info.config)
    model = load_decoder(info, "float16")
    params = weights.param_fingerprints(dict(model.named_parameters()))
    step = wrap_decoder(model, shape)
    _export(info, step, shape, dest, np.float16, external=True, trace=trace)
    cases = verification_feeds(shape, where, np.float16)
    refs = [_run_torch(step, f) for f in cases]
    del step, model
    gc.collect()
    return cases, refs, params


def _generation_ids(info: ModelInfo) -> tuple[int | list[int] | None, int | None]:
    """(eos_token_id, pad_token_id): generation_config.json's when present, else config.json's."""
    import json

    gen = Path(info.path) / "generation_config.json"
    merged = {**info.config, **(json.loads(gen.read_text()) if gen.is_file() else {})}
    eos = merged.get("eos_token_id")
    pad = merged.get("pad_token_id")
    first_eos = eos[0] if isinstance(eos, list) and eos else eos
    return eos, pad if pad is not None else first_eos


def copy_tokenizer(checkpoint: Path, dest: Path) -> bool:
    """Copies the checkpoint's tokenizer files into directory `dest` (replaced whole); False if none."""
    import os
    import tempfile

    found = [Path(checkpoint) / f for f in TOKENIZER_FILES if (Path(checkpoint) / f).is_file()]
    if not {f.name for f in found} & VOCAB_FILES:
        return False
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    for f in found:
        shutil.copy2(f, tmp / f.name)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return True


def sliding_window(config: dict) -> int | None:
    """The attention window of the checkpoint's sliding-window layers, None when every layer attends
    to the whole sequence (the runtime's cache layout depends on it: runtime/decoder_trt.py)."""
    if config.get("use_sliding_window") is False:  # Qwen2-style: the window is declared but off
        return None
    window = config.get("sliding_window")
    return int(window) if window else None


def decoder_section(info: ModelInfo, artifact: Path, kv_dtype: str = "float32", max_batch: int = 32) -> dict:
    """The record's `decoder` section; copies the tokenizer to `<out>/<name>.tokenizer/`."""
    from trt_seer.export.families import max_positions

    shape = decoder_shape(info.config)
    eos, pad = _generation_ids(info)
    max_total = max_positions(info) or 32768
    tok_dir = Path(artifact).with_name(f"{info.name}.tokenizer")
    has_tokenizer = copy_tokenizer(info.path, tok_dir)
    return {"num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
            "kv_dtype": kv_dtype, "vocab_size": shape.vocab_size, "eos_token_id": eos, "pad_token_id": pad,
            "max_batch": max_batch, "max_prompt": max_total - 1, "max_total": max_total,
            "sliding_window": sliding_window(info.config), "attention": info.attention,
            "tokenizer": tok_dir.name if has_tokenizer else None}


def _session_steps(session, shape: DecoderShape, prompt: dict, kv_dtype, steps: int,
                   forced: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(logits [steps, batch, vocab], tokens [batch, steps]) of a prefill and decode steps, each fed
    the token in `forced` or, without it, the graph's own greedy choice."""
    inputs, outputs = decoder_io(shape.num_layers)
    feeds = {k: (v.astype(kv_dtype) if k.startswith("past_") else v) for k, v in prompt.items()}
    logits, tokens = [], []
    for t in range(steps):
        out = session.run(list(outputs), feeds)
        logits.append(out[0][:, -1].astype(np.float32))  # (batch, vocab)
        tokens.append(np.argmax(logits[-1], axis=-1) if forced is None else forced[:, t])
        mask = np.concatenate([feeds["attention_mask"], np.ones_like(feeds["attention_mask"][:, :1])], axis=1)
        feeds = {"input_ids": tokens[-1][:, None].astype(np.int64), "attention_mask": mask,
                 "position_ids": position_ids(mask, 1), **dict(zip(inputs[3:], out[1:]))}
    return np.stack(logits), np.stack(tokens, axis=1)


def compare_decoders(ref_path: Path, cand_path: Path, config: dict, kv_dtype=np.float16,
                     batch: int = 4, prompt: int = 12, steps: int = 16) -> dict:
    """A reduced-precision decoder against the FP32 one, each on its own cache: a left-padded
    prefill, then decode steps fed the reference's greedy tokens. Returns {"top1_agreement",
    "max_abs_diff", "logits_rms_error"} over every step's next-token logits."""
    from trt_seer.runtime.ort import create_session

    shape = decoder_shape(config)
    feeds = sample_feeds(shape, batch, prompt, 0, seed=3, pad_id=int(config.get("pad_token_id") or 0))
    ref_s, cand_s = (create_session(p) for p in (ref_path, cand_path))
    ref, tokens = _session_steps(ref_s, shape, feeds, np.float32, steps)
    cand, _ = _session_steps(cand_s, shape, feeds, kv_dtype, steps, forced=tokens)
    return {"top1_agreement": float(np.mean(ref.argmax(-1) == cand.argmax(-1))),
            "max_abs_diff": float(np.max(np.abs(ref - cand))),
            "logits_rms_error": float(np.sqrt(np.mean((ref - cand) ** 2)))}
