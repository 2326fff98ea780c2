"""Argument groups shared by subcommands: model/task, shape profile, precision, calibration data,
output. Defined once here; each subcommand picks the groups it needs."""
from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from trt_seer.errors import InputError
from trt_seer.export.families import TASKS

PRECISIONS = ("fp32", "fp16", "int8", "int4")


def int_triple(text: str) -> tuple[int, int, int]:
    """'1,8,32' -> (1, 8, 32); a single '32' -> (32, 32, 32)."""
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,OPT,MAX integers, got {text!r}") from None
    if len(values) == 1:
        values = values * 3
    if len(values) != 3 or not 1 <= values[0] <= values[1] <= values[2]:
        raise argparse.ArgumentTypeError(f"expected MIN,OPT,MAX with 1 <= MIN <= OPT <= MAX, got {text!r}")
    return values


def int_list(text: str) -> tuple[int, ...]:
    """'1,8,32' -> (1, 8, 32), each >= 1."""
    try:
        values = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def positive_int(text: str) -> int:
    return _int_from(text, 1)


def non_negative_int(text: str) -> int:
    return _int_from(text, 0)


def _int_from(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected an integer >= {least}, got {text!r}")
    return value


def add_model_args(p: argparse.ArgumentParser, task_help: str | None = None) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", metavar="DIR", default=None,
                   help="Hugging Face checkpoint directory (default: the embedded all-MiniLM-L6-v2)")
    g.add_argument("--task", choices=sorted(TASKS), default=None,
                   help=task_help or "what the model computes (default: inferred from config.json 'architectures')")


def add_profile_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("shape profile")
    g.add_argument("--batch", type=int_triple, default=(1, 8, 32), metavar="MIN,OPT,MAX",
                   help="batch sizes of the optimization profile (default: 1,8,32)")
    g.add_argument("--seq", type=int_triple, default=(8, 128, 256), metavar="MIN,OPT,MAX",
                   help="sequence lengths of the optimization profile (default: 8,128,256); for a "
                        "causal LM, the prompt lengths")
    g.add_argument("--max-total", type=int, default=None, metavar="N",
                   help="causal LMs: the longest prompt + generated tokens an engine serves "
                        "(default: 2 x the --seq max)")


def add_output_args(p: argparse.ArgumentParser, default: str = "engines") -> None:
    p.add_argument("--out", metavar="DIR", default=default, help=f"output directory (default: {default}/)")


@dataclass(frozen=True)
class ArtifactPaths:
    """An artifact named by either of its files: the engine or its manifest, the .onnx or its record."""

    artifact: Path  # <name>.<precision>.engine | <name>.<precision>[.cpu].onnx
    record: Path  # <name>.<precision>.manifest.json | <name>.<precision>[.cpu].onnx.json
    engine: bool


def artifact_paths(text: str | Path) -> ArtifactPaths:
    """Both names of the artifact `text` names (one resolver for run, diff and triton's argument);
    InputError for a name that is neither."""
    path = Path(text)
    name = path.name
    if name.endswith(".manifest.json"):
        return ArtifactPaths(path.with_name(name.removesuffix(".manifest.json") + ".engine"), path, True)
    if name.endswith(".engine"):
        return ArtifactPaths(path, path.with_name(name.removesuffix(".engine") + ".manifest.json"), True)
    if name.endswith(".onnx.json"):
        return ArtifactPaths(path.with_name(name.removesuffix(".json")), path, False)
    if name.endswith(".onnx"):
        return ArtifactPaths(path, path.with_name(name + ".json"), False)
    raise InputError(f"{path}: expected an engine (.engine, or its .manifest.json) or an ONNX artifact "
                     "(.onnx, or its .onnx.json record)")


# What each command's report.json holds, to tell whose report a --report directory already has.
REPORT_KEYS = {"diff": ("verdict", "comparisons"), "bench": ("rows", "machine")}


def check_report_dir(path: str | Path, command: str) -> None:
    """A --report directory may hold this command's earlier report (replaced), never another's."""
    existing = Path(path) / "report.json"
    if not existing.is_file():
        return
    try:
        data = json.loads(existing.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(f"--report {path} holds a report.json that cannot be read ({e}); "
                         "choose another directory") from e
    owner = next((c for c, keys in REPORT_KEYS.items() if isinstance(data, dict) and all(k in data for k in keys)),
                 None)
    if owner != command:
        whose = f"`trt-seer {owner}`'s" if owner else "another tool's"
        raise InputError(f"--report {path} holds {whose} report; give `trt-seer {command}` a directory "
                         "of its own (--report DIR)")


def add_verbosity(p: argparse.ArgumentParser) -> None:
    p.add_argument("-v", "--verbose", action="store_true", help="verbose logs (TensorRT builder log included)")


def add_calib_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("INT8 calibration")
    g.add_argument("--calib", metavar="PATH", default=None,
                   help="representative data: .txt (one sample per line), .jsonl/.csv (see --text-field) "
                        "or a directory of .npz token batches (default: the corpus in calib/)")
    g.add_argument("--text-field", default="text", help="text field of .jsonl/.csv data (default: text)")
    g.add_argument("--calib-samples", type=positive_int, default=256, metavar="N",
                   help="calibration samples to use (default: 256)")
    g.add_argument("--calib-batch", type=positive_int, default=16, metavar="B",
                   help="calibration batch size (default: 16)")
    g.add_argument("--calib-method", choices=("entropy", "max", "percentile"), default="entropy",
                   help="activation range method (default: entropy, TensorRT's KL-divergence search)")


def configure_logging(verbose: bool) -> None:
    """Our own messages at INFO (DEBUG with -v); libraries keep their default WARNING."""
    log = logging.getLogger("trt_seer")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False


CONFIG_TYPES = {"model_type": str, "architectures": list, "max_position_embeddings": int, "n_positions": int,
                "id2label": dict}


def check_config(model: str | None) -> None:
    """InputError when `--model DIR`'s config.json is not UTF-8 JSON or has fields of the wrong type
    (the fields trt_seer reads before loading the model); a missing file is resolve_model's to report."""
    path = Path(model) / "config.json" if model else None
    if path is None or not path.is_file():
        return
    try:
        config = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError too
        raise InputError(f"unreadable config.json in {model}: {str(e) or type(e).__name__}") from e
    if not isinstance(config, dict):
        raise InputError(f"{path} is not a JSON object")
    for key, kind in CONFIG_TYPES.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            raise InputError(f"{path}: {key} should be a JSON {kind.__name__}, got {json.dumps(value)[:40]}")


def add_decoder_runtime_args(p) -> None:
    """How a causal-LM artifact is opened (generate, serve): its tokenizer and ONNX Runtime's threads."""
    p.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="directory with tokenizer.json (default: the one copied beside the artifact)")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="ONNX Runtime intra-op threads (default: one per core)")
