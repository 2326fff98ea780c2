"""The library entry of `trt-seer build`: a BuildRequest in, engines + manifests out.

    from trt_seer.build import BuildRequest, build
    result = build(BuildRequest(model="ckpt/", precisions=("fp16", "int4"), out=Path("engines")))
    result.manifests["int4"]["engine"]["file"]

Plan first, then execute: a request whose engines are all up to date is answered from their
manifests (a hash of the request, no torch import); otherwise the model is resolved, the disk and
memory it needs are worked out from the checkpoint's headers (resources.py) and a build into a
directory without room is refused before anything is written. `dry_run` stops after the plan.
Encoders run the stage sequence of pipeline.py; decoders the streaming one of decoder_build.py.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

from trt_seer import __version__
from trt_seer.engine import manifest
from trt_seer.engine.build import BuildSpec
from trt_seer.files import sha256_json
from trt_seer.quantize.spec import QuantStageSpec

log = logging.getLogger(__name__)
ORDER = ("fp32", "fp16", "int8", "int4")
PROMPT_SLICE = 512  # tokens per prompt slice of chunked attention's engines by default (--prompt-slice)


@dataclass(frozen=True)
class BuildRequest:
    """What to build. `spec` is the engine settings shared by every precision (its precision is
    replaced per engine); `quant` what the INT8/INT4 stages take from the user."""

    model: str | None = None
    task: str | None = None
    precisions: tuple[str, ...] = ("fp16",)
    out: Path = Path("engines")
    spec: BuildSpec = field(default_factory=BuildSpec)
    quant: QuantStageSpec | None = None
    force: bool = False
    keep_intermediates: bool | None = None  # decoders; None: keep where no engine runs here
    dry_run: bool = False
    attention: str = "eager"  # causal LMs: "eager" or "chunked" (export/attention.py); encoders: "decomposed"
    packed: bool = False  # feature-extraction encoders: also the packed-token FP16 form (export/packed.py)
    prompt_slice: int | None = None  # causal LMs: tokens per prompt slice; None: PROMPT_SLICE if chunked; 0: none

    def chosen(self) -> list[str]:
        """FP16 when none is given; INT8/INT4 bring their FP16 engine along, the baseline they are
        judged by."""
        chosen = set(self.precisions) or {"fp16"}
        if chosen & {"int8", "int4"}:
            chosen.add("fp16")
        return [p for p in ORDER if p in chosen]

    def quant_spec(self) -> QuantStageSpec:
        return self.quant or QuantStageSpec(out=Path(self.out), batch=self.spec.profile.batch,
                                            seq=self.spec.profile.seq, model=self.model, force=self.force)

    def engine_spec(self, precision: str) -> BuildSpec:
        return replace(self.spec, precision=precision)


@dataclass
class BuildResult:
    manifests: dict = field(default_factory=dict)  # precision -> engine manifest
    plan: object = None  # resources.Plan, None on a cache hit
    stages: list = field(default_factory=list)  # resources.StageMeter records
    up_to_date: bool = False
    heading: str = ""  # "plan for <model> (<precisions>) into <out>:", above the plan


def build(request: BuildRequest) -> BuildResult:
    """Builds (or finds up to date) every engine `request` asks for; see the module docstring."""
    request = with_decoder_limits(request)
    hit = _cache_hit(request)
    if hit is not None:
        for p, m in hit.items():
            log.info("%s engine up to date: %s (%.1f MiB)", p, Path(request.out) / m["engine"]["file"],
                     m["engine"]["size_bytes"] / 2**20)
        return BuildResult(hit, up_to_date=True)
    from trt_seer import resources
    from trt_seer.export.families import check_profile, resolve_model
    from trt_seer.files import check_out_dir, ensure_out_dir

    info = replace(resolve_model(request.model, request.task), attention=request.attention)
    check_out_dir(request.out)
    chosen = request.chosen()
    check_profile(info, request.spec.profile)
    _check_request(info, request, chosen)
    if info.task == "causal-lm":
        from trt_seer.decoder_build import keeping_cpu_forms

        request = keeping_cpu_forms(request)
    if request.spec.prompt_slice:
        log.info("the engine takes prompts over %d tokens in slices of %d, each on the cache of those before it",
                 request.spec.prompt_slice, request.spec.prompt_slice)
    if request.attention == "chunked":
        log.info("chunked attention: TensorRT workspace limit %d MiB, room for a prompt step of %d x %d tokens",
                 request.spec.workspace_mb, request.spec.profile.batch[2], request.spec.profile.seq[2])
    plan = plan_for(info, request, chosen)
    heading = f"plan for {info.name} ({', '.join(chosen)}) from {info.path} into {request.out}:"
    if request.dry_run:
        return BuildResult(plan=plan, heading=heading)
    resources.check_room(plan, request.out, already=_existing_bytes(request.out, info.name))
    log.info("%s\n%s", heading, plan.describe())
    out = ensure_out_dir(request.out)
    if info.task == "causal-lm":
        from trt_seer.decoder_build import build_decoder as run
    else:
        from trt_seer.encoder_build import build_encoder as run
    manifests, stages = run(info, replace(request, out=out), chosen)
    result = BuildResult(manifests, plan, stages)
    _stamp(request, result, info)
    return result


def with_decoder_limits(request: BuildRequest) -> BuildRequest:
    """`request` with two engine settings of causal LMs settled (both in the engine's cache key):
    - the prompt slice (engine/profiles.py): `request.prompt_slice`, by default PROMPT_SLICE with
      chunked attention and none with eager; none where no prompt of the profile is longer;
    - for chunked attention, TensorRT's workspace limit, raised where it is lower to a bound on what
      the scores of the profile's largest prompt step take (export/attention.prompt_scratch_bytes):
      the longest prompt at once, or a slice on the longest cache. TensorRT-RTX refuses an
      allocation over the limit the engine is built with, in the build and at run time; the limit
      is a ceiling, and a step allocates only what its plan needs."""
    chunked = request.attention == "chunked"
    profile = request.spec.profile
    chosen = request.prompt_slice if request.prompt_slice is not None else PROMPT_SLICE if chunked else 0
    spec = replace(request.spec, prompt_slice=chosen if 0 < chosen < profile.seq[2] else None)
    if chunked:
        from trt_seer.engine.profiles import check_total
        from trt_seer.export.attention import prompt_scratch_bytes
        from trt_seer.export.families import resolve_model

        config, batch = resolve_model(request.model, request.task).config, profile.batch[2]
        need = prompt_scratch_bytes(config, batch, profile.seq[2])
        if spec.prompt_slice:
            cached = check_total(profile, spec.max_total) - 1
            need = max(need, prompt_scratch_bytes(config, batch, spec.prompt_slice, cached))
        spec = replace(spec, workspace_mb=max(spec.workspace_mb, -(-need // 2**20)))
    return replace(request, spec=spec)


def _check_request(info, request: BuildRequest, chosen: list[str]) -> None:
    """Every option checked against the model and the installed TensorRT before any work."""
    from trt_seer.engine import trt
    from trt_seer.errors import UnsupportedError

    flavor = trt.load()
    trt.check_targets(flavor, request.spec.compute_caps)
    trt.target_description(flavor, request.spec.hardware_compat, request.spec.compute_caps)
    quant = request.quant_spec()
    if request.attention == "chunked" and info.task != "causal-lm":
        raise UnsupportedError(f"--attention {request.attention} is for causal LMs; {info.name} is {info.task}")
    if request.attention == "decomposed" and info.task == "causal-lm":
        raise UnsupportedError(f"--attention decomposed is for encoders; {info.name} is {info.task}")
    if request.packed and info.task != "feature-extraction":
        raise UnsupportedError(f"--packed is for feature-extraction encoders; {info.name} is {info.task}")
    if request.packed and "fp16" not in request.chosen():
        raise UnsupportedError("--packed builds the FP16 packed-token form; add --fp16")
    if request.packed and request.attention == "decomposed":
        raise UnsupportedError("--packed needs the fused attention form; drop --attention decomposed")
    if request.prompt_slice and info.task != "causal-lm":
        raise UnsupportedError(f"--prompt-slice is for causal LMs; {info.name} is {info.task}")
    if "int4" in chosen and info.task != "causal-lm":
        raise UnsupportedError(f"--int4 is weight-only quantization for decoding; {info.name} is {info.task}, "
                               "use --int8")
    if "int8" in chosen and info.task == "causal-lm" and quant.int8_mode == "w8a8":
        raise UnsupportedError("causal LMs get weight-only INT8 (what pays when decoding); drop --int8-mode w8a8")
    if chosen[-1] in ("int8", "int4"):
        from trt_seer.quantize import int8

        int8.check_spec(quant)
    if "int4" in chosen:
        from trt_seer.quantize.decoder_stage import int4_qat

        int4_qat(info, quant, 4)  # a finetune --qat int4 checkpoint: same block size, same LM head


def plan_for(info, request: BuildRequest, chosen: list[str]):
    """The disk and memory the build needs (resources.Plan)."""
    from trt_seer import resources

    sizes = resources.weight_sizes(info.path, info.config)
    if sizes is None:
        plan = resources.Plan(notes=["no safetensors in the checkpoint: sizes not known ahead, room not checked"])
        return plan
    if info.task == "causal-lm":
        from trt_seer.decoder_build import plan_decoder

        return plan_decoder(sizes, chosen, request.quant_spec(), request.keep_intermediates)
    from trt_seer.encoder_build import plan_encoder

    return plan_encoder(sizes, chosen)


def _existing_bytes(out: Path, name: str) -> int:
    """Bytes of this model's artifacts already under `out` (a rebuild replaces them)."""
    from trt_seer.resources import disk_usage

    out = Path(out)
    return sum(disk_usage(p) if p.is_dir() else p.stat().st_blocks * 512 for p in out.glob(f"{name}.*")) \
        if out.is_dir() else 0


# --- cache hits without resolving the model ----------------------------------------------------

def _name(request: BuildRequest) -> tuple[Path, str] | None:
    from trt_seer.export.families import DEFAULT_MODEL_NAME, default_checkpoint

    if request.model is None:
        return default_checkpoint(), DEFAULT_MODEL_NAME
    path = Path(request.model)
    return (path, path.resolve().name) if (path / "config.json").is_file() else None


def request_key(request: BuildRequest, precision: str, source: dict) -> str:
    """What an engine was asked for: checkpoint identity, task, engine settings, quantization
    options (for INT8/INT4), TensorRT flavor/version/targets and this version of trt_seer."""
    from dataclasses import asdict

    from trt_seer.engine import trt
    from trt_seer.records import source_identity

    flavor = trt.load()
    quant = {}
    if precision in ("int8", "int4"):
        from trt_seer.quantize import int8

        q = request.quant_spec()
        quant = {k: v for k, v in asdict(q).items() if k not in ("out", "force", "model")}
        quant["data"] = int8.data_fingerprint(q)
    return sha256_json({"source": source_identity(source), "task": request.task,
                        "spec": request.engine_spec(precision).settings(), "quant": quant,
                        "tensorrt": flavor.describe(), "targets": trt.target_description(
                            flavor, request.spec.hardware_compat, request.spec.compute_caps),
                        "qat": _qat_sha(source), "trt_seer": __version__,
                        **({"attention": request.attention} if request.attention != "eager" else {}),
                        **({"packed": True} if request.packed else {})})


def _qat_sha(source: dict) -> str | None:
    from trt_seer.files import sha256_file

    qat = Path(source["checkpoint"]) / "qat_ranges.json"
    return sha256_file(qat) if qat.is_file() else None


def _cache_hit(request: BuildRequest) -> dict | None:
    """{precision: manifest} when every asked-for engine is up to date for this very request."""
    from trt_seer.engine import trt
    from trt_seer.records import checkpoint_fingerprint, file_sha

    if request.force or request.dry_run or not Path(request.out).is_dir():
        return None
    found = _name(request)
    if found is None:
        return None
    ckpt, name = found
    targets = trt.target_description(trt.load(), request.spec.hardware_compat, request.spec.compute_caps)
    if targets["mode"] in trt.NEEDS_BUILD_GPU:
        return None  # the key would need the build GPU: resolve and build as usual
    hit = {}
    for p in request.chosen():
        engine = Path(request.out) / f"{name}.{p}.engine"
        m = manifest.read_if_exists(manifest.engine_manifest_path(engine))
        if not m or not engine.is_file() or "request_key" not in m.get("build", {}):
            return None
        source = checkpoint_fingerprint(ckpt, m.get("source"))
        if m["build"]["request_key"] != request_key(request, p, source):
            return None
        if file_sha(engine, m["engine"]) != m["engine"]["sha256"]:
            return None
        if "decoder" in m and not _sampler_beside(engine, m):
            return None  # a decoder's build ends with its device sampler
        if "decoder" in m and request.keep_intermediates is None and not _runs_here(engine):
            return None  # built where engines ran: the graphs ONNX Runtime runs instead are made again
        if "decoder" in m and not _same_network_passes(request, p, m):
            return None
        if "decoder" not in m and p != "fp32" and m.get("graph_form", {}).get("requested") != _encoder_form(request):
            return None  # built before the encoder's graph form changed
        if request.packed and p == "fp16" and not manifest.read_if_exists(manifest.record_path(engine.with_name(
                f"{name}.fp16.packed.onnx"))):
            return None  # the packed-token graph is made by this build
        hit[p] = m
    return hit


def _same_network_passes(request: BuildRequest, precision: str, m: dict) -> bool:
    """The decoder engine's cache key is the one today's network passes give its graph
    (engine/build.decoder_passes: an engine built before a pass changed is built again)."""
    from trt_seer.engine.build import decoder_engine_key

    return m["build"].get("key") == decoder_engine_key(m["onnx"]["sha256"], request.engine_spec(precision))


def _encoder_form(request: BuildRequest) -> str:
    """The graph form an encoder's engines are built in for this request (export/engine_form.py)."""
    from trt_seer.export.engine_form import FORM

    return "decomposed" if request.attention == "decomposed" else FORM


def _runs_here(engine: Path) -> bool:
    """A TensorRT runs `engine` here, or ONNX Runtime has the graph it runs in its place."""
    from trt_seer.runtime import tensorrt_unavailable_reason
    from trt_seer.runtime.backends import onnx_sibling

    return tensorrt_unavailable_reason() is None or onnx_sibling(engine).is_file()


def _sampler_beside(engine: Path, m: dict) -> bool:
    """The decoder's device sampler is there, made by this version's rule."""
    from trt_seer.export.sampler import PASSES, THRESHOLDS
    from trt_seer.runtime.sampler_trt import sampler_file
    from trt_seer.runtime.sampling import DRAWS

    logits = manifest.output_dtype(m, "logits")
    path = sampler_file(engine, m["name"], logits) if logits else None
    own = manifest.read_if_exists(manifest.engine_manifest_path(path)) if path and path.is_file() else None
    rule = {"draws": DRAWS, "thresholds": THRESHOLDS, "passes": PASSES}
    return bool(own) and {k: own.get("sampler", {}).get(k) for k in rule} == rule


def _stamp(request: BuildRequest, result: BuildResult, info) -> None:
    """Writes each engine's request key, the plan and the stage figures into its manifest."""
    from trt_seer.records import checkpoint_fingerprint

    stages = [s for s in result.stages]
    for p, m in result.manifests.items():
        source = checkpoint_fingerprint(info.path, m.get("source"))
        path = Path(request.out) / m["engine"]["file"]
        data = {**m, "build": {**m["build"], "request_key": request_key(request, p, source)},
                "build_stages": stages, "build_plan": result.plan.to_dict() if result.plan else None}
        manifest.write(manifest.engine_manifest_path(path), data)
        result.manifests[p] = manifest.read(manifest.engine_manifest_path(path))
