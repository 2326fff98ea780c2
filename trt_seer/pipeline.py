"""The `build` pipeline: checkpoint -> FP32 ONNX -> (FP16 | Q/DQ) ONNX -> engine, each stage
skipped when its output's record says it was made from the same inputs (a cache hit)."""
from __future__ import annotations

import logging
from pathlib import Path


from trt_seer import __version__
from trt_seer.engine import manifest
from trt_seer.export import onnxio
from trt_seer.export.families import ModelInfo
from trt_seer.files import sha256_json
from trt_seer.files import staging_dir
from trt_seer.records import (Artifacts, checkpoint_fingerprint, inherit, publish_record,  # noqa: F401
                              source_identity, token_limits, up_to_date, write_record)

log = logging.getLogger(__name__)
def fp32_onnx(info: ModelInfo, art: Artifacts, force: bool = False) -> dict:
    """Stage 1: the verified FP32 ONNX and its record."""
    from trt_seer.export.checkpoint import OPSET

    dest = art.path("fp32.onnx")
    known = manifest.read_if_exists(manifest.record_path(dest)) or {}
    source = checkpoint_fingerprint(info.path, known.get("source"))
    key = sha256_json({"source": source_identity(source), "task": info.task, "opset": OPSET, "trt_seer": __version__,
                       "kv_cache": is_decoder(info), **(decoder_form(info) if is_decoder(info) else {})})
    record = None if force else up_to_date(dest, manifest.record_path(dest), key)
    if record:
        log.info("fp32 ONNX up to date: %s", dest)
        return record
    from trt_seer.export.checkpoint import onnx_from_checkpoint

    log.info("exporting %s (%s, %s) to ONNX ...", info.name, info.model_type, info.task)
    with staging_dir(dest) as work:
        staged = work / dest.name
        report = onnx_from_checkpoint(info, staged)
        log.info("export verified against PyTorch: %s", _fmt_verification(report))
        record = {"kind": "onnx", "precision": "fp32", "key": key, "name": info.name, "task": info.task,
                  "model_type": info.model_type, "source": source, "limits": token_limits(info),
                  "io": onnxio.describe_io(onnxio.load(staged, False)), "verification": report}
        if is_decoder(info):
            from trt_seer.export.decoder import decoder_section

            record["decoder"] = decoder_section(info, dest)
        return publish_record(staged, dest, record)


def decoder_form(info: ModelInfo) -> dict:
    """What a decoder graph's cache key says about its form: the rotary embedding's (graphs exported
    before export/rotary.py are exported again) and, with `--attention chunked`, the attention's."""
    from trt_seer.export.attention import CHUNKS
    from trt_seer.export.rotary import FORM

    return {"outputs": "next_token", "rotary": FORM,
            **({"attention": f"chunked-{CHUNKS}-split"} if info.attention == "chunked" else {})}


def is_decoder(info: ModelInfo) -> bool:
    """A causal LM: exported with a KV cache for generation."""
    return info.task == "causal-lm"


def fp32_cpu_onnx(info: ModelInfo, art: Artifacts, fp32: dict, force: bool = False) -> dict | None:
    """Stage 1b (encoders): the fused FP32 graph ONNX Runtime's CPU kernels run fast, verified
    against the FP32 graph; None for a decoder or when no fusion matches (the plain graph serves)."""
    from importlib.metadata import version

    from trt_seer.errors import UnsupportedError

    if info.family.kind == "decoder":
        return None
    dest = art.path("fp32.cpu.onnx")
    key = sha256_json({"fp32": fp32["sha256"], "onnxscript": version("onnxscript"),
                       "onnxruntime": version("onnxruntime"), "trt_seer": __version__})
    record = None if force else up_to_date(dest, manifest.record_path(dest), key)
    if record:
        log.info("fp32 CPU ONNX up to date: %s", dest)
        return record
    from trt_seer.export.cpu import cpu_onnx_from_fp32

    log.info("fusing the FP32 graph for ONNX Runtime's CPU kernels ...")
    with staging_dir(dest) as work:
        staged = work / dest.name
        try:
            report = cpu_onnx_from_fp32(info, art.path("fp32.onnx"), staged)
        except UnsupportedError as e:
            log.warning("warning: no %s: %s", dest.name, e)
            return None
        log.info("fused %s; verified against %s: %s", ", ".join(f"{n} {k}" for k, n in report["fused_ops"].items()),
                 art.path("fp32.onnx").name, _fmt_verification(report["verification"]))
        from trt_seer.eval.evaluate import accuracy_entry, compare_onnx, eval_batches

        accuracy = compare_onnx(info, art.path("fp32.onnx"), staged, eval_batches(info))
        log.info("fused vs plain FP32 (ONNX Runtime, held-out data): %s", _fmt_metrics(accuracy))
        return publish_record(staged, dest, {
            **inherit(fp32), "precision": "fp32", "form": "onnxruntime CPU (fused)", "key": key,
            "fp32_sha256": fp32["sha256"], **report,
            "accuracy": {"onnx_vs_fp32": accuracy_entry(accuracy, dest, art.path("fp32.onnx"))}})


def _fmt_verification(report: dict) -> str:
    return ", ".join(f"{k} max |Δ| {v['max_abs_diff']:.2e}" for k, v in report["outputs"].items())


def fp16_onnx(info: ModelInfo, art: Artifacts, fp32: dict, force: bool = False) -> dict:
    """Stage 2: the FP16-typed ONNX, with its accuracy against FP32 on held-out data. An encoder's is
    written from its fused-attention form (export/engine_form.py) where that applies."""
    from trt_seer.export.precision import KEEP_FP32_OPS, Fp16Spec

    src, dest = art.path("fp32.onnx"), art.path("fp16.onnx")
    spec = Fp16Spec(fp16_io=frozenset(_kv_names(fp32)))
    key = sha256_json({"fp32": fp32["sha256"], "keep": sorted(KEEP_FP32_OPS), "trt_seer": __version__,
                       "fp16_io": sorted(spec.fp16_io), **_form_key(info)})
    record = None if force else up_to_date(dest, manifest.record_path(dest), key)
    if record:
        log.info("fp16 ONNX up to date: %s", dest)
        return record
    from trt_seer.eval.evaluate import accuracy_entry
    from trt_seer.export.precision import fp16_from_onnx

    with staging_dir(dest) as work:
        graph, form, spec = _graph_form(info, src, work, spec)
        log.info("converting to an FP16-typed graph ...")
        staged = fp16_from_onnx(graph, work / dest.name, spec)
        accuracy = _fp16_accuracy(info, src, staged)
        log.info("fp16 vs fp32 (ONNX Runtime, held-out data): %s", _fmt_metrics(accuracy))
        extra = {"decoder": {**fp32["decoder"], "kv_dtype": "float16"}} if "decoder" in fp32 else {}
        return publish_record(staged, dest, {
            **inherit(fp32), "precision": "fp16", "key": key, **extra, **form,
            "io": onnxio.describe_io(onnxio.load(staged, False)),
            "fp32_sha256": fp32["sha256"], "accuracy": {"onnx_vs_fp32": accuracy_entry(accuracy, dest, src)}})


def fp16_packed_onnx(info: ModelInfo, art: Artifacts, fp32: dict, fp16: dict, force: bool = False) -> dict | None:
    """Stage 2b (feature-extraction encoders whose FP16 graph has the fused form): the FP16 graph over
    packed tokens (export/packed.py), with its accuracy against FP32 through the packing path. None,
    said in the log, for a model that has no packed form."""
    from trt_seer.export.engine_form import FORM, FP16_OPS
    from trt_seer.export.packed import FORM as PACKED

    from trt_seer.export.precision import KEEP_FP32_OPS

    if info.task != "feature-extraction" or fp16.get("graph_form", {}).get("attention") != FORM:
        log.warning("warning: no packed-token form: it is built from a feature-extraction encoder's fused "
                    "attention (%s: %s, attention %s)", info.name, info.task, fp16.get("graph_form", {}).get("attention"))
        return None
    src, dest = art.path("fp32.onnx"), art.path("fp16.packed.onnx")
    key = sha256_json({"fp32": fp32["sha256"], "form": PACKED, "fp16_ops": sorted(FP16_OPS), "trt_seer": __version__,
                       "keep": sorted(KEEP_FP32_OPS)})
    record = None if force else up_to_date(dest, manifest.record_path(dest), key)
    if record:
        log.info("fp16 packed ONNX up to date: %s", dest)
        return record
    from trt_seer.errors import UnsupportedError

    log.info("exporting the packed-token graph (batches without padding) ...")
    with staging_dir(dest) as work:
        try:
            section, accuracy = _packed_graph(info, src, work, dest.name)
        except UnsupportedError as e:
            log.warning("warning: no packed-token engine: %s", e)
            return None
        from trt_seer.eval.evaluate import accuracy_entry

        log.info("fp16 packed vs fp32 (ONNX Runtime, held-out data): %s", _fmt_metrics(accuracy))
        return publish_record(work / dest.name, dest, {
            **inherit(fp32), "precision": "fp16", "key": key, "packed": section,
            "io": onnxio.describe_io(onnxio.load(work / dest.name, False)),
            "fp32_sha256": fp32["sha256"], "accuracy": {"onnx_vs_fp32": accuracy_entry(accuracy, dest, src)}})


def _packed_graph(info: ModelInfo, src: Path, work: Path, name: str) -> tuple[dict, dict]:
    """(the record's `packed` section, accuracy against `src` on held-out batches): the packed FP32
    graph exported and verified, then typed FP16 with FP16 LayerNormalization, into `work / name`."""
    from trt_seer.eval.evaluate import compare_outputs, eval_batches, run_batches, session
    from trt_seer.export.engine_form import FP16_OPS
    from trt_seer.export.packed import packed_onnx_from_checkpoint
    from trt_seer.export.precision import KEEP_FP32_OPS, Fp16Spec, fp16_from_onnx
    from trt_seer.runtime.packed import pack, unpack

    report = packed_onnx_from_checkpoint(info, src, work / "packed.fp32.onnx")
    log.info("packed graph verified against %s (%s positions): %s", src.name, report["rule"]["positions"],
             _fmt_verification(report["verification"]))
    staged = fp16_from_onnx(work / "packed.fp32.onnx", work / name, Fp16Spec(keep_ops=KEEP_FP32_OPS - FP16_OPS))
    batches = eval_batches(info)
    packed = session(staged)
    names = [o.name for o in packed.get_outputs()]
    cand = []
    for feeds in batches:
        fed, layout = pack(feeds, report["rule"])
        cand.append(unpack(dict(zip(names, packed.run(names, {k: fed[k] for k in report["inputs"]}))), layout))
    accuracy = compare_outputs(info.task, run_batches(session(src), batches), cand, batches)
    section = {**report, "padded_inputs": list(info.inputs)}
    return section, accuracy


def _form_key(info: ModelInfo) -> dict:
    """What an encoder's FP16 graph form adds to its cache key (graphs of an older form are redone)."""
    if is_decoder(info):
        return {}
    from trt_seer.export.engine_form import FORM, FP16_OPS

    return {"form": "decomposed" if info.attention == "decomposed" else FORM, "fp16_ops": sorted(FP16_OPS)}


def _graph_form(info: ModelInfo, src: Path, work: Path, spec):
    """(the FP32 graph to type as FP16, its record section, the FP16 spec): an encoder's fused-attention
    form with FP16 LayerNormalization, or `src` as it is (decoders; encoders whose attention does not
    match or whose fused form disagrees, said in the log and recorded)."""
    from dataclasses import replace

    from trt_seer.errors import ExportMismatchError, UnsupportedError

    if is_decoder(info):
        return src, {}, spec
    if info.attention == "decomposed":
        return src, {"graph_form": {"requested": "decomposed", "attention": "decomposed",
                                    "reason": "--attention decomposed"}}, spec
    from trt_seer.export.engine_form import FORM, FP16_OPS, engine_form_from_fp32

    try:
        report = engine_form_from_fp32(info, src, work / src.name)
    except (UnsupportedError, ExportMismatchError) as e:
        log.warning("warning: attention stays decomposed in the engine graph: %s", e)
        return src, {"graph_form": {"requested": FORM, "attention": "decomposed", "reason": str(e)}}, spec
    log.info("attention fused: %d ONNX Attention nodes (%d reading the padding mask); verified against %s: %s",
             report["attention"], report["padding_mask"], src.name, _fmt_verification(report["verification"]))
    form = {"requested": FORM, "attention": report["form"], "fused": report["attention"], "padding_mask": report["padding_mask"],
            "fp16_ops": sorted(FP16_OPS), "verification": report["verification"]}
    return work / src.name, {"graph_form": form}, replace(spec, keep_ops=spec.keep_ops - FP16_OPS)


def _kv_names(record: dict) -> list[str]:
    """A decoder's cache inputs and outputs, which FP16 graphs take and give in float16."""
    io = record.get("io", {})
    return [v["name"] for v in io.get("inputs", []) + io.get("outputs", [])
            if v["name"].startswith(("past_key_values.", "present."))]


def _fp16_accuracy(info: ModelInfo, src: Path, dest: Path) -> dict:
    if is_decoder(info):  # step by step through the cache, as generation runs it
        from trt_seer.export.decoder import compare_decoders

        return compare_decoders(src, dest, info.config)
    from trt_seer.eval.evaluate import compare_onnx, eval_batches

    return compare_onnx(info, src, dest, eval_batches(info))


def _fmt_metrics(m: dict) -> str:
    return ", ".join(f"{k} {v:.5g}" if isinstance(v, float) else f"{k} {v}" for k, v in m.items())


def engine(onnx_record: dict, art: Artifacts, spec, force: bool = False) -> tuple[dict, bool]:
    """Stage 3: the TensorRT engine + manifest. Returns (manifest, rebuilt). An engine that is up
    to date keeps its file; its manifest takes the record's current sections (a gate may have built
    the engine before the record was written). A packed graph's engine is `<precision>.packed.engine`."""
    from trt_seer.engine import trt as trt_adapter
    from trt_seer.engine.build import cache_key, engine_from_onnx

    form = ".packed" if "packed" in onnx_record else ""
    onnx_path = art.path(f"{onnx_record['precision']}{form}.onnx")
    engine_path = art.path(f"{spec.precision}{form}.engine")
    key = cache_key(onnx_record["sha256"], spec, trt_adapter.load(), decoder="decoder" in onnx_record,
                    packed=bool(form))
    extra = engine_extra(onnx_record, onnx_path, spec)
    current = None if force else up_to_date(engine_path, manifest.engine_manifest_path(engine_path), key)
    if current:
        if any(current.get(k) != v for k, v in extra.items()):
            manifest.write(manifest.engine_manifest_path(engine_path), {**current, **extra})
            current = manifest.read(manifest.engine_manifest_path(engine_path))
        return current, False
    log.info("building the %s engine with %s ...", spec.precision, trt_adapter.load().name)
    built = engine_from_onnx(onnx_path, engine_path, spec, art.path("timing.cache"), extra, onnx_record["sha256"])
    return built, True


def name_packed_sibling(art: Artifacts, precision: str, packed: dict | None) -> dict:
    """The padded engine's manifest naming its packed sibling (`packed` its manifest; None: no packed
    engine was built, and an earlier one is no longer named); returns it."""
    path = manifest.engine_manifest_path(art.path(f"{precision}.engine"))
    current = manifest.read(path)
    sibling = None if packed is None else {"engine": packed["engine"]["file"], "form": packed["packed"]["form"],
                                           "choice": "the caller's: load the packed engine to run batches without padding"}
    if current.get("packed_sibling") != sibling:
        manifest.write(path, {**{k: v for k, v in current.items() if k != "packed_sibling"},
                              **({"packed_sibling": sibling} if sibling else {})})
        current = manifest.read(path)
    return current


def engine_extra(onnx_record: dict, onnx_path: Path, spec) -> dict:
    """The manifest sections an engine takes from the record of the graph it is built from."""
    extra = {k: onnx_record[k] for k in ("name", "task", "model_type", "source", "decoder", "limits", "graph_form")
             if k in onnx_record}
    if "decoder" in extra:  # the engine's limits are its profiles' (engine/profiles.py)
        from trt_seer.engine.profiles import check_total

        extra["decoder"] = {**extra["decoder"], "max_batch": spec.profile.batch[2],
                            "max_prompt": spec.profile.seq[2], "max_total": check_total(spec.profile, spec.max_total),
                            "prompt_slice": spec.prompt_slice}
    if "packed" in onnx_record:  # the padded batches it takes: the build's profile
        extra["packed"] = {**onnx_record["packed"], "max_batch": spec.profile.batch[2], "max_seq": spec.profile.seq[2]}
    extra["onnx_record"] = manifest.record_path(onnx_path).name
    # Measured on the ONNX graph (each entry's measured_on says where), not on this engine: `diff`
    # writes the engine's own under "accuracy" where the engine runs.
    extra["accuracy_of_source_graph"] = onnx_record.get("accuracy", {})
    if "quantization" in onnx_record:  # how many GEMMs are really INT8 travels with the engine
        extra["quantization"] = onnx_record["quantization"]
    return extra


def fp16_decoder_key(info: ModelInfo, source: dict) -> str:
    from trt_seer.export.checkpoint import OPSET

    return sha256_json({"source": source_identity(source), "task": info.task, "opset": OPSET, "trt_seer": __version__,
                        "kv_cache": True, "export": "float16", **decoder_form(info)})


def fp16_decoder_onnx(info: ModelInfo, art: Artifacts, force: bool = False) -> dict:
    """Stage 1 of a decoder: the FP16 graph exported straight from the checkpoint (no FP32 copy of
    the weights), verified against PyTorch FP16, with the map from its weights to the checkpoint's
    tensors (`weights_from_checkpoint`) that lets later stages drop its weights and read them back."""
    from trt_seer.export.decoder import fp16_onnx_from_decoder

    dest = art.path("fp16.onnx")
    known = manifest.read_if_exists(manifest.record_path(dest)) or {}
    source = checkpoint_fingerprint(info.path, known.get("source"))
    key = fp16_decoder_key(info, source)
    record = None if force else up_to_date(dest, manifest.record_path(dest), key)
    if record:
        log.info("fp16 ONNX up to date: %s", dest)
        return record
    log.info("exporting %s (%s, causal-lm) to FP16 ONNX with a KV cache ...", info.name, info.model_type)
    with staging_dir(dest) as work:
        staged = work / dest.name
        report, wmap = fp16_onnx_from_decoder(info, staged)
        log.info("export verified against PyTorch FP16: %s", _fmt_verification(report))
        return publish_record(staged, dest, _fp16_decoder_record(info, dest, staged, key, source, report, wmap))


def _fp16_decoder_record(info: ModelInfo, dest: Path, staged: Path, key: str, source: dict, report: dict,
                         wmap: dict) -> dict:
    from trt_seer.export.decoder import decoder_section

    outputs = {f"{k}_max_abs_diff": v["max_abs_diff"] for k, v in report["outputs"].items()}
    return {"kind": "onnx", "precision": "fp16", "key": key, "name": info.name, "task": info.task,
            "model_type": info.model_type, "source": source, "limits": token_limits(info),
            "export": "float16 from the checkpoint",
            "io": onnxio.describe_io(onnxio.load(staged, False)), "verification": report,
            "decoder": decoder_section(info, dest, kv_dtype="float16"),  # copies the tokenizer beside dest
            "accuracy": {"onnx_vs_pytorch_fp16": {
                **outputs, "cases": report["cases"], "measured_on": {"artifact": dest.name, "backend": "onnxruntime CPU"},
                "reference_measured_on": {"artifact": Path(info.path).name, "backend": "PyTorch float16 CPU"}}},
            "weights_from_checkpoint": wmap}


def sampler_engine(art: Artifacts, name: str, vocab: int, logits_dtype: str, spec, force: bool = False,
                   keep: bool = False) -> dict:
    """The device sampler (export/sampler.py) for a decoder's vocabulary and logits dtype: the
    engine `<name>.sampler.<dtype>.engine`, which runtime/sampler_trt.py finds beside the decoder's
    engines. `spec`: the decoder's BuildSpec (its targets and batch range). Its graph is written
    each time (the same bytes for the same vocabulary: the cache key's hash) and removed after
    unless `keep`."""
    from dataclasses import replace

    from trt_seer.engine import trt as trt_adapter
    from trt_seer.engine.build import cache_key, engine_from_onnx
    from trt_seer.export import sampler
    from trt_seer.export.families import ShapeProfile
    from trt_seer.runtime.sampling import DRAWS

    spec = replace(spec, precision="sampler", max_total=None, prompt_slice=None,
                   profile=ShapeProfile(spec.profile.batch, (1, 1, 1)))
    graph, engine_path = art.path(f"sampler.{logits_dtype}.onnx"), art.path(f"sampler.{logits_dtype}.engine")
    with staging_dir(graph) as work:  # the graph reaches --out only when kept
        onnx_path = sampler.sampler_onnx((graph.parent if keep else work) / graph.name, vocab, logits_dtype)
        sha = onnxio.sha256(onnx_path)
        current = None if force else up_to_date(engine_path, manifest.engine_manifest_path(engine_path),
                                                 cache_key(sha, spec, trt_adapter.load()))
        if not current:
            log.info("building the device sampler (%s logits) ...", logits_dtype)
            about = {"vocab": int(vocab), "logits_dtype": logits_dtype, "draws": DRAWS,
                     "thresholds": sampler.THRESHOLDS, "passes": sampler.PASSES}
            current = engine_from_onnx(onnx_path, engine_path, spec, onnx_sha=sha,
                                       extra={"name": name, "task": "next-token-sampler", "sampler": about})
    return current
