"""engine/gemm_fusion.py on networks the ONNX parser makes: which GEMMs sharing an activation become
one over a stacked weight, how their outputs are sliced back, and which stay apart."""
import numpy as np
import pytest

from tiny import parsed_network
from trt_seer.engine import gemm_fusion, trt
from trt_seer.engine.weight_layout import transposed_gemms

pytestmark = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
K, SIZES = 8, (16, 4, 4)  # q, k, v of a grouped-query layer


def _graph(path, rng):
    """x [b, s, K] float16 into three MatMuls (q, k, v) whose outputs feed Relu / Sigmoid / Neg; a
    fourth MatMul on another activation (Relu of x); and a pair on x2 whose first output is also a
    network output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = {f"w{i}": rng.standard_normal((K, n)).astype(np.float16) for i, n in enumerate(SIZES)}
    weights.update(w_other=rng.standard_normal((K, K)).astype(np.float16),
                   w_p0=rng.standard_normal((K, 4)).astype(np.float16), w_p1=rng.standard_normal((K, 4)).astype(np.float16))
    nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"], name=f"mm{i}") for i in range(3)]
    nodes += [helper.make_node("Relu", ["y0"], ["q"]), helper.make_node("Sigmoid", ["y1"], ["k"]),
              helper.make_node("Neg", ["y2"], ["v"]), helper.make_node("Relu", ["x"], ["xr"]),
              helper.make_node("MatMul", ["xr", "w_other"], ["other"], name="mm_other"),
              helper.make_node("MatMul", ["x2", "w_p0"], ["p0"], name="mm_p0"),
              helper.make_node("MatMul", ["x2", "w_p1"], ["p1"], name="mm_p1")]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, ["b", "s", K]) for n in ("x", "x2")]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None) for n in ("q", "k", "v", "other", "p0", "p1")]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outs,
                                                [numpy_helper.from_array(w, n) for n, w in weights.items()]),
                              opset_imports=[helper.make_opsetid("", 21)])
    onnx.save(model, str(path))
    return weights


def _by_name(network) -> dict:
    layers = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        layers[layer.name] = layer
    return layers


def test_gemms_sharing_an_activation_read_one_stacked_weight(tmp_path):
    weights = _graph(tmp_path / "g.onnx", np.random.default_rng(0))
    flavor, _builder, network, _parser = parsed_network(tmp_path / "g.onnx")
    t = flavor.trt
    gemms = transposed_gemms(flavor, network)
    assert len(gemms) == 6
    kept, folded = gemm_fusion.fuse_shared_input_gemms(flavor, network, gemms)
    assert folded == 2  # k and v into q; the x2 pair stays apart (p0 is a network output), `other` alone
    stacked = next(a for a in kept if a.shape == (sum(SIZES), K))
    assert np.array_equal(stacked, np.concatenate([weights[f"w{i}"].T for i in range(3)]))
    first = next(g for g in gemms if "mm0" in g.mm.name)
    assert tuple(first.mm.get_input(1).shape)[-2:] == (sum(SIZES), K)
    # each reader of q, k, v now reads a slice of the stacked GEMM's output, in order, at its own width
    layers = _by_name(network)
    for name, (offset, width) in {"q": (0, 16), "k": (16, 4), "v": (20, 4)}.items():
        reader = next(layer for layer in layers.values() if layer.num_outputs and layer.get_output(0).name == name)
        src = reader.get_input(0)
        slice_layer = next(layer for layer in layers.values()
                           if layer.type == t.LayerType.SLICE and layer.get_output(0).name == src.name)
        slice_layer.__class__ = t.ISliceLayer
        assert slice_layer.get_input(0).name == first.mm.get_output(0).name
        assert tuple(slice_layer.start)[-1] == offset and tuple(src.shape)[-1] == width
    # the folded GEMMs' own weights are emptied; the unfused keep theirs
    for g in gemms:
        if "mm1" in g.mm.name or "mm2" in g.mm.name:
            assert tuple(g.const.shape) == (1, 1)
        elif g is not first:
            assert tuple(g.const.shape) == g.weights.shape and any(a is g.weights for a in kept)


def test_stacks_over_the_size_limit_stay_apart(tmp_path, monkeypatch):
    _graph(tmp_path / "g.onnx", np.random.default_rng(0))
    flavor, _builder, network, _parser = parsed_network(tmp_path / "g.onnx")
    gemms = transposed_gemms(flavor, network)
    monkeypatch.setattr(gemm_fusion, "MAX_STACKED_BYTES", sum(SIZES) * K * 2 - 1)  # q + k + v is one byte over
    kept, folded = gemm_fusion.fuse_shared_input_gemms(flavor, network, gemms)
    assert folded == 0 and len(kept) == len(gemms)
    assert all(tuple(g.const.shape) == g.weights.shape for g in gemms)


def test_a_fused_network_builds_an_engine(tmp_path):
    """The builder takes the rewired network: slices with dynamic batch and length, GEMMs left
    without readers."""
    _graph(tmp_path / "g.onnx", np.random.default_rng(0))
    flavor, builder, network, _parser = parsed_network(tmp_path / "g.onnx")
    kept, folded = gemm_fusion.fuse_shared_input_gemms(flavor, network, transposed_gemms(flavor, network))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("x", "x2"):
        profile.set_shape(name, (1, 1, K), (2, 3, K), (4, 8, K))
    config.add_optimization_profile(profile)
    blob = builder.build_serialized_network(network, config)
    assert folded == 2 and blob is not None and blob.nbytes > 0


def test_gemms_reading_the_activation_differently_stay_apart():
    """Two GEMMs on one input, one of them reading it transposed: not one GEMM."""
    flavor = trt.load()
    t = flavor.trt
    builder = t.Builder(trt.logger(flavor))
    network = trt.strongly_typed_network(flavor, builder)
    x = network.add_input("x", t.float16, (K, K))
    for op0 in (t.MatrixOperation.NONE, t.MatrixOperation.TRANSPOSE):
        w = network.add_constant((K, 4), np.ones((K, 4), np.float16)).get_output(0)
        y = network.add_matrix_multiply(x, op0, w, t.MatrixOperation.NONE).get_output(0)
        network.mark_output(network.add_activation(y, t.ActivationType.RELU).get_output(0))
    gemms = transposed_gemms(flavor, network)
    assert len(gemms) == 2
    assert gemm_fusion.fuse_shared_input_gemms(flavor, network, gemms)[1] == 0
