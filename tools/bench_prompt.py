"""A long prompt on a decoder engine built with `--prompt-slice`, taken in slices and whole: time to
the first token, the GPU memory the prompt step takes, and whether the two give the same logits;
appends the table to docs/BENCHMARKS.md.

    python tools/bench_prompt.py engines/l11.fp16.engine --batches 1,8 --prompt 3840 [--append docs/BENCHMARKS.md]

Each (batch, form) runs in a process of its own, so that one's GPU allocations do not carry into the
next: it opens the engine (`TensorRTDecoder`, its `prompt_slice` the engine's or 0 for the whole
prompt), runs the prompt step `--repeats` + 1 times on the same random ids (the first run dropped)
and saves the last logits. GPU memory is the largest value `nvidia-smi` reads every 100 ms while the
process runs (the whole GPU's: run it on a GPU of its own). The logits of the two forms are compared
per batch: relative RMS difference over the spread of the whole prompt's logits, and top-1 agreement.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

FORMS = ("slices", "whole")


def _child(engine: str, form: str, batch: int, prompt: int, repeats: int, logits_path: str) -> dict:
    """One form at one batch in this process: the prompt step's times (ms) and the decoder's facts."""
    import time

    from trt_seer.decoder_io import position_ids
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    with TensorRTDecoder(engine, prompt_slice=None if form == "slices" else 0) as dec:
        ids = np.random.default_rng(0).integers(3, dec.vocab, (batch, prompt)).astype(np.int64)
        mask = np.ones_like(ids)
        times = []
        for _ in range(repeats + 1):
            dec.reset(batch)
            start = time.perf_counter()
            logits = dec.step(ids, mask, position_ids(mask))
            times.append((time.perf_counter() - start) * 1e3)
        np.save(logits_path, logits)
        return {"times_ms": times[1:], "slice": dec.prompt_slice, "kv_cache_bytes": dec.kv_cache_bytes}


def _peak_mib(engine: str, form: str, batch: int, prompt: int, repeats: int, logits_path: str) -> tuple[dict, int | None]:
    """Runs `_child` in a new process under an nvidia-smi reader: (its result, peak MiB or None)."""
    smi = shutil.which("nvidia-smi")
    reader = subprocess.Popen([smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "100"],
                              stdout=subprocess.PIPE, text=True) if smi else None
    try:
        child = subprocess.run([sys.executable, __file__, engine, "--child", form, "--batches", str(batch),
                                "--prompt", str(prompt), "--repeats", str(repeats), "--logits", logits_path],
                               capture_output=True, text=True)
    finally:
        if reader is not None:
            reader.terminate()
    if child.returncode != 0:
        raise SystemExit(f"bench_prompt: {form} at batch {batch} failed: {child.stderr.strip().splitlines()[-1:]}")
    readings = [int(v) for v in reader.communicate()[0].split() if v.isdigit()] if reader is not None else []
    return json.loads(child.stdout.strip().splitlines()[-1]), max(readings) if readings else None


def compare(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(relative RMS difference of `got` against `want`'s spread per row, top-1 agreement)."""
    rel = float(np.sqrt(np.mean((got - want) ** 2) / np.mean((want - want.mean(-1, keepdims=True)) ** 2)))
    return rel, float(np.mean(got.argmax(-1) == want.argmax(-1)))


def table(rows: list[dict]) -> str:
    """Markdown: per batch and form the TTFT median (range), peak GPU memory, and the slices' logits
    against the whole prompt's."""
    lines = ["| batch | prompt in | TTFT median ms (range) | GPU memory, largest | logits vs whole: relative RMS, top-1 |",
             "|---:|---|---:|---:|---|"]
    for r in rows:
        t = sorted(r["times_ms"])
        form = f"slices of {r['slice']}" if r["slice"] else "one step"
        mem = "not read" if r["peak_mib"] is None else f"{r['peak_mib'] / 1024:.1f} GiB ({r['peak_mib']:,} MiB)"
        agree = "" if r.get("rel_rms") is None else f"{r['rel_rms']:.3f}, {r['top1']:.2f}"
        lines.append(f"| {r['batch']} | {form} | {statistics.median(t):,.1f} ({t[0]:,.1f}-{t[-1]:,.1f}) | {mem} | {agree} |")
    return "\n".join(lines)


def measure(engine: str, batches: list[int], prompt: int, repeats: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in batches:
            logits = {}
            for form in FORMS:
                logits[form] = str(Path(tmp) / f"{form}{batch}.npy")
                result, peak = _peak_mib(engine, form, batch, prompt, repeats, logits[form])
                rows.append({"batch": batch, "form": form, "peak_mib": peak, **result})
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
            rel, top1 = compare(np.load(logits["slices"]), np.load(logits["whole"]))
            rows[-2].update(rel_rms=rel, top1=top1)
    return rows


def refusal(engine: Path, prompt: int) -> str | None:
    """Why this cannot measure `engine` at `prompt` tokens (one line), or None."""
    from trt_seer.engine import manifest as manifest_io

    if not engine.is_file():
        return f"engine not found: {engine}"
    decoder = manifest_io.read_engine_manifest(manifest_io.engine_manifest_path(engine)).get("decoder") or {}
    if not decoder.get("prompt_slice"):
        return f"{engine.name} takes no prompt slices (build it with --prompt-slice)"
    if prompt > int(decoder["max_prompt"]):
        return f"--prompt {prompt} exceeds the engine's longest prompt ({decoder['max_prompt']})"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", type=Path)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt", type=int, default=3840)
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--append", type=Path)
    ap.add_argument("--child", choices=FORMS, help=argparse.SUPPRESS)
    ap.add_argument("--logits", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(_child(str(args.engine), args.child, batches[0], args.prompt, args.repeats, args.logits)))
        return 0
    why = refusal(args.engine, args.prompt)
    if why is not None:
        print(f"bench_prompt: {why}", file=sys.stderr)
        return 2
    text = table(measure(str(args.engine), batches, args.prompt, args.repeats))
    print(text)
    if args.append:
        from trt_seer.bench.host import engine_gpu_text, machine_text
        from trt_seer.bench.report import append_benchmark

        body = (f"A {args.prompt}-token prompt step on `{args.engine.name}`, taken in the engine's slices and whole, "
                f"each batch and form in a process of its own: median of {args.repeats} runs after one dropped, "
                "with its range; GPU memory the largest `nvidia-smi` reading over the process (the whole GPU); "
                f"the slices' last logits against the whole prompt's.\n\n{text}\n")
        append_benchmark(args.append, "Long prompts in slices and whole", "python " + " ".join(sys.argv),
                         machine_text(engine_gpu_text()), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
