"""trt_seer.finetune on tiny BERT checkpoints (CPU): AMP, gradient accumulation, ZeRO-1 over two
gloo processes, the output checkpoint, metrics and bad input; and --task causal-lm on a tiny Llama."""
from __future__ import annotations

import json
import logging
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import make_tiny_checkpoint

from trt_seer.cli import main
from trt_seer.errors import InputError
from trt_seer.finetune import (
    AmpSpec,
    DataSpec,
    FinetuneSpec,
    checkpoint,
    data,
    finetune,
    monitor,
)

TOPICS = ("sports", "health", "business", "tech")
SPECIAL = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # ids 0..4; tiny.py's pad id is 0
CUES = {t: [f"{t}{k}" for k in range(6)] for t in TOPICS}  # words that give the label away
FILLER = [f"w{k}" for k in range(24)]  # words every class uses
VOCAB = SPECIAL + [w for words in CUES.values() for w in words] + FILLER  # 53 tokens < tiny's 128


def save_tokenizer(dest: Path) -> None:
    """A WordPiece tokenizer over VOCAB with BERT's [CLS] x [SEP] template."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]",
                                   model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    fast.save_pretrained(str(dest))


def tiny_bert(dest: Path, **overrides) -> Path:
    """Tiny BERT for 4-way classification, dropout off (so runs are deterministic), plus tokenizer.
    64 hidden units: at tiny.py's 32 some seeds stall at 2 of 4 classes."""
    kwargs = {"hidden_size": 64, "intermediate_size": 128, **overrides}
    make_tiny_checkpoint("bert", "text-classification", dest, num_labels=4, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, **kwargs)
    save_tokenizer(dest)
    return dest


def toy_rows(n: int, seed: int) -> list[dict]:
    """A learnable task: three cue words name the topic among 1-5 filler words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topic = rng.choice(TOPICS)
        words = rng.sample(CUES[topic], 3) + [rng.choice(FILLER) for _ in range(rng.randint(1, 5))]
        rng.shuffle(words)
        rows.append({"text": " ".join(words), "label": topic})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def spec(tmp: Path, model: Path, out: str = "out", **kw) -> FinetuneSpec:
    kw.setdefault("data", DataSpec(train=tmp / "train.jsonl", eval=tmp / "eval.jsonl"))
    return FinetuneSpec(out=tmp / out, model=model, device="cpu", **{"lr": 3e-3, "batch": 8, **kw})


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("toy")
    tiny_bert(tmp / "bert")
    write_jsonl(tmp / "train.jsonl", toy_rows(192, seed=1))
    write_jsonl(tmp / "eval.jsonl", toy_rows(64, seed=2))
    return tmp


@pytest.fixture(scope="module")
def trained(toy) -> Path:
    """One bf16 run on the toy task, shared by the output tests."""
    return finetune(spec(toy, toy / "bert", "bf16", amp=AmpSpec("bf16"), epochs=3))


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".")]


# -- AMP ---------------------------------------------------------------------------------------

def test_bf16_on_cpu_trains_and_loss_decreases(trained):
    record = json.loads((trained / "training.json").read_text())
    epochs = record["metrics"]["epochs"]
    assert record["settings"]["amp"]["mode"] == "bf16" and record["hardware"]["device"] == "cpu"
    assert epochs[-1]["train_loss"] < 0.5 * epochs[0]["train_loss"]
    assert epochs[-1]["eval_loss"] < epochs[0]["eval_loss"]
    assert epochs[-1]["eval_accuracy"] > 0.8  # chance is 0.25
    assert record["metrics"]["skipped_steps"] == 0 and epochs[-1]["loss_scale"] is None  # no scaler


def test_fp16_without_cuda_is_refused_before_anything_is_written(toy, capsys):
    with pytest.raises(InputError, match="--amp bf16"):
        finetune(spec(toy, toy / "bert", "fp16", amp=AmpSpec("fp16")))
    code = main(["finetune", "--model", str(toy / "bert"), "--train", str(toy / "train.jsonl"),
                 "--amp", "fp16", "--device", "cpu", "--out", str(toy / "fp16")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--amp bf16" in err
    assert not (toy / "fp16").exists() and not leftovers(toy)


def test_help_says_fp16_needs_cuda_and_bf16_works_on_cpu(capsys):
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "needs a CUDA GPU; on CPU use bf16" in text and "--zero1" in text


@pytest.mark.gpu
def test_fp16_loss_scaler_counts_overflowed_steps(toy):
    """The scaler path itself (CUDA only): an absurd initial scale overflows and is backed off."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("fp16 loss scaling needs a CUDA GPU")
    out = finetune(FinetuneSpec(out=toy / "fp16-gpu", model=toy / "bert", device="cuda", batch=16,
                                amp=AmpSpec("fp16", init_scale=2.0**40), epochs=2,
                                data=DataSpec(toy / "train.jsonl", toy / "eval.jsonl")))
    record = json.loads((out / "training.json").read_text())
    assert record["metrics"]["skipped_steps"] >= 1
    assert record["metrics"]["epochs"][-1]["loss_scale"] < 2.0**40


# -- gradient accumulation -----------------------------------------------------------------------

def step_once(model_dir: Path, data_spec: DataSpec, micro_sizes: list[int], task: str = "text-classification"):
    """One optimizer step's backward over the first training examples, in micro-batches of the
    given sizes. Returns (gradients by parameter name, the step's loss, the collated micro-batches)."""
    import torch

    from trt_seer.finetune.distributed import Context
    from trt_seer.finetune.objective import for_task
    from trt_seer.finetune.train import backward, make_trainer

    objective = for_task(task)
    info = checkpoint.resolve(model_dir, task)
    tokenizer = checkpoint.load_tokenizer(info)
    dataset = objective.load_data(data_spec)
    encoded = objective.encode(dataset.train, tokenizer, 64)
    model = objective.load_model(info, dataset, tokenizer.pad_token_id, seed=0)
    run = FinetuneSpec(model=model_dir, task=task, data=data_spec, accum=len(micro_sizes), device="cpu")
    tr = make_trainer(model, run, Context(torch.device("cpu")), 10, tokenizer.pad_token_id)
    starts = [sum(micro_sizes[:i]) for i in range(len(micro_sizes))]
    indices = [list(range(s, s + n)) for s, n in zip(starts, micro_sizes)]
    micro = [data.collate(encoded, i, tokenizer.pad_token_id) for i in indices]
    loss, _ = backward(tr, [dict(m) for m in micro], sum(objective.units(encoded, i) for i in indices))
    return {name: p.grad.clone() for name, p in tr.module.named_parameters()}, float(loss), micro


def grads_after(model_dir: Path, data_spec: DataSpec, micro_sizes: list[int],
                task: str = "text-classification") -> dict:
    return step_once(model_dir, data_spec, micro_sizes, task)[0]


def assert_same_gradients(accumulated: dict, large: dict) -> None:
    import torch

    assert accumulated.keys() == large.keys()
    for name, g in large.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(accumulated[name], g, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("micro_sizes", [[4, 4, 4, 4], [5, 5, 3]])
def test_accumulated_gradients_equal_one_large_batch(toy, micro_sizes):
    files = DataSpec(train=toy / "train.jsonl", eval=toy / "eval.jsonl")
    assert_same_gradients(grads_after(toy / "bert", files, micro_sizes),
                          grads_after(toy / "bert", files, [sum(micro_sizes)]))


# -- ZeRO-1 over two processes -------------------------------------------------------------------

@pytest.mark.slow
def test_zero1_two_gloo_processes_match_one_process(toy):
    """torchrun, 2 CPU processes x batch 4 with ZeRO-1 == 1 process x batch 8: same losses; each
    rank holds about half of AdamW's state."""
    args = ["--model", str(toy / "bert"), "--train", str(toy / "train.jsonl"), "--eval", str(toy / "eval.jsonl"),
            "--device", "cpu", "--lr", "3e-3", "--epochs", "1", "--max-steps", "8"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "trt_seer", "finetune", *args, "--batch", "4", "--zero1", "--out", str(toy / "zero")],
                       capture_output=True, text=True, env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    single = finetune(spec(toy, toy / "bert", "single", epochs=1, max_steps=8))
    zero, one = (json.loads((d / "training.json").read_text()) for d in (toy / "zero", single))
    assert zero["settings"]["processes"] == 2 and zero["settings"]["effective_batch"] == 8
    losses = [[r["loss"] for r in monitor.read_metrics(d / "metrics.jsonl") if r["kind"] == "step"]
              for d in (toy / "zero", single)]
    assert len(losses[0]) == len(losses[1]) == 8
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    shards, (whole,) = zero["metrics"]["optimizer_state_bytes_per_rank"], one["metrics"]["optimizer_state_bytes_per_rank"]
    assert len(shards) == 2 and sum(shards) == pytest.approx(whole, rel=0.01)
    assert all(0.35 * whole < s < 0.65 * whole for s in shards)


def test_zero1_without_torchrun_is_refused(toy):
    with pytest.raises(InputError, match="torchrun"):
        finetune(spec(toy, toy / "bert", "z", zero1=True))


# -- output ------------------------------------------------------------------------------------

def test_output_is_a_hugging_face_checkpoint(trained, toy):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(str(trained)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(trained))
    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "business", "1": "health", "2": "sports", "3": "tech"}
    assert config["label2id"]["tech"] == 3
    rows = toy_rows(32, seed=3)
    with torch.no_grad():
        logits = model(**tokenizer([r["text"] for r in rows], padding=True, return_tensors="pt")).logits
    predicted = [model.config.id2label[i] for i in logits.argmax(-1).tolist()]
    assert sum(p == r["label"] for p, r in zip(predicted, rows)) / len(rows) > 0.8
    assert not leftovers(toy)


def test_training_json_metrics_jsonl_and_png(trained):
    record = json.loads((trained / "training.json").read_text())
    assert record["data"] == {"source": str(trained.parent / "train.jsonl"), "train_examples": 192,
                              "eval_examples": 64, "labels": ["business", "health", "sports", "tech"], "max_seq": 128}
    assert record["settings"]["master_weights"] == "fp32" and record["hardware"]["torch"]
    rows = monitor.read_metrics(trained / "metrics.jsonl")
    steps, epochs = [r for r in rows if r["kind"] == "step"], [r for r in rows if r["kind"] == "epoch"]
    assert len(steps) == record["metrics"]["optimizer_steps"] == 3 * 24  # 192 / 8 per epoch
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and epochs == record["metrics"]["epochs"]
    for e in epochs:
        assert e["tokens_per_s"] > e["samples_per_s"] > 0 and e["peak_memory_bytes"] > 0
        assert 0 <= e["eval_accuracy"] <= 1
    png = trained / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread
    assert imread(str(png)).shape[:2] == (360, 1100)


def test_rerun_replaces_an_earlier_output_but_not_other_directories(tmp_path):
    earlier = tmp_path / "ckpt"
    earlier.mkdir()
    (earlier / checkpoint.TRAINING_FILE).write_text("{}")
    checkpoint.check_out(earlier)
    staged = checkpoint.stage(earlier)
    (staged / "config.json").write_text("{}")
    checkpoint.publish(staged, earlier)
    assert sorted(p.name for p in earlier.iterdir()) == ["config.json"] and not leftovers(tmp_path)
    other = tmp_path / "src"
    other.mkdir()
    (other / "main.py").write_text("")
    with pytest.raises(InputError, match="not a finetune output"):
        checkpoint.check_out(other)


def test_failure_during_training_leaves_nothing(toy, tmp_path):
    """Token ids beyond the model's vocabulary fail in the first forward: no --out, no temp dir."""
    model = tiny_bert(tmp_path / "small-vocab", vocab_size=20)
    with pytest.raises(IndexError):
        finetune(spec(toy, model, out=str(tmp_path / "never")))
    assert not (tmp_path / "never").exists() and not leftovers(tmp_path)


# -- data --------------------------------------------------------------------------------------

def test_embedded_topics_split_every_tenth_line():
    dataset = data.load_dataset(DataSpec())
    assert dataset.labels == ("business", "health", "sports", "tech") and dataset.source == "embedded:topics"
    assert 0.09 < len(dataset.eval) / (len(dataset.train) + len(dataset.eval)) < 0.11
    again = data.load_dataset(DataSpec())
    assert dataset.eval == again.eval and {e.label for e in dataset.eval} == {0, 1, 2, 3}
    assert not {e.text for e in dataset.eval} & {e.text for e in dataset.train}


def test_csv_with_integer_labels_and_named_fields(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("body,y\n" + "".join(f"text number {i},{i % 3}\n" for i in range(20)))
    dataset = data.load_dataset(DataSpec(train=path, text_field="body", label_field="y", num_labels=4))
    assert dataset.labels == ("LABEL_0", "LABEL_1", "LABEL_2", "LABEL_3")
    assert [e.label for e in dataset.train[:4]] == [0, 1, 2, 0] and len(dataset.eval) == 2


def test_length_bucketed_batches_cover_every_example_once_with_little_padding():
    rng = random.Random(0)
    lengths = [rng.randint(3, 120) for _ in range(1000)]
    batches = data.plan_batches(lengths, 16, seed=5)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert batches != data.plan_batches(lengths, 16, seed=6)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert padded < 1.1 * sum(lengths)  # random batches would pad to ~2x
    encoded = data.Encoded([{"input_ids": [7] * n} for n in (3, 9)], [0, 1])
    batch = data.collate(encoded, [0, 1], pad_id=0)
    assert batch["input_ids"].shape == (2, 16) and batch["attention_mask"].sum(1).tolist() == [3, 9]
    coarse = data.collate(encoded, [0, 1], pad_id=0, multiple=data.COMPILED_PAD_MULTIPLE)  # under --compile
    assert coarse["input_ids"].shape == (2, 32) and coarse["attention_mask"].sum(1).tolist() == [3, 9]
    shapes = {data.collate(data.Encoded([{"input_ids": [7] * n}], [0]), [0], 0, 32)["input_ids"].shape[1]
              for n in range(1, 129)}
    assert shapes == {32, 64, 96, 128}  # every length up to 128 in four compiled shapes


# -- bad input ---------------------------------------------------------------------------------

BAD = {
    "missing text field": ('{"txt": "a", "label": "x"}\n', "jsonl", [], "no field 'text'"),
    "missing label column": ("text,category\na,x\nb,y\n", "csv", [], "no column 'label'"),
    "empty file": ("", "jsonl", [], "has no examples"),
    "label beyond --num-labels": ('{"text": "a", "label": 0}\n{"text": "b", "label": 5}\n', "jsonl",
                                  ["--num-labels", "3"], "not one of the 3 labels"),
    "more names than --num-labels": (('{"text": "a", "label": "x"}\n{"text": "b", "label": "y"}\n'
                                      '{"text": "c", "label": "z"}\n'), "jsonl", ["--num-labels", "2"],
                                     "found 3 labels"),
    "unknown amp": ('{"text": "a", "label": "x"}\n', "jsonl", ["--amp", "fp8"], "unknown --amp 'fp8'"),
    "not json": ("{text: a}\n", "jsonl", [], "not valid JSON"),
    "unsupported format": ("a\tb\n", "tsv", [], "use .jsonl or .csv"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(toy, tmp_path, capsys, case):
    text, ext, extra, needle = BAD[case]
    train = tmp_path / f"train.{ext}"
    train.write_text(text)
    out = tmp_path / "out"
    code = main(["finetune", "--model", str(toy / "bert"), "--train", str(train), "--device", "cpu",
                 "--out", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [train.name]


@pytest.mark.parametrize("content", ['{"version": "1.0", "model": 42}', '{"version": "1.0", "model": '])
def test_corrupt_tokenizer_json_is_bad_input(toy, tmp_path, capsys, content):
    import shutil

    model = tmp_path / "bert"
    shutil.copytree(toy / "bert", model)
    (model / "tokenizer.json").write_text(content)
    code = main(["finetune", "--model", str(model), "--train", str(toy / "train.jsonl"), "--device", "cpu",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "tokenizer.json" in err, err
    assert not (tmp_path / "out").exists()


def _can_mount() -> bool:
    import shutil

    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-rm", "true"], capture_output=True).returncode == 0


def in_mount_namespace(mount_point: Path, *cmd) -> subprocess.CompletedProcess:
    """Runs `cmd` in a private mount namespace where `mount_point` is a fresh tmpfs."""
    mount_point.mkdir()
    script = 'mount -t tmpfs none "$0" && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, str(mount_point), *map(str, cmd)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not _can_mount(), reason="no private mount namespace (unshare -rm) here")
def test_out_on_a_mount_point_is_refused_before_training(toy, tmp_path):
    r = in_mount_namespace(tmp_path / "mnt", sys.executable, "-m", "trt_seer", "finetune", "--model", toy / "bert",
                           "--train", toy / "train.jsonl", "--eval", toy / "eval.jsonl", "--device", "cpu",
                           "--max-steps", "2", "--out", tmp_path / "mnt")
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1, err
    assert "is a mount point" in err and "epoch" not in r.stdout + r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mnt"]


@pytest.mark.skipif(not _can_mount(), reason="no private mount namespace (unshare -rm) here")
def test_a_finished_checkpoint_that_cannot_be_renamed_is_kept(tmp_path):
    staged = tmp_path / ".out.partial"
    staged.mkdir()
    (staged / "model.safetensors").write_bytes(b"weights")
    script = ("import sys; from pathlib import Path; from trt_seer.finetune import checkpoint\n"
              "try:\n    checkpoint.publish(Path(sys.argv[1]), Path(sys.argv[2]))\n"
              "except checkpoint.NotPublishedError as e:\n    print(e.kept)\n"
              "    print(sorted(p.name for p in Path(sys.argv[2]).iterdir()))")
    r = in_mount_namespace(tmp_path / "out", sys.executable, "-c", script, staged, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == [str(staged), "[]"]  # named, and --out left as it was
    assert (staged / "model.safetensors").read_bytes() == b"weights"


def test_eval_label_unseen_in_training_is_refused(toy, tmp_path):
    write_jsonl(tmp_path / "eval.jsonl", [{"text": "w1", "label": "weather"}])
    with pytest.raises(InputError, match="eval label 'weather'"):
        finetune(spec(toy, toy / "bert", data=DataSpec(toy / "train.jsonl", tmp_path / "eval.jsonl")))


@pytest.mark.skipif(not __import__("trt_seer.engine.trt", fromlist=["available"]).available(),
                    reason="no TensorRT / TensorRT-RTX importable")
def test_finetune_output_builds_an_fp16_engine(trained, tmp_path):
    """The whole seed pipeline: fine-tune (bf16, CPU) -> build --fp16 -> a real engine."""
    import json
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "trt_seer", "build", "--model", str(trained), "--fp16",
                        "--batch", "1,2,4", "--seq", "8,16,32", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "TQDM_DISABLE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    name = trained.resolve().name
    m = json.loads((tmp_path / f"{name}.fp16.manifest.json").read_text())
    assert m["task"] == "text-classification" and m["io"]["outputs"][0]["name"] == "logits"
    assert (tmp_path / m["engine"]["file"]).stat().st_size == m["engine"]["size_bytes"]
    assert m["accuracy_of_source_graph"]["onnx_vs_fp32"]["top1_agreement"] >= 0.95


# -- causal-lm ---------------------------------------------------------------------------------

LM_SPECIAL = ["<unk>", "<s>", "</s>"]  # ids 0, 1, 2 as in tiny.py's decoders; no pad token
LM_WORDS = [f"v{k}" for k in range(40)]


def save_lm_tokenizer(dest: Path) -> None:
    """A word-level tokenizer that prepends <s> (as Llama's does) and has no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(LM_SPECIAL + LM_WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                            model_input_names=["input_ids", "attention_mask"]).save_pretrained(str(dest))


def lm_lines(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(LM_WORDS) for _ in range(rng.randint(4, 10))) for _ in range(n)]


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Path:
    """A tiny random Llama (causal LM) with its tokenizer, and 8 lines of text."""
    tmp = tmp_path_factory.mktemp("lm")
    make_tiny_checkpoint("llama", "causal-lm", tmp / "llama")
    save_lm_tokenizer(tmp / "llama")
    (tmp / "corpus.txt").write_text("\n".join(lm_lines(8, seed=1)) + "\n")
    return tmp


def lm_spec(lm: Path, out: str, **kw) -> FinetuneSpec:
    files = DataSpec(train=lm / "corpus.txt", eval=lm / "corpus.txt")
    return FinetuneSpec(out=lm / out, model=lm / "llama", task="causal-lm", device="cpu",
                        **{"data": files, "lr": 1e-2, "batch": 4, **kw})


@pytest.fixture(scope="module")
def lm_trained(lm) -> Path:
    """bf16, 15 epochs x 2 steps over the same 8 lines (memorisation), evaluated on them."""
    return finetune(lm_spec(lm, "lm-out", amp=AmpSpec("bf16"), epochs=15))


def test_causal_lm_memorises_a_repeated_corpus(lm_trained):
    rows = monitor.read_metrics(lm_trained / "metrics.jsonl")
    steps, epochs = [r for r in rows if r["kind"] == "step"], [r for r in rows if r["kind"] == "epoch"]
    assert len(steps) == 30 and len(epochs) == 15
    assert steps[-1]["loss"] < 0.5 * steps[0]["loss"]
    assert epochs[-1]["eval_loss"] < 0.5 * epochs[0]["eval_loss"]
    for e in epochs:
        assert "eval_accuracy" not in e
        assert math.isfinite(e["eval_perplexity"]) and e["eval_perplexity"] == pytest.approx(math.exp(e["eval_loss"]))
    record = json.loads((lm_trained / "training.json").read_text())
    assert record["task"] == "causal-lm" and record["data"]["labels"] == []
    assert record["data"]["train_examples"] == record["data"]["eval_examples"] == 8
    assert record["metrics"]["final"] == {k: epochs[-1][k] for k in ("train_loss", "eval_loss", "eval_perplexity")}
    assert (lm_trained / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_causal_lm_output_reloads_with_transformers(lm_trained, lm):
    """A plain HF causal-LM directory: the reloaded model's loss on the corpus is the recorded one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((lm_trained / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["pad_token_id"] is not None
    tokenizer = AutoTokenizer.from_pretrained(str(lm_trained))
    assert tokenizer.pad_token == tokenizer.eos_token == "</s>"  # pad = eos: the base had no pad token
    model = AutoModelForCausalLM.from_pretrained(str(lm_trained)).eval()
    lines = (lm / "corpus.txt").read_text().splitlines()
    total, predicted = 0.0, 0
    with torch.no_grad():
        for line in lines:
            ids = torch.tensor([tokenizer(line)["input_ids"] + [tokenizer.eos_token_id]])  # (1, seq)
            total += model(input_ids=ids, labels=ids).loss.item() * (ids.shape[1] - 1)  # HF: mean over seq - 1
            predicted += ids.shape[1] - 1
    mean = total / predicted
    final = json.loads((lm_trained / "training.json").read_text())["metrics"]["final"]
    assert mean == pytest.approx(final["eval_loss"], rel=0.05)  # the run evaluated under bf16 autocast
    assert not leftovers(lm)


def test_causal_lm_documents_get_eos_and_padding_is_ignored(lm):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(lm / "llama"))
    docs = [data.Example("v1 v2"), data.Example("v3 v4 v5 v6 v7 v8")]
    encoded = data.encode_documents(docs, tokenizer, max_seq=5)
    assert [f["input_ids"] for f in encoded.features] == [[1, 4, 5, 2], [1, 6, 7, 8, 9]]  # cut short: no EOS
    batch = data.collate(encoded, [0, 1], pad_id=2)
    assert batch["labels"].tolist() == [[1, 4, 5, 2] + [-100] * 4, [1, 6, 7, 8, 9] + [-100] * 3]
    assert batch["input_ids"][0].tolist() == [1, 4, 5, 2, 2, 2, 2, 2]  # padded with EOS, labelled -100


@pytest.mark.parametrize("micro_sizes", [[3, 3, 2], [1, 7]])
def test_causal_lm_accumulated_gradients_equal_one_large_batch(lm, micro_sizes):
    """Lines of different lengths, so micro-batches pad differently and hold different token counts."""
    files = DataSpec(train=lm / "corpus.txt", eval=lm / "corpus.txt")
    assert_same_gradients(grads_after(lm / "llama", files, micro_sizes, "causal-lm"),
                          grads_after(lm / "llama", files, [8], "causal-lm"))


@pytest.mark.slow
def test_causal_lm_zero1_two_gloo_processes_match_one_process(lm):
    """The token-weighted loss under torchrun: 2 processes x batch 2 with ZeRO-1 == 1 x batch 4."""
    args = ["--task", "causal-lm", "--model", str(lm / "llama"), "--train", str(lm / "corpus.txt"),
            "--device", "cpu", "--lr", "1e-2", "--epochs", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        "-m", "trt_seer", "finetune", *args, "--batch", "2", "--zero1", "--out", str(lm / "zero")],
                       capture_output=True, text=True, env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    single = finetune(lm_spec(lm, "single", data=DataSpec(train=lm / "corpus.txt"), epochs=3))
    losses = [[r["loss"] for r in monitor.read_metrics(d / "metrics.jsonl") if r["kind"] == "step"]
              for d in (lm / "zero", single)]
    assert len(losses[0]) == len(losses[1]) == 6
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    assert json.loads((lm / "zero" / "training.json").read_text())["settings"]["effective_batch"] == 4


def test_causal_lm_step_loss_is_the_transformers_token_mean(lm):
    """The loss trained on is what transformers computes for the batch: mean over predicted tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    _, loss, (batch,) = step_once(lm / "llama", DataSpec(train=lm / "corpus.txt"), [8], "causal-lm")
    assert (batch["labels"] == -100).any()  # lines differ in length: the batch has padding
    model = AutoModelForCausalLM.from_pretrained(str(lm / "llama")).eval()
    with torch.no_grad():
        expected = model(**batch).loss  # shifts the labels and ignores -100 itself
    assert loss == pytest.approx(float(expected), rel=1e-5)


def test_causal_lm_default_data_is_the_calib_corpus():
    dataset = data.load_corpus(DataSpec())
    corpus = Path(__file__).resolve().parents[1] / "calib" / "default.txt"
    lines = [line for line in corpus.read_text().splitlines() if line.strip()]
    assert dataset.source == "calib/default.txt" and [e.text for e in dataset.train] == lines
    assert len(dataset.eval) > 100 and all(e.label is None for e in dataset.train + dataset.eval)


def test_causal_lm_jsonl_text_field_and_held_out_tenth(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"body": f"document {i}"} for i in range(20)])
    dataset = data.load_corpus(DataSpec(train=path, text_field="body"))
    assert [e.text for e in dataset.eval] == ["document 9", "document 19"] and len(dataset.train) == 18


LM_BAD = {
    "encoder checkpoint": (None, "text", [], "needs a"),
    "empty corpus": (None, "\n  \n", [], "has no examples"),
    "jsonl without the text field": ("c.jsonl", '{"content": "a b"}\n', [], "no field 'text'"),
    "num-labels": (None, "v1 v2\n", ["--num-labels", "3"], "--num-labels is for text-classification"),
}


@pytest.mark.parametrize("case", sorted(LM_BAD))
def test_causal_lm_bad_input_is_one_line_exit_2_and_writes_nothing(lm, toy, tmp_path, capsys, case):
    name, text, extra, needle = LM_BAD[case]
    train = tmp_path / (name or "c.txt")
    train.write_text(text)
    model = toy / "bert" if case == "encoder checkpoint" else lm / "llama"
    code = main(["finetune", "--task", "causal-lm", "--model", str(model), "--train", str(train),
                 "--device", "cpu", "--out", str(tmp_path / "out"), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and needle in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [train.name]


def test_diverged_training_fails_and_writes_no_checkpoint(lm):
    """A step size that blows the weights up: the loss goes non-finite, finetune stops with exit
    code 1 and a hint, and no checkpoint is left for `build` to pick up."""
    from trt_seer.errors import TrainingDivergedError

    spec = lm_spec(lm, "lm-diverged", amp=AmpSpec("bf16"), epochs=4, lr=1e6, clip_norm=0.0)
    with pytest.raises(TrainingDivergedError, match=r"training diverged in epoch \d+ .*lower --lr") as e:
        finetune(spec)
    assert e.value.exit_code == 1
    assert not (lm / "lm-diverged" / "config.json").exists()


def test_checkpoint_files_follow_the_umask(trained):
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in trained.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == oct(0o666 & ~mask), modes  # transformers stages it as 0600
    assert set(modes.values()) == {oct(0o666 & ~mask)}, modes


def test_progress_is_logged_where_no_bar_is_drawn(tmp_path, monkeypatch, caplog):
    from trt_seer.finetune import monitor

    monkeypatch.setattr(monitor, "PROGRESS_EVERY_S", 0.0)
    reporter = monitor.Reporter(tmp_path)
    with caplog.at_level(logging.INFO, "trt_seer.finetune"), reporter.bar(3, "epoch 1") as bar:
        assert bar.disable  # pytest's stderr is no terminal: tqdm draws nothing
        for loss in (0.9, 0.7, 0.5):
            reporter.tick(bar, loss)
    assert [r.getMessage() for r in caplog.records] == ["epoch 1: step 1 of 3, loss 0.9000",
                                                        "epoch 1: step 2 of 3, loss 0.7000",
                                                        "epoch 1: step 3 of 3, loss 0.5000"]
    quiet = monitor.Reporter(None)  # ranks other than 0 say nothing
    caplog.clear()
    with quiet.bar(1, "epoch 1") as bar:
        quiet.tick(bar, 0.1)
    assert caplog.records == []
