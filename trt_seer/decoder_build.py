"""The decoder build (causal-lm), streaming: what is on disk at any time stays near two copies of
the FP16 weights, whatever the model's size.

    1. FP16 ONNX straight from the checkpoint (no FP32 copy), verified against PyTorch FP16
    2. FP16 engine (1 and 2 where FP16 is chosen: --fp16, and --int8/--int4, which gate against it)
    3. for INT8/INT4: the gate's FP16 reference logits (and AWQ statistics) while the FP16 graph
       is on disk; then its weights are removed (a weightless skeleton stays)
    4. per weight-only precision: the Q/DQ graph, its weights quantized tensor by tensor from the
       checkpoint, gated (on the GPU through its engine when one runs engines, else ONNX Runtime
       on the CPU); its engine; the graph removed
    5. --fp32 only: the FP32 graph and engine, last
    6. the device sampler for the engines' logits (export/sampler.py: a few MB, built in seconds)

`keep_intermediates` keeps every graph, and writes the FP32 graph and ONNX Runtime's INT8/INT4
CPU forms (MatMulNBits, made from the FP32 graph) that the CPU backend runs when no GPU does; it
is on by default where no engine runs on the building machine (`keeping_cpu_forms`), so that
`generate` there finds the graphs it runs instead. Each stage's wall time, peak RSS, bytes written
and disk under --out go to the log and to the engines' manifests (`build_stages`).
"""
from __future__ import annotations

import logging
from pathlib import Path

from trt_seer import intermediates, pipeline, resources
from trt_seer.engine import manifest
from trt_seer.records import Artifacts

log = logging.getLogger(__name__)
SAMPLER_BYTES = 8 << 20  # the device sampler's graph and engine: about 3 MB at a 32,000-token vocabulary


def plan_decoder(sizes: resources.WeightSizes, chosen: list[str], quant, keep: bool) -> resources.Plan:
    """The order in which a decoder build writes and removes its artifacts (module docstring)."""
    f16 = sizes.fp16_bytes
    eng = resources.ENGINE_MARGIN
    plan = resources.Plan()
    if "fp16" in chosen:
        plan.add("fp16.onnx", f16)
        plan.add("fp16.engine", int(f16 * eng))
    if "fp16" in chosen and not keep and {"int8", "int4"} & set(chosen):
        plan.add("fp16.onnx weights removed (read back from the checkpoint)", -f16)
    elif "fp16" in chosen and not keep:
        plan.add("fp16.onnx removed", -f16)
    for bits in (8, 4):
        if f"int{bits}" not in chosen:
            continue
        q = sizes.quantized_bytes(bits, quant.int4_block, quant.quantize_lm_head)
        plan.add(f"int{bits}.onnx", q)
        plan.add(f"int{bits}.engine", int(q * eng))
        if not keep:
            plan.add(f"int{bits}.onnx removed", -q)
    if keep and {"int8", "int4"} & set(chosen):
        plan.add("fp32.onnx (source of the CPU forms)", 2 * f16)
        for bits in (8, 4):
            if f"int{bits}" in chosen:
                plan.add(f"int{bits}.cpu.onnx", sizes.quantized_bytes(bits, 32, False) + 2 * sizes.fp16_bytes // 10)
    if "fp32" in chosen:
        plan.add("fp32.onnx", 0 if keep and {"int8", "int4"} & set(chosen) else 2 * f16)
        plan.add("fp32.engine", int(2 * f16 * eng))
        if not keep:
            plan.add("fp32.onnx removed", -2 * f16)
    plan.add("sampler engine (device sampling)", SAMPLER_BYTES * (2 if {"fp16", "fp32"} <= set(chosen) else 1))
    # measured peaks (docs/BENCHMARKS.md, decoder builds at scale): the FP16 engine build, where
    # TensorRT-RTX maps the parsed graph's weights and holds its own copies (2.7x the FP16 weights
    # with the process at 7B, 2.9x at 1.1B), plus the FP16 GEMM weights transposed for it
    # (engine/weight_layout.py, about 1x); the export and its lean check hold them about once;
    # --fp32's engine stage (FP32 weights, kept [K, N]) peaks higher still
    plan.ram_bytes = int((6 if "fp32" in chosen else 4) * f16) + (2 << 30)
    if {"fp32", "fp16"} <= set(chosen):
        plan.notes.append("--fp32 exports a second graph with FP32 weights (twice the FP16 bytes)")
    return plan


def keeping_cpu_forms(request):
    """`request` with `keep_intermediates` settled: as given, else (None) on where no engine runs
    here, said in the log: the graphs ONNX Runtime runs in the engines' place
    (runtime/backends.onnx_sibling) stay."""
    from dataclasses import replace

    from trt_seer.runtime import tensorrt_unavailable_reason

    if request.keep_intermediates is not None:
        return request
    reason = tensorrt_unavailable_reason()
    if reason is None:
        return replace(request, keep_intermediates=False)
    log.info("no engine runs on this machine (%s): keeping the ONNX graphs that ONNX Runtime runs in the "
             "engines' place, as --keep-intermediates does", reason)
    return replace(request, keep_intermediates=True)


def build_decoder(info, request, chosen: list[str]) -> tuple[dict, list]:
    """({precision: engine manifest}, the stages' figures). The FP16 graph and engine only where
    FP16 is chosen (INT8/INT4 choose it: their gate's reference)."""
    from trt_seer.encoder_build import report

    art, keep = Artifacts(request.out, info.name), request.keep_intermediates
    stages = resources.Stages(request.out)
    manifests = {}
    todo = [b for b in (8, 4) if f"int{b}" in chosen]
    if "fp16" in chosen:
        fp16 = _fp16_graph(info, art, request, stages)
        manifests["fp16"] = _engine(stages, art, fp16, request.engine_spec("fp16"), request.force)
        if todo:
            manifests.update(_weight_only(info, art, request, fp16, todo, stages))
        elif not keep and not fp16.get("removed"):
            intermediates.remove_graph(art, "fp16")
    if "fp32" in chosen:
        fp32 = stages.run("fp32 onnx", pipeline.fp32_onnx, info, art, request.force)
        manifests["fp32"] = _engine(stages, art, fp32, request.engine_spec("fp32"), request.force)
        if not keep:
            intermediates.remove_graph(art, "fp32")
    _samplers(art, request, manifests, stages)
    for p in chosen:
        report(art, p, manifests[p], manifests[p].get("_rebuilt", False))
        manifests[p].pop("_rebuilt", None)
    if todo:
        _weight_only_benefit(art, [f"int{b}" for b in todo])
    return manifests, stages.records


def _samplers(art: Artifacts, request, manifests: dict, stages) -> None:
    """The device sampler for each logits dtype the decoder engines give (runtime/sampler_trt.py)."""
    first = next(iter(manifests.values()))
    vocab = int(first["decoder"]["vocab_size"])
    for dtype in sorted({manifest.output_dtype(m, "logits") for m in manifests.values()}):
        stages.run(f"sampler engine ({dtype})", pipeline.sampler_engine, art, first["name"], vocab,
                   dtype, request.engine_spec("fp16"), request.force, request.keep_intermediates)


def _engine(stages, art: Artifacts, record: dict, spec, force: bool) -> dict:
    m, rebuilt = stages.run(f"{spec.precision} engine", pipeline.engine, record, art, spec, force)
    return {**m, "_rebuilt": rebuilt}


def _fp16_graph(info, art: Artifacts, request, stages) -> dict:
    """The FP16 graph's record: reused when its key matches and the graph (or, once its weights
    were released, its skeleton) is there and its engine is up to date; else exported again."""
    from trt_seer.records import checkpoint_fingerprint

    path = art.path("fp16.onnx")
    record = manifest.read_if_exists(manifest.record_path(path))
    if record and not request.force and record.get("removed"):
        source = checkpoint_fingerprint(info.path, record.get("source"))
        current = record.get("key") == pipeline.fp16_decoder_key(info, source)
        if current and intermediates.fp16_available(art, record) and _engine_current(art, record, request, "fp16"):
            log.info("fp16 engine up to date; its graph's weights stay in the checkpoint")
            return record
    return stages.run("fp16 onnx", pipeline.fp16_decoder_onnx, info, art, request.force or bool(record and record.get("removed")))


def _engine_current(art: Artifacts, record: dict, request, precision: str) -> bool:
    from trt_seer.engine.build import decoder_engine_key
    from trt_seer.records import up_to_date

    engine = art.path(f"{precision}.engine")
    key = decoder_engine_key(record["sha256"], request.engine_spec(precision))
    return up_to_date(engine, manifest.engine_manifest_path(engine), key) is not None


def _int_current(info, art: Artifacts, request, fp16: dict, bits: int) -> dict | None:
    """The INT{bits} graph's record when it and its engine are up to date (the graph may be gone)."""
    from trt_seer.quantize import decoder_stage

    record = manifest.read_if_exists(manifest.record_path(art.path(f"int{bits}.onnx")))
    if request.force or not record:
        return None
    if record.get("key") != decoder_stage.stage_key(fp16, request.quant_spec(), info, bits):
        return None
    return record if _engine_current(art, record, request, f"int{bits}") else None


def _weight_only(info, art: Artifacts, request, fp16: dict, todo: list[int], stages) -> dict:
    from trt_seer.quantize import decoder_stage

    manifests, pending = {}, []
    for bits in todo:
        record = _int_current(info, art, request, fp16, bits)
        if record:
            manifests[f"int{bits}"] = _engine(stages, art, record, request.engine_spec(f"int{bits}"), False)
        else:
            pending.append(bits)
    if not pending:
        return manifests
    quant = request.quant_spec()
    cd, rows = decoder_stage.gate_rows(info, quant)
    gpu = _gpu_gate(art, request, rows)
    ref = stages.run("fp16 reference", _reference, info, art, fp16, rows, gpu)
    awq = 4 in pending and decoder_stage.uses_awq(quant, 4, decoder_stage.int4_qat(info, quant, 4))
    modules = _awq_modules(art, fp16, quant) if awq and not request.keep_intermediates else None
    if awq and fp16.get("removed") and modules is None:  # ONNX Runtime's AWQ reads the FP16 graph: export it again
        fp16 = stages.run("fp16 onnx", pipeline.fp16_decoder_onnx, info, art, True)
    stats = None
    graph = None if fp16.get("removed") else art.path("fp16.onnx")
    if awq and not request.keep_intermediates:
        stats = stages.run("awq statistics", _awq_stats, info, art, quant, cd, modules)
    measured_on = gpu.measured_on() if gpu else decoder_stage.measured_on_cpu(graph or intermediates.skeleton_path(art))
    if not request.keep_intermediates and intermediates.can_release(fp16, info.path):
        fp16 = intermediates.release_fp16_weights(art, fp16)
        graph = None
    for bits in pending:
        source = decoder_stage.DecoderSource(
            fp16=fp16, weights=intermediates.FP16Weights(art, fp16, info.path), graph=graph,
            rows=gpu.metric_rows if gpu else rows, reference=ref,
            evaluate=gpu.evaluator(fp16, bits) if gpu else None, awq_stats=stats,
            measured_on=measured_on)
        record = stages.run(f"int{bits} onnx", decoder_stage.weight_only_onnx, info, art, source, quant, bits, cd)
        manifests[f"int{bits}"] = _engine(stages, art, record, request.engine_spec(f"int{bits}"), request.force)
        if not request.keep_intermediates:
            intermediates.remove_graph(art, f"int{bits}")
        else:  # kept graphs serve the CPU backend: ONNX Runtime's own INT8/INT4 form beside each
            fp32 = stages.run("fp32 onnx", pipeline.fp32_onnx, info, art, request.force)
            stages.run(f"int{bits} cpu onnx", decoder_stage.cpu_form, info, art, fp32, record, cd)
    return manifests


def _awq_modules(art: Artifacts, fp16: dict, quant) -> dict | None:
    """{Linear module: activation} when PyTorch has a GPU to collect AWQ's statistics on and every
    INT4 target's weight is a Linear of the checkpoint; else None (ONNX Runtime on the CPU)."""
    from trt_seer.export import onnxio
    from trt_seer.quantize import awq_torch, decoder_stage, weightonly

    if awq_torch.gpu() is None or not fp16.get("weights_from_checkpoint"):
        return None
    path = intermediates.skeleton_path(art) if fp16.get("removed") else art.path("fp16.onnx")
    targets = weightonly.find_targets(onnxio.load(path, False), decoder_stage.weight_only_spec(quant, 4))
    return awq_torch.target_modules(targets, fp16["weights_from_checkpoint"])


def _awq_stats(info, art: Artifacts, quant, cd, modules: dict | None):
    """AWQ's activation statistics: the checkpoint in PyTorch on the GPU when `modules` (from
    _awq_modules) says it can, else ONNX Runtime on the FP16 graph while it is on disk (its weights
    go next)."""
    from trt_seer.export import onnxio
    from trt_seer.quantize import awq_torch, decoder_stage, weightonly

    if modules is not None:
        log.info("AWQ statistics: the checkpoint in PyTorch on the GPU, %d GEMM inputs, %d calibration batches",
                 len(set(modules.values())), len(cd.calib))
        return awq_torch.activation_stats(info, cd.calib, modules, awq_torch.gpu())
    graph = art.path("fp16.onnx")
    model = onnxio.load(graph, False)
    targets = weightonly.find_targets(model, decoder_stage.weight_only_spec(quant, 4))
    return decoder_stage.awq_statistics(graph, targets, decoder_stage.prefill_batches(graph, cd.calib))


def _reference(info, art: Artifacts, fp16: dict, rows, gpu):
    """The gate's FP16 teacher-forced logits: through the FP16 engine on a GPU, else ONNX Runtime
    on the FP16 graph (put together again from the checkpoint in a temp dir if it was removed)."""
    import tempfile

    from trt_seer.eval import teacher
    from trt_seer.export import onnxio

    if gpu:
        return gpu.logits(art.path("fp16.engine"))
    log.info("teacher-forcing %d held-out rows of %d tokens through the FP16 graph ...", *rows.shape)
    if not fp16.get("removed"):
        return teacher.teacher_forced_logits(art.path("fp16.onnx"), rows)
    with tempfile.TemporaryDirectory(prefix=".fp16-reference-", dir=art.out) as tmp:
        graph = onnxio.save(intermediates.FP16Weights(art, fp16, info.path).whole(), Path(tmp) / "fp16.onnx",
                            give_back=False)
        return teacher.teacher_forced_logits(graph, rows)


def _gpu_gate(art: Artifacts, request, rows):
    """An EngineGate over `rows` when a GPU runs this TensorRT's engines, else None (the gate runs
    on the CPU)."""
    from trt_seer.runtime import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason is not None:
        log.info("gate on the CPU (ONNX Runtime): %s", reason)
        return None
    from trt_seer.engine_gate import EngineGate

    return EngineGate(art, request, rows)


def _weight_only_benefit(art: Artifacts, chosen: list[str]) -> None:
    """Says what weight-only engines buy here: their size against the FP16 engine's."""
    def size(precision: str) -> int:
        path = manifest.engine_manifest_path(art.path(f"{precision}.engine"))
        return manifest.read_engine_manifest(path)["engine"]["size_bytes"]

    log.info("engine size vs FP16: %s", ", ".join(f"{p.upper()} {size(p) / size('fp16'):.2f}x" for p in chosen))
    log.info("whether they also decode faster depends on the GPU, the TensorRT flavor and the model's size "
             "(docs/BENCHMARKS.md); `tools/bench_generate.py` measures them here")
