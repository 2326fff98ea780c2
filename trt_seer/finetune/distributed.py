"""Where a run executes: the device, and under torchrun the process group (nccl on GPUs, gloo on
CPUs), DDP wrapping and the ZeRO-1 optimizer that shards AdamW's state across ranks.

    torchrun --nproc-per-node 2 -m trt_seer finetune --zero1 ...
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from trt_seer.errors import InputError


@dataclass(frozen=True)
class Context:
    """The device and this process's place among `world` processes."""

    device: object  # torch.device
    rank: int = 0
    world: int = 1
    distributed: bool = False
    owns_group: bool = False  # this run created the process group, so it also destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def pick_device(choice: str, local_rank: int):
    """`auto` takes GPU `local_rank` when CUDA works, else the CPU."""
    import torch

    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InputError("--device cuda but no CUDA GPU is usable here; use --device cpu")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def start(device_choice: str, zero1: bool) -> Context:
    """Picks the device and, under torchrun, joins the process group (or uses one already set up)."""
    import torch.distributed as dist

    if not launched_by_torchrun():
        if zero1:
            raise InputError("--zero1 shards optimizer state across processes; launch with "
                             "torchrun --nproc-per-node N -m trt_seer finetune ... --zero1")
        return Context(pick_device(device_choice, 0))
    device = pick_device(device_choice, int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return Context(device, dist.get_rank(), dist.get_world_size(), True, owns)


def stop(ctx: Context) -> None:
    import torch.distributed as dist

    if ctx.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: Context) -> None:
    import torch.distributed as dist

    if ctx.distributed:
        dist.barrier()


def all_sum(ctx: Context, values: list[float]) -> list[float]:
    """Sums `values` element-wise over all ranks (float64)."""
    import torch
    import torch.distributed as dist

    if not ctx.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t)
    return t.tolist()


def sum_tensor(ctx: Context, t):
    """Sums a device tensor over all ranks, queued without waiting (a no-op for one process)."""
    import torch.distributed as dist

    if ctx.distributed:
        dist.all_reduce(t)
    return t


def gather(ctx: Context, obj) -> list:
    """Every rank's `obj`, in rank order, on every rank."""
    import torch.distributed as dist

    if not ctx.distributed:
        return [obj]
    out = [None] * ctx.world
    dist.all_gather_object(out, obj)
    return out


def wrap_ddp(module, ctx: Context):
    """DistributedDataParallel over `module` (which must already be on ctx.device)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [ctx.device.index] if ctx.cuda else None
    return DistributedDataParallel(module, device_ids=ids)


def make_optimizer(groups: list[dict], ctx: Context, zero1: bool, **adamw):
    """AdamW (fused on CUDA); with `zero1`, ZeroRedundancyOptimizer shards its state by rank."""
    import torch
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if ctx.cuda:
        adamw["fused"] = True  # one kernel for all parameters instead of a loop per tensor
    if zero1:
        return ZeroRedundancyOptimizer(groups, optimizer_class=torch.optim.AdamW, **adamw)
    return torch.optim.AdamW(groups, **adamw)


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of optimizer state held by this rank (only its shard under ZeRO-1)."""
    local = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard in .optim
    return sum(v.numel() * v.element_size() for state in local.state.values()
               for v in state.values() if hasattr(v, "numel"))
