"""What token values and sequence lengths a model takes: the ids its embedding tables hold and the
positions it has, so that `validate_feeds` refuses token id 50000 or a 600-token sequence before
any work, instead of ONNX Runtime failing inside a Gather (or TensorRT reading past a table).

    limits = token_limits(record, onnx_path)       # from the record, else from the graph itself
    specs = limits.apply(specs)                     # IOSpecs with `id_range` / `max_positions` set

The record's (or engine manifest's) `limits` {vocab_size, type_vocab_size, max_positions} come
first. Without them the ONNX graph is read, without importing `onnx`: a graph input that indexes an
initializer (Gather, or a fused EmbedLayerNormalization) takes ids below that table's first
dimension, and a table named `position_embeddings` gives the positions. Token inputs the model
says nothing about still refuse negative ids.
"""
from __future__ import annotations

import dataclasses
import logging
import mmap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from trt_seer.runtime.io import IOSpec

log = logging.getLogger(__name__)
TOKEN_INPUTS = {"input_ids": "vocab_size", "token_type_ids": "type_vocab_size"}
NO_LIMIT = 2**63 - 1
PASS_THROUGH = ("DequantizeLinear", "Cast", "Identity")  # a table reached through these is still the table


@dataclass(frozen=True)
class TokenLimits:
    """`ids`: {input name: number of ids it may take}; `max_positions`: the longest sequence."""

    ids: dict
    max_positions: int | None = None

    def apply(self, specs: Sequence[IOSpec]) -> tuple[IOSpec, ...]:
        out = []
        for spec in specs:
            limit = self.ids.get(spec.name)
            if limit is None and spec.name in TOKEN_INPUTS:
                limit = NO_LIMIT  # nothing known but the sign
            id_range = (0, int(limit)) if limit is not None and spec.dtype.startswith("int") else None
            positions = self.max_positions if "seq" in spec.axes else None
            out.append(dataclasses.replace(spec, id_range=id_range, max_positions=positions))
        return tuple(out)


def token_limits(record: dict | None, onnx_path: Path | None) -> TokenLimits:
    """From the record's `limits` when it has them, else from the ONNX graph at `onnx_path`."""
    recorded = (record or {}).get("limits")
    if isinstance(recorded, dict):
        ids = {name: int(recorded[key]) for name, key in TOKEN_INPUTS.items() if recorded.get(key)}
        positions = recorded.get("max_positions")
        return TokenLimits(ids, int(positions) if positions else None)
    if onnx_path is not None and Path(onnx_path).is_file():
        try:
            return limits_from_onnx(Path(onnx_path))
        except (ValueError, IndexError, UnicodeDecodeError, OSError) as e:  # not a graph we can read
            log.debug("no token limits from %s: %s", onnx_path, e)
    return TokenLimits({})


def recorded_max_length(record: dict | None) -> tuple[int, str] | None:
    """(tokens, which setting) of the model's own length limit as its record says (records.token_limits)."""
    recorded = (record or {}).get("limits")
    if isinstance(recorded, dict) and isinstance(recorded.get("max_length"), int) and recorded["max_length"] > 0:
        return recorded["max_length"], str(recorded.get("max_length_from") or "max length")
    return None


def limits_from_onnx(path: Path) -> TokenLimits:
    """Token limits read from the graph's embedding tables (see the module docstring)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        graph = next((value for field, value in _fields(buf, 0, len(buf)) if field == 7), None)
        if graph is None:
            raise ValueError("no graph")
        nodes, tables = _graph(buf, *graph)
    producers = {out: (op, ins) for op, ins, outs in nodes for out in outs}

    def table(name: str) -> tuple[str, int] | None:
        for _ in range(4):
            if name in tables:
                return name, tables[name]
            op, ins = producers.get(name, ("", []))
            if op not in PASS_THROUGH or not ins:
                return None
            name = ins[0]
        return None

    ids, positions = {}, None
    for op, ins, _ in nodes:
        pairs = [(ins[1], ins[0])] if op == "Gather" and len(ins) >= 2 else []
        if op == "EmbedLayerNormalization":  # (input_ids, segment_ids, word, position, segment, ...)
            pairs = [(ins[0], ins[2]), (ins[1], ins[4])] if len(ins) >= 5 else []
            found = table(ins[3]) if len(ins) >= 4 else None
            positions = found[1] if found else positions
        for index, data in pairs:
            found = table(data)
            if found is None:
                continue
            if "position_embeddings" in found[0]:
                positions = found[1]
            elif index:
                ids[index] = found[1]
    return TokenLimits(ids, positions)


def _graph(buf, start: int, end: int) -> tuple[list, dict]:
    """([(op_type, inputs, outputs)], {initializer name: first dimension}) of a GraphProto."""
    nodes, tables = [], {}
    for field, value in _fields(buf, start, end):
        if field == 1:  # NodeProto: 1 input, 2 output, 4 op_type
            parts = {1: [], 2: [], 4: [""]}
            for f, v in _fields(buf, *value):
                if f in parts and isinstance(v, tuple):
                    parts[f].append(bytes(buf[v[0]:v[1]]).decode())
            nodes.append((parts[4][-1], parts[1], parts[2]))
        elif field == 5:  # TensorProto: 1 dims, 8 name
            dims, name = [], None
            for f, v in _fields(buf, *value):
                if f == 1:
                    dims.extend([v] if isinstance(v, int) else _packed(buf, *v))
                elif f == 8:
                    name = bytes(buf[v[0]:v[1]]).decode()
            if name is not None and len(dims) == 2:
                tables[name] = dims[0]
    return nodes, tables


def _fields(buf, start: int, end: int) -> Iterator[tuple[int, object]]:
    """(field number, int value or (start, end) of its bytes) of a protobuf message."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = (pos, pos + n), pos + n
        elif wire in (1, 5):
            value, pos = None, pos + (8 if wire == 1 else 4)
        else:
            raise ValueError(f"protobuf wire type {wire} at byte {pos}")
        yield key >> 3, value


def _packed(buf, start: int, end: int) -> list[int]:
    values, pos = [], start
    while pos < end:
        value, pos = _varint(buf, pos)
        values.append(value)
    return values


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def engine_token_limits(manifest: dict, engine_path: Path) -> TokenLimits:
    """An engine's limits: its manifest's, else those of the ONNX graph it was built from, if beside it."""
    source = (manifest.get("onnx") or {}).get("file")
    return token_limits(manifest, Path(engine_path).with_name(source) if source else None)
