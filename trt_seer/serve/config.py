"""A Triton model configuration (config.pbtxt) from a manifest's I/O and optimization profiles.

Triton batches along dim 0 of every input and output. When all of an engine's I/O tensors have a
dynamic dim 0, `max_batch_size` is the largest batch every optimization profile accepts and `dims`
leave that dim out; otherwise `max_batch_size: 0` and `dims` are the full shapes (-1 = dynamic).
Pure functions over dicts: no Triton, TensorRT or protobuf import.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from trt_seer.errors import InputError, UnsupportedError

# numpy dtype names (as the manifest records them) -> Triton's DataType enum
DTYPES = {
    "bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
    "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
    "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
    "bfloat16": "TYPE_BF16",
}
TENSORRT, ONNXRUNTIME = "tensorrt_plan", "onnxruntime_onnx"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def check_name(name: str) -> str:
    """A model name that is one directory and one URL segment (/v2/models/<name>)."""
    if not _NAME.match(name):
        raise InputError(f"--name {name!r}: use letters, digits, '_', '.', '-' (not starting with '.')")
    return name


@dataclass(frozen=True)
class TritonSpec:
    """What the user chose; None means "derive it from the manifest".

    Attributes:
        name: model name (the directory under the repository).
        instances: execution instances per optimization profile (per instance group).
        max_queue_delay_us: how long the dynamic batcher waits to fill a batch.
        preferred_batch: preferred batch sizes of the dynamic batcher.
        max_batch_size: cap below the profile's largest batch.
        overwrite: replace an existing model directory of the same name.
    """

    name: str | None = None
    instances: int = 1
    max_queue_delay_us: int = 100
    preferred_batch: tuple[int, ...] | None = None
    max_batch_size: int | None = None
    overwrite: bool = False

    def __post_init__(self):
        if self.name is not None:
            check_name(self.name)
        if self.instances < 1:
            raise InputError(f"--instances must be >= 1, got {self.instances}")
        if self.max_queue_delay_us < 0:
            raise InputError(f"--max-queue-delay-us must be >= 0, got {self.max_queue_delay_us}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise InputError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.preferred_batch is not None and (not self.preferred_batch or min(self.preferred_batch) < 1):
            raise InputError(f"--preferred-batch sizes must be >= 1, got {list(self.preferred_batch)}")


@dataclass(frozen=True)
class BatchRange:
    """The batch sizes one optimization profile accepts, and the one it was tuned for."""

    min: int
    opt: int
    max: int


def dtype_of(tensor: dict) -> str:
    try:
        return DTYPES[tensor["dtype"]]
    except KeyError:
        raise UnsupportedError(f"tensor {tensor['name']}: dtype {tensor['dtype']} has no Triton data type") from None


def batches_dim0(io: dict) -> bool:
    """True when every input and output has a dynamic dim 0 (Triton's batching dimension)."""
    tensors = io["inputs"] + io["outputs"]
    return bool(tensors) and all(t["shape"] and t["shape"][0] == -1 for t in tensors)


def engine_batch_ranges(manifest: dict) -> list[BatchRange]:
    """One BatchRange per optimization profile: dim 0 of the profile's input shapes."""
    ranges = []
    for profile in manifest.get("optimization_profiles") or []:
        shapes = list(profile["shapes"].values())  # each [min, opt, max] shape
        ranges.append(BatchRange(max(s[0][0] for s in shapes), max(s[1][0] for s in shapes),
                                 min(s[2][0] for s in shapes)))
    if not ranges:  # manifests written before optimization_profiles was recorded
        ranges = [BatchRange(*p["batch"]) for p in manifest["profiles"]]
    return ranges


def max_batch_size(ranges: list[BatchRange], spec: TritonSpec, where: str) -> int:
    """The largest batch every profile accepts, or the user's smaller cap; InputError on conflict."""
    low = [(i, r.min) for i, r in enumerate(ranges) if r.min > 1]
    if low:
        i, b = low[0]
        raise InputError(f"{where}: profile {i} accepts batch {b}..{ranges[i].max} but Triton's batcher sends "
                         f"batches from 1; rebuild with --batch 1,OPT,MAX")
    top = min(r.max for r in ranges)
    if spec.max_batch_size is not None and spec.max_batch_size > top:
        raise InputError(f"--max-batch-size {spec.max_batch_size} exceeds the engine's profile "
                         f"(batch 1..{top}); pass at most {top} or rebuild with a larger --batch MAX")
    return spec.max_batch_size or top


def preferred_sizes(ranges: list[BatchRange], top: int, spec: TritonSpec) -> list[int]:
    """The user's preferred sizes, each checked against 1..top; else the profiles' opt and top."""
    if spec.preferred_batch is not None:
        outside = [b for b in spec.preferred_batch if not 1 <= b <= top]
        if outside:
            raise InputError(f"--preferred-batch {','.join(map(str, outside))} outside the batches the model "
                             f"serves (1..{top}: its profile / --max-batch-size); pick sizes within it")
        return sorted(set(spec.preferred_batch))
    return sorted({r.opt for r in ranges if 1 < r.opt <= top} | ({top} - {1}))


def _tensor(t: dict, batching: bool) -> dict:
    dims = list(t["shape"][1:] if batching else t["shape"])
    entry = {"name": t["name"], "data_type": dtype_of(t), "dims": dims or [1]}
    if not dims:  # a per-row scalar: Triton needs one dim, reshaped away
        entry["reshape"] = {"shape": []}
    return entry


def model_config(name: str, platform: str, io: dict, ranges: list[BatchRange],
                 spec: TritonSpec, where: str) -> dict:
    """The configuration as a dict shaped like Triton's ModelConfig.

    Args:
        ranges: batch range per TensorRT optimization profile (one instance group each); for ONNX
            Runtime the one range it is served over (one CPU instance group).
        where: the artifact, for error messages.
    """
    batching = batches_dim0(io)
    if not batching and (spec.max_batch_size or spec.preferred_batch):
        tensor = next(t for t in io["inputs"] + io["outputs"] if not t["shape"] or t["shape"][0] != -1)
        raise InputError(f"{where}: tensor {tensor['name']} has shape {tensor['shape']}, no dynamic batch dim 0, "
                         f"so Triton cannot batch it; drop --max-batch-size / --preferred-batch")
    cfg = {"name": name, "platform": platform, "max_batch_size": 0,
           "input": [_tensor(t, batching) for t in io["inputs"]],
           "output": [_tensor(t, batching) for t in io["outputs"]]}
    if platform == TENSORRT:
        cfg["instance_group"] = [{"name": f"{name}_profile{i}", "kind": "KIND_GPU", "count": spec.instances,
                                  "profile": [str(i)]} for i in range(len(ranges))]
    else:
        cfg["instance_group"] = [{"name": f"{name}_cpu", "kind": "KIND_CPU", "count": spec.instances}]
    if batching:
        top = max_batch_size(ranges, spec, where)
        cfg["max_batch_size"] = top
        cfg["dynamic_batching"] = {"preferred_batch_size": preferred_sizes(ranges, top, spec),
                                   "max_queue_delay_microseconds": spec.max_queue_delay_us}
    return cfg


_ENUMS = ("data_type", "kind")


def _scalar(key: str, value) -> str:
    if isinstance(value, str) and key not in _ENUMS:
        return json.dumps(value)  # a quoted, escaped string; text format reads JSON's escapes
    return str(value)


def _lines(cfg: dict, indent: str) -> list[str]:
    out = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            out += [f"{indent}{key} {{", *_lines(value, indent + "  "), f"{indent}}}"]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            blocks = [[f"{indent}  {{", *_lines(v, indent + "    "), f"{indent}  }}"] for v in value]
            for block in blocks[:-1]:
                block[-1] += ","
            out += [f"{indent}{key} [", *(line for b in blocks for line in b), f"{indent}]"]
        elif isinstance(value, list):
            out.append(f"{indent}{key}: [ {', '.join(_scalar(key, v) for v in value)} ]")
        else:
            out.append(f"{indent}{key}: {_scalar(key, value)}")
    return out


def to_pbtxt(cfg: dict, comments: list[str] = ()) -> str:
    """Protobuf text format of `cfg`, `# comments` first."""
    return "\n".join([*(f"# {c}" for c in comments), *_lines(cfg, "")]) + "\n"
