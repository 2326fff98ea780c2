"""What a fine-tuning run is asked to do: plain frozen dataclasses, checked before anything heavy
is imported or anything is written."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trt_seer.errors import InputError, UnsupportedError

AMP_MODES = ("fp16", "bf16", "off")
TASKS = ("text-classification", "causal-lm", "feature-extraction")  # feature-extraction: --qat int8 only
DEVICES = ("auto", "cuda", "cpu")


@dataclass(frozen=True)
class AmpSpec:
    """Mixed precision. fp16 uses dynamic loss scaling (CUDA only); bf16 needs no scaler."""

    mode: str = "off"  # "fp16" | "bf16" | "off"
    init_scale: float = 2.0**16
    growth_interval: int = 2000  # clean steps before the loss scale doubles
    backoff_factor: float = 0.5  # scale multiplier after a step with inf/nan gradients

    def check(self) -> None:
        if self.mode not in AMP_MODES:
            raise InputError(f"unknown --amp {self.mode!r}; choose fp16, bf16 or off")
        if not self.init_scale > 0 or self.growth_interval < 1 or not 0 < self.backoff_factor < 1:
            raise InputError("loss scaling needs --init-scale > 0, --growth-interval >= 1 "
                             "and 0 < --backoff-factor < 1")


@dataclass(frozen=True)
class DataSpec:
    """Training data. No `train`: the embedded topics corpus (causal-lm: calib/default.txt,
    evaluated on calib/heldout.txt). No `eval`: every 10th training example is held out for
    evaluation. Causal-lm reads only the text field (and .txt files, one document per line)."""

    train: Path | None = None
    eval: Path | None = None
    text_field: str = "text"
    label_field: str = "label"
    num_labels: int | None = None  # default: from the labels found
    max_seq: int = 128

    def check(self) -> None:
        if self.eval is not None and self.train is None:
            raise InputError("--eval needs --train (without --train the embedded corpus is used)")
        if self.max_seq < 2:
            raise InputError(f"--max-seq must be >= 2, got {self.max_seq}")
        if self.num_labels is not None and self.num_labels < 2:
            raise InputError(f"--num-labels must be >= 2, got {self.num_labels}")


QAT_MODES = ("int8", "int4")
RANGE_MODES = ("learned", "frozen")
QAT_TRAIN = ("all", "ranges")


@dataclass(frozen=True)
class QatSpec:
    """Quantization-aware training. int8 (finetune/qat.py): fake INT8 where `build --int8 --int8-mode
    w8a8` puts Q/DQ. Ranges start at the entropy calibration (or a TensorRT cache, `from_calib`) and
    are then learned (log amax, LSQ-style gradients, learning rate `range_lr`) or kept frozen.
    int4 (finetune/qat_int4.py, causal LMs): fake block-wise INT4 weights where `build --int4` puts
    them, blocks of `block` input channels; the other fields are INT8's."""

    mode: str = "int8"
    from_calib: Path | None = None
    ranges: str = "learned"  # "learned" | "frozen"
    range_lr: float = 1e-3
    attention: bool = False  # also the attention batched matmuls (build --int8-attention)
    loss: str = "labels"  # "labels" (the task loss) | "distill" (KL to the FP32 starting model)
    smooth_alpha: float = 0.5  # SmoothQuant as build applies it (build must use the same --smooth-alpha)
    train: str = "all"  # "all": weights and ranges | "ranges": weights frozen, ranges distilled on calib text
    smoothing: str = "fixed"  # "fixed": build's SmoothQuant s | "learned": s trained too, build applies it
    data: str = "task"  # "task": the training data | "calib": calib/default.txt (distillation only)
    block: int = 128  # int4: input channels per scale (build --int4-block)
    weights: str = "latent"  # int4: save the trained FP32 weights (latent) or their INT4 values (rounded)

    def check(self, task: str) -> None:
        if self.mode not in QAT_MODES:
            raise UnsupportedError(f"--qat supports {', '.join(QAT_MODES)}, not {self.mode!r}")
        if self.mode == "int4":
            self._check_int4(task)
            return
        if self.weights != "latent":
            raise InputError("--qat-weights is for --qat int4")
        if task not in ("text-classification", "feature-extraction"):
            raise UnsupportedError(f"--qat int8 trains W8A8 encoders (--task text-classification or "
                                   f"feature-extraction), not --task {task}")
        if task == "feature-extraction" and (self.train, self.loss, self.data) != ("ranges", "distill", "calib"):
            raise InputError("--task feature-extraction --qat int8 has no label to train weights on: it takes only "
                             "--qat-train ranges, --qat-loss distill and --qat-data calib (the defaults)")
        if self.ranges not in RANGE_MODES:
            raise InputError(f"unknown --qat-ranges {self.ranges!r}; choose learned or frozen")
        if self.loss not in ("labels", "distill"):
            raise InputError(f"unknown --qat-loss {self.loss!r}; choose labels or distill")
        if self.train not in QAT_TRAIN:
            raise InputError(f"unknown --qat-train {self.train!r}; choose all or ranges")
        if self.smoothing not in ("fixed", "learned"):
            raise InputError(f"unknown --qat-smoothing {self.smoothing!r}; choose fixed or learned")
        if self.smoothing == "learned" and not self.smooth_alpha > 0:
            raise InputError("--qat-smoothing learned starts from SmoothQuant: it needs --smooth-alpha > 0")
        if self.data not in ("task", "calib"):
            raise InputError(f"unknown --qat-data {self.data!r}; choose task or calib")
        if self.data == "calib" and self.loss != "distill":
            raise InputError("--qat-data calib has no labels: it needs --qat-loss distill")
        if self.train == "ranges" and (self.loss != "distill" or self.ranges != "learned"):
            raise InputError("--qat-train ranges learns the ranges by distilling the FP32 model: it needs "
                             "--qat-loss distill and --qat-ranges learned")
        if not 0 <= self.smooth_alpha < 1:
            raise InputError(f"--smooth-alpha must be in [0, 1), got {self.smooth_alpha}")
        if not self.range_lr > 0:
            raise InputError(f"--range-lr must be > 0, got {self.range_lr}")

    def _check_int4(self, task: str) -> None:
        from trt_seer.quantize.weightonly import BLOCK_SIZES

        if task != "causal-lm":
            raise UnsupportedError(f"--qat int4 trains causal LMs (build --int4 is weight-only INT4 for decoding), "
                                   f"not --task {task}; use --qat int8")
        if self.block not in BLOCK_SIZES:
            raise InputError(f"--int4-block {self.block} is not one of {', '.join(map(str, BLOCK_SIZES))}")
        if self.weights not in ("latent", "rounded"):
            raise InputError(f"unknown --qat-weights {self.weights!r}; choose latent or rounded")
        if self.loss not in ("labels", "distill") or self.train != "all" or self.data != "task":
            raise InputError("--qat int4 trains the weights on the training data (--qat-train all, --qat-data task)")


@dataclass(frozen=True)
class FinetuneSpec:
    """One run. `batch` is each process's micro-batch: an optimizer step sees
    batch x accum x processes examples."""

    out: Path | None = None  # default: out/<model name>-<task>
    model: Path | None = None  # default: the embedded all-MiniLM-L6-v2
    task: str = "text-classification"  # or "causal-lm", or "feature-extraction" (with --qat int8)
    data: DataSpec = DataSpec()
    amp: AmpSpec = AmpSpec()
    batch: int = 32
    accum: int = 1
    epochs: int = 3
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of optimizer steps with a linearly rising learning rate
    clip_norm: float = 1.0  # 0 disables clipping
    max_steps: int | None = None  # stop after this many optimizer steps
    seed: int = 0
    compile: bool = False
    zero1: bool = False
    device: str = "auto"  # "auto" | "cuda" | "cpu"
    qat: QatSpec | None = None  # quantization-aware training

    def check(self) -> None:
        """Raises InputError for anything wrong that needs no file or library to find out."""
        if self.task not in TASKS:
            raise UnsupportedError(f"finetune supports --task {', '.join(TASKS)}, not {self.task!r}")
        if self.task == "causal-lm" and self.data.num_labels is not None:
            raise InputError("--num-labels is for text-classification; causal-lm predicts tokens")
        if self.task == "feature-extraction":
            self._check_embedding()
        if self.device not in DEVICES:
            raise InputError(f"unknown --device {self.device!r}; choose auto, cuda or cpu")
        for name in ("batch", "accum", "epochs"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise InputError(f"--max-steps must be >= 1, got {self.max_steps}")
        if not self.lr > 0 or self.clip_norm < 0 or not 0 <= self.warmup < 1:
            raise InputError("--lr must be > 0, --clip-norm >= 0 and warmup in [0, 1)")
        self.amp.check()
        self.data.check()
        if self.qat is not None:
            self.qat.check(self.task)

    def _check_embedding(self) -> None:
        """Embeddings have no label: finetune only learns their INT8 ranges, by distillation on the
        calibration corpus (QatSpec.check)."""
        if self.qat is None or self.qat.mode != "int8":
            raise UnsupportedError("finetune has no training objective for --task feature-extraction (no labels); "
                                   "it learns INT8 activation ranges only: add --qat int8")
        if self.data.train is not None or self.data.num_labels is not None:
            raise InputError("--task feature-extraction --qat int8 distils on calib/default.txt (evaluated on "
                             "calib/heldout.txt): --train, --eval and --num-labels do not apply")

    def to_dict(self) -> dict:
        """JSON-ready settings (paths as strings)."""
        def plain(v):
            return str(v) if isinstance(v, Path) else v
        return dataclasses.asdict(self, dict_factory=lambda items: {k: plain(v) for k, v in items})
