"""Decoder builds at scale: a random-init checkpoint of a named Llama shape (written shard by
shard) through `trt-seer build --fp16 --int8 --int4`, then its engines' decode speed and memory;
appends a table to docs/BENCHMARKS.md, with rows for larger shapes worked out from the same plan.

    python tools/bench_scale.py --shape llama-1.1b --work /data/scale [--append docs/BENCHMARKS.md]
    python tools/bench_scale.py --shape llama-7b --precisions fp16,int4 --no-awq --work /data/scale
    python tools/bench_scale.py --plan-only --shape llama-13b            # the worked-out row alone

Per build stage: wall time, peak RSS, bytes written, disk under --out (from the manifests);
peak disk under --out sampled from outside every 50 ms; engine sizes; per engine on the GPU: GPU
memory with the engine loaded and its decoder's cache for the profile's largest batch (after batch-1 /
batch-8 decoding), and with a decoder for one sequence of --max-total positions (`max_batch=1`), decode
tokens/s at batch 1 and 8 (prompt 128, 128 new tokens, greedy, end to end), time to first token of
a 128-token prompt, and the fraction of the memory-bandwidth limit the batch-1 decode reaches
(engine bytes read per step / step time / --bandwidth-gbs). Random weights: the gate is loosened
(--min-agreement 0), since it has nothing to protect; speed and size do not depend on the values.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GiB = 1 << 30
CARDS = (16, 24, 48, 80)  # GB classes: Turing T4 / RTX 24 GB / A6000-L40S / A100-H100


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(ckpt: Path, out: Path, args) -> dict:
    from trt_seer.resources import StageMeter

    cmd = [sys.executable, "-m", "trt_seer", "build", "--model", str(ckpt), *[f"--{p}" for p in args.precisions],
           "--batch", "1,8,8", "--seq", "1,128,1024", "--max-total", str(args.max_total),
           "--min-agreement", "0", "--max-ppl-increase", "10", "--out", str(out), *(["--no-awq"] if args.no_awq else [])]
    print(" ".join(cmd), flush=True)
    with StageMeter("build", out, interval=0.05) as meter:  # disk under --out, sampled from outside
        rc = subprocess.run(cmd, env={**os.environ, "TQDM_DISABLE": "1"}).returncode
    if rc != 0:
        sys.exit(f"build failed with exit code {rc}")
    return {"seconds": meter.seconds, "peak_disk_bytes": meter.peak_disk, "cmd": " ".join(cmd[1:])}


def one_sequence_memory(engine: Path) -> int:
    """GPU memory of the engine with a decoder for one sequence (KV cache for 1 x max_total)."""
    from trt_seer.runtime import cuda
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    free0 = cuda.mem_info()[0]
    with TensorRTDecoder(engine, max_batch=1) as dec:
        dec.warm_up(1)
        return free0 - cuda.mem_info()[0]


def decode(engine: Path, batches=(1, 8)) -> dict:
    from trt_seer.bench.generate import GenBenchSpec, decode_rate, ttft_ms
    from trt_seer.runtime import cuda
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    cuda.set_device(0)
    free0 = cuda.mem_info()[0]
    spec = GenBenchSpec(batches=batches, ttft_prompts=(128,))
    row = {}
    with TensorRTDecoder(engine) as dec:
        row["memory_loaded_bytes"] = free0 - cuda.mem_info()[0]
        for b in batches:
            row[f"b{b}"] = decode_rate(dec, b, spec, dec.vocab)
            row[f"memory_b{b}_bytes"] = free0 - cuda.mem_info()[0]
        row["ttft_ms"] = ttft_ms(dec, 128, spec, dec.vocab)
    return row


def worked_out(shape: str, args) -> dict:
    """Disk, memory and fit of a shape from its config alone (the build's own plan)."""
    from trt_seer import resources
    from trt_seer.decoder_build import plan_decoder
    from trt_seer.quantize.spec import QuantStageSpec

    rc = _tool("random_checkpoint")
    cfg = rc.config_for(shape)
    shapes = rc.tensor_shapes(cfg)
    counts = {"gemm": 0, "embed": 0, "head": 0, "other": 0}
    for name, s in shapes.items():
        n = 1
        for d in s:
            n *= d
        counts[resources.role(name, list(s))] += n
    total = sum(counts.values())
    sizes = resources.WeightSizes(**counts, checkpoint_bytes=2 * total, tied=bool(cfg.tie_word_embeddings))
    plan = plan_decoder(sizes, ["fp16", "int8", "int4"], QuantStageSpec(out=Path(".")), False)
    heads = cfg.num_key_value_heads
    kv = 2 * cfg.num_hidden_layers * heads * (cfg.hidden_size // cfg.num_attention_heads) * 2  # bytes per token
    engines = {"fp16": sizes.fp16_bytes, "int8": sizes.quantized_bytes(8, 128, False),
               "int4": sizes.quantized_bytes(4, 128, False)}
    need = {p: b + kv * args.max_total for p, b in engines.items()}  # the cache once (engine/kv_outputs.py)
    return {"shape": shape, "parameters": total, "fp16_bytes": sizes.fp16_bytes, "plan": plan.to_dict(),
            "engine_bytes": engines, "kv_bytes_per_token": kv, "gpu_bytes_one_sequence": need,
            "fits": {p: [c for c in CARDS if n * 1.1 < c * 1e9] for p, n in need.items()}}


def _md(shape: str, gpu: str, b: dict, rows: dict, wo: dict, args) -> str:
    f16 = wo["fp16_bytes"]
    lines = [f"{shape}: {wo['parameters'] / 1e9:.2f}B parameters, random init. Build command: `{b['cmd']}`.\n",
             f"Build: {b['seconds']:.0f} s in all; peak disk under --out {b['peak_disk_bytes'] / GiB:.2f} GiB = "
             f"{b['peak_disk_bytes'] / f16:.2f}x the FP16 weights ({f16 / GiB:.2f} GiB; sampled every 50 ms); "
             f"the plan said {wo['plan']['peak_disk_bytes'] / GiB:.2f} GiB.\n",
             "| stage | wall s | peak RSS GiB | RSS after GiB | written GiB | disk under --out GiB |",
             "|---|---:|---:|---:|---:|---:|"]
    for s in b["stages"]:
        after = f"{s['rss_after_bytes'] / GiB:.2f}" if "rss_after_bytes" in s else "n/a"
        lines.append(f"| {s['stage']} | {s['seconds']:.1f} | {s['peak_rss_bytes'] / GiB:.2f} | {after} | "
                     f"{s['written_bytes'] / GiB:.2f} | {s['peak_disk_bytes'] / GiB:.2f} |")
    lines += ["", "| engine | size GiB | GPU memory loaded / b1 / b8 GiB | one sequence of --max-total GiB | "
              "decode tok/s b1 | b8 | TTFT 128 ms | b1 bandwidth use |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p, r in rows.items():
        bw = r["size_bytes"] / (r["b1"]["ms_per_step"] / 1e3) / (args.bandwidth_gbs * 1e9)
        lines.append(f"| {p.upper()} | {r['size_bytes'] / GiB:.2f} | {r['memory_loaded_bytes'] / GiB:.2f} / "
                     f"{r['memory_b1_bytes'] / GiB:.2f} / {r['memory_b8_bytes'] / GiB:.2f} | "
                     f"{r['memory_one_sequence_bytes'] / GiB:.2f} | {r['b1']['tokens_per_s']:.0f} | {r['b8']['tokens_per_s']:.0f} | {r['ttft_ms']:.1f} | {100 * bw:.0f}% |")
    lines.append(f"\nBandwidth use: engine bytes read once per step over the step's wall time, against "
                 f"{args.bandwidth_gbs:.0f} GB/s. Engines are TensorRT-RTX on H200 (Ampere kernels).")
    return "\n".join(lines) + "\n"


def _md_worked(rows: list[dict], max_total: int) -> str:
    lines = ["\nWorked out from the build's own plan (no build run), batch 1, one sequence of "
             f"{max_total} positions (its cache held once, as the runtime does with engines that give `new_key_values`; without the engine's scratch memory):\n", "| shape | params | peak disk under --out | peak RAM (plan) | "
             "FP16 / INT8 / INT4 engine + KV GiB | fits (GB cards) FP16 / INT8 / INT4 |", "|---|---:|---:|---:|---:|---|"]
    for w in rows:
        n = w["gpu_bytes_one_sequence"]
        fit = " / ".join(",".join(map(str, w["fits"][p])) or "none" for p in ("fp16", "int8", "int4"))
        lines.append(f"| {w['shape']} | {w['parameters'] / 1e9:.1f}B | {w['plan']['peak_disk_bytes'] / GiB:.1f} GiB | "
                     f"{w['plan']['ram_bytes'] / GiB:.1f} GiB | {n['fp16'] / GiB:.1f} / {n['int8'] / GiB:.1f} / "
                     f"{n['int4'] / GiB:.1f} | {fit} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-1.1b")
    ap.add_argument("--work", type=Path, default=Path("out/scale"))
    ap.add_argument("--precisions", type=lambda s: s.split(","), default=["fp16", "int8", "int4"])
    ap.add_argument("--max-total", type=int, default=4096)
    ap.add_argument("--no-awq", action="store_true")
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0, help="the GPU's memory bandwidth (H200: 4800)")
    ap.add_argument("--worked", default="llama-7b,llama-13b", help="shapes to work out from their plan")
    ap.add_argument("--plan-only", action="store_true")
    ap.add_argument("--append", type=Path)
    args = ap.parse_args()
    worked = [worked_out(s, args) for s in args.worked.split(",") if s]
    if args.plan_only:
        print(_md_worked(worked, args.max_total))
        return
    ckpt = _tool("random_checkpoint").write_checkpoint(args.shape, args.work / args.shape)
    out = args.work / f"{args.shape}-engines"
    b = build(ckpt, out, args)
    from trt_seer.engine import manifest

    rows = {}
    for p in args.precisions:
        m = manifest.read_engine_manifest(out / f"{args.shape}.{p}.manifest.json")
        b["stages"] = m["build_stages"]
        rows[p] = {"size_bytes": m["engine"]["size_bytes"], **decode(out / f"{args.shape}.{p}.engine"),
                   "memory_one_sequence_bytes": one_sequence_memory(out / f"{args.shape}.{p}.engine")}
        print(p, json.dumps(rows[p]), flush=True)
    from trt_seer.runtime import cuda

    gpu = cuda.device_info(0).name
    text = _md(args.shape, gpu, b, rows, worked_out(args.shape, args), args) + _md_worked(worked, args.max_total)
    print(text)
    (args.work / f"{args.shape}.json").write_text(json.dumps({"build": b, "engines": rows}, indent=1))
    if args.append:
        from trt_seer.bench.report import append_benchmark

        append_benchmark(args.append, f"Decoder build at scale: {args.shape}", "python " + " ".join(sys.argv),
                         f"{gpu} ({_flavor()}), {os.cpu_count()}-core host", text)


def _flavor() -> str:
    from trt_seer.engine import trt

    flavor = trt.load()
    return f"{flavor.name} {flavor.version}"


if __name__ == "__main__":
    main()
