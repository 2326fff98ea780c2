"""runtime/texts.py and `trt-seer run --file`: one length limit (the engine profile's and the
model's own), texts sorted by length into batches of at most the engine's largest batch, results in
input order, one warning per run naming the truncated count and the limit. A tiny BERT with a
word-level tokenizer is built once (FP16 engine, batch 1..4, seq 8..32); without a GPU its CPU form
runs, as it does on this machine."""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from tiny import make_tiny_checkpoint

from trt_seer.runtime import load
from trt_seer.runtime.texts import LengthLimit, TextRunner, length_batches

MODEL_MAX = 24  # the checkpoint's sentence-transformers max_seq_length, under the profile's 32
LARGEST_BATCH = 4
WORDS = 100


def write_tokenizer(ckpt):
    """A word-level tokenizer that wraps each text in [CLS] ... [SEP], as BERT's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, **{f"w{i}": i + 4 for i in range(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tok.save(str(ckpt / "tokenizer.json"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("texts")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp / "ckpt")
    write_tokenizer(ckpt)
    (ckpt / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": MODEL_MAX}))
    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), "--fp16",
                        "--batch", f"1,2,{LARGEST_BATCH}", "--seq", "8,16,32", "--out", str(tmp / "out")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return tmp / "out" / "ckpt.fp16.engine"


def texts_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{i}" for i in rng.integers(0, WORDS, n)) for n in lengths]


class CountingModel:
    """The loaded model, with the batch size of every call it runs kept."""

    def __init__(self, model):
        self.model, self.rows = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def infer(self, feeds, *args, **kwargs):
        self.rows.append(len(feeds["input_ids"]))
        return self.model.infer(feeds, *args, **kwargs)


def quiet_load(path):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the CPU fallback's notice
        return load(path)


def test_the_manifest_records_the_models_own_length(engine):
    limits = json.loads(engine.with_name("ckpt.fp16.manifest.json").read_text())["limits"]
    assert limits["max_length"] == MODEL_MAX and limits["max_length_from"] == "sentence-transformers max_seq_length"


def test_batches_sorted_by_length_return_the_one_at_a_time_results_in_input_order(engine):
    lengths = [3, 17, 1, 9, 9, 20, 2, 14, 5, 11, 7]
    texts = texts_of(lengths)
    with quiet_load(engine) as model:
        counted = CountingModel(model)
        runner = TextRunner.open(counted, engine)
        rows = runner.run(texts)
        assert counted.rows and max(counted.rows) <= LARGEST_BATCH and sum(counted.rows) == len(texts)
        one = TextRunner.open(model, engine, max_batch=1)
        alone = [one.run([t])[0] for t in texts]
    for row, single in zip(rows, alone):
        np.testing.assert_allclose(row["sentence_embedding"], single["sentence_embedding"], rtol=1e-5, atol=1e-6)
        assert row["last_hidden_state"].shape == single["last_hidden_state"].shape  # cut to the text's own length
    first = {n: i for i, n in reversed(list(enumerate(lengths)))}
    assert rows[first[9]]["last_hidden_state"].shape[0] == 9 + 2  # [CLS] and [SEP]


def test_length_batches_sort_stably_and_never_exceed_the_largest_batch():
    batches = length_batches([5, 1, 5, 3, 1, 9, 2], 3)
    assert batches == [[1, 4, 6], [3, 0, 2], [5]]


def test_a_text_over_the_models_length_is_cut_to_it_with_one_warning(engine, caplog):
    long, short = texts_of([40, 35, 4])[:2], texts_of([4])[0]
    with quiet_load(engine) as model, caplog.at_level(logging.WARNING, logger="trt_seer.runtime.texts"):
        runner = TextRunner.open(model, engine)
        rows = runner.run([long[0], short, long[1]])
        cut = runner.run([" ".join(long[0].split()[:MODEL_MAX - 2])])[0]  # the words that fit beside [CLS], [SEP]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"warning: 2 of 3 texts were longer than {MODEL_MAX} tokens and were truncated")
    assert "the limit of the model's sentence-transformers max_seq_length; the engine profile's max seq is 32" in warnings[0]
    assert runner.limit == LengthLimit(MODEL_MAX, runner.limit.known)
    np.testing.assert_allclose(rows[0]["sentence_embedding"], cut["sentence_embedding"], rtol=1e-5, atol=1e-6)


def test_the_engine_profile_limits_when_it_is_the_shorter(engine, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((engine.parent.parent / "ckpt" / "tokenizer.json").read_bytes())
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 64}))
    with quiet_load(engine) as model:
        record = dict(model.manifest)
        model.manifest = {k: v for k, v in record.items() if k != "limits"}  # as a record from before `max_length`
        runner = TextRunner.open(model, engine, tokenizer_dir=tmp_path)
    assert runner.limit.tokens == 32 and runner.limit.applied == "the engine profile's max seq"
    assert runner.limit.known["the model's sentence-transformers max_seq_length"] == 64


def test_run_file_keeps_input_order_and_warns_once(engine, tmp_path):
    lengths = [30, 2, 12, 1, 40, 6, 3]
    texts = texts_of(lengths, seed=3)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    r = subprocess.run([sys.executable, "-m", "trt_seer", "run", str(engine), "--file", str(tmp_path / "texts.txt"), "--json"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [row["text"] for row in doc["results"]] == texts
    truncation = [line for line in r.stderr.splitlines() if "were truncated" in line]
    assert truncation == [f"warning: 2 of 7 texts were longer than {MODEL_MAX} tokens and were truncated to {MODEL_MAX} "
                          "(the limit of the model's sentence-transformers max_seq_length; the engine profile's max seq "
                          "is 32; the model's max positions is 128)"]
    with quiet_load(engine) as model:
        one = TextRunner.open(model, engine, max_batch=1)
        for row, text in zip(doc["results"], texts):
            np.testing.assert_allclose(row["embedding"], one.run([text])[0]["sentence_embedding"], rtol=1e-5, atol=1e-6)


def test_diff_and_the_gates_tokenize_to_the_models_length_too(engine):
    from trt_seer.eval.evaluate import EvalSpec, eval_batches
    from trt_seer.export.families import resolve_model

    info = resolve_model(engine.parent.parent / "ckpt")
    widths = {b["input_ids"].shape[1] for b in eval_batches(info, EvalSpec(samples=32, batch=8))}
    assert max(widths) == MODEL_MAX, widths  # held-out sentences run longer; the profile would allow 256


def test_progress_bar_only_on_a_terminal_or_a_long_file(monkeypatch):
    from trt_seer.cli import run

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert run._progress(50, LARGEST_BATCH).disable and not run._progress(run.LONG_RUN, LARGEST_BATCH).disable
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert not run._progress(50, LARGEST_BATCH).disable
    assert run._progress(LARGEST_BATCH, LARGEST_BATCH).disable  # one batch: nothing to follow
