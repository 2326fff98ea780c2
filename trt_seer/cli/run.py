"""`trt-seer run`: tokenize text, run an engine (or ONNX artifact) and print what it computes:
sentence embeddings or class labels with logits (causal LMs: `trt-seer generate`).

    python -m trt_seer run engines/all-MiniLM-L6-v2.fp16.engine --text "hello world" --json
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from pathlib import Path

import numpy as np

from trt_seer.cli import common
from trt_seer.errors import InputError, UnsupportedError

log = logging.getLogger("trt_seer")
LONG_RUN = 10_000  # texts: a progress bar even where stderr is not a terminal


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
    p.add_argument("--batch-size", type=common.positive_int, default=None, metavar="N",
                   help="at most N texts per call (default: the engine's largest batch; 32 for an ONNX graph); "
                        "texts are sorted by length into batches, results come in input order")
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


def summarize(task: str, row: dict[str, np.ndarray], labels: dict | None, full: bool) -> dict:
    """One text's result: the embedding, the label and logits, or each output (its shape unless `full`)."""
    if task == "feature-extraction" and "sentence_embedding" in row:
        vec = row["sentence_embedding"].astype(np.float64)
        return {"embedding": vec.tolist() if full else vec[:8].round(5).tolist(),
                "dim": int(vec.size), "norm": round(float(np.linalg.norm(vec)), 5)}
    if task == "text-classification" and "logits" in row:
        logits = row["logits"].astype(np.float64)
        k = int(np.argmax(logits))
        return {"label": (labels or {}).get(str(k), str(k)), "label_id": k, "logits": logits.round(6).tolist()}
    return {name: (v.tolist() if full else list(v.shape)) for name, v in row.items()}


def run(args) -> int:
    from trt_seer.runtime import load
    from trt_seer.runtime.texts import TextRunner

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
        runner = TextRunner.open(model, common.artifact_paths(args.artifact).artifact, args.tokenizer, args.batch_size,
                                 hint="pass --tokenizer DIR")
        task = record.get("task") or _guess_task(model.output_names)
        gpu_ms = []
        with _progress(len(texts), runner.shape.max_batch) as bar:
            def done(n: int) -> None:
                bar.update(n)
                if model.last_gpu_ms is not None:
                    gpu_ms.append(model.last_gpu_ms)

            outputs = runner.run(texts, done)
        labels = _labels(runner.checkpoint)
        results = [summarize(task, row, labels, args.json) for row in outputs]
        _print(args, model, task, texts, results, gpu_ms)
    return 0


def _progress(total: int, batch: int):
    """A progress bar on stderr over many batches: where stderr is a terminal, or on a file so long
    (LONG_RUN texts) that a log of it wants one, updated at most every 30 s there."""
    from tqdm import tqdm

    tty = sys.stderr.isatty()
    shown = total > batch and (tty or total >= LONG_RUN)
    return tqdm(total=total, unit="text", file=sys.stderr, disable=not shown, mininterval=0.1 if tty else 30,
                leave=False)


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
