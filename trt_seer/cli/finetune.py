"""`trt-seer finetune`: mixed-precision fine-tuning for text classification or causal language
modelling -> a Hugging Face checkpoint directory that `build --model DIR` takes.

With no --model and no --train: all-MiniLM-L6-v2 on the embedded topics corpus (sports, health,
business, tech). Several GPUs: torchrun --nproc-per-node N -m trt_seer finetune ... [--zero1].

--task causal-lm (a gpt2 / llama / qwen2 / mistral checkpoint): next-token loss on plain text, one
document per line of a .txt file or per --text-field of .jsonl / .csv (default: calib/default.txt,
evaluated on calib/heldout.txt). Documents are padded, not packed: each is one sequence truncated
to --max-seq tokens with EOS appended, and the loss ignores padding (label -100); eval reports
perplexity. A tokenizer without a pad token pads with its EOS token, and is saved that way.

--task feature-extraction (sentence-embedding encoders) takes --qat int8 only: no label to train
the weights on, so they stay frozen and the activation ranges are distilled on calib/default.txt
(loss 1 - cosine of the sentence embedding to the FP32 model's; eval on calib/heldout.txt).
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

log = logging.getLogger("trt_seer")
RANGES_ONLY_LR = 3e-3  # --qat-train ranges: log(amax) learning rate (docs/DESIGN.md, measured)


def add_parser(subparsers, common):
    p = subparsers.add_parser("finetune", help="fine-tune a checkpoint for text classification or as a causal LM "
                                              "(AMP, DDP, ZeRO-1)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_model_args(p, task_help="text-classification (default), causal-lm (decoders: next-token "
                                       "loss on plain text) or feature-extraction (embedding models, with "
                                       "--qat int8 only: weights frozen, INT8 ranges distilled)")
    _data_args(p.add_argument_group("data"), common)
    _training_args(p.add_argument_group("training"), common)
    _amp_args(p.add_argument_group("mixed precision"))
    _qat_args(p.add_argument_group("quantization-aware training"))
    s = p.add_argument_group("speed and scale")
    s.add_argument("--compile", action="store_true",
                   help="torch.compile the model (static shapes; batches padded to multiples of 32 tokens)")
    s.add_argument("--zero1", action="store_true",
                   help="shard optimizer state across torchrun processes (ZeroRedundancyOptimizer)")
    s.add_argument("--device", default="auto", metavar="{auto,cuda,cpu}",
                   help="where to train (default: auto, the GPU when CUDA works)")
    p.add_argument("--init-from-config", metavar="NAME", default=None,
                   help="instead of --model, with --task causal-lm: start from a random-initialised model "
                        "of a config shipped in the package, with a BPE tokenizer trained on the embedded "
                        "corpus; nothing is downloaded (shipped: small-llama, a 4-layer Llama)")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="checkpoint directory to write (default: out/<model>-<task>/); "
                        "replaced only when the run succeeds")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def _data_args(g, common) -> None:
    g.add_argument("--train", metavar="FILE", default=None,
                   help=".jsonl or .csv with a text and a label field (default: the embedded topics corpus); "
                        "causal-lm: .txt with one document per line, or .jsonl / .csv with a text field "
                        "(default: calib/default.txt)")
    g.add_argument("--eval", metavar="FILE", default=None,
                   help="evaluation data in the same format (default: every 10th training example; "
                        "causal-lm without --train: calib/heldout.txt)")
    g.add_argument("--text-field", default="text", help="text field or column (default: text)")
    g.add_argument("--label-field", default="label",
                   help="label field or column: strings (names) or integers (ids) (default: label)")
    g.add_argument("--num-labels", type=common.positive_int, default=None, metavar="N",
                   help="number of classes (default: from the training labels)")
    g.add_argument("--max-seq", type=common.positive_int, default=128, metavar="N",
                   help="truncate texts (causal-lm: documents, EOS included) to N tokens (default: 128)")


def _training_args(g, common) -> None:
    g.add_argument("--batch", type=common.positive_int, default=32, metavar="N",
                   help="micro-batch per process (default: 32); a step sees batch x accum x processes")
    g.add_argument("--accum", type=common.positive_int, default=1, metavar="N",
                   help="micro-batches accumulated per optimizer step (default: 1)")
    g.add_argument("--epochs", type=common.positive_int, default=3, help="passes over the data (default: 3)")
    g.add_argument("--max-steps", type=common.positive_int, default=None, metavar="N",
                   help="stop after N optimizer steps")
    g.add_argument("--lr", type=float, default=5e-5, help="peak AdamW learning rate (default: 5e-5)")
    g.add_argument("--clip-norm", type=float, default=1.0, help="gradient norm clip, 0 = off (default: 1.0)")
    g.add_argument("--seed", type=int, default=0, help="seed for the new head and the data order (default: 0)")


def _amp_args(g) -> None:
    g.add_argument("--amp", default="off", metavar="{fp16,bf16,off}",
                   help="autocast precision (default: off = FP32). fp16 adds dynamic loss scaling and "
                        "needs a CUDA GPU; on CPU use bf16. Weights and optimizer state stay FP32")
    g.add_argument("--init-scale", type=float, default=2.0**16, help="fp16: initial loss scale (default: 65536)")
    g.add_argument("--growth-interval", type=int, default=2000,
                   help="fp16: overflow-free steps before the scale doubles (default: 2000)")
    g.add_argument("--backoff-factor", type=float, default=0.5,
                   help="fp16: scale multiplier after an overflow, whose step is skipped (default: 0.5)")


def _qat_args(g) -> None:
    g.add_argument("--qat", choices=("int8", "int4"), default=None,
                   help="int8 (text-classification, feature-extraction): train with fake INT8 where build --int8 "
                        "--int8-mode w8a8 puts Q/DQ (GEMM inputs per tensor, weights per output channel); writes "
                        "qat_ranges.json, which build uses instead of calibrating. int4 (causal-lm): train with the weights "
                        "build --int4 quantizes fake-quantized block-wise to INT4 (round-to-nearest); build "
                        "--int4 then skips AWQ")
    g.add_argument("--int4-block", type=int, default=None, metavar="N",
                   help="--qat int4: input channels per INT4 scale; build with the same --int4-block "
                        "(default 128)")
    g.add_argument("--qat-weights", choices=("latent", "rounded"), default=None,
                   help="--qat int4: save the trained FP32 weights (latent), or the INT4 values they round to "
                        "(rounded: the checkpoint is the quantized model, and build's INT4 graph reproduces "
                        "its FP16 graph) (default: latent)")
    g.add_argument("--from-calib", metavar="PATH", default=None,
                   help="--qat: start the ranges from this TensorRT calibration cache (from build --int8 "
                        "--int8-mode w8a8 of the starting checkpoint, same --smooth-alpha) instead of entropy calibration")
    g.add_argument("--qat-ranges", choices=("learned", "frozen"), default=None,
                   help="--qat: learn the activation ranges (LSQ-style, log amax) or keep them frozen "
                        "(default: learned)")
    g.add_argument("--int8-attention", action="store_true",
                   help="--qat: also fake-quantize the attention batched matmuls, for build --int8-attention")
    g.add_argument("--qat-train", choices=("all", "ranges"), default=None,
                   help="--qat: train the weights and the ranges (all), or freeze the weights and learn only "
                        "the activation ranges by distilling the FP32 model on the calibration corpus "
                        "(calib/default.txt, disjoint from the gate's calib/heldout.txt), so the checkpoint's "
                        "FP32 stays the starting model's (ranges) (default: all)")
    g.add_argument("--qat-loss", choices=("labels", "distill"), default=None,
                   help="--qat: train on the labels (task loss) or distill the FP32 starting model's class "
                        "(causal-lm: next-token) distribution into the quantized one (KL; labels unused) "
                        "(default: labels; distill with --qat-train ranges; with --qat int4, distill measured "
                        "better: docs/DESIGN.md)")
    g.add_argument("--smooth-alpha", type=float, default=None,
                   help="--qat: SmoothQuant strength, as build applies it; build with the same value (default 0.5)")
    g.add_argument("--qat-data", choices=("task", "calib"), default=None,
                   help="--qat: train on the training data (task) or on build's calibration corpus "
                        "calib/default.txt (calib; needs --qat-loss distill) (default: task; calib with "
                        "--qat-train ranges)")
    g.add_argument("--qat-smoothing", choices=("fixed", "learned"), default=None,
                   help="--qat: keep SmoothQuant's per-channel scales as build computes them (fixed), or "
                        "start from them and learn them with the ranges; qat_ranges.json then carries them "
                        "and build applies them instead of its own (default: fixed)")
    g.add_argument("--range-lr", type=float, default=None,
                   help="--qat learned ranges: AdamW learning rate of log(amax) (default: 1e-3; "
                        f"{RANGES_ONLY_LR:g} with --qat-train ranges)")


def _qat_spec(args, path):
    from trt_seer.errors import InputError
    from trt_seer.finetune import QatSpec

    if args.qat is None:
        if args.from_calib is not None:
            raise InputError("--from-calib needs --qat int8")
        return None
    if args.qat == "int4":
        return _int4_spec(args)
    for flag, value in (("--int4-block", args.int4_block), ("--qat-weights", args.qat_weights)):
        if value is not None:
            raise InputError(f"{flag} is for --qat int4 (block-wise INT4 weights of causal LMs)")
    embedding = args.task == "feature-extraction"  # no labels: ranges only, whatever the defaults
    ranges_only = args.qat_train == "ranges" or (embedding and args.qat_train is None)
    train = "ranges" if ranges_only else args.qat_train or "all"
    loss = args.qat_loss or ("distill" if ranges_only else "labels")
    range_lr = args.range_lr if args.range_lr is not None else RANGES_ONLY_LR if ranges_only else 1e-3
    return QatSpec(args.qat, path(args.from_calib), args.qat_ranges or "learned", range_lr, args.int8_attention,
                   loss, 0.5 if args.smooth_alpha is None else args.smooth_alpha, train,
                   args.qat_smoothing or "fixed", args.qat_data or ("calib" if ranges_only else "task"))


INT8_ONLY = ("from_calib", "qat_ranges", "int8_attention", "qat_train", "smooth_alpha", "qat_data", "qat_smoothing",
             "range_lr")


def _int4_spec(args):
    """--qat int4: weights only, so none of INT8's activation-range options applies."""
    from trt_seer.errors import InputError
    from trt_seer.finetune import QatSpec

    given = [f"--{name.replace('_', '-')}" for name in INT8_ONLY if getattr(args, name) not in (None, False)]
    if given:
        raise InputError(f"{', '.join(given)}: INT8 activation-range options; --qat int4 quantizes weights only")
    return QatSpec("int4", loss=args.qat_loss or "labels", block=128 if args.int4_block is None else args.int4_block,
                   weights=args.qat_weights or "latent")


def spec_from_args(args):
    from trt_seer.finetune import AmpSpec, DataSpec, FinetuneSpec

    def path(value):
        return None if value is None else Path(value)

    data = DataSpec(path(args.train), path(args.eval), args.text_field, args.label_field,
                    args.num_labels, args.max_seq)
    amp = AmpSpec(args.amp, args.init_scale, args.growth_interval, args.backoff_factor)
    return FinetuneSpec(out=path(args.out), model=path(args.model), task=args.task or "text-classification",
                        data=data, amp=amp, batch=args.batch, accum=args.accum, epochs=args.epochs,
                        lr=args.lr, clip_norm=args.clip_norm, max_steps=args.max_steps, seed=args.seed,
                        compile=args.compile, zero1=args.zero1, device=args.device, qat=_qat_spec(args, path))


def run(args) -> int:
    from trt_seer.finetune import finetune

    spec = spec_from_args(args)
    if args.init_from_config is None:
        out = finetune(spec)
    else:
        out = _from_config(args, spec, finetune)
    if os.environ.get("RANK", "0") == "0":  # torchrun: one line, not one per process
        log.info("fine-tuned checkpoint: %s", out)
    return 0


def _from_config(args, spec, finetune) -> Path:
    """Makes the shipped config's random-initialised checkpoint in a temporary directory, then
    fine-tunes it into --out (the default: out/<config>-causal-lm/)."""
    import dataclasses
    import tempfile

    from trt_seer.errors import InputError
    from trt_seer.finetune import checkpoint, starter

    if args.model is not None or spec.task != "causal-lm":
        raise InputError("--init-from-config takes --task causal-lm and no --model")
    starter.starter_config(args.init_from_config)  # an unknown name fails before any work
    if spec.out is not None:
        checkpoint.check_out(spec.out)
    with tempfile.TemporaryDirectory(prefix="trt-seer-init-") as tmp:
        model = starter.make_starter(args.init_from_config, Path(tmp) / args.init_from_config, args.seed)
        log.info("random-initialised %s from the shipped config, tokenizer trained on the embedded corpus",
                 args.init_from_config)
        return finetune(dataclasses.replace(spec, model=model))
