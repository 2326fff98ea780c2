"""`trt-seer run`: tokenize text, run an engine (or ONNX artifact) and print what it computes:
sentence embeddings or class labels with logits (causal LMs: `trt-seer generate`).

    python -m trt_seer run engines/all-MiniLM-L6-v2.fp16.engine --text "hello world" --json
"""
from __future__ import annotations

import argparse
import json
import logging
import warnings
from pathlib import Path

import numpy as np

from trt_seer.cli import common
from trt_seer.errors import InputError, UnsupportedError
from trt_seer.tokenizer import load_tokenizer

log = logging.getLogger("trt_seer")
DEFAULT_MAX_LENGTH = 512
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def add_parser(subparsers, common):
    p = subparsers.add_parser("run", help="run an engine or ONNX artifact on text", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", metavar="ENGINE_OR_ONNX",
                   help="<name>.<precision>.engine or .onnx, or its manifest / record (.manifest.json, .onnx.json)")
    p.add_argument("--text", action="append", default=[], help="a text to run (repeatable)")
    p.add_argument("--file", metavar="PATH", help="texts, one per line")
    p.add_argument("--json", action="store_true", help="print one JSON document (full vectors)")
    p.add_argument("--backend", choices=("auto", "tensorrt", "onnxruntime"), default="auto",
                   help="auto: TensorRT where a GPU is usable, else the sibling .onnx on CPU (default)")
    p.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="directory with tokenizer.json (default: the checkpoint recorded in the manifest)")
    p.add_argument("--batch-size", type=common.positive_int, default=32, metavar="N",
                   help="texts per call (capped by the engine's profile; default 32)")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="ONNX Runtime intra-op threads (default: one per core)")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def read_texts(args) -> list[str]:
    texts = list(args.text)
    if args.file:
        path = Path(args.file)
        try:
            texts += [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read --file {path}: {e}") from e
    if not texts:
        raise InputError("nothing to run: pass --text TEXT or --file PATH")
    return texts


def tokenizer_dir(args, record: dict | None) -> Path:
    if args.tokenizer:
        return Path(args.tokenizer)
    checkpoint = ((record or {}).get("source") or {}).get("checkpoint")
    if not checkpoint:
        raise InputError(f"{Path(args.artifact).name} has no manifest naming its checkpoint; "
                         "pass --tokenizer DIR (a directory with tokenizer.json)")
    return Path(checkpoint)



def seq_limits(model) -> tuple[int, int]:
    """(min, max) sequence length the model takes: the profile's, or 1..512 with no profile."""
    ids = next((s for s in model.inputs if s.name == "input_ids"), None)
    if ids is None or set(model.input_names) - set(TOKEN_INPUTS):
        raise UnsupportedError(f"the model takes {list(model.input_names)}; `run` feeds token ids "
                               "(input_ids, attention_mask[, token_type_ids])")
    if ids.min_shape is not None:
        return ids.min_shape[1], ids.max_shape[1]
    return 1, DEFAULT_MAX_LENGTH


def batch_limits(model, wanted: int) -> tuple[int, int]:
    spec = model.inputs[0]
    if spec.min_shape is None:
        return 1, wanted
    return spec.min_shape[0], max(spec.min_shape[0], min(wanted, spec.max_shape[0]))


def batches(model, ids: list[list[int]], batch_size: int):
    """Yields (number of real rows, feeds): right-padded to the longest row (within the profile),
    with repeated rows filling a batch up to the profile's minimum."""
    from trt_seer.data import pad_batch

    lo_seq, _ = seq_limits(model)
    lo_batch, hi_batch = batch_limits(model, batch_size)
    for start in range(0, len(ids), hi_batch):
        rows = ids[start:start + hi_batch]
        real = len(rows)
        rows = rows + [rows[-1]] * max(0, lo_batch - real)
        seq = max(lo_seq, max(len(r) for r in rows))
        yield real, pad_batch(rows, model.input_names, seq)


def summarize(task: str, outputs: dict[str, np.ndarray], labels: dict | None, full: bool) -> list[dict]:
    """One dict per row: the embedding, the label and logits, or the next-token prediction."""
    rows = []
    for i in range(len(next(iter(outputs.values())))):
        if task == "feature-extraction" and "sentence_embedding" in outputs:
            vec = outputs["sentence_embedding"][i].astype(np.float64)
            rows.append({"embedding": vec.tolist() if full else vec[:8].round(5).tolist(),
                         "dim": int(vec.size), "norm": round(float(np.linalg.norm(vec)), 5)})
        elif task == "text-classification" and "logits" in outputs:
            logits = outputs["logits"][i].astype(np.float64)
            k = int(np.argmax(logits))
            rows.append({"label": (labels or {}).get(str(k), str(k)), "label_id": k,
                         "logits": logits.round(6).tolist()})
        else:
            rows.append({name: (v[i].tolist() if full else list(v[i].shape)) for name, v in outputs.items()})
    return rows


def run(args) -> int:
    from trt_seer.runtime import load

    texts = read_texts(args)
    opts = {"time_gpu": True, **({"threads": args.threads} if args.threads else {})}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        model = load(common.artifact_paths(args.artifact).artifact, backend=args.backend, **opts)
    for w in caught:  # the fallback to ONNX Runtime, as one log line
        log.warning("warning: %s", w.message)
    with model:
        record = model.manifest or {}
        if record.get("task") == "causal-lm":
            raise UnsupportedError(f"{Path(args.artifact).name} is a causal-lm artifact (a KV-cache "
                                   "decoder); run it with `trt-seer generate`")
        tok_dir = tokenizer_dir(args, record)
        tokenizer = load_tokenizer(tok_dir, seq_limits(model)[1], "pass --tokenizer DIR")
        ids = [e.ids for e in tokenizer.encode_batch(texts)]
        task = record.get("task") or _guess_task(model.output_names)
        labels = _labels(tok_dir)
        results, gpu_ms = [], []
        for real, feeds in batches(model, ids, args.batch_size):
            out = model.infer(feeds)
            rows = summarize(task, out, labels, args.json)
            results += rows[:real]
            if model.last_gpu_ms is not None:
                gpu_ms.append(model.last_gpu_ms)
        _print(args, model, task, texts, results, gpu_ms)
    return 0


def _guess_task(output_names) -> str:
    if "sentence_embedding" in output_names:
        return "feature-extraction"
    return "text-classification" if "logits" in output_names else "unknown"


def _labels(checkpoint: Path) -> dict | None:
    config = checkpoint / "config.json"
    if not config.is_file():
        return None
    return {str(k): v for k, v in (json.loads(config.read_text()).get("id2label") or {}).items()}


def _print(args, model, task: str, texts: list[str], results: list[dict], gpu_ms: list[float]) -> None:
    if args.json:
        doc = {"artifact": str(args.artifact), "backend": model.backend, "task": task,
               "gpu_ms": [round(t, 4) for t in gpu_ms] or None,
               "results": [{"text": t, **r} for t, r in zip(texts, results)]}
        print(json.dumps(doc))
        return
    log.info("%s on %s (%s)", Path(model.path).name, model.backend, task)
    for text, row in zip(texts, results):
        shown = text if len(text) <= 60 else text[:57] + "..."
        print(f"{shown!r}: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    if gpu_ms:
        log.info("engine GPU time: %s ms", ", ".join(f"{t:.3f}" for t in gpu_ms))
