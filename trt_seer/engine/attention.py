"""The network's attention layers (the ONNX parser's `IAttention`, from ONNX `Attention` nodes:
export/engine_form.py) made decomposable: TensorRT runs each as its one fused kernel where it has one
for the shapes and types, and otherwise as the primitive layers it decomposes into, instead of
refusing the build ("Attention operation was not supported by a dedicated kernel": a head size of 8,
say). The ONNX graph is not changed.

In a packed encoder's network (an input `cu_seqlens`: export/packed.py), make_packed gives every
attention the packed form instead: q/k/v as [tokens, heads, head_dim], each sequence's bounds from
cu_seqlens and no mask, so attention costs the real tokens only.
"""
from __future__ import annotations

ATTENTION_PASS = "decomposable"  # recorded in the engine manifest's build section


def attention_layers(flavor, network) -> list:
    """The network's `IAttention`s, in layer order."""
    trt = flavor.trt
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if getattr(trt.LayerType, "ATTENTION_OUTPUT", None) is not None and layer.type == trt.LayerType.ATTENTION_OUTPUT:
            layer.__class__ = trt.IAttentionOutputLayer
            out.append(layer.attention)
    return out


def make_decomposable(flavor, network) -> int:
    """Marks every attention decomposable; returns how many the network has."""
    layers = attention_layers(flavor, network)
    for attention in layers:
        attention.decomposable = True
    return len(layers)


PACKED_PASS = "packed-nhd-1"  # recorded in a packed engine's manifest and cache key
CU_SEQLENS = "cu_seqlens"  # the network input that makes attention packed (engine/profiles.PACKED_BOUNDS)


def _input(network, name: str):
    for i in range(network.num_inputs):
        if network.get_input(i).name == name:
            return network.get_input(i)
    return None


def _readers(network, tensor) -> list[tuple]:
    """(layer, input index) of every layer reading `tensor`."""
    out = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        out.extend((layer, j) for j in range(layer.num_inputs) if layer.get_input(j) is not None
                   and layer.get_input(j).name == tensor.name)
    return out


def _to_nhd(trt, network, x, heads: int, head_dim: int):
    """[1, heads, tokens, head_dim] -> [tokens, heads, head_dim]."""
    shuffle = network.add_shuffle(x)
    shuffle.first_transpose = trt.Permutation([0, 2, 1, 3])  # (1, tokens, heads, d)
    shuffle.reshape_dims = (-1, heads, head_dim)
    return shuffle.get_output(0)


def _from_nhd(trt, network, x, heads: int, head_dim: int):
    """[tokens, heads, head_dim] -> [1, heads, tokens, head_dim]."""
    shuffle = network.add_shuffle(x)
    shuffle.reshape_dims = (1, -1, heads, head_dim)
    shuffle.second_transpose = trt.Permutation([0, 2, 1, 3])
    return shuffle.get_output(0)


def _pack_one(trt, network, attention, cu):
    """A packed attention computing what `attention` does; its readers now read it (the parsed one,
    read by nothing, is dropped by the builder). A new layer, since a parsed attention's mask can be
    replaced but not removed."""
    from trt_seer.errors import BuildError

    shape = tuple(attention.get_input(0).shape)  # (1, heads, tokens, head_dim)
    if len(shape) != 4 or min(shape[1], shape[3]) < 0:
        raise BuildError(f"attention {attention.name}: query of shape {list(shape)}; the packed form needs "
                         "(1, heads, tokens, head_dim) with heads and head_dim fixed")
    qkv = [attention.get_input(i) for i in range(3)]
    packed = network.add_attention_v2(*qkv, attention.norm_op, attention.causal_kind)
    packed.query_form = packed.key_value_form = trt.AttentionIOForm.PACKED_NHD
    for i, x in enumerate(qkv):
        packed.set_input(i, _to_nhd(trt, network, x, x.shape[1], x.shape[3]))
    packed.query_lengths = packed.key_value_lengths = cu
    packed.decomposable = attention.decomposable
    packed.name = f"{attention.name}_packed"
    back = _from_nhd(trt, network, packed.get_output(0), shape[1], shape[3])
    for layer, j in _readers(network, attention.get_output(0)):
        layer.set_input(j, back)
    return packed


def make_packed(flavor, network) -> int:
    """In a network with a `cu_seqlens` input (1-D INT32 cumulative token counts), every attention
    takes the packed form: q/k/v as [tokens, heads, head_dim], the sequences' bounds from
    cu_seqlens instead of a mask (TensorRT then attends inside each sequence only). Returns how many
    attentions changed (0 for a padded network)."""
    cu = _input(network, CU_SEQLENS)
    if cu is None:
        return 0
    layers = attention_layers(flavor, network)
    for attention in layers:
        _pack_one(flavor.trt, network, attention, cu)
    return len(layers)


def packed_attentions(flavor, network) -> list:
    """The network's attentions that take the packed form (after make_packed), in layer order."""
    packed = flavor.trt.AttentionIOForm.PACKED_NHD
    return [a for a in attention_layers(flavor, network) if a.query_form == packed]
