"""Checkpoint -> verified ONNX for every family and task; mismatches, bad checkpoints and
external-data saving."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from tiny import HIDDEN, NUM_LABELS, VOCAB

from trt_seer import files
from trt_seer.export import checkpoint as export
from trt_seer.export import onnxio
from trt_seer.errors import ExportMismatchError, InputError, UnsupportedError
from trt_seer.export.families import TASKS, TESTED_DECODERS, TESTED_ENCODERS, TESTED_FAMILIES, resolve_model

FE, TC, LM = "feature-extraction", "text-classification", "causal-lm"
CASES = [  # one task per family, every task several times; tiny configs in tests/tiny.py
    ("bert", FE), ("electra", TC), ("distilbert", TC), ("roberta", FE), ("xlm-roberta", TC), ("mpnet", FE),
    ("deberta-v2", TC), ("albert", FE), ("camembert", TC), ("mobilebert", FE), ("ernie", TC),
    ("roformer", FE), ("deberta", TC), ("modernbert", FE),
    ("gpt2", LM), ("llama", TC), ("qwen2", FE), ("mistral", LM), ("qwen3", LM), ("gemma", LM),
    ("phi3", TC), ("gpt_neox", LM), ("opt", LM), ("stablelm", LM),
]
DECODERS = {"gpt2", "llama", "qwen2", "mistral", "qwen3", "gemma", "phi3", "gpt_neox", "opt", "stablelm"}
FAST = {("bert", FE), ("distilbert", TC), ("albert", FE), ("camembert", TC), ("gpt2", LM)}  # < 10 s each
STATIC_DIMS = {  # (task, output) -> sizes of the axes that are not batch/seq
    ("feature-extraction", "last_hidden_state"): {2: HIDDEN},
    ("feature-extraction", "sentence_embedding"): {1: HIDDEN},
    ("text-classification", "logits"): {1: NUM_LABELS},
}


def _case(model_type, task):
    marks = () if (model_type, task) in FAST else (pytest.mark.slow,)
    return pytest.param(model_type, task, marks=marks, id=f"{model_type}-{task}")


def _dims(value_info) -> list:
    """Each dimension as its symbol (str) when dynamic, its size (int) when static."""
    return [d.dim_param if d.HasField("dim_param") else d.dim_value
            for d in value_info.type.tensor_type.shape.dim]


def _assert_dynamic_io(onnx_path, info):
    import onnx

    graph = onnx.load(str(onnx_path)).graph
    assert [v.name for v in graph.input] == list(info.inputs)
    assert [v.name for v in graph.output] == list(info.outputs)
    batch, seq = _dims(graph.input[0])
    assert isinstance(batch, str) and isinstance(seq, str) and batch != seq
    for v in graph.input:
        assert v.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert _dims(v) == [batch, seq], v.name
    symbols = {"batch": batch, "seq": seq}
    for v in graph.output:
        assert v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        expected = {**{axis: symbols[s] for axis, s in TASKS[info.task].outputs[v.name].items()},
                    **STATIC_DIMS[(info.task, v.name)]}
        assert _dims(v) == [expected[i] for i in range(len(expected))], v.name


@pytest.mark.parametrize("model_type,task", [_case(*c) for c in CASES if c[1] != "causal-lm"])
def test_export_matches_pytorch(tiny_checkpoint, tmp_path, model_type, task):
    info = resolve_model(tiny_checkpoint(model_type, task))
    dest = tmp_path / f"{model_type}.fp32.onnx"

    report = export.onnx_from_checkpoint(info, dest)

    assert report["shapes"] == [list(s) for s in export.VERIFY_SHAPES]
    assert set(report["outputs"]) == set(TASKS[task].outputs)
    for name, r in report["outputs"].items():
        assert 0.0 <= r["max_abs_diff"] <= r["allowed"], name
        assert r["max_abs_diff"] < export.Tolerance().atol, name  # FP32 graphs agree far closer
    _assert_dynamic_io(dest, info)
    assert not onnxio.data_path(dest).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dest.name, info.path.name])


def test_matrix_covers_the_listed_families():
    """Encoders here; the decoders' generation matrix is tests/test_generate.py's."""
    assert sorted({m for m, _ in CASES} - DECODERS) == sorted(TESTED_ENCODERS) and len(TESTED_FAMILIES) >= 16
    assert DECODERS <= set(TESTED_DECODERS)


KV_DECODERS = ["gpt2", "llama", "qwen2", "mistral", "qwen3", "gemma", "phi3"]  # exported with a KV cache


@pytest.mark.parametrize("model_type", [pytest.param(m, marks=() if m == "llama" else (pytest.mark.slow,))
                                        for m in KV_DECODERS])
def test_decoder_export_with_kv_cache(tiny_checkpoint, tmp_path, model_type):
    import onnx

    from trt_seer.export import decoder
    from trt_seer.decoder_io import decoder_io, exported_outputs

    info = resolve_model(tiny_checkpoint(model_type, "causal-lm"))
    shape = decoder.decoder_shape(info.config)
    dest = tmp_path / f"{model_type}.fp32.onnx"

    report = export.onnx_from_checkpoint(info, dest)

    assert report["cases"] == [list(c) for c in decoder.VERIFY_CASES]
    assert {c[2] for c in report["cases"]} >= {0} and max(c[2] for c in report["cases"]) > 0
    for name, r in report["outputs"].items():
        assert r["max_abs_diff"] < export.Tolerance().atol, name
    graph = onnx.load(str(dest)).graph
    inputs, outputs = decoder_io(shape.num_layers)
    assert [v.name for v in graph.input] == list(inputs)
    assert [v.name for v in graph.output] == list(exported_outputs(shape.num_layers)) == [*outputs, "next_token"]
    dims = {v.name: _dims(v) for v in list(graph.input) + list(graph.output)}
    batch, seq = dims["input_ids"]
    assert isinstance(batch, str) and isinstance(seq, str) and dims["position_ids"] == [batch, seq]
    assert dims["logits"] == [batch, 1, VOCAB] and dims["next_token"] == [batch, 1]
    past = dims["past_key_values.0.key"]
    assert past[0] == batch and past[1:] == [shape.num_kv_heads, past[2], shape.head_dim]
    assert isinstance(past[2], str) and dims["present.0.key"][2] not in (past[2], seq)
    if model_type != "gpt2":  # the tiny configs use grouped-query attention
        assert shape.num_kv_heads < info.config["num_attention_heads"]
    rotations = sum(n.op_type == "Neg" for n in graph.node)  # rotate_half negates once per rotated tensor
    assert rotations == (0 if model_type == "gpt2" else shape.num_layers)  # q and k stacked: one per layer


def test_decoder_verify_catches_graph_of_other_weights(tiny_checkpoint, tmp_path):
    from trt_seer.export import decoder

    ours = resolve_model(tiny_checkpoint("llama", "causal-lm", seed=0))
    other = resolve_model(tiny_checkpoint("llama", "causal-lm", seed=1))
    dest = tmp_path / "other.onnx"
    decoder.onnx_from_decoder(other, dest)
    shape = decoder.decoder_shape(ours.config)
    step = decoder.wrap_decoder(decoder.load_decoder(ours), shape)
    with pytest.raises(ExportMismatchError, match=r"on logits at batch=3 seq=7 past=0: max \|Δ\|") as e:
        decoder.verify_decoder(step, shape, dest, ours.name, export.Tolerance())
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_type,task", CASES)
def test_family_read_from_transformers(tiny_checkpoint, model_type, task):
    info = resolve_model(tiny_checkpoint(model_type, task))
    assert (info.model_type, info.task) == (model_type, task)  # task from `architectures`
    assert info.family.kind == ("decoder" if model_type in DECODERS else "encoder")
    assert set(info.family.tasks) == {FE, TC, LM} if model_type in DECODERS else {FE, TC}
    assert info.inputs[:2] == ("input_ids", "attention_mask")


@pytest.mark.parametrize("model_type,overrides,takes_types", [
    ("bert", {}, True), ("bert", {"type_vocab_size": 1}, False), ("roberta", {}, False),
    ("deberta-v2", {}, False), ("distilbert", {}, False), ("albert", {}, True), ("llama", {}, False),
])
def test_token_type_ids_only_where_they_carry_something(tiny_checkpoint, model_type, overrides, takes_types):
    info = resolve_model(tiny_checkpoint(model_type, FE, **overrides))
    assert ("token_type_ids" in info.inputs) is takes_types


def test_sample_inputs_pad_both_sides_with_pad_id(tiny_checkpoint):
    info = resolve_model(tiny_checkpoint("roberta", "feature-extraction"))
    feeds = export.sample_inputs(info, 3, 12)
    mask, ids = feeds["attention_mask"], feeds["input_ids"]
    assert list(feeds) == list(info.inputs)
    assert mask[0, -1] == 0 and mask[0, 0] == 1  # right padding
    assert mask[2, 0] == 0 and mask[2, -1] == 1  # left padding
    assert mask[1].all()
    assert (ids[mask == 0] == info.config["pad_token_id"]).all()
    assert (ids[mask == 1] != info.config["pad_token_id"]).all()


def test_verify_catches_graph_of_other_weights(tiny_checkpoint, tmp_path):
    ours = resolve_model(tiny_checkpoint("bert", "feature-extraction", seed=0))
    other = resolve_model(tiny_checkpoint("bert", "feature-extraction", seed=1))
    dest = tmp_path / "other.onnx"
    export.onnx_from_checkpoint(other, dest)

    with pytest.raises(ExportMismatchError, match=r"on last_hidden_state: max \|Δ\| \d[\d.e+-]* > ") as e:
        export.verify(export.wrap(export.load_model(ours), ours), ours, dest)
    assert "\n" not in str(e.value)


def test_failed_verification_removes_the_onnx(tiny_checkpoint, tmp_path):
    info = resolve_model(tiny_checkpoint("distilbert", "text-classification"))
    dest = tmp_path / "m.onnx"
    with pytest.raises(ExportMismatchError, match=r"on logits: max \|Δ\|"):
        export.onnx_from_checkpoint(info, dest, export.Tolerance(atol=0.0, rtol=0.0))  # bit-exact
    assert not dest.exists() and not onnxio.data_path(dest).exists()


def _one_line_error(exc_type, match, *args):
    with pytest.raises(exc_type, match=match) as e:
        resolve_model(*args)
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    return str(e.value)


def test_resolve_missing_directory(tmp_path):
    _one_line_error(InputError, "model directory not found", tmp_path / "nope")


def test_resolve_directory_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    _one_line_error(InputError, r"no config\.json", tmp_path)


def test_resolve_unreadable_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    _one_line_error(InputError, r"unreadable config\.json", tmp_path)


@pytest.mark.parametrize("config,needle", [
    ({"model_type": "t5", "architectures": ["T5Model"]}, "'t5' .*: only text encoders and decoders"),
    ({"model_type": "vit"}, "'vit' .*: only text encoders and decoders"),
    ({"model_type": "no-such-model"}, r"'no-such-model' .*: transformers \S+ has no such model type"),
])
def test_resolve_unsupported_model_type(tmp_path, config, needle):
    (tmp_path / "config.json").write_text(json.dumps(config))
    _one_line_error(UnsupportedError, "unsupported architecture " + needle, tmp_path)


@pytest.mark.parametrize("model_type,task,tasks", [("bert", LM, (FE, TC)), ("llama", "token-classification", (LM, TC, FE))])
def test_resolve_unsupported_task(tiny_checkpoint, model_type, task, tasks):
    ckpt = tiny_checkpoint(model_type, FE)
    msg = _one_line_error(UnsupportedError, f"task '{task}' is not supported for {model_type}", ckpt, task)
    assert msg.endswith("choose one of: " + ", ".join(tasks))


def _untranslatable(body):
    """A module as wrap() gives the exporter (inputs positional) whose forward is `body`."""
    import torch

    class Module(torch.nn.Module):
        def forward(self, *args):  # (input_ids, attention_mask)
            return body(*args)

    return Module()


def test_export_failure_is_one_line_naming_the_op(tiny_checkpoint, tmp_path):
    """An operator the ONNX translator has no function for fails with the project's one-line error
    naming it, exit code 2, and leaves no file."""
    import torch

    info = resolve_model(tiny_checkpoint("distilbert", TC))
    dest = tmp_path / "m.onnx"
    with pytest.raises(UnsupportedError, match=r"^ONNX export of \S+ \(distilbert\) failed at aten\.cummax: ") as e:
        export._export(_untranslatable(lambda ids, mask: torch.cummax(ids.float(), dim=1)[0]), info, dest)
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    assert not dest.exists()


def test_untraceable_export_failure_is_one_line(tiny_checkpoint, tmp_path):
    info = resolve_model(tiny_checkpoint("distilbert", TC))

    def branchy(ids, mask):  # branching on a tensor's value: torch.export cannot capture it
        return ids.float() * 2 if int(mask.sum().item()) > 3 else ids.float()

    with pytest.raises(UnsupportedError, match=r"^ONNX export of \S+ \(distilbert\) failed: \w+: .*data-dependent") as e:
        export._export(_untranslatable(branchy), info, tmp_path / "m.onnx")
    assert "\n" not in str(e.value)


def _bytes_in_data_file(onnx_path) -> int:
    """Bytes of initializers the graph file points into its `.data` file (which must exist)."""
    import onnx

    assert onnxio.data_path(onnx_path).is_file()
    graph = onnxio.load(onnx_path, load_external_data=False).graph
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert all(e.value == onnxio.data_path(onnx_path).name
               for t in external for e in t.external_data if e.key == "location")
    return sum(int(e.value) for t in external for e in t.external_data if e.key == "length")


def test_external_data_export_and_save(tiny_checkpoint, tmp_path, monkeypatch):
    import onnxruntime as ort

    monkeypatch.setattr(onnxio, "EXTERNAL_DATA_THRESHOLD", 1024)
    info = resolve_model(tiny_checkpoint("distilbert", "feature-extraction"))
    exported = tmp_path / "exported.onnx"
    export.onnx_from_checkpoint(info, exported)  # verified with ONNX Runtime from the split files
    assert _bytes_in_data_file(exported) > 50_000  # the word embeddings alone are 16 KB

    model = onnxio.load(exported)
    saved = onnxio.save(model, tmp_path / "saved.onnx")
    data = onnxio.data_path(saved)
    assert _bytes_in_data_file(saved) == data.stat().st_size
    assert _bytes_in_data_file(saved) >= _bytes_in_data_file(exported)

    feeds = export.sample_inputs(info, 2, 9)
    want = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"]).run(None, feeds)
    for source in (str(saved), model.SerializeToString()):  # the caller's model is still whole
        got = ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

    digest = onnxio.sha256(saved)
    assert digest == hashlib.sha256(saved.read_bytes() + data.read_bytes()).hexdigest()
    assert digest != files.sha256_file(saved)
    with open(data, "r+b") as f:  # one weight byte changed must change the hash
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))
    assert onnxio.sha256(saved) != digest

    monkeypatch.undo()
    onnxio.save(model, saved)  # under the real threshold: one self-contained file, stale data gone
    assert not data.exists()
    got = ort.InferenceSession(str(saved), providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging dirs left


def test_decoder_next_token_must_be_the_argmax_of_the_logits(tiny_checkpoint, tmp_path):
    """The export's next_token output (ArgMax in the graph) is checked against ONNX Runtime's own
    logits: a graph whose next_token is another token is rejected, in one line."""
    import onnx

    from trt_seer.export import decoder

    info = resolve_model(tiny_checkpoint("llama", "causal-lm"))
    shape = decoder.decoder_shape(info.config)
    dest = tmp_path / "llama.fp32.onnx"
    decoder.onnx_from_decoder(info, dest)
    model = onnx.load(str(dest))
    argmax = [n for n in model.graph.node if n.op_type == "ArgMax"]
    assert len(argmax) == 1
    argmax[0].op_type = "ArgMin"
    onnx.save(model, str(dest))
    step = decoder.wrap_decoder(decoder.load_decoder(info), shape)
    with pytest.raises(ExportMismatchError, match=r"next_token at batch=3 seq=7 past=0 is not the argmax") as e:
        decoder.verify_decoder(step, shape, dest, info.name, export.Tolerance())
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_type,overrides,window", [
    ("llama", {}, None), ("mistral", {}, 32), ("qwen2", {"use_sliding_window": False, "sliding_window": 64}, None),
    ("qwen2", {"use_sliding_window": True, "sliding_window": 64}, 64)])
def test_decoder_record_says_whether_attention_slides(tiny_checkpoint, tmp_path, model_type, overrides, window):
    """The record's decoder.sliding_window (None: full attention) is what lets the runtime keep a
    sequence left-aligned in its cache window (one position copied per step, not the window)."""
    from trt_seer.export import decoder

    info = resolve_model(tiny_checkpoint(model_type, "causal-lm", **overrides))
    section = decoder.decoder_section(info, tmp_path / f"{model_type}.fp16.onnx")
    assert "sliding_window" in section and section["sliding_window"] == window


@pytest.mark.parametrize("batch, heads, kv_heads, seq, total", [(2, 8, 2, 1, 257), (3, 4, 4, 7, 7), (1, 8, 1, 1, 300),
                                                               (2, 8, 2, 3, 640)])
def test_chunked_attention_is_eager_attention(batch, heads, kv_heads, seq, total):
    """export/attention.py against transformers' eager attention, grouped heads and a padded row
    included, at cache lengths that do and do not split evenly into its chunks."""
    import types

    import torch
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from trt_seer.export.attention import attention

    gen = torch.Generator().manual_seed(batch + total)
    q = torch.randn(batch, heads, seq, 32, generator=gen)
    k, v = (torch.randn(batch, kv_heads, total, 32, generator=gen) for _ in range(2))
    mask = torch.zeros(batch, 1, seq, total)
    mask[-1, ..., : total // 3] = torch.finfo(torch.float32).min
    module = types.SimpleNamespace(num_key_value_groups=heads // kv_heads, training=False)
    want, _ = eager_attention_forward(module, q, k, v, mask, scaling=32 ** -0.5)
    got, _ = attention(module, q, k, v, mask, scaling=32 ** -0.5)
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5)


def test_chunked_attention_export_verifies_and_gives_eagers_logits(tiny_checkpoint, tmp_path):
    """--attention chunked: the graph verifies against PyTorch like the eager one, its record says
    so, and ONNX Runtime's logits equal the eager graph's on the same feeds."""
    import json
    from dataclasses import replace

    from trt_seer.export import decoder
    from trt_seer.export.attention import CHUNKS
    from trt_seer.runtime.ort import create_session

    info = resolve_model(tiny_checkpoint("llama", "causal-lm"))
    shape = decoder.decoder_shape(info.config)
    graphs, reports = {}, {}
    for form in ("eager", "chunked"):
        graphs[form] = tmp_path / f"{form}.fp32.onnx"
        reports[form] = decoder.onnx_from_decoder(replace(info, attention=form), graphs[form])
    assert decoder.decoder_section(replace(info, attention="chunked"), graphs["chunked"])["attention"] == "chunked"
    # the check ran over caches whose chunks hold several positions, not only one
    assert max(seq + past for _, seq, past in reports["chunked"]["cases"]) > 2 * CHUNKS
    for past in (37, 3 * CHUNKS + 9):  # decode steps over caches of one and of several positions a chunk
        feeds = decoder.sample_feeds(shape, 3, 1, past, seed=4)
        eager, chunked = (create_session(graphs[f]).run(["logits"], feeds)[0] for f in ("eager", "chunked"))
        assert np.allclose(eager, chunked, atol=1e-4), (past, float(np.abs(eager - chunked).max()))
    assert json.loads(json.dumps(replace(info, attention="chunked").to_dict()))["attention"] == "chunked"


def test_a_row_of_padding_alone_is_left_out_of_the_logits_compared():
    """The export check compares the logits of rows that end with a real token and the cache at
    real positions; a row without any real token has no next token to compare."""
    from trt_seer.export.decoder import defined

    logits = np.arange(12, dtype=np.float32).reshape(3, 1, 4)
    mask = np.array([[1, 1], [0, 1], [0, 0]])
    assert np.array_equal(defined("logits", logits, mask), logits[:2])
    cache = np.arange(3 * 2 * 2 * 1, dtype=np.float32).reshape(3, 2, 2, 1)  # (batch, kv_heads, positions, dim)
    assert defined("present.0.key", cache, mask).shape == (3, 2, 1)


def test_stacked_rotary_gives_the_models_own_rotation_to_the_bit():
    """export/rotary.py: q and k rotated as one tensor equal Llama's function on each; outside the
    context the modeling module has its own function back."""
    import torch
    from transformers.models.llama import modeling_llama

    from trt_seer.export.rotary import stacked, stacked_rotary

    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 8, 5, 16, generator=gen), torch.randn(2, 2, 5, 16, generator=gen)
    cos, sin = torch.randn(2, 5, 16, generator=gen), torch.randn(2, 5, 16, generator=gen)
    original = modeling_llama.apply_rotary_pos_emb
    want = original(q, k, cos, sin)
    got = stacked(original)(q, k, cos, sin)
    assert all(torch.equal(g, w) for g, w in zip(got, want)) and got[0].shape == q.shape
    heads = []  # how many heads each call of the wrapped function saw
    spy = stacked(lambda q, k, *a, **kw: heads.append(q.shape[1]) or (q, k))
    spy(q, k, cos, sin)
    spy(q, k, cos, sin, torch.zeros(2, 5))  # an older signature's position_ids: left as it was
    spy(q, k, cos, sin, unsqueeze_dim=2)
    spy(q, k[:, :, :4], cos, sin)  # key positions that differ from the query's
    assert heads == [10, 8, 8, 8]
    model = type("LlamaForCausalLM", (), {"__module__": modeling_llama.__name__})()
    with stacked_rotary(model):
        assert modeling_llama.apply_rotary_pos_emb is not original
        with stacked_rotary(model):  # entered twice: wrapped once
            assert modeling_llama.apply_rotary_pos_emb.stacked_from is original
    assert modeling_llama.apply_rotary_pos_emb is original


def test_stacked_rotary_takes_only_the_plain_form():
    """GPT-J's `apply_rotary_pos_emb(tensor, sin, cos)` (and anything not giving the stacked result
    to the bit) is left to the model; Llama's and GPT-NeoX's partial form are stacked."""
    from transformers.models.gpt_neox import modeling_gpt_neox
    from transformers.models.gptj import modeling_gptj
    from transformers.models.llama import modeling_llama

    from trt_seer.export.rotary import plain_form, stacked_rotary

    assert plain_form(modeling_llama.apply_rotary_pos_emb) and plain_form(modeling_gpt_neox.apply_rotary_pos_emb)
    assert not plain_form(modeling_gptj.apply_rotary_pos_emb)
    assert not plain_form(lambda q, k, cos, sin: (q * q.shape[1], k))  # depends on the head count
    original = modeling_gptj.apply_rotary_pos_emb
    with stacked_rotary(type("GPTJForCausalLM", (), {"__module__": modeling_gptj.__name__})()):
        assert modeling_gptj.apply_rotary_pos_emb is original
