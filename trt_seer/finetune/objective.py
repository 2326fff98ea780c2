"""What a run trains the model to predict, per task: the data it reads, the model class it loads,
the loss and what that loss is averaged over, and the evaluation metric. The loop in train.py is
the same for every task; this is the part that differs.

    objective = for_task("causal-lm")
    dataset = objective.load_data(DataSpec(train=Path("corpus.txt")))
    train = objective.encode(dataset.train, tokenizer, max_seq=128)

text-classification: one label per example; loss averaged over examples; eval accuracy.
causal-lm: next-token prediction; loss averaged over predicted (non-padding) tokens; eval perplexity.
feature-extraction (--qat int8 only): the sentence embedding the exported graph computes, against
the frozen FP32 model's; loss 1 - cosine averaged over examples; eval mean cosine.
"""
from __future__ import annotations

import math

import trt_seer.finetune.data as fdata
from trt_seer.finetune.data import IGNORE_INDEX, Dataset, Encoded
from trt_seer.finetune.spec import DataSpec


class Logits:
    """What the model predicts: its logits; the loss compares them with the data's labels."""

    forward_kwargs: dict = {}
    target_from_teacher = False  # True: the target is the frozen FP32 model's prediction, not a label

    def predict(self, forward, batch: dict):
        return forward(**batch, **self.forward_kwargs).logits  # (batch, [seq,] classes)


class Classification(Logits):
    """One class per example: cross-entropy over the sequence-classification head's logits."""

    task = "text-classification"
    metric = "eval_accuracy"
    eval_sums_names = ("loss", "correct", "examples")

    def load_data(self, spec: DataSpec) -> Dataset:
        return fdata.load_dataset(spec)

    def encode(self, examples, tokenizer, max_seq: int) -> Encoded:
        return fdata.encode(examples, tokenizer, max_seq)

    def load_model(self, info, dataset: Dataset, pad_id: int, seed: int):
        from trt_seer.finetune.checkpoint import load_model

        return load_model(info, dataset.labels, pad_id, seed)

    def units(self, data: Encoded, indices: list[int]) -> int:
        """What the loss is averaged over: examples."""
        return len(indices)

    def loss_sum(self, logits, labels):
        """Summed cross-entropy; logits (batch, num_labels), labels (batch,)."""
        import torch

        return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")

    def eval_sums(self, logits, labels) -> list[float]:
        """`eval_sums_names` of one evaluation batch; summed over batches and ranks."""
        logits = logits.float()
        return [float(self.loss_sum(logits, labels)), int((logits.argmax(-1) == labels).sum()), len(labels)]

    def eval_metrics(self, sums: list[float] | None) -> dict:
        if sums is None:
            return {"eval_loss": None, "eval_accuracy": None}
        loss, correct, n = sums
        return {"eval_loss": loss / n, "eval_accuracy": correct / n}

    def describe(self, row: dict) -> str:
        return f", eval loss {row['eval_loss']:.4f}, accuracy {row['eval_accuracy']:.3f}"


class CausalLM(Logits):
    """Next-token prediction: token t's logits predict token t + 1; padding (-100) is ignored."""

    task = "causal-lm"
    metric = "eval_perplexity"
    forward_kwargs = {"use_cache": False}  # training and evaluation never reuse the KV cache
    eval_sums_names = ("loss", "predicted_tokens")

    def load_data(self, spec: DataSpec) -> Dataset:
        return fdata.load_corpus(spec)

    def encode(self, examples, tokenizer, max_seq: int) -> Encoded:
        return fdata.encode_documents(examples, tokenizer, max_seq)

    def load_model(self, info, dataset: Dataset, pad_id: int, seed: int):
        from trt_seer.finetune.checkpoint import load_causal_lm

        return load_causal_lm(info, pad_id, seed)

    def units(self, data: Encoded, indices: list[int]) -> int:
        """What the loss is averaged over: predicted tokens (every token but each document's first)."""
        return sum(len(data.features[i]["input_ids"]) - 1 for i in indices)

    def loss_sum(self, logits, labels):
        """Summed cross-entropy of the next-token predictions; logits (batch, seq, vocab), labels
        (batch, seq) with -100 on padding."""
        import torch

        predicted = logits[:, :-1].flatten(0, 1).float()  # (batch * (seq - 1), vocab)
        return torch.nn.functional.cross_entropy(predicted, labels[:, 1:].flatten(),
                                                 ignore_index=IGNORE_INDEX, reduction="sum")

    def eval_sums(self, logits, labels) -> list[float]:
        """`eval_sums_names` of one evaluation batch."""
        return [float(self.loss_sum(logits, labels)), int((labels[:, 1:] != IGNORE_INDEX).sum())]

    def eval_metrics(self, sums: list[float] | None) -> dict:
        if sums is None or sums[1] == 0:
            return {"eval_loss": None, "eval_perplexity": None}
        loss = sums[0] / sums[1]
        return {"eval_loss": loss, "eval_perplexity": math.exp(loss)}

    def describe(self, row: dict) -> str:
        return f", eval loss {row['eval_loss']:.4f}, perplexity {row['eval_perplexity']:.2f}"


class Embedding:
    """Sentence embeddings, for `--qat int8` only (weights frozen, activation ranges distilled): the
    prediction is the exported graph's sentence_embedding (mean over unmasked tokens, L2-normalised,
    export/checkpoint.py), the target the frozen FP32 model's, the loss 1 - cosine per example: the
    quantity build's feature-extraction gate averages (its mean cosine), in the same units."""

    task = "feature-extraction"
    metric = "eval_mean_cosine"
    target_from_teacher = True
    eval_sums_names = ("loss", "examples")

    def load_data(self, spec: DataSpec) -> Dataset:
        return fdata.load_corpus(spec)  # calib/default.txt, calib/heldout.txt

    def encode(self, examples, tokenizer, max_seq: int) -> Encoded:
        return fdata.encode([fdata.Example(e.text, 0) for e in examples], tokenizer, max_seq)  # label unread

    def load_model(self, info, dataset: Dataset, pad_id: int, seed: int):
        from trt_seer.export.checkpoint import load_model

        return load_model(info)

    def predict(self, forward, batch: dict):
        from trt_seer.export.checkpoint import mean_pool

        return mean_pool(forward(**batch).last_hidden_state, batch["attention_mask"])  # (batch, hidden)

    def units(self, data: Encoded, indices: list[int]) -> int:
        return len(indices)

    def loss_sum(self, embedding, target):
        """Summed 1 - cosine(embedding, target) over the batch; both (batch, hidden), unit length.
        Computed as |e - t|^2 / 2, equal for unit vectors, from the difference: no cancellation
        when the cosine is within float32 rounding of 1, as it is for a good INT8 model."""
        return 0.5 * (embedding.float() - target.float()).square().sum()

    def eval_sums(self, embedding, target) -> list[float]:
        return [float(self.loss_sum(embedding, target)), len(target)]

    def eval_metrics(self, sums: list[float] | None) -> dict:
        if sums is None or sums[1] == 0:
            return {"eval_loss": None, "eval_mean_cosine": None}
        return {"eval_loss": sums[0] / sums[1], "eval_mean_cosine": 1 - sums[0] / sums[1]}

    def describe(self, row: dict) -> str:
        return f", eval 1 - cosine {row['eval_loss']:.3e}, mean cosine to FP32 {row['eval_mean_cosine']:.5f}"


OBJECTIVES = {o.task: o for o in (Classification(), CausalLM(), Embedding())}


def for_task(task: str):
    return OBJECTIVES[task]
