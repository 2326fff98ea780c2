"""What one `bench` run will do: the settings (BenchSpec) and, per selected path, the batches it
runs or why it is skipped (an engine runs only the batches inside its optimization profile)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from trt_seer.bench.measure import QUICK_TIMING, TimingSpec
from trt_seer.bench.paths import PATH_BY_KEY, PathSpec, artifact_path, label, skip_reason

EVAL_BATCH = 16


@dataclass(frozen=True)
class BenchSpec:
    model: str | None = None
    model_config: str | None = None  # a bench.model.RANDOM_CONFIGS key instead of a checkpoint
    task: str | None = None
    engines: Path = Path("engines")
    batches: tuple[int, ...] = (1, 8, 32)
    seq: int = 128
    price_per_hour: float = 2.5
    paths: tuple[str, ...] = tuple(PATH_BY_KEY)
    threads: int | None = None  # intra-op threads for the CPU paths (default: the library's)
    timing: TimingSpec = field(default_factory=TimingSpec)
    eval_samples: int = 128
    quick: bool = False
    write_manifests: bool = True
    main_output: bool = True  # engine paths also timed returning only the task's main output
    command: str = ""


def quick(spec: BenchSpec, batches: tuple[int, ...] | None = None, seq: int | None = None) -> BenchSpec:
    """The CI grid: batch 1,2 at seq 16, a few timed runs, 16 held-out samples."""
    return replace(spec, batches=batches or (1, 2), seq=seq or 16, timing=QUICK_TIMING, eval_samples=16,
                   quick=True)


@dataclass(frozen=True)
class Planned:
    path: PathSpec
    label: str
    artifact: Path | None
    batches: tuple[int, ...] = ()
    skipped_batches: tuple[tuple[int, str], ...] = ()
    reason: str | None = None  # the whole path is skipped


def _engine_profile(artifact: Path) -> dict | None:
    from trt_seer.engine import manifest

    data = manifest.read_if_exists(manifest.engine_manifest_path(artifact))
    return (data or {}).get("profiles", [None])[0]


def fit_profile(planned: Planned, seq: int) -> Planned:
    """Skips the batches (or the whole engine) outside the engine's optimization profile."""
    profile = _engine_profile(planned.artifact)
    if not profile:
        return planned
    lo, _, hi = profile["seq"]
    if not lo <= seq <= hi:
        return replace(planned, batches=(), reason=f"seq {seq} is outside the engine's profile ({lo}..{hi})")
    lo, _, hi = profile["batch"]
    keep = tuple(b for b in planned.batches if lo <= b <= hi)
    skipped = tuple((b, f"outside the engine's batch profile ({lo}..{hi})") for b in planned.batches if b not in keep)
    return replace(planned, batches=keep, skipped_batches=skipped)


def plan(spec: BenchSpec, name: str, host) -> list[Planned]:
    """One entry per selected path, each runnable on `host` (a bench.host.Host) or with its skip reason."""
    out = []
    for key in spec.paths:
        path = PATH_BY_KEY[key]
        artifact = artifact_path(path, spec.engines, name)
        reason = skip_reason(path, host, artifact)
        planned = Planned(path, label(path, host), artifact, () if reason else tuple(sorted(spec.batches)),
                          reason=reason)
        if path.backend == "tensorrt" and not reason:
            planned = fit_profile(planned, spec.seq)
        out.append(planned)
    return out


def eval_batch_size(planned: list[Planned]) -> int:
    """One held-out batch size every runnable path accepts, so all see the same eval batches."""
    size = EVAL_BATCH
    for p in planned:
        if p.path.backend == "tensorrt" and not p.reason:
            size = min(size, (_engine_profile(p.artifact) or {"batch": [1, 1, EVAL_BATCH]})["batch"][2])
    return size


def copies_path(planned: list[Planned]) -> str | None:
    """The path whose process also measures host<->device copy bandwidth: the first engine that runs."""
    return next((p.path.key for p in planned if p.path.backend == "tensorrt" and p.batches), None)
