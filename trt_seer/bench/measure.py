"""How `bench` times one (path, batch) point, and the arithmetic on the times: percentiles and
noise, throughput and cost. Pure functions; nothing here knows a backend.

Every path is timed as its users run it: the end-to-end time (host inputs to host outputs,
`time.perf_counter`) comes from plain calls with nothing added to them. On a GPU the device time of
the model's own work (CUDA events around it, copies excluded) comes from a second, separate pass,
so the events never weigh on the end-to-end figures (`summarize_apart`). Throughput and cost come
from the end-to-end median: it is what a caller pays per call.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

NOISY_CV = 0.10  # coefficient of variation above which a timing is flagged noisy
COST_ASSUMPTION = ("cost per 1M inferences = price per hour / (3600 x end-to-end throughput) x 1e6: one "
                   "request stream that always fills the measured batch, the machine busy 100% of the time, "
                   "nothing else sharing it")


@dataclass(frozen=True)
class TimingSpec:
    """When to stop timing one (path, batch) point."""

    warmup: int = 10
    warmup_s: float = 2.0  # warm-up stops after this long even if fewer than `warmup` runs
    check_every: int = 50  # compare the running median every this many runs
    rtol: float = 0.01  # stable: the median moved less than this between two checks
    max_iters: int = 5000
    budget_s: float = 5.0  # timed runs stop after this long (at least 3 runs)


QUICK_TIMING = TimingSpec(warmup=2, warmup_s=0.2, check_every=5, rtol=0.05, max_iters=10, budget_s=0.3)


def summarize(times_ms: list[float]) -> dict:
    """p50/p90/p99/mean in ms, the coefficient of variation and the noisy flag."""
    import numpy as np

    a = np.asarray(times_ms, dtype=np.float64)
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    mean = float(a.mean())
    cv = float(a.std(ddof=1) / mean) if len(a) > 1 and mean > 0 else 0.0
    return {"iters": int(len(a)), "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "mean_ms": mean,
            "cv": cv, "noisy": cv > NOISY_CV}


def summarize_point(samples: list) -> dict:
    """Summary of (end-to-end ms, device ms or None) samples: the end-to-end figures under the
    plain keys (p50_ms, ...) and the device ones as device_p50_ms / device_p90_ms / device_p99_ms,
    None where the path has no device time (the CPU paths)."""
    e2e = [float(s[0]) for s in samples]
    device = [float(s[1]) for s in samples if s[1] is not None]
    out = summarize(e2e)
    d = summarize(device) if device else {}
    out.update({f"device_{k}": d.get(k) for k in ("p50_ms", "p90_ms", "p99_ms")})
    return out


def summarize_apart(e2e_samples: list, device_samples: list) -> dict:
    """`summarize_point` of the plain calls, its device figures taken from the separate pass with
    CUDA events (whose own end-to-end times are left out)."""
    out = summarize_point(e2e_samples)
    device = [float(s[1]) for s in device_samples if s[1] is not None]
    if device:
        d = summarize(device)
        out.update({f"device_{k}": d[k] for k in ("p50_ms", "p90_ms", "p99_ms")})
    return out


def device_pass(spec: TimingSpec) -> TimingSpec:
    """The device-time pass: device times are steady, so a quarter of the time budget."""
    return dataclasses.replace(spec, warmup=min(spec.warmup, 3), budget_s=spec.budget_s / 4)


def throughput(batch: int, p50_ms: float) -> float:
    """Samples per second at the median latency."""
    return batch * 1000.0 / p50_ms


def cost_per_million(price_per_hour: float, samples_per_s: float) -> float:
    """Price of 1M inferences at `samples_per_s` on a machine billed `price_per_hour` (COST_ASSUMPTION)."""
    return price_per_hour / (3600.0 * samples_per_s) * 1e6


def _ms(sample) -> float:
    return float(sample[0] if isinstance(sample, tuple) else sample)


def measure(once, spec: TimingSpec) -> tuple[list, str]:
    """Calls `once()` through warm-up, then until the running median is stable, `max_iters` runs or
    the time budget. `once()` returns milliseconds, or a tuple whose first item is the milliseconds
    the stop rule watches (end to end) and the rest kept as they are (the device time). Returns
    (what each timed call returned, why it stopped)."""
    end = time.perf_counter() + spec.warmup_s
    for _ in range(spec.warmup):
        once()
        if time.perf_counter() > end:
            break
    samples: list = []
    last_median = None
    deadline = time.perf_counter() + spec.budget_s
    while True:
        samples.append(once())
        n = len(samples)
        if n % spec.check_every == 0:
            median = sorted(_ms(s) for s in samples)[n // 2]
            if last_median is not None and abs(median - last_median) <= spec.rtol * last_median:
                return samples, "stable"
            last_median = median
        if n >= spec.max_iters:
            return samples, "max-iters"
        if n >= 3 and time.perf_counter() > deadline:
            return samples, "time-budget"


def wall_ms(fn) -> float:
    """Milliseconds `fn()` takes by the host clock."""
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000.0
