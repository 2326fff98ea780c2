"""A decoder's TensorRT network: each GEMM's constant FP16 weight stored [N, K] (one row per output, the
layout of a PyTorch Linear) and multiplied transposed, instead of the exporter's [K, N].

At decode size a GEMM reads its whole weight for 1-16 rows. With the weight as [K, N], TensorRT-RTX
picks split-K kernels for most of a decoder's GEMMs, each with a memset of its output; with [N, K]
it picks kernels without either (measured on a 1.1B Llama, docs/BENCHMARKS.md: 517 -> 604 decode
tokens/s at batch 1, 323 -> 279 launches per step, batch 8 unchanged). Done on the parsed network,
like engine/kv_outputs.py, so the ONNX graph, its checks and the INT8/INT4 graphs made from it keep
the exporter's layout. Weights behind a DequantizeLinear (weight-only INT8/INT4) are not constants
here and keep theirs.

The transposed copies are new host arrays that TensorRT reads until the engine is serialized: the
caller keeps the returned GEMMs' arrays alive until then (about the FP16 weights' size in RAM).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from trt_seer.engine.kv_outputs import producers as producers_of
from trt_seer.engine.kv_outputs import readers as readers_of

WEIGHT_LAYOUT = "nk"  # recorded in decoder engines' cache key


def _as(layer, cls):
    layer.__class__ = cls
    return layer


def _weight_source(trt, layer, producers, readers):
    """(constant layer, broadcast shuffle or None) when input 1 of the GEMM `layer` is a 2-D constant
    read by it alone, directly or through a shuffle that only prepends 1s (the ONNX parser's
    broadcast of a MatMul weight), neither of them a network output; else None."""

    def only_here(t) -> bool:
        return len(readers.get(t.name, ())) == 1 and not t.is_network_output

    t = layer.get_input(1)
    src = producers.get(t.name)
    shuffle = None
    if src is not None and src.type == trt.LayerType.SHUFFLE and src.num_inputs == 1 and only_here(t):
        shuffle = _as(src, trt.IShuffleLayer)
        t = shuffle.get_input(0)
        src = producers.get(t.name)
    if src is None or src.type != trt.LayerType.CONSTANT or not only_here(t):
        return None
    const = _as(src, trt.IConstantLayer)
    shape = tuple(const.shape)
    if len(shape) != 2 or min(shape) < 2:
        return None
    if shuffle is not None and not _only_prepends_ones(shuffle, shape):
        return None
    return const, shuffle


def _only_prepends_ones(shuffle, shape: tuple) -> bool:
    """True when `shuffle` reshapes `shape` to (1, ..., 1, *shape) and permutes nothing."""
    if shuffle.reshape_dims is None:  # no reshape: a transpose alone
        return False
    dims = tuple(shuffle.reshape_dims)
    ident = tuple(range(len(dims)))
    return (tuple(shuffle.first_transpose)[:len(dims)] == ident and tuple(shuffle.second_transpose)[:len(dims)] == ident
            and dims[-2:] == shape and all(d == 1 for d in dims[:-2]))


class Gemm(NamedTuple):
    """A GEMM whose weight this module stored [N, K]: the layers and the new array."""
    mm: object  # IMatrixMultiplyLayer, op1 TRANSPOSE
    const: object  # IConstantLayer holding `weights`
    shuffle: object  # the parser's broadcast IShuffleLayer, or None
    weights: np.ndarray  # [N, K] float16


def transposed_gemms(flavor, network) -> list[Gemm]:
    """Stores every eligible GEMM weight of `network` as [N, K] and sets the GEMM to transpose it
    (module docstring). Returns them; their arrays must outlive the build."""
    trt = flavor.trt
    producers, readers = producers_of(network), readers_of(network)
    done = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type != trt.LayerType.MATRIX_MULTIPLY:
            continue
        mm = _as(layer, trt.IMatrixMultiplyLayer)
        if mm.op1 != trt.MatrixOperation.NONE:
            continue
        found = _weight_source(trt, mm, producers, readers)
        if found is None:
            continue
        const, shuffle = found
        w = const.weights
        if not isinstance(w, np.ndarray) or w.dtype != np.float16:  # measured on FP16 GEMMs; FP32 engines keep [K, N]
            continue
        k, n = tuple(const.shape)
        nk = np.ascontiguousarray(w.reshape(k, n).T)
        set_weight(const, shuffle, nk)
        mm.op1 = trt.MatrixOperation.TRANSPOSE
        done.append(Gemm(mm, const, shuffle, nk))
    return done


def set_weight(const, shuffle, weights: np.ndarray) -> None:
    """Gives the constant layer `weights` (2-D) and the broadcast shuffle behind it, if any, their shape."""
    const.shape = weights.shape
    const.weights = weights
    if shuffle is not None:
        dims = tuple(shuffle.reshape_dims)
        shuffle.reshape_dims = dims[:-2] + tuple(weights.shape)

