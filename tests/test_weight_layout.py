"""engine/weight_layout.py on networks the ONNX parser makes: which GEMM weights become [N, K] with a
transposed multiply, and which keep their layout."""
import numpy as np
import pytest

from tiny import parsed_network
from trt_seer.engine import kv_outputs, trt
from trt_seer.engine.weight_layout import transposed_gemms

pytestmark = pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
K, N = 8, 16


def _graph(path):
    """x [b, s, K] (float16) into: MatMul by a weight of its own (w_own [K, N]); two MatMuls sharing
    one weight (w_shared); a MatMul by a dequantized INT8 weight; a MatMul by another activation;
    and a float32 x32 by a float32 weight of its own (w_fp32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    own = rng.standard_normal((K, N)).astype(np.float16)
    shared = rng.standard_normal((K, K)).astype(np.float16)
    inits = [numpy_helper.from_array(own, "w_own"), numpy_helper.from_array(shared, "w_shared"),
             numpy_helper.from_array(rng.integers(-127, 127, (K, K)).astype(np.int8), "w_q"),
             numpy_helper.from_array(np.full(K, 0.01, np.float16), "w_scale"),
             numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "w_fp32")]
    nodes = [helper.make_node("MatMul", ["x", "w_own"], ["y_own"], name="own"),
             helper.make_node("MatMul", ["x", "w_shared"], ["y_shared"], name="shared_a"),
             helper.make_node("MatMul", ["y_shared", "w_shared"], ["y_shared2"], name="shared_b"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale"], ["w_dq"], axis=1),
             helper.make_node("MatMul", ["x", "w_dq"], ["y_dq"], name="dq"),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["x", "xt"], ["y_act"], name="act"),
             helper.make_node("MatMul", ["x32", "w_fp32"], ["y_fp32"], name="fp32")]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["b", "s", K])
    x32 = helper.make_tensor_value_info("x32", TensorProto.FLOAT, ["b", "s", K])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, None)
            for n in ("y_own", "y_shared2", "y_dq", "y_act")] + [
            helper.make_tensor_value_info("y_fp32", TensorProto.FLOAT, None)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, x32], outs, inits),
                              opset_imports=[helper.make_opsetid("", 21)])
    onnx.save(model, str(path))
    return own


def _matmuls(flavor, network) -> dict:
    out = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type == flavor.trt.LayerType.MATRIX_MULTIPLY:
            layer.__class__ = flavor.trt.IMatrixMultiplyLayer
            out[layer.name] = layer
    return out


def _constant_of(flavor, network, tensor):
    """The constant layer behind `tensor`, through the parser's broadcast shuffle."""
    producers = kv_outputs.producers(network)
    layer = producers[tensor.name]
    if layer.type == flavor.trt.LayerType.SHUFFLE:
        layer = producers[layer.get_input(0).name]
    assert layer.type == flavor.trt.LayerType.CONSTANT
    layer.__class__ = flavor.trt.IConstantLayer
    return layer


def test_only_a_weight_read_by_one_gemm_alone_is_transposed(tmp_path):
    own = _graph(tmp_path / "g.onnx")
    flavor, _builder, network, _parser = parsed_network(tmp_path / "g.onnx")
    kept = [g.weights for g in transposed_gemms(flavor, network)]
    layers = _matmuls(flavor, network)
    ops = {name.removeprefix("node_"): layer.op1 for name, layer in layers.items()}
    transposed = sorted(n for n, op in ops.items() if op == flavor.trt.MatrixOperation.TRANSPOSE)
    assert len(layers) == 6 and len(kept) == 1 and len(transposed) == 1 and "own" in transposed[0]
    mm = next(layer for name, layer in layers.items() if "own" in name)
    const = _constant_of(flavor, network, mm.get_input(1))
    assert tuple(const.shape) == (N, K)
    assert np.array_equal(np.asarray(const.weights).reshape(N, K), own.T)
    assert tuple(mm.get_input(1).shape)[-2:] == (N, K)  # the broadcast shuffle follows the new shape


def test_a_second_pass_changes_nothing(tmp_path):
    """A GEMM that already transposes its weight is left alone (the pass is not a toggle)."""
    _graph(tmp_path / "g.onnx")
    flavor, _builder, network, _parser = parsed_network(tmp_path / "g.onnx")
    assert len(transposed_gemms(flavor, network)) == 1
    assert transposed_gemms(flavor, network) == []


def _network(flavor):
    builder = flavor.trt.Builder(trt.logger(flavor))
    return builder, trt.strongly_typed_network(flavor, builder)


def _gemm_on(flavor, network, weight_tensor, x_shape=(2, K)):
    x = network.add_input(f"x{network.num_inputs}", flavor.trt.float16, x_shape)
    none = flavor.trt.MatrixOperation.NONE
    mm = network.add_matrix_multiply(x, none, weight_tensor, none)
    network.mark_output(mm.get_output(0))
    return mm


def test_weights_left_alone_on_networks_made_by_hand():
    """A 2-D activation on a constant read directly is transposed; a constant that is also a network
    output, one behind a shuffle that only transposes, and one on input 0 are not."""
    flavor = trt.load()
    t = flavor.trt
    w = np.arange(K * N, dtype=np.float16).reshape(K, N)
    _builder, network = _network(flavor)
    direct = _gemm_on(flavor, network, network.add_constant((K, N), w).get_output(0))
    shown = network.add_constant((K, N), w.copy())
    _gemm_on(flavor, network, shown.get_output(0))
    network.mark_output(shown.get_output(0))
    flip = network.add_shuffle(network.add_constant((N, K), np.ascontiguousarray(w.T)).get_output(0))
    flip.first_transpose = (1, 0)
    behind_flip = _gemm_on(flavor, network, flip.get_output(0))
    first = network.add_constant((N, K), np.ascontiguousarray(w.T))
    y = network.add_input("y", t.float16, (K, 2))
    network.mark_output(network.add_matrix_multiply(first.get_output(0), t.MatrixOperation.NONE, y,
                                                    t.MatrixOperation.NONE).get_output(0))
    kept = [g.weights for g in transposed_gemms(flavor, network)]
    assert len(kept) == 1 and np.array_equal(kept[0], w.T)
    assert direct.op1 == t.MatrixOperation.TRANSPOSE and tuple(direct.get_input(1).shape) == (N, K)
    assert tuple(shown.get_output(0).shape) == (K, N)  # the network output keeps its shape
    assert tuple(flip.get_output(0).shape) == (K, N) and behind_flip.op1 == t.MatrixOperation.NONE
    assert tuple(first.shape) == (N, K)
