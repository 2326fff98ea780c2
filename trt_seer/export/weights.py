"""Which checkpoint tensor each weight of an exported decoder graph is, so later stages can take
weights tensor by tensor from the checkpoint instead of keeping a second copy on disk.

    wmap = weight_map(named_fp16_params, Path("m.fp16.onnx"))    # {initializer: {tensor, transposed, fp}}
    skeleton = weightless(Path("m.fp16.onnx"), wmap)             # the graph without those weights
    model = materialize(skeleton, wmap, CheckpointTensors(ckpt)) # the FP16 graph again, in memory

The exporter names folded weights `val_N` (a Linear's weight is stored transposed, [K, N]), so the
map is made by content: a fingerprint (shape + hash of a strided sample) of each parameter and of
its transpose, matched against each initializer read in place from the saved external data.
`materialize` checks every tensor it reads against the recorded fingerprint.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from trt_seer.errors import InputError

MIN_ELEMENTS = 4096  # smaller initializers stay inside the weightless graph
SAMPLES = 4096
FLOAT16 = 10  # onnx.TensorProto.FLOAT16


def fingerprint(a: np.ndarray) -> str:
    """Shape + hash of ~SAMPLES evenly strided float16 values (reads a few pages of a memmap)."""
    flat = a.reshape(-1)
    step = max(1, flat.size // SAMPLES)
    sample = np.ascontiguousarray(flat[::step][:SAMPLES], dtype=np.float16)
    return f"{'x'.join(map(str, a.shape))}:{hashlib.sha1(sample.tobytes()).hexdigest()}"


def param_fingerprints(named: dict) -> dict[str, tuple[str, bool]]:
    """{fingerprint: (name, transposed)} of 2-D and larger float parameters (torch tensors)."""
    out = {}
    for name, p in named.items():
        if p.numel() < MIN_ELEMENTS:
            continue
        a = p.detach().to("cpu").numpy()
        out.setdefault(fingerprint(a), (name, False))
        if a.ndim == 2:
            out.setdefault(fingerprint(a.T), (name, True))
    return out


def _external(t) -> dict:
    return {e.key: e.value for e in t.external_data}


def initializer_arrays(onnx_path: Path):
    """(initializer proto, float16 array read in place) for each large FP16 initializer kept in
    external data; the arrays are memory maps, so nothing is loaded whole."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    for t in model.graph.initializer:
        if t.data_type != FLOAT16 or t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        ext = _external(t)
        shape = tuple(int(d) for d in t.dims)
        if int(np.prod(shape)) < MIN_ELEMENTS:
            continue
        yield t, np.memmap(Path(onnx_path).parent / ext["location"], dtype=np.float16, mode="r",
                           offset=int(ext.get("offset", 0)), shape=shape)


def weight_map(params: dict[str, tuple[str, bool]], onnx_path: Path) -> dict[str, dict]:
    """{initializer name: {"tensor", "transposed", "fingerprint"}} for every large FP16
    initializer of `onnx_path` that equals a checkpoint tensor (or its transpose)."""
    out = {}
    for t, a in initializer_arrays(onnx_path):
        fp = fingerprint(a)
        if fp in params:
            name, transposed = params[fp]
            out[t.name] = {"tensor": name, "transposed": transposed, "fingerprint": fp}
    return out


def weightless(onnx_path: Path, wmap: dict):
    """The graph with the mapped initializers' values left out (name, type and dims kept) and
    every other initializer loaded inline: small, and independent of the external-data file."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    for t in model.graph.initializer:
        if t.name in wmap:
            t.CopyFrom(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
    onnx.external_data_helper.load_external_data_for_model(model, str(Path(onnx_path).parent))
    return model


class CheckpointTensors:
    """Reads a safetensors checkpoint one tensor at a time, as float16 numpy arrays."""

    def __init__(self, ckpt: Path):
        self.ckpt = Path(ckpt)
        self.files = _tensor_files(self.ckpt)

    def get(self, name: str, transposed: bool = False) -> np.ndarray:
        """The tensor as float16 (transposed: its 2-D transpose, made contiguous by PyTorch on
        every core)."""
        import torch
        from safetensors import safe_open

        if name not in self.files:
            raise InputError(f"tensor {name} is not in the checkpoint {self.ckpt} (was it changed since the export?)")
        with safe_open(str(self.files[name]), framework="pt") as f:
            t = f.get_tensor(name).to(torch.float16)
        return (t.T.contiguous() if transposed else t).numpy()


def _tensor_files(ckpt: Path) -> dict[str, Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        return {k: ckpt / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    from safetensors import safe_open

    out = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as h:
            out.update({k: f for k in h.keys()})
    return out


def streamable(ckpt: Path) -> bool:
    """Whether weights can be read back tensor by tensor (safetensors; not .bin pickles)."""
    return any(Path(ckpt).glob("*.safetensors"))


def checkpoint_weight(entry: dict, tensors: CheckpointTensors) -> np.ndarray:
    """The initializer a weight-map entry describes, read from the checkpoint (transposed as
    stored in the graph); InputError when the tensor no longer matches its fingerprint."""
    a = tensors.get(entry["tensor"], bool(entry["transposed"]))
    if fingerprint(a) != entry["fingerprint"]:
        raise InputError(f"checkpoint tensor {entry['tensor']} changed since the graph was exported; "
                         "rebuild with --force")
    return a


def materialize(skeleton, wmap: dict, tensors: CheckpointTensors):
    """`skeleton` (a weightless graph, modified in place and returned) with every mapped weight
    it still holds read from the checkpoint; InputError when a tensor no longer matches its
    fingerprint."""
    from onnx import numpy_helper

    for t in skeleton.graph.initializer:
        if t.name in wmap:
            t.CopyFrom(numpy_helper.from_array(checkpoint_weight(wmap[t.name], tensors), t.name))
    return skeleton
