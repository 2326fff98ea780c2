"""Generation speed on a GPU: PyTorch's generate (transformers, FP16: its static cache compiled by
transformers, and eager) against FP16 / INT8 / INT4 decoder engines of the same causal LM, in one
run; appends the table to docs/BENCHMARKS.md.

    PYTHONPATH=. python tools/bench_generate.py --config llama-1b --work out/gen [--append docs/BENCHMARKS.md]
    PYTHONPATH=. python tools/bench_generate.py --config llama-1b --contexts 256,3840 --hf none  # cost vs context
    python tools/bench_generate.py --model ckpt/ --work out/gen     # a checkpoint of your own

Every path is timed the same way, as its users run it, with nothing added inside its loop: the
whole greedy generation call (`--new-tokens` + 1 tokens after a prompt of each of `--contexts`
tokens, per batch of `--batches`; the engines through the product's own generation loop, PyTorch
through `generate`) minus a 1-token call (the prompt step, which is TTFT), median and spread of
`--repeats` runs (at least 3), first runs and compiles untimed (trt_seer/bench/generate.py). Engines are built for `--max-total` (4096) and
decode in windows of 256, 512, ... tokens (runtime/kv_window.py). `--kernels` adds kernel launches
per decode step of each engine (torch.profiler, trt_seer/bench/kernels.py).

With --config the model is randomly initialised from a named shape (speed does not depend on the
weights), exported with its KV cache, converted to FP16, quantized weight-only (INT8 per channel,
INT4 in blocks of 128; round to nearest: random weights have nothing to calibrate against) and built
into engines. With --model the checkpoint's artifacts are made the same way, or taken from
`--engines DIR` (a `trt-seer build --out DIR` of it: its gated engines). Every figure is end to end
(ids in, the next token on the host). `--sampling` adds rows per engine that sample (top-p 0.9,
temperature 0.8): drawn by the engine's device sampler and fed back on the device, where the build
wrote one, and with the logits back on the host (runtime/sampling.py), beside greedy.

    python -m trt_seer build --model ckpt/ --task causal-lm --fp16 --seq 1,128,4000 --out out/b
    python tools/bench_generate.py --model ckpt/ --engines out/b --contexts 256,3840 --hf none
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {  # name -> transformers LlamaConfig keywords
    "llama-1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                     num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=4096),
    "llama-small": dict(vocab_size=8192, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096),
    "llama-tiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096),
}


def random_checkpoint(name: str, dest: Path) -> Path:
    import torch
    import transformers

    if (dest / "config.json").is_file():
        return dest
    cfg = transformers.LlamaConfig(**CONFIGS[name], bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.float16)
    model.save_pretrained(str(dest))
    return dest


def artifacts(ckpt: Path, work: Path, precisions: list[str], spec_kw: dict) -> dict[str, Path]:
    """{precision: engine path}: FP32 ONNX (verified) -> FP16 -> weight-only INT8 / INT4 -> engines."""
    from trt_seer import pipeline
    from trt_seer.engine.build import BuildSpec
    from trt_seer.export.families import ShapeProfile, resolve_model

    info = resolve_model(ckpt, "causal-lm")
    art = pipeline.Artifacts(work, info.name)
    t = time.perf_counter()
    fp32 = pipeline.fp32_onnx(info, art)
    print(f"fp32 ONNX: {time.perf_counter() - t:.0f} s", flush=True)
    graphs = {"fp16": _fp16(art, fp32)}
    for p in precisions:
        if p in ("int8", "int4"):
            graphs[p] = _weight_only(art, graphs["fp16"], p)
    profile = ShapeProfile(tuple(spec_kw["batch"]), tuple(spec_kw["seq"]))
    engines = {}
    for p in precisions:
        spec = BuildSpec(precision=p, profile=profile, max_total=spec_kw["max_total"],
                         compute_caps=tuple(spec_kw["compute_caps"]))
        t = time.perf_counter()
        manifest, _ = pipeline.engine(graphs[p], art, spec)
        print(f"{p} engine: {time.perf_counter() - t:.0f} s, {manifest['engine']['size_bytes'] / 2**20:.0f} MiB",
              flush=True)
        engines[p] = art.path(f"{p}.engine")
    return engines


def _fp16(art, fp32: dict) -> dict:
    from trt_seer import pipeline
    from trt_seer.engine import manifest
    from trt_seer.export.precision import Fp16Spec, fp16_from_onnx

    dest = art.path("fp16.onnx")
    if manifest.record_path(dest).is_file():  # made by an earlier run of this tool
        return manifest.read(manifest.record_path(dest))
    kv = frozenset(pipeline._kv_names(fp32))
    fp16_from_onnx(art.path("fp32.onnx"), dest, Fp16Spec(fp16_io=kv))
    record = {**pipeline.inherit(fp32), "precision": "fp16", "key": "bench-only", "fp32_sha256": fp32["sha256"],
              "decoder": {**fp32["decoder"], "kv_dtype": "float16"}}
    return pipeline.write_record(dest, record)


def _weight_only(art, fp16: dict, precision: str) -> dict:
    from trt_seer import pipeline
    from trt_seer.engine import manifest
    from trt_seer.export import onnxio
    from trt_seer.quantize import weightonly

    dest = art.path(f"{precision}.onnx")
    if manifest.record_path(dest).is_file():
        return manifest.read(manifest.record_path(dest))
    spec = weightonly.WeightOnlySpec(bits=8 if precision == "int8" else 4)
    model = onnxio.load(art.path("fp16.onnx"))
    weightonly.weight_only_model(model, weightonly.find_targets(model, spec), spec)
    onnxio.save(model, dest)
    return pipeline.write_record(dest, {**pipeline.inherit(fp16), "precision": precision, "key": "bench-only",
                                        "quantization": {"bits": spec.bits, "method": "round to nearest"}})


def _name(ckpt: Path) -> str:
    from trt_seer.export.families import resolve_model

    return resolve_model(ckpt, "causal-lm").name


def _cpu_artifacts(ckpt: Path, work: Path, precisions: list[str]) -> None:
    """The FP32 graph and (for INT8 / INT4) the FP16 and Q/DQ graphs, no engines."""
    from trt_seer import pipeline
    from trt_seer.export.families import resolve_model

    info = resolve_model(ckpt, "causal-lm")
    art = pipeline.Artifacts(work, info.name)
    fp32 = pipeline.fp32_onnx(info, art)
    fp16 = _fp16(art, fp32)
    for p in precisions:
        if p in ("int8", "int4"):
            _weight_only(art, fp16, p)


SAMPLED = dict(temperature=0.8, top_p=0.9, seed=0)  # the --sampling rows


def measure_engines(engines: dict[str, Path], spec, variants: list[str], align: str | None,
                    sampled: bool = False) -> dict[str, dict]:
    """One row per engine and runtime variant ("cache:specialization", the first is the default);
    with `sampled`, one more per engine (default variant) choosing by top-p on the host."""
    from trt_seer.bench.generate import measure_step
    from trt_seer.runtime import cuda
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    rows = {}
    for precision, path in engines.items():
        for i, variant in enumerate(variants):
            cache, specialize = variant.split(":")
            label = f"TensorRT-RTX {precision.upper()} engine" + ("" if i == 0 else f" ({cache} cache, {specialize})")
            cuda.set_device(0)
            free_before = cuda.mem_info()[0]
            with TensorRTDecoder(path, cache=cache, specialize=specialize, align=align, windows="ladder") as dec:  # windows warmed
                used = free_before - cuda.mem_info()[0]
                rows[label] = {**measure_step(dec, dec.vocab, spec), "memory_bytes": used}
                print(label, json.dumps(rows[label]), flush=True)
                if sampled and i == 0:
                    rows.update(_sampled_rows(dec, label, spec, used))
    return rows


class HostSampled:
    """A decoder with its device sampler out of reach: the logits come back and the host samples."""

    samples = False

    def __init__(self, decoder):
        self._decoder = decoder

    def __getattr__(self, name):
        return getattr(self._decoder, name)


def _sampled_rows(dec, label: str, spec, used: int) -> dict[str, dict]:
    """Top-p rows for one engine: drawn by its device sampler (where the build wrote one), and on the host."""
    from trt_seer.bench.generate import measure_step
    from trt_seer.runtime.generate import Sampling

    rows = {}
    for where, step in (("device sampler", dec), ("host sampler", HostSampled(dec))):
        if where == "device sampler" and not dec.samples:
            continue
        name = f"{label}, top-p {SAMPLED['top_p']} T {SAMPLED['temperature']} ({where})"
        rows[name] = {**measure_step(step, dec.vocab, spec, Sampling(**SAMPLED)), "memory_bytes": used}
        print(name, json.dumps(rows[name]), flush=True)
    return rows


def built_engines(engines_dir: Path, name: str, precisions: list[str]) -> dict[str, Path]:
    """{precision: engine} from a `trt-seer build --out` directory; exits naming a missing one."""
    found = {p: engines_dir / f"{name}.{p}.engine" for p in precisions}
    missing = [str(path) for path in found.values() if not path.is_file()]
    if missing:
        sys.exit(f"no engine {', '.join(missing)}: build it first (trt-seer build --model ... --out {engines_dir})")
    return found


def measure_cpu(work: Path, name: str, precisions: list[str], spec) -> dict[str, dict]:
    """ONNX Runtime (CPU) steps: the FP32 graph, and for INT8 / INT4 the Q/DQ graph the engine is
    built from and ONNX Runtime's MatMulNBits form of the same bits (written here, ungated)."""
    from trt_seer.bench.generate import measure_step
    from trt_seer.export import onnxio
    from trt_seer.quantize.cpu_nbits import nbits_model
    from trt_seer.runtime.decoder_ort import OrtDecoderStep

    paths = {"FP32 graph": work / f"{name}.fp32.onnx"}
    for p in precisions:
        if p in ("int8", "int4"):
            cpu = work / f"{name}.{p}.cpu.onnx"
            if not cpu.is_file():
                onnxio.save(nbits_model(work / f"{name}.fp32.onnx", int(p[3:]))[0], cpu)
            paths[f"{p.upper()} Q/DQ graph"] = work / f"{name}.{p}.onnx"
            paths[f"{p.upper()} MatMulNBits graph"] = cpu
    fp32 = json.loads((work / f"{name}.fp32.onnx.json").read_text())
    rows = {}
    for label, path in paths.items():
        step = OrtDecoderStep(path, decoder={**fp32["decoder"], "kv_dtype": _kv_dtype(path)})
        rows[f"ONNX Runtime CPU, {label}"] = measure_step(step, fp32["decoder"]["vocab_size"], spec)
        print(label, json.dumps(rows[f"ONNX Runtime CPU, {label}"]), flush=True)
    return rows


def _kv_dtype(path: Path) -> str:
    from trt_seer.eval.teacher import empty_past, graph_inputs

    past = next(a for a in graph_inputs(path) if a.name.startswith("past_key_values."))
    return empty_past(past, 1).dtype.name


HF_PATHS = {"compiled": ("PyTorch generate, static cache compiled FP16", {"cache_implementation": "static"}),
            "eager": ("PyTorch generate, eager FP16", {})}


def measure_hf(ckpt: Path, spec, paths: list[str]) -> dict[str, dict]:
    """transformers' generate on the GPU: its static cache (which transformers compiles) and eager."""
    import torch
    import transformers

    from trt_seer.bench.generate import hf_generate_rows

    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float16).cuda().eval()
    model.generation_config.pad_token_id = 0
    rows = {}
    for path in paths:
        label, kw = HF_PATHS[path]
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        rows[label] = {**hf_generate_rows(model, model.config.vocab_size, spec, **kw),
                       "memory_bytes": torch.cuda.max_memory_allocated()}
        print(label, json.dumps(rows[label]), flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


def measure_kernels(engines: dict[str, Path], spec, align: str | None) -> str:
    from trt_seer.bench.kernels import decode_kernels, kernels_text
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    parts = []
    for precision, path in engines.items():
        with TensorRTDecoder(path, align=align, windows="ladder") as dec:
            found = []
            for b in spec.batches:
                dec.warm_up(b)
                found.append(decode_kernels(dec, dec.vocab, b, spec.prompt))
        parts.append(f"Kernels per decode step, {precision.upper()} engine:\n\n{kernels_text(found)}")
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", choices=sorted(CONFIGS))
    src.add_argument("--model", type=Path)
    ap.add_argument("--work", type=Path, default=ROOT / "out" / "gen")
    ap.add_argument("--precisions", default="fp16", help="engines to build and time: fp16,int8,int4")
    ap.add_argument("--batches", default="1,8", help="batch sizes to time")
    ap.add_argument("--new-tokens", type=int, default=128, help="decode steps timed per batch and context")
    ap.add_argument("--contexts", default="128", help="prompt lengths before the timed decode steps; the first is "
                                                      "the main one (ratios, TTFT rows)")
    ap.add_argument("--ttft", default="128,1024", help="prompt lengths for time to first token (batch 1)")
    ap.add_argument("--batch", default=None, help="the engines' batch profile (default 1,max,max of --batches)")
    ap.add_argument("--seq", default="1,128,4000", help="prompt lengths of the engines' profile")
    ap.add_argument("--max-total", type=int, default=4096)
    ap.add_argument("--compute-capability", action="append", default=[])
    ap.add_argument("--variants", default="window:eager",
                    help="runtime variants per engine, cache:specialization (window|grow : none|lazy|eager); "
                         "the first one is the engine's row")
    ap.add_argument("--hf", default="compiled,eager", help="PyTorch baselines: compiled, eager, both or none; "
                                                           "the compiled one is the ratios' baseline")
    ap.add_argument("--no-hf", action="store_true", help="same as --hf none")
    ap.add_argument("--engines", type=Path, help="with --model: take the engines from this build --out directory")
    ap.add_argument("--sampling", action="store_true", help="also time top-p sampling per engine (device sampler, and on the host)")
    ap.add_argument("--kernels", action="store_true", help="also profile kernel launches per decode step")
    ap.add_argument("--build-only", action="store_true", help="make the artifacts and engines, measure nothing")
    ap.add_argument("--cpu", action="store_true",
                    help="no GPU: time ONNX Runtime's CPU forms (FP32, Q/DQ and MatMulNBits) instead of engines")
    ap.add_argument("--append", type=Path)
    ap.add_argument("--price-per-hour", type=float, default=2.5)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per point, median and spread (at least 3)")
    args = ap.parse_args(argv)
    from trt_seer.bench.generate import MIN_RUNS, GenBenchSpec, table
    from trt_seer.bench.host import engine_gpu_text, machine_text

    batches = tuple(int(x) for x in args.batches.split(","))
    contexts = tuple(int(x) for x in args.contexts.split(","))
    spec = GenBenchSpec(batches=batches, prompt=contexts[0], contexts=contexts, new_tokens=args.new_tokens,
                        ttft_prompts=tuple(int(x) for x in args.ttft.split(",")), price_per_hour=args.price_per_hour,
                        repeats=args.repeats)
    args.work.mkdir(parents=True, exist_ok=True)
    ckpt = random_checkpoint(args.config, args.work / f"{args.config}-random") if args.config else args.model
    profile = args.batch or f"1,{max(batches)},{max(batches)}"
    kw = {"batch": [int(x) for x in profile.split(",")], "seq": [int(x) for x in args.seq.split(",")],
          "max_total": args.max_total, "compute_caps": args.compute_capability}
    if args.cpu:
        spec = GenBenchSpec(batches=(1, 4), prompt=64, new_tokens=32, ttft_prompts=(128,), repeats=args.repeats,
                            price_per_hour=args.price_per_hour)
        _cpu_artifacts(ckpt, args.work, args.precisions.split(","))
        rows = measure_cpu(args.work, _name(ckpt), args.precisions.split(","), spec)
        baseline = "ONNX Runtime CPU, FP32 graph"
    else:
        if args.engines and not args.model:
            sys.exit("--engines goes with --model (the checkpoint the engines were built from)")
        engines = (built_engines(args.engines, _name(ckpt), args.precisions.split(",")) if args.engines
                   else artifacts(ckpt, args.work, args.precisions.split(","), kw))
        if args.build_only:
            return 0
        hf = [] if args.no_hf or args.hf == "none" else args.hf.split(",")
        rows = measure_hf(ckpt, spec, hf) if hf else {}
        # the named shapes are Llamas (full attention); a checkpoint's manifest decides for itself
        align = "left" if args.config else None
        rows.update(measure_engines(engines, spec, args.variants.split(","), align, args.sampling))
        baseline = next(iter(rows))  # the first PyTorch path, else the first engine
    text = table(rows, spec, baseline)
    if args.kernels and not args.cpu:
        text += "\n\n" + measure_kernels(engines, spec, "left" if args.config else None)
    print(text)
    (args.work / "bench_generate.json").write_text(json.dumps(rows, indent=1))
    if args.append:
        from trt_seer.bench.report import append_benchmark

        what = f"random init, {args.config} shape" if args.config else str(args.model)
        what += ", ONNX Runtime on the CPU" if args.cpu else ""
        runs = max(MIN_RUNS, spec.repeats)
        body = (f"Model: {what}. Decode: greedy, batch x {spec.new_tokens} new tokens after a prompt of "
                f"{' / '.join(map(str, contexts))} tokens; every path timed as its users run it, nothing added "
                f"inside its loop: the whole generation call (ids in, every token on the host) minus a 1-token "
                f"call, median of {runs} runs (± half their range). Engines: max_total {args.max_total}. TTFT: "
                f"the 1-token call at batch 1, median of {runs}. Cost at ${spec.price_per_hour}/hour.\n\n{text}\n")
        append_benchmark(args.append, f"Generation speed, {what}", "python " + " ".join(sys.argv),
                         machine_text(None if args.cpu else engine_gpu_text()), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
