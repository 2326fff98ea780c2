"""`trt-seer bench`: latency, throughput, memory, size, cost and accuracy of every inference path
this machine can run, in one table.

    python -m trt_seer bench --engines engines/ --batch 1,8,32 --seq 128 --report out/
    python -m trt_seer bench --model-config bert-base      # random-init BERT-base, speed only

Paths: PyTorch (FP32 eager with TF32 off / on, AMP FP16 / BF16 and `.half()` on a GPU, dynamic
INT8 on the CPU), ONNX Runtime on `<engines>/<name>.{fp32,fp16,int8}.onnx`, and the TensorRT
engines `<engines>/<name>.{fp32,fp16,int8}.engine`. A path this machine cannot run is listed as
skipped with the reason, never left out.

Method: every path runs in a fresh Python process, so its peak RSS (VmHWM), the CUDA
allocator's peak and its thread pools are its own. Per batch size: warm-up, then timed runs until
the median moves less than `rtol` between two checks (or the time budget is spent); p50/p90/p99
and the coefficient of variation, flagged noisy above 10%. GPU timings are CUDA events (PyTorch)
or the engine runtime's own GPU time; CPU timings are `time.perf_counter`. Inputs are held-out
text tokenised and padded / truncated to exactly batch x seq.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from fnmatch import fnmatch
from pathlib import Path

from trt_seer.errors import InputError

log = logging.getLogger(__name__)

NOISY_CV = 0.10  # coefficient of variation above which a timing is flagged noisy
INT8_MIN_GAIN = 0.10  # INT8 should be at least this much faster or smaller than its base
REFERENCE = "torch-fp32-cpu"  # accuracy reference: PyTorch FP32 eager on the CPU
EVAL_BATCH = 16
COST_ASSUMPTION = ("cost per 1M inferences = price per hour / (3600 x throughput) x 1e6: one request "
                   "stream that always fills the measured batch, the machine busy 100% of the time, "
                   "nothing else sharing it")


@dataclass(frozen=True)
class PathSpec:
    """One way to run the model. `title` names the method; the row label adds where it ran."""

    key: str
    backend: str  # torch | onnxruntime | tensorrt
    precision: str  # fp32 | tf32 | fp16 | bf16 | int8: what the matrix products compute in
    mode: str  # eager | autocast | half | dynamic-int8 | onnx | engine
    device: str  # cpu | cuda
    title: str


PATHS = (
    PathSpec("torch-fp32-cpu", "torch", "fp32", "eager", "cpu", "PyTorch FP32 eager"),
    PathSpec("torch-int8-cpu", "torch", "int8", "dynamic-int8", "cpu", "PyTorch dynamic INT8"),
    PathSpec("ort-fp32-cpu", "onnxruntime", "fp32", "onnx", "cpu", "ONNX Runtime FP32"),
    PathSpec("ort-fp16-cpu", "onnxruntime", "fp16", "onnx", "cpu", "ONNX Runtime FP16"),
    PathSpec("ort-int8-cpu", "onnxruntime", "int8", "onnx", "cpu", "ONNX Runtime Q/DQ INT8"),
    PathSpec("ort-int8dyn-cpu", "onnxruntime", "int8", "onnx-cpu", "cpu", "ONNX Runtime dynamic INT8 (int8.cpu.onnx)"),
    PathSpec("torch-fp32-gpu", "torch", "fp32", "eager", "cuda", "PyTorch FP32 eager (TF32 off)"),
    PathSpec("torch-tf32-gpu", "torch", "tf32", "eager", "cuda", "PyTorch FP32 eager (TF32 on)"),
    PathSpec("torch-amp-fp16-gpu", "torch", "fp16", "autocast", "cuda", "PyTorch AMP FP16"),
    PathSpec("torch-amp-bf16-gpu", "torch", "bf16", "autocast", "cuda", "PyTorch AMP BF16"),
    PathSpec("torch-half-gpu", "torch", "fp16", "half", "cuda", "PyTorch .half() FP16"),
    PathSpec("trt-fp32", "tensorrt", "fp32", "engine", "cuda", "FP32"),
    PathSpec("trt-fp16", "tensorrt", "fp16", "engine", "cuda", "FP16"),
    PathSpec("trt-int8", "tensorrt", "int8", "engine", "cuda", "INT8"),
)
PATH_BY_KEY = {p.key: p for p in PATHS}
INT8_PAIRS = (("torch-int8-cpu", "torch-fp32-cpu"), ("ort-int8-cpu", "ort-fp32-cpu"),
              ("ort-int8dyn-cpu", "ort-fp32-cpu"), ("trt-int8", "trt-fp16"))

# Random-initialised models built from a config in code (no download), for speed-only runs.
RANDOM_CONFIGS = {
    "bert-base": {"model_type": "bert", "vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512,
                  "type_vocab_size": 2},
}


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


@dataclass(frozen=True)
class BenchSpec:
    model: str | None = None
    model_config: str | None = None  # a RANDOM_CONFIGS key instead of a checkpoint
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
    command: str = ""


def quick(spec: BenchSpec, batches: tuple[int, ...] | None = None, seq: int | None = None) -> BenchSpec:
    """The CI grid: batch 1,2 at seq 16, a few timed runs, 16 held-out samples."""
    return replace(spec, batches=batches or (1, 2), seq=seq or 16, timing=QUICK_TIMING, eval_samples=16,
                   quick=True)


def select_paths(patterns: list[str] | None) -> tuple[str, ...]:
    """Path keys matching any of `patterns` (keys or globs, comma-separated too); all by default."""
    if not patterns:
        return tuple(PATH_BY_KEY)
    wanted = [p for item in patterns for p in item.split(",") if p]
    for pattern in wanted:
        if not any(fnmatch(k, pattern) for k in PATH_BY_KEY):
            raise InputError(f"--paths {pattern!r} matches no path; known: {', '.join(PATH_BY_KEY)}")
    return tuple(k for k in PATH_BY_KEY if any(fnmatch(k, p) for p in wanted))


# ---------------------------------------------------------------------------------------------
# Statistics and arithmetic (pure functions)


def summarize(times_ms: list[float]) -> dict:
    """p50/p90/p99/mean in ms, the coefficient of variation and the noisy flag."""
    import numpy as np

    a = np.asarray(times_ms, dtype=np.float64)
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    mean = float(a.mean())
    cv = float(a.std(ddof=1) / mean) if len(a) > 1 and mean > 0 else 0.0
    return {"iters": int(len(a)), "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "mean_ms": mean,
            "cv": cv, "noisy": cv > NOISY_CV}


def throughput(batch: int, p50_ms: float) -> float:
    """Samples per second at the median latency."""
    return batch * 1000.0 / p50_ms


def cost_per_million(price_per_hour: float, samples_per_s: float) -> float:
    """Price of 1M inferences at `samples_per_s` on a machine billed `price_per_hour` (COST_ASSUMPTION)."""
    return price_per_hour / (3600.0 * samples_per_s) * 1e6


def measure(once, spec: TimingSpec) -> tuple[list[float], str]:
    """Calls `once()` (which returns milliseconds) through warm-up, then until the running median
    is stable, `max_iters` runs or the time budget. Returns (times, why it stopped)."""
    end = time.perf_counter() + spec.warmup_s
    for _ in range(spec.warmup):
        once()
        if time.perf_counter() > end:
            break
    times: list[float] = []
    last_median = None
    deadline = time.perf_counter() + spec.budget_s
    while True:
        times.append(float(once()))
        n = len(times)
        if n % spec.check_every == 0:
            median = sorted(times)[n // 2]
            if last_median is not None and abs(median - last_median) <= spec.rtol * last_median:
                return times, "stable"
            last_median = median
        if n >= spec.max_iters:
            return times, "max-iters"
        if n >= 3 and time.perf_counter() > deadline:
            return times, "time-budget"


# ---------------------------------------------------------------------------------------------
# INT8 benefit


@dataclass(frozen=True)
class Facts:
    """What decides whether an artifact is worth it: its size and its p50 latencies."""

    size_bytes: int | None
    p50_ms: dict  # (seq, batch) -> milliseconds
    where: object = None  # latencies compare only when measured on the same machine


def int8_comparison(int8: Facts, base: Facts) -> dict:
    """{"smaller": fraction or None, "faster": fraction or None, "points": [[seq, batch], ...]};
    faster is 1 - the geometric mean of the p50 ratios over the common (seq, batch) points."""
    smaller = None
    if int8.size_bytes and base.size_bytes:
        smaller = 1.0 - int8.size_bytes / base.size_bytes
    common = sorted(set(int8.p50_ms) & set(base.p50_ms)) if int8.where == base.where else []
    faster = None
    if common:
        logs = [math.log(int8.p50_ms[k] / base.p50_ms[k]) for k in common]
        faster = 1.0 - math.exp(sum(logs) / len(logs))
    return {"smaller": smaller, "faster": faster, "points": [list(k) for k in common]}


def has_int8_benefit(smaller: float | None, faster: float | None) -> bool:
    """At least INT8_MIN_GAIN faster, or that much smaller without being slower. Unknown is no
    evidence against it."""
    if smaller is None and faster is None:
        return True
    if faster is not None and faster >= INT8_MIN_GAIN:
        return True
    return smaller is not None and smaller >= INT8_MIN_GAIN and (faster is None or faster >= 0)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**10:,.1f} KiB" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


def fmt_smaller(x: float) -> str:
    return f"{x:.0%} smaller" if x >= 0 else f"{-x:.0%} larger"


def fmt_faster(x: float) -> str:
    """From `faster` (1 - latency ratio): '12% faster' or '1.31x the latency (slower)'."""
    return f"{x:.0%} faster" if x >= 0 else f"slower ({1 - x:.2f}x the latency)"


def int8_verdict(int8: Facts, base: Facts, base_name: str) -> str | None:
    """A plain warning when INT8 buys too little over `base_name`, else None."""
    c = int8_comparison(int8, base)
    if has_int8_benefit(c["smaller"], c["faster"]):
        return None
    parts = []
    if c["smaller"] is not None:
        parts.append(f"{fmt_smaller(c['smaller'])} ({fmt_bytes(int8.size_bytes)} vs {fmt_bytes(base.size_bytes)})")
    if c["faster"] is not None:
        where = ", ".join(f"b{b}" for _, b in c["points"])
        parts.append(f"{fmt_faster(c['faster'])} at p50 (seq {c['points'][0][0]}, {where})")
    else:
        parts.append("latency not measured yet (run trt-seer bench)")
    return (f"INT8 brings no real benefit over {base_name}: {' and '.join(parts)}; less than "
            f"{INT8_MIN_GAIN:.0%} gained for the accuracy INT8 costs, so prefer {base_name}")


def manifest_facts(data: dict) -> Facts:
    """Facts from an engine manifest (or ONNX record) and its `bench` section, if any."""
    size = data.get("engine", {}).get("size_bytes") or (data.get("stat") or [None])[0]
    bench = data.get("bench") or {}
    p50 = {(int(bench["seq"]), int(p["batch"])): float(p["p50_ms"]) for p in bench.get("points", [])}
    return Facts(size, p50, json.dumps(bench.get("machine"), sort_keys=True))


def int8_benefit_warning(int8_manifest: dict, fp16_manifest: dict) -> str | None:
    """For `build --int8`: a warning when the INT8 engine is not at least 10% faster (latency from
    the manifests' `bench` sections, when both have one) or 10% smaller than the FP16 engine."""
    return int8_verdict(manifest_facts(int8_manifest), manifest_facts(fp16_manifest), "FP16")


# ---------------------------------------------------------------------------------------------
# What this machine can run


@dataclass(frozen=True)
class Host:
    cpu: str
    cores: int
    gpu: str | None  # "NVIDIA H200", as PyTorch or the engine runtime sees it
    torch_gpu_reason: str | None  # why PyTorch cannot use a GPU here; None when it can
    bf16: bool
    torch_int8: bool
    onnxruntime: str | None  # version
    tensorrt: dict | None  # {"flavor", "version"} when a flavor imports
    engine_reason: str | None  # why engines cannot run here; None when they can
    versions: dict

    def machine(self, threads: int | None) -> dict:
        return {"cpu": self.cpu, "cores": self.cores, "threads": threads, "gpu": self.gpu}


def cpu_name() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), else what platform reports."""
    cpuinfo = Path("/proc/cpuinfo")  # Linux; platform.processor() names it elsewhere
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or platform.machine()


def _torch_gpu() -> tuple[str | None, str | None, bool]:
    """(GPU name, why PyTorch has no GPU or None, BF16 support)."""
    import torch

    if not torch.cuda.is_available():
        return None, f"no CUDA GPU visible to PyTorch {torch.__version__} (torch.cuda.is_available() is False)", False
    return torch.cuda.get_device_name(0), None, bool(torch.cuda.is_bf16_supported())


def _engine_facts() -> tuple[dict | None, str | None, str | None]:
    """(TensorRT flavor, GPU name as cuda-python sees it, why engines cannot run here or None)."""
    from trt_seer import runtime
    from trt_seer.engine import trt
    from trt_seer.runtime import cuda

    flavor = trt.load().describe() if trt.available() else None
    gpu = None if cuda.gpu_unavailable_reason() else cuda.device_info(0).name
    return flavor, gpu, runtime.tensorrt_unavailable_reason()


def _versions() -> dict:
    import importlib.util

    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    if importlib.util.find_spec("onnxruntime"):
        import onnxruntime

        out["onnxruntime"] = onnxruntime.__version__
    return out


def probe_host() -> Host:
    """What this machine offers; imports torch (and TensorRT, if installed) but starts no work."""
    import torch

    torch_gpu, torch_reason, bf16 = _torch_gpu()
    flavor, engine_gpu, engine_reason = _engine_facts()
    versions = _versions()
    if flavor:
        versions[flavor["flavor"]] = flavor["version"]
    quant = {"fbgemm", "x86", "qnnpack", "onednn"} & set(torch.backends.quantized.supported_engines)
    return Host(cpu_name(), os.cpu_count() or 1, torch_gpu or engine_gpu, torch_reason, bf16, bool(quant),
                versions.get("onnxruntime"), flavor, engine_reason, versions)


FLAVOR_NAMES = {"tensorrt": "TensorRT", "tensorrt_rtx": "TensorRT-RTX"}


def short_gpu_name(name: str) -> str:
    """'NVIDIA H200' -> 'H200'; 'NVIDIA GeForce RTX 4090' -> 'GeForce RTX 4090'."""
    return name.removeprefix("NVIDIA ").strip() or name


def label(path: PathSpec, host: Host) -> str:
    """The row name: method plus where it ran, e.g. 'TensorRT-RTX FP16 on H200'."""
    where = "CPU" if path.device == "cpu" else short_gpu_name(host.gpu) if host.gpu else "GPU"
    if path.backend == "tensorrt":
        flavor = (host.tensorrt or {}).get("flavor", "tensorrt")
        return f"{FLAVOR_NAMES.get(flavor, flavor)} {path.title} on {where}"
    return f"{path.title} on {where}"


def artifact_path(path: PathSpec, engines: Path, name: str) -> Path | None:
    if path.backend == "onnxruntime":
        cpu = ".cpu" if path.mode == "onnx-cpu" else ""  # build --int8 writes int8.cpu.onnx for ONNX Runtime
        return Path(engines) / f"{name}.{path.precision}{cpu}.onnx"
    if path.backend == "tensorrt":
        return Path(engines) / f"{name}.{path.precision}.engine"
    return None


def skip_reason(path: PathSpec, host: Host, artifact: Path | None) -> str | None:
    """Why `path` cannot run here (all reasons, '; '-joined), or None."""
    reasons = []
    if path.backend == "torch" and path.device == "cuda" and host.torch_gpu_reason:
        reasons.append(host.torch_gpu_reason)
    if path.precision == "bf16" and not host.torch_gpu_reason and not host.bf16:
        reasons.append(f"{host.gpu} has no BF16 support")
    if path.mode == "dynamic-int8" and not host.torch_int8:
        reasons.append("this PyTorch build has no quantized CPU engine (fbgemm / x86 / qnnpack)")
    if path.backend == "onnxruntime" and not host.onnxruntime:
        reasons.append("onnxruntime is not installed")
    if path.backend == "tensorrt" and host.engine_reason:
        reasons.append(f"engines cannot run here: {host.engine_reason}")
    if artifact is not None and not artifact.is_file():
        reasons.append(f"no {artifact.name} in {artifact.parent}/ ({_how_to_make(path, artifact.parent)})")
    return "; ".join(reasons) or None


def _how_to_make(path: PathSpec, folder: Path) -> str:
    if path.backend == "tensorrt":
        return f"make it with: trt-seer build --{path.precision} --out {folder}"
    if path.precision == "int8":
        return f"make it with: trt-seer build --int8 --out {folder}"
    flag = " --fp16" if path.precision == "fp16" else ""
    return f"make it with: trt-seer export{flag} --out {folder}"


# ---------------------------------------------------------------------------------------------
# The plan: which path runs which batches


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


def _fit_profile(planned: Planned, seq: int) -> Planned:
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


def plan(spec: BenchSpec, name: str, host: Host) -> list[Planned]:
    """One entry per selected path, each runnable or with its skip reason."""
    out = []
    for key in spec.paths:
        path = PATH_BY_KEY[key]
        artifact = artifact_path(path, spec.engines, name)
        reason = skip_reason(path, host, artifact)
        planned = Planned(path, label(path, host), artifact, () if reason else tuple(sorted(spec.batches)),
                          reason=reason)
        if path.backend == "tensorrt" and not reason:
            planned = _fit_profile(planned, spec.seq)
        out.append(planned)
    return out


def eval_batch_size(planned: list[Planned]) -> int:
    """One held-out batch size every runnable path accepts, so all see the same eval batches."""
    size = EVAL_BATCH
    for p in planned:
        if p.path.backend == "tensorrt" and not p.reason:
            size = min(size, (_engine_profile(p.artifact) or {"batch": [1, 1, EVAL_BATCH]})["batch"][2])
    return size


# ---------------------------------------------------------------------------------------------
# The parent: run every planned path, then put the table together


def _job(planned: Planned, info, spec: BenchSpec, out: Path, eval_batch: int, timed: bool = True) -> dict:
    return {"path": planned.path.key, "model": str(info.path), "task": info.task,
            "artifact": str(planned.artifact) if planned.artifact else None,
            "batches": list(planned.batches) if timed else [], "seq": spec.seq, "threads": spec.threads,
            "timing": asdict(spec.timing), "eval_samples": spec.eval_samples, "eval_batch": eval_batch,
            "out": str(out)}


def run_worker(job: dict, bar) -> dict:
    """Runs one path in a fresh Python process; advances `bar` per finished point."""
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "job.json").write_text(json.dumps(job))
    code = "import sys; from trt_seer.bench.worker import main; sys.exit(main(sys.argv[1]))"
    with open(out / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, str(out / "job.json")], stdout=subprocess.PIPE,
                                stderr=err, text=True)
        for line in proc.stdout:
            if line.strip() == "POINT":
                bar.update(1)
        rc = proc.wait()
    result_file = out / "result.json"
    if result_file.is_file():
        return json.loads(result_file.read_text())
    tail = [line for line in (out / "stderr.txt").read_text().splitlines() if line.strip()]
    return {"error": tail[-1] if tail else f"the benchmark process exited with code {rc}"}


def _eval_outputs(out: Path):
    import numpy as np

    f = out / "eval.npz"
    if not f.is_file():
        return None
    with np.load(f) as z:
        return {k: z[k] for k in z.files}


def _accuracy(task: str, ref: dict | None, cand: dict | None) -> dict | None:
    from trt_seer.eval.metrics import task_metrics

    if ref is None or cand is None:
        return None
    if any(ref[k].shape != cand[k].shape for k in ref):
        return None
    return task_metrics(task, ref, cand)


def _row(planned: Planned, result: dict | None, spec: BenchSpec) -> dict:
    row = {"key": planned.path.key, "label": planned.label, "backend": planned.path.backend,
           "precision": planned.path.precision, "mode": planned.path.mode, "device": planned.path.device,
           "artifact": str(planned.artifact) if planned.artifact else None,
           "skipped_batches": [{"batch": b, "reason": r} for b, r in planned.skipped_batches]}
    if planned.reason or result is None:
        return {**row, "status": "skipped", "reason": planned.reason or "not run", "points": []}
    if "error" in result:
        return {**row, "status": "failed", "reason": result["error"], "points": []}
    failed = [p for p in result["points"] if "error" in p]
    row["skipped_batches"] += [{"batch": p["batch"], "reason": f"failed: {p['error']}"} for p in failed]
    points = [_with_cost(p, spec.price_per_hour) for p in result["points"] if "error" not in p]
    if failed and not points:
        return {**row, "status": "failed", "reason": failed[0]["error"], "points": []}
    keep = ("size_bytes", "size_kind", "timing_kind", "memory_kind", "rss_before_load_bytes", "rss_peak_bytes")
    row["accuracy_note"] = f"held-out run failed: {result['eval_error']}" if result.get("eval_error") else None
    return {**row, "status": "ok", "reason": None, "points": points, **{k: result[k] for k in keep}}


def _with_cost(point: dict, price: float) -> dict:
    thr = throughput(point["batch"], point["p50_ms"])
    return {**point, "throughput": thr, "cost_per_million": cost_per_million(price, thr)}


def accuracy_summary(task: str, metrics: dict | None, is_reference: bool) -> str:
    if is_reference:
        return "reference"
    if not metrics:
        return "n/a"
    if task == "feature-extraction":
        return f"cos {metrics['mean_cosine']:.5f}"
    return f"top-1 {metrics['top1_agreement']:.4f}"


def _add_accuracy(rows: list[dict], outputs: dict, task: str, ref_status: str) -> None:
    ref = outputs.get(REFERENCE)
    for row in rows:
        if row["status"] != "ok":
            continue
        is_ref = row["key"] == REFERENCE
        row["accuracy"] = None if is_ref else _accuracy(task, ref, outputs.get(row["key"]))
        row["accuracy_summary"] = accuracy_summary(task, row["accuracy"], is_ref)
        if ref is None and not is_ref:
            row["accuracy_note"] = row.get("accuracy_note") or f"no FP32 reference: {ref_status}"


def _facts(row: dict, seq: int, machine: dict) -> Facts:
    where = json.dumps({**machine, "device": row["device"]}, sort_keys=True)
    return Facts(row.get("size_bytes"), {(seq, p["batch"]): p["p50_ms"] for p in row["points"]}, where)


def int8_findings(rows: list[dict], seq: int, machine: dict) -> list[dict]:
    """INT8 against its base for every pair where both ran: the numbers and the warning, if any."""
    by_key = {r["key"]: r for r in rows if r["status"] == "ok"}
    found = []
    for int8_key, base_key in INT8_PAIRS:
        if int8_key in by_key and base_key in by_key:
            a, b = _facts(by_key[int8_key], seq, machine), _facts(by_key[base_key], seq, machine)
            base_name = by_key[base_key]["label"]
            found.append({"int8": by_key[int8_key]["label"], "base": base_name, **int8_comparison(a, b),
                          "warning": int8_verdict(a, b, base_name)})
    return found


def _run_all(planned: list[Planned], info, spec: BenchSpec, tmp: Path) -> tuple[dict, dict]:
    from tqdm import tqdm

    runnable = [p for p in planned if not p.reason]
    extra_ref = REFERENCE not in {p.path.key for p in runnable}
    total = sum(len(p.batches) + 1 for p in runnable) + int(extra_ref)
    eval_batch = eval_batch_size(planned)
    results, outputs = {}, {}
    with tqdm(total=total, desc="bench", unit="point", dynamic_ncols=True) as bar:
        for p in runnable:
            bar.set_postfix_str(p.path.key)
            out = tmp / p.path.key
            results[p.path.key] = run_worker(_job(p, info, spec, out, eval_batch), bar)
            outputs[p.path.key] = _eval_outputs(out)
        if extra_ref:  # accuracy needs the FP32 reference even when its timing was not asked for
            ref = Planned(PATH_BY_KEY[REFERENCE], "", None)
            results["_reference"] = run_worker(_job(ref, info, spec, tmp / "_reference", eval_batch, False), bar)
            outputs[REFERENCE] = _eval_outputs(tmp / "_reference")
    return results, outputs


def _reference_status(results: dict, outputs: dict) -> str:
    if outputs.get(REFERENCE) is not None:
        return "ok"
    result = results.get(REFERENCE) or results.get("_reference") or {}
    return result.get("error", "the reference path did not run")


def assemble(spec: BenchSpec, info, host: Host, planned: list[Planned], results: dict, outputs: dict) -> dict:
    """The report: settings, machine, one row per path (ok, skipped or failed), INT8 findings."""
    rows = [_row(p, results.get(p.path.key), spec) for p in planned]
    _add_accuracy(rows, outputs, info.task, _reference_status(results, outputs))
    machine = host.machine(spec.threads)
    from trt_seer.bench.worker import inputs_description

    inputs = inputs_description(info)
    return {
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": spec.command,
        "model": {"name": info.name, "path": str(info.path), "task": info.task, "model_type": info.model_type,
                  "random_init": spec.model_config},
        "machine": {**machine, "versions": host.versions, "tensorrt": host.tensorrt},
        "settings": {"batches": list(spec.batches), "seq": spec.seq, "price_per_hour": spec.price_per_hour,
                     "quick": spec.quick, "timing": asdict(spec.timing), "eval_samples": spec.eval_samples,
                     "inputs": inputs, "engines": str(spec.engines)},
        "method": {"isolation": "each path in a fresh Python process; host memory is that process's peak RSS "
                                "(VmHWM), so it includes the Python runtime and the libraries the path imports",
                   "noisy_cv": NOISY_CV, "accuracy_reference": REFERENCE, "cost": COST_ASSUMPTION},
        "rows": rows,
        "int8": int8_findings(rows, spec.seq, machine),
    }


def record_in_manifests(report: dict) -> list[Path]:
    """Writes each artifact's results under `bench` in its engine manifest / ONNX record."""
    from trt_seer.engine import manifest

    written = []
    for row in report["rows"]:
        if row["status"] != "ok" or not row["artifact"]:
            continue
        artifact = Path(row["artifact"])
        target = (manifest.engine_manifest_path(artifact) if row["backend"] == "tensorrt"
                  else manifest.record_path(artifact))
        if target.is_file():
            manifest.update_section(target, "bench", bench_section(report, row))
            written.append(target)
    return written


def bench_section(report: dict, row: dict) -> dict:
    keep = ("batch", "p50_ms", "p90_ms", "p99_ms", "cv", "noisy", "throughput", "memory_bytes", "cost_per_million")
    machine = {k: report["machine"][k] for k in ("cpu", "cores", "threads", "gpu")}  # as Host.machine()
    return {"measured_at": report["created_at"], "label": row["label"], "path": row["key"],
            "machine": {**machine, "device": row["device"]},
            "seq": report["settings"]["seq"], "timing_kind": row["timing_kind"], "memory_kind": row["memory_kind"],
            "price_per_hour": report["settings"]["price_per_hour"],
            "points": [{k: p[k] for k in keep if k in p} for p in row["points"]],
            "accuracy_vs_fp32": row.get("accuracy")}


def random_checkpoint(config_name: str, dest: Path) -> Path:
    """Saves a random-initialised model of a RANDOM_CONFIGS size into `dest` (no download); copies
    the default model's tokenizer when the vocabularies match, so inputs are real text."""
    import torch
    import transformers

    if config_name not in RANDOM_CONFIGS:
        raise InputError(f"unknown --model-config {config_name!r}; choose one of {', '.join(RANDOM_CONFIGS)}")
    kwargs = dict(RANDOM_CONFIGS[config_name])
    config = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    torch.manual_seed(0)
    transformers.AutoModel.from_config(config, dtype=torch.float32).eval().save_pretrained(dest)
    _copy_tokenizer(Path(dest), config.vocab_size)
    return Path(dest)


def _copy_tokenizer(dest: Path, vocab_size: int) -> None:
    import shutil

    from trt_seer.export.families import default_checkpoint

    try:
        src = default_checkpoint()
    except InputError as e:
        log.info("random-init model gets random token ids: %s", e)
        return
    if json.loads((src / "config.json").read_text()).get("vocab_size") != vocab_size:
        log.info("random-init model gets random token ids: the default tokenizer's vocabulary differs")
        return
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (src / name).is_file():
            shutil.copy(src / name, dest / name)


@contextlib.contextmanager
def model_info(spec: BenchSpec):
    """The ModelInfo to benchmark: a checkpoint, or a random-init model saved to a temp dir."""
    from trt_seer.export.families import resolve_model

    if spec.model_config is None:
        yield resolve_model(spec.model, spec.task)
        return
    with tempfile.TemporaryDirectory(prefix="trt-seer-bench-") as tmp:
        dest = random_checkpoint(spec.model_config, Path(tmp) / f"{spec.model_config}-random-init")
        yield resolve_model(dest, spec.task)


def bench(spec: BenchSpec) -> dict:
    """Runs the sweep and returns the report (see `assemble`); records results in manifests."""
    host = probe_host()
    with model_info(spec) as info, tempfile.TemporaryDirectory(prefix="trt-seer-bench-") as tmp:
        planned = plan(spec, info.name, host)
        results, outputs = _run_all(planned, info, spec, Path(tmp))
        report = assemble(spec, info, host, planned, results, outputs)
    if spec.write_manifests:
        report["manifests_updated"] = [str(p) for p in record_in_manifests(report)]
    return report
