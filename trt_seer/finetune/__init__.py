"""Mixed-precision fine-tuning: checkpoint + labelled text (text-classification) or plain text
(causal-lm) -> fine-tuned Hugging Face checkpoint (the input of `build`).

    python -m trt_seer finetune --amp bf16 --out ckpt/            # default model, embedded corpus
    torchrun --nproc-per-node 2 -m trt_seer finetune --train t.jsonl --amp fp16 --zero1 --out ckpt/
    python -m trt_seer finetune --task causal-lm --model llama/ --train corpus.txt --out lm/

    from trt_seer.finetune import FinetuneSpec, AmpSpec, DataSpec, finetune
    finetune(FinetuneSpec(out=Path("ckpt"), amp=AmpSpec("bf16"), data=DataSpec(train=Path("t.jsonl"))))

The output directory holds model.safetensors, config.json (id2label, label2id,
architectures = *ForSequenceClassification; for causal-lm *ForCausalLM with a pad token), the
tokenizer files (pad = EOS when the base tokenizer had no pad token), training.json (task,
settings, metrics, hardware), metrics.jsonl and curves.png; with QatSpec (--qat int8) also
qat_ranges.json, which `build --int8 --int8-mode w8a8` uses instead of calibrating (finetune/qat.py);
with --qat int4 (causal-lm) a qat_ranges.json that tells `build --int4` the block size and to skip
AWQ (finetune/qat_int4.py).
It appears only when the run succeeded.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from trt_seer.errors import InputError
from trt_seer.finetune.spec import AMP_MODES, AmpSpec, DataSpec, FinetuneSpec, QatSpec

FINAL = ("train_loss", "eval_loss")  # training.json's metrics.final, with the task's eval metric

__all__ = ["AMP_MODES", "AmpSpec", "DataSpec", "FinetuneSpec", "QatSpec", "finetune"]


def finetune(spec: FinetuneSpec) -> Path:
    """Runs `spec` and returns the output checkpoint directory. Under torchrun every rank calls
    this; rank 0 writes. Raises InputError before writing anything when the inputs are bad."""
    from trt_seer.finetune import distributed

    from trt_seer.finetune import checkpoint

    spec.check()
    if spec.out is not None:  # before the slow imports of distributed.start
        checkpoint.check_out(Path(spec.out))
    ctx = distributed.start(spec.device, spec.zero1)
    try:
        if spec.amp.mode == "fp16" and not ctx.cuda:
            raise InputError("--amp fp16 needs a CUDA GPU (dynamic loss scaling runs there); "
                             "on CPU use --amp bf16, which CPU autocast supports, or --amp off")
        return _run(spec, ctx)
    finally:
        distributed.stop(ctx)


def _run(spec: FinetuneSpec, ctx) -> Path:
    from trt_seer.finetune import checkpoint, distributed
    from trt_seer.finetune.objective import for_task

    objective = for_task(spec.task)
    info = checkpoint.resolve(spec.model, spec.task)
    out = Path(spec.out) if spec.out is not None else checkpoint.default_out(info)
    checkpoint.check_out(out)
    if spec.qat is not None:
        from trt_seer.finetune import qat

        qat.check(spec.qat)
    dataset = objective.load_data(spec.data)
    tokenizer = checkpoint.load_tokenizer(info)
    max_seq = checkpoint.max_tokens(info, tokenizer, spec.data.max_seq)
    train, evaluation = (objective.encode(part, tokenizer, max_seq) for part in (dataset.train, dataset.eval))
    model = objective.load_model(info, dataset, tokenizer.pad_token_id, spec.seed)
    teacher = None
    if spec.qat is not None and spec.qat.mode == "int4":
        from trt_seer.finetune import qat_int4

        teacher = qat.teacher(model, spec.qat)
        qat_int4.prepare(model, tokenizer, spec.qat.block)
    elif spec.qat is not None:
        teacher = qat.teacher(model, spec.qat)  # before fake quantization goes on
        qat.prepare(model, tokenizer, spec.qat, spec.task)
        if spec.qat.train == "ranges":
            qat.ranges_only(model)
        if spec.qat.data == "calib":
            train = qat.calibration_examples(tokenizer, max_seq)
    staged = checkpoint.stage(out) if ctx.is_main else None
    try:
        record = _train(spec, ctx, model, tokenizer, train, evaluation, staged, teacher)
        if staged is not None:
            record.update(_describe(info, dataset, train, evaluation, max_seq))
            checkpoint.write_training_json(staged, record)
            try:
                checkpoint.publish(staged, out)
            except checkpoint.NotPublishedError:
                staged = None  # the finished checkpoint stays where the error says
                raise
        distributed.barrier(ctx)  # every rank returns once the output exists
    finally:
        if staged is not None and staged.exists():
            shutil.rmtree(staged)
    return out


def _train(spec, ctx, model, tokenizer, train, evaluation, staged: Path | None, teacher=None) -> dict:
    """Trains, then (rank 0) saves the checkpoint and the curves into `staged`."""
    from trt_seer.finetune import checkpoint, distributed, monitor
    from trt_seer.finetune.train import fit, make_trainer, total_steps

    started = time.perf_counter()
    tr = make_trainer(model, spec, ctx, total_steps(train, spec, ctx), tokenizer.pad_token_id, teacher)
    epochs = fit(tr, train, evaluation, spec, monitor.Reporter(staged))
    state_bytes = distributed.gather(ctx, distributed.optimizer_state_bytes(tr.optimizer))
    if staged is not None:
        if spec.qat is not None:
            from trt_seer.finetune import qat, qat_int4

            save = qat_int4.save if spec.qat.mode == "int4" else qat.save_ranges
            save(tr.module, staged, spec.qat)  # also takes the fake quantization off
        checkpoint.save(tr.module, tokenizer, staged)
        monitor.plot_curves(staged / monitor.METRICS_FILE, staged / monitor.PLOT_FILE)
    final = (*FINAL, tr.objective.metric)
    return {"settings": _settings(spec, ctx), "hardware": checkpoint.hardware(ctx),
            "metrics": {"epochs": epochs, "final": {k: epochs[-1][k] for k in final} if epochs else None,
                        "optimizer_steps": tr.step, "skipped_steps": tr.skipped,
                        "optimizer_state_bytes_per_rank": state_bytes},
            "seconds": time.perf_counter() - started}


def _settings(spec: FinetuneSpec, ctx) -> dict:
    optimizer = "AdamW" + (" (fused)" if ctx.cuda else "")
    return {**spec.to_dict(), "processes": ctx.world, "effective_batch": spec.batch * spec.accum * ctx.world,
            "master_weights": "fp32", "optimizer": f"ZeroRedundancyOptimizer({optimizer})" if spec.zero1 else optimizer}


def _describe(info, dataset, train, evaluation, max_seq: int) -> dict:
    return {"task": info.task, "base_model": {"name": info.name, "path": str(info.path), "model_type": info.model_type},
            "data": {"source": dataset.source, "train_examples": len(train),
                     "eval_examples": len(evaluation), "labels": list(dataset.labels), "max_seq": max_seq}}
