"""A decoder's TensorRT network: `present` outputs -> `new_key_values` outputs, so the engine gives
only the step's own keys and values and the runtime keeps one copy of the cache.

The exported graph (decoder_io) computes `present.{i}.key = Concat(past_key_values.{i}.key, new, axis
seq)` and outputs it: the window + the new token, written every step, and a second buffer of the
cache's size to hold it. Here, after parsing, each such Concat's second input becomes the output
`new_key_values.{i}.key` ([batch, kv_heads, seq, head_dim]) and `present` is no longer an output
(TensorRT keeps the Concat for the attention, in its own scratch). The ONNX graph is not changed:
ONNX Runtime and every check of the graph still see `present`.
"""
from __future__ import annotations

from trt_seer.decoder_io import PRESENT_PREFIX, PAST_PREFIX, NEW_PREFIX
from trt_seer.errors import BuildError

KV_OUTPUTS = "new"  # recorded in decoder engines' build settings (and so in their cache key)


def producers(network) -> dict:
    """{tensor name: the layer that produces it} over `network`."""
    out = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            out[layer.get_output(j).name] = layer
    return out


def readers(network) -> dict:
    """{tensor name: [(layer, input index), ...]}: every layer input that reads it, over `network`."""
    out = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_inputs):
            t = layer.get_input(j)
            if t is not None:
                out.setdefault(t.name, []).append((layer, j))
    return out


def mark_new_kv_outputs(flavor, network) -> int:
    """Replaces every `present.*` output of `network` by its `new_key_values.*`; returns how many.
    BuildError when a `present` output is not the Concat of its past input and one other tensor."""
    presents = [t for t in (network.get_output(i) for i in range(network.num_outputs))
                if t.name.startswith(PRESENT_PREFIX)]
    producers_of = producers(network) if presents else {}
    for present in presents:
        suffix = present.name.removeprefix(PRESENT_PREFIX)
        layer = producers_of.get(present.name)
        if (layer is None or layer.type != flavor.trt.LayerType.CONCATENATION or layer.num_inputs != 2
                or layer.get_input(0).name != PAST_PREFIX + suffix or layer.get_input(1).is_network_input):
            raise BuildError(f"{present.name} is not Concat({PAST_PREFIX}{suffix}, new) in the parsed "
                             "network: re-export the decoder")
        new = layer.get_input(1)
        network.unmark_output(present)
        new.name = NEW_PREFIX + suffix
        network.mark_output(new)
    return len(presents)
