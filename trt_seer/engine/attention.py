"""The network's attention layers (the ONNX parser's `IAttention`, from ONNX `Attention` nodes:
export/engine_form.py) made decomposable: TensorRT runs each as its one fused kernel where it has one
for the shapes and types, and otherwise as the primitive layers it decomposes into, instead of
refusing the build ("Attention operation was not supported by a dedicated kernel": a head size of 8,
say). The ONNX graph is not changed.
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
