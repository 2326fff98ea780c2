"""The training loop: AMP (autocast + dynamic loss scaling for fp16), gradient accumulation with
DDP `no_sync`, gradient clipping after unscaling, evaluation and per-epoch metrics.

Weights and optimizer state stay FP32 ("master weights"); autocast runs matmuls in fp16/bf16.
A step's loss is the sum of per-unit losses divided by the units in the whole optimizer step (all
micro-batches, all ranks), so accumulated gradients equal one large batch's even when the last
micro-batch is short. The task's objective (objective.py) says what a unit is: an example for
text-classification, a predicted token for causal-lm. The host never waits for the step it just
queued: a step's loss, gradient norm and loss scale are read once the next step is queued, and a
non-finite gradient norm is how an fp16 overflow (a step the scaler skipped) is detected.
"""
from __future__ import annotations

import contextlib
import math
import time
import warnings
from dataclasses import dataclass

from trt_seer.errors import TrainingDivergedError
import trt_seer.finetune.distributed as distributed
from trt_seer.finetune.data import COMPILED_PAD_MULTIPLE, PAD_MULTIPLE, Encoded, collate, plan_batches
from trt_seer.finetune.distributed import Context
from trt_seer.finetune.monitor import Reporter, peak_memory, reset_peak_memory
from trt_seer.finetune.objective import for_task
from trt_seer.finetune.spec import AmpSpec, FinetuneSpec

AMP_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass
class Trainer:
    """Everything a step touches. Mutable: the counters change every step."""

    ctx: Context
    amp: str
    module: object  # the bare Hugging Face model (saved at the end)
    forward: object  # what training calls: module, DDP(module) or torch.compile of either
    ddp: object | None
    optimizer: object
    scheduler: object
    scaler: object
    pad_id: int
    objective: object  # objective.Classification | objective.CausalLM | objective.Embedding
    clip_norm: float = 1.0
    max_steps: int | None = None
    one: object = None  # a device scalar 1.0: scaler.scale(one) reads the loss scale without waiting
    pad_multiple: int = PAD_MULTIPLE  # training batches' sequence length is a multiple of this
    step: int = 0
    skipped: int = 0
    teacher: object = None  # QAT distillation: the FP32 starting model; the loss then ignores labels


def autocast(ctx: Context, amp: str):
    """torch.autocast for the run's device; a no-op context for amp 'off'."""
    import torch

    if amp == "off":
        return contextlib.nullcontext()
    return torch.autocast(ctx.device.type, dtype=getattr(torch, AMP_DTYPES[amp]))


def make_scaler(amp: AmpSpec, ctx: Context):
    """Dynamic loss scaling for fp16; disabled (a pass-through) for bf16 and fp32."""
    import torch

    return torch.amp.GradScaler(ctx.device.type, init_scale=amp.init_scale, backoff_factor=amp.backoff_factor,
                                growth_interval=amp.growth_interval, enabled=amp.mode == "fp16")


def make_scheduler(optimizer, total_steps: int, warmup: float):
    """Linear warm-up over `warmup` of the steps, then linear decay to zero."""
    import torch

    ramp = max(1, round(total_steps * warmup))

    def factor(step: int) -> float:
        if step < ramp:
            return (step + 1) / ramp
        return max(0.0, (total_steps - step) / max(1, total_steps - ramp))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def param_groups(module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only (not on biases and LayerNorm weights); QAT ranges (tagged
    `range_lr`, finetune/qat.py) get their own learning rate and no decay."""
    params = [p for p in module.parameters() if p.requires_grad and not hasattr(p, "range_lr")]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    ranges = [p for p in module.parameters() if p.requires_grad and hasattr(p, "range_lr")]
    if ranges:
        groups.append({"params": ranges, "weight_decay": 0.0, "lr": ranges[0].range_lr})
    return [g for g in groups if g["params"]]  # frozen weights (QAT --qat-train ranges) leave groups empty


def make_trainer(module, spec: FinetuneSpec, ctx: Context, total_steps: int, pad_id: int, teacher=None) -> Trainer:
    """Moves `module` to the device and wraps it (DDP, torch.compile) with optimizer and scaler."""
    import torch

    module = module.to(ctx.device).train()
    ddp = distributed.wrap_ddp(module, ctx) if ctx.distributed else None
    forward = ddp or module
    if spec.compile:
        # Static shapes, and sequence lengths padded to multiples of 32: a handful of shapes that
        # each compile once. Left dynamic, BERT-base recompiled for each new length range until
        # torch._dynamo hit its recompile limit.
        forward = torch.compile(forward, dynamic=False)
    optimizer = distributed.make_optimizer(param_groups(module, spec.weight_decay), ctx, spec.zero1,
                                           lr=spec.lr, betas=(0.9, 0.999), eps=1e-8)
    scheduler = make_scheduler(optimizer, total_steps, spec.warmup)
    return Trainer(ctx, spec.amp.mode, module, forward, ddp, optimizer, scheduler, make_scaler(spec.amp, ctx),
                   pad_id, for_task(spec.task), spec.clip_norm, spec.max_steps, torch.ones((), device=ctx.device),
                   pad_multiple=COMPILED_PAD_MULTIPLE if spec.compile else PAD_MULTIPLE,
                   teacher=None if teacher is None else teacher.to(ctx.device).eval())


def backward(tr: Trainer, micro_batches: list[dict], step_units: int):
    """Forward + backward over one optimizer step's micro-batches on this rank; gradients are
    all-reduced only on the last one. `step_units`: the objective's units (examples or predicted
    tokens) in the whole step, all ranks. Returns (this rank's summed loss / step_units, its
    non-padding tokens) as 0-dim device tensors: reading them would make the host wait."""
    import torch

    total, tokens = torch.zeros((), device=tr.ctx.device), torch.zeros((), device=tr.ctx.device)
    for i, batch in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync = contextlib.nullcontext() if last or tr.ddp is None else tr.ddp.no_sync()
        batch = to_device(batch, tr.ctx)
        labels = batch.pop("labels")
        with sync:
            with autocast(tr.ctx, tr.amp):
                out = tr.objective.predict(tr.forward, batch)  # logits (batch, [seq,] classes) or embeddings
                loss = tr.objective.loss_sum(out, labels) if tr.teacher is None else distill_sum(tr, batch, out, labels)
            # DDP averages gradients over ranks: multiply back so the result is a sum / step_units
            loss = loss * (tr.ctx.world / max(step_units, 1))
            tr.scaler.scale(loss).backward()
        total += loss.detach()
        tokens += batch["attention_mask"].sum()
    return total / tr.ctx.world, tokens


def distill_sum(tr: Trainer, batch: dict, logits, labels=None):
    """Summed KL(teacher || student) of the class distributions; logits (batch, classes), or for a
    causal LM (batch, seq, vocab): the next-token distributions at the positions the task loss
    counts (labels[:, 1:] not -100), so the sum has the task loss's units. Embeddings: the
    objective's own loss against the teacher's embeddings (1 - cosine)."""
    import torch

    with torch.no_grad():
        target = tr.objective.predict(tr.teacher, batch).float()
    if tr.objective.target_from_teacher:
        return tr.objective.loss_sum(logits, target)
    if logits.ndim == 3:
        keep = labels[:, 1:] != -100
        logits, target = logits[:, :-1][keep], target[:, :-1][keep]
    return torch.nn.functional.kl_div(torch.log_softmax(logits.float(), -1), torch.log_softmax(target, -1),
                                      log_target=True, reduction="sum")


def to_device(batch: dict, ctx: Context) -> dict:
    """Host tensors to the device; through pinned memory on CUDA so the copy does not block."""
    if not ctx.cuda:
        return batch
    return {k: v.pin_memory().to(ctx.device, non_blocking=True) for k, v in batch.items()}


def optimizer_step(tr: Trainer):
    """Unscale, clip, step, update the loss scale, advance the schedule. Returns the gradient
    norm before clipping as a device tensor: not finite means fp16 overflowed and the scaler
    skipped the update. The schedule advances on skipped steps too, so nothing waits for the GPU."""
    import torch

    tr.scaler.unscale_(tr.optimizer)
    norm = torch.nn.utils.clip_grad_norm_(tr.module.parameters(), tr.clip_norm or float("inf"))
    tr.scaler.step(tr.optimizer)
    tr.scaler.update()
    tr.optimizer.zero_grad(set_to_none=True)
    tr.step += 1
    with warnings.catch_warnings():  # a skipped first update makes LambdaLR warn about the call order
        warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
        tr.scheduler.step()
    return norm


def loss_scale(tr: Trainer) -> float | None:
    return tr.scaler.get_scale() if tr.scaler.is_enabled() else None


def epoch_plan(data: Encoded, spec: FinetuneSpec, ctx: Context, epoch: int) -> list[list[list[int]]]:
    """This epoch's optimizer steps, each a list of up to `accum` global micro-batches of
    batch x world example indices; rank r takes every world-th example of each."""
    size = spec.batch * ctx.world
    batches = [b for b in plan_batches(data.lengths, size, seed=spec.seed + epoch) if len(b) >= ctx.world]
    return [batches[i:i + spec.accum] for i in range(0, len(batches), spec.accum)]


def total_steps(data: Encoded, spec: FinetuneSpec, ctx: Context) -> int:
    steps = spec.epochs * len(epoch_plan(data, spec, ctx, 0))
    return min(steps, spec.max_steps or steps)


@dataclass
class Epoch:
    """Running totals of one epoch, over all ranks."""

    epoch: int
    start: float
    loss_sum: float = 0.0  # per-unit loss x units
    units: int = 0
    examples: int = 0
    tokens: int = 0


def train_epoch(tr: Trainer, data: Encoded, plan: list, epoch: int, reporter: Reporter) -> dict:
    """One pass over `plan`; returns the epoch's training numbers (over all ranks). Each step's
    numbers are read one step late, once the next step is queued, so the GPU never idles."""
    import torch

    reset_peak_memory(tr.ctx.device)
    run, first_step, skipped, pending = Epoch(epoch, time.perf_counter()), tr.step, tr.skipped, None
    with reporter.bar(len(plan), f"epoch {epoch}") as bar:
        for step_batches in plan:
            if tr.max_steps is not None and tr.step >= tr.max_steps:
                break
            n, lr = sum(len(b) for b in step_batches), tr.scheduler.get_last_lr()[0]
            units = sum(tr.objective.units(data, b) for b in step_batches)
            micro = [collate(data, b[tr.ctx.rank::tr.ctx.world], tr.pad_id, tr.pad_multiple) for b in step_batches]
            loss, tokens = backward(tr, micro, units)
            norm = optimizer_step(tr)
            # (loss, tokens) summed over ranks, grad norm, loss scale after the update: (4,)
            stats = [*distributed.sum_tensor(tr.ctx, torch.stack([loss, tokens])), norm, tr.scaler.scale(tr.one)]
            queued = (tr.step, n, units, lr, torch.stack(stats))
            if pending is not None:
                _finish_step(tr, reporter, run, *pending, bar)
            pending = queued
        if pending is not None:
            _finish_step(tr, reporter, run, *pending, bar)
    _synchronize(tr.ctx)
    seconds = time.perf_counter() - run.start
    return {"steps": tr.step - first_step, "skipped_steps": tr.skipped - skipped,
            "train_loss": run.loss_sum / max(run.units, 1), "samples_per_s": run.examples / seconds,
            "tokens_per_s": run.tokens / seconds, "seconds": seconds, **peak_memory(tr.ctx.device)}


def _finish_step(tr: Trainer, reporter: Reporter, run: Epoch, step: int, examples: int, units: int, lr: float,
                 stats, bar) -> None:
    """Reads a queued step's numbers (waits for that step only), logs and records them."""
    loss, tokens, norm, scale = stats.tolist()
    skipped = tr.scaler.is_enabled() and not math.isfinite(norm)
    tr.skipped += skipped
    run.loss_sum, run.units = run.loss_sum + loss * units, run.units + units
    run.examples, run.tokens = run.examples + examples, run.tokens + int(tokens)
    scale = scale if tr.scaler.is_enabled() else None
    if skipped:
        reporter.info(f"step {step}: fp16 gradients overflowed (inf/nan); update skipped, "
                      f"loss scale lowered to {scale:g}")
    reporter.record({"kind": "step", "step": step, "epoch": run.epoch, "loss": loss, "examples": examples,
                     "tokens": int(tokens), "elapsed_s": time.perf_counter() - run.start,
                     "grad_norm": norm if math.isfinite(norm) else None,
                     "lr": lr, "loss_scale": scale, "skipped": skipped})
    reporter.tick(bar, loss)


def _synchronize(ctx: Context) -> None:
    import torch

    if ctx.cuda:
        torch.cuda.synchronize(ctx.device)


def evaluate(tr: Trainer, data: Encoded, batch: int) -> dict:
    """The objective's eval metrics over `data` (eval_loss, eval_accuracy | eval_perplexity),
    sharded over ranks; None values if `data` is empty."""
    import torch

    if not len(data):
        return tr.objective.eval_metrics(None)
    sums = [0.0] * len(tr.objective.eval_sums_names)  # a rank with an empty shard still joins all_sum
    shard = plan_batches(data.lengths, batch)[tr.ctx.rank::tr.ctx.world]
    tr.module.eval()
    with torch.no_grad():
        for indices in shard:
            inputs = to_device(collate(data, indices, tr.pad_id), tr.ctx)
            labels = inputs.pop("labels")
            with autocast(tr.ctx, tr.amp):
                out = tr.objective.predict(tr.module, inputs)  # (batch, [seq,] classes) or embeddings
                if tr.objective.target_from_teacher:  # embeddings: compared with the FP32 model's
                    labels = tr.objective.predict(tr.teacher, inputs)
            sums = [a + b for a, b in zip(sums, tr.objective.eval_sums(out, labels))]
    tr.module.train()
    return tr.objective.eval_metrics(distributed.all_sum(tr.ctx, sums))


def fit(tr: Trainer, train: Encoded, evaluation: Encoded, spec: FinetuneSpec, reporter: Reporter) -> list[dict]:
    """Trains for spec.epochs (or until spec.max_steps); returns one metrics dict per epoch."""
    epochs = []
    for epoch in range(1, spec.epochs + 1):
        if tr.max_steps is not None and tr.step >= tr.max_steps:
            break
        row = train_epoch(tr, train, epoch_plan(train, spec, tr.ctx, epoch - 1), epoch, reporter)
        row = {"kind": "epoch", "epoch": epoch, "step_end": tr.step, **row,
               **evaluate(tr, evaluation, spec.batch), "loss_scale": loss_scale(tr)}
        reporter.record(row)
        reporter.info(_epoch_line(row, tr.objective))
        check_finite(row, spec)
        epochs.append(row)
    return epochs


def check_finite(row: dict, spec: FinetuneSpec) -> None:
    """A NaN or infinite training loss means the weights are gone: stop before any checkpoint is
    written, and say what to change."""
    if not math.isfinite(row["train_loss"]):
        raise TrainingDivergedError(f"training diverged in epoch {row['epoch']} (train loss {row['train_loss']}); "
                                    f"no checkpoint written: lower --lr (now {spec.lr:g}) or --clip-norm "
                                    f"(now {spec.clip_norm:g}), or use --amp fp16 with its loss scaling")


def _epoch_line(row: dict, objective) -> str:
    evaluated = "" if row["eval_loss"] is None else objective.describe(row)
    scale = "" if row["loss_scale"] is None else f", loss scale {row['loss_scale']:g}"
    return (f"epoch {row['epoch']}: train loss {row['train_loss']:.4f}{evaluated}, "
            f"{row['samples_per_s']:.1f} samples/s, {row['tokens_per_s']:.0f} tokens/s, "
            f"peak memory {row['peak_memory_bytes'] / 2**20:.0f} MiB{scale}, "
            f"{row['skipped_steps']} skipped steps")
