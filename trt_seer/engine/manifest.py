"""The manifest: the JSON beside each engine (and each ONNX artifact) that every later stage and
every service reads instead of re-deriving facts.

Engine manifest (`<name>.<precision>.manifest.json`) keys:
  schema, trt_seer_version, name, precision, task, model_type,
  engine {file, sha256, size_bytes}, onnx {file, sha256, fp32_file, fp32_sha256},
  source {checkpoint, config_sha256, weights_sha256},
  tensorrt {flavor, version}, targets {mode, compute_capabilities, build_compute_capability},
  build_gpu {name, compute_capability} | null   (null: built without a GPU, e.g. TensorRT-RTX on
      CPU; then only "ampere+" / "listed" targets, which need no build GPU, are allowed),
  profiles [{batch: [min, opt, max], seq: [min, opt, max]}],
  io {inputs: [{name, dtype, shape}], outputs: [...]}   (-1 marks a dynamic axis),
  build {key, settings, seconds, finished_at},
  accuracy_of_source_graph {<stage>: {...}}   (the ONNX record's accuracy at build time: measured on
      the graph, each entry's measured_on {artifact, backend} says where; not the engine's),
  accuracy {diff_vs_<against>: {verdict, ran, not_run, comparisons}}   (by `diff`: what ran where),
  bench {measured_at, label, path, machine, seq, points: [{batch, p50_ms, ...}], ...}   (by `bench`).
ONNX records (`<file>.onnx.json`) hold {kind, precision, sha256, key, source, io, verification,
accuracy {<stage>: {..., measured_on, reference_measured_on}}}.
"""
from __future__ import annotations

import json
from pathlib import Path

from trt_seer import __version__
from trt_seer.errors import InputError
from trt_seer.files import atomic_write_json

SCHEMA = 1
ENGINE_REQUIRED = ("schema", "name", "precision", "task", "engine", "tensorrt", "targets",
                   "profiles", "io", "build")


def engine_manifest_path(engine_path: Path) -> Path:
    """`x.fp16.engine` -> `x.fp16.manifest.json`."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name.removesuffix(".engine") + ".manifest.json")


def record_path(artifact: Path) -> Path:
    """The record beside a non-engine artifact: `x.fp32.onnx` -> `x.fp32.onnx.json`."""
    return Path(str(artifact) + ".json")


def read(path: Path) -> dict:
    """Reads and validates a manifest or record; InputError on anything malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError as e:
        raise InputError(f"manifest not found: {path}") from e
    except OSError as e:
        raise InputError(f"unreadable manifest {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise InputError(f"manifest {path} is not UTF-8 JSON: {e.reason} at byte {e.start}") from e
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError; absurdly deep nesting
        raise InputError(f"manifest {path} is not valid JSON: {str(e) or type(e).__name__}") from e
    if not isinstance(data, dict):
        raise InputError(f"manifest {path} is not a JSON object")
    check_fields(data, RECORD_FIELDS, path, required=False)
    if data.get("schema", SCHEMA) > SCHEMA:
        raise InputError(f"manifest {path} has schema {data['schema']}; this trt_seer reads {SCHEMA}")
    return data


def output_dtype(data: dict, name: str) -> str | None:
    """The dtype (numpy name) of output `name` in a manifest's `io`, None where it has no such output."""
    return next((o["dtype"] for o in data.get("io", {}).get("outputs", []) if o["name"] == name), None)


def read_engine_manifest(path: Path) -> dict:
    data = read(path)
    missing = [k for k in ENGINE_REQUIRED if k not in data]
    if missing:
        raise InputError(f"manifest {path} lacks {', '.join(missing)}")
    check_fields(data, ENGINE_FIELDS, path, required=True)
    return data


# The fields readers rely on, with their JSON types: a manifest edited by hand, truncated or written
# by another tool fails here with its path and the field named, not deep inside a later stage.
_IO = {"inputs": [{"name": str, "dtype": str, "shape": [int]}],
       "outputs": [{"name": str, "dtype": str, "shape": [int]}]}
RECORD_FIELDS = {"schema": int, "name": str, "precision": str, "task": str, "key": str, "sha256": str,
                 "source": dict, "accuracy": dict, "io": _IO, "profiles": [{"batch": [int], "seq": [int]}],
                 "engine": dict, "tensorrt": dict, "targets": dict, "build": dict}
ENGINE_FIELDS = {"engine": {"file": str, "sha256": str, "size_bytes": int},
                 "tensorrt": {"flavor": str, "version": str}, "io": _IO, "build": {"key": str}}
_JSON_NAMES = {str: "a string", int: "an integer", dict: "an object", list: "a list"}


def check_fields(data: dict, fields: dict, path: Path, required: bool, prefix: str = "") -> None:
    """InputError naming the first field whose JSON type differs from `fields`. A field's type is
    a Python type, a dict of fields, or a one-element list `[type or dict]` for a list of them."""
    for key, want in fields.items():
        if key in data:
            _check_value(data[key], want, path, required, f"{prefix}{key}")
        elif required:
            raise InputError(f"manifest {path} lacks {prefix}{key}")


def _check_value(value, want, path: Path, required: bool, name: str) -> None:
    kind = dict if isinstance(want, dict) else list if isinstance(want, list) else want
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InputError(f"manifest {path}: {name} should be {_JSON_NAMES.get(kind, kind.__name__)}, "
                         f"got {json.dumps(value)[:40]}")
    if isinstance(want, dict):
        check_fields(value, want, path, required, name + ".")
    elif isinstance(want, list):
        for i, item in enumerate(value):
            _check_value(item, want[0], path, True, f"{name}[{i}]")


def read_if_exists(path: Path) -> dict | None:
    return read(path) if Path(path).is_file() else None


def write(path: Path, data: dict) -> Path:
    data = {"schema": SCHEMA, "trt_seer_version": __version__, **data}
    return atomic_write_json(path, data)


def update_accuracy(path: Path, stage: str, metrics: dict) -> dict:
    """Merges `metrics` under accuracy[stage] and rewrites the manifest atomically."""
    data = read(path)
    data.setdefault("accuracy", {})[stage] = metrics
    atomic_write_json(path, data)
    return data


def update_section(path: Path, key: str, value) -> dict:
    """Sets the top-level `key` (e.g. `bench`) to `value` and rewrites the manifest atomically."""
    data = read(path)
    data[key] = value
    atomic_write_json(path, data)
    return data
