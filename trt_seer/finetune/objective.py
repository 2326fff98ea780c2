"""What a run trains the model to predict, per task: the data it reads, the model class it loads,
the loss and what that loss is averaged over, and the evaluation metric. The loop in train.py is
the same for every task; this is the part that differs.

    objective = for_task("causal-lm")
    dataset = objective.load_data(DataSpec(train=Path("corpus.txt")))
    train = objective.encode(dataset.train, tokenizer, max_seq=128)

text-classification: one label per example; loss averaged over examples; eval accuracy.
causal-lm: next-token prediction; loss averaged over predicted (non-padding) tokens; eval perplexity.
"""
from __future__ import annotations

import math

import trt_seer.finetune.data as fdata
from trt_seer.finetune.data import IGNORE_INDEX, Dataset, Encoded
from trt_seer.finetune.spec import DataSpec


class Classification:
    """One class per example: cross-entropy over the sequence-classification head's logits."""

    task = "text-classification"
    metric = "eval_accuracy"
    forward_kwargs: dict = {}
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


class CausalLM:
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


OBJECTIVES = {o.task: o for o in (Classification(), CausalLM())}


def for_task(task: str):
    return OBJECTIVES[task]
