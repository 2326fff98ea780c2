"""PTQ vs QAT for block-wise INT4 weights on a small trained causal LM: FP16 GEMMs the gate keeps,
the gate's metrics, and held-out perplexity against the FP32 starting model.

    python tools/bench_qat_lm.py --work runs/ [--base small-lm/] --steps 300 --seeds 0 1 2 \
        --build-flags="--int4-block 256 --min-agreement 0.95" --qat labels distill distill:rounded \
        [--control] [--append docs/BENCHMARKS.md]

1. BASE: the small Llama of tools/quality_generate.py (4 layers, hidden 256), `finetune --task
   causal-lm` on calib/default.txt (--base, or trained here with --base-epochs).
2. PTQ: `build --int4 <build flags>` of BASE (AWQ unless --no-awq), gated against its FP16 graph.
3. QAT: `finetune --task causal-lm --model BASE --qat int4 --max-steps N` on calib/default.txt
   (the task loss, or `--qat-loss distill` from BASE; `:rounded` saves the INT4 values,
   `--qat-weights rounded`), then the same build (round-to-nearest, AWQ skipped). --control: BASE
   fine-tuned N more steps without QAT, then PTQ (is it only more training?).
4. Perplexity of every FP32 / INT4 graph (ONNX Runtime CPU, teacher-forced through the KV cache)
   on calib/heldout.txt rows that come after the tokens the gate measures (no training saw any of
   it), and next-token agreement with BASE's FP32 graph; also of each checkpoint's all-INT4 graph
   (the same build with the gate opened): what the gate's first attempt measures, on more tokens.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
PROFILE = ["--batch", "1,8,16", "--seq", "1,64,256", "--max-total", "512"]
GATE_TOKENS = 16 * 64  # the gate's rows (decoder_stage.GATE_ROWS x GATE_LENGTH) come first in heldout.txt


def trt_seer(*args: str, check: bool = True) -> int:
    print("$ trt-seer", " ".join(args), flush=True)
    return subprocess.run([sys.executable, "-m", "trt_seer", *args], check=check,
                          env={**os.environ, "TQDM_DISABLE": "1"}).returncode


def base_checkpoint(work: Path, base: Path | None, epochs: int) -> Path:
    if base is not None:
        return base
    import quality_generate

    ckpt = work / "small-lm"
    if not (ckpt / "config.json").is_file():
        init = quality_generate.initial_checkpoint(work / "init")
        trt_seer("finetune", "--task", "causal-lm", "--model", str(init), "--out", str(ckpt), "--epochs", str(epochs),
                 "--lr", "1e-3", "--batch", "16", "--max-seq", "256", "--device", "cpu")
    return ckpt


def build(model: Path, out: Path, flags: list[str]) -> dict | None:
    """The INT4 record of `build --int4 <flags>` (None: the gate failed even with every GEMM FP16)."""
    rec = out / f"{model.name}.int4.onnx.json"
    if not rec.is_file():
        code = trt_seer("build", "--model", str(model), "--int4", *flags, *PROFILE, "--out", str(out), check=False)
        if code == 1:
            return None
        if code:
            raise SystemExit(f"build exited {code}")
    return json.loads(rec.read_text())


def finetune(base: Path, out: Path, steps: int, seed: int, lr: float, extra: list[str]) -> Path:
    if not (out / "config.json").is_file():
        trt_seer("finetune", "--task", "causal-lm", "--model", str(base), "--out", str(out), "--max-steps", str(steps),
                 "--epochs", "100", "--lr", str(lr), "--batch", "16", "--max-seq", "256", "--seed", str(seed),
                 "--device", "cpu", *extra)
    return out


def eval_rows(ckpt: Path, length: int, rows: int) -> np.ndarray:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    lines = [t for t in (ROOT / "calib" / "heldout.txt").read_text().splitlines() if t.strip()]
    stream = np.concatenate([np.array(e.ids + [2], np.int64) for e in tok.encode_batch(lines)])[2 * GATE_TOKENS:]
    n = min(rows, len(stream) // length)
    return stream[:n * length].reshape(n, length)


def quality(onnx_path: Path, rows: np.ndarray, ref: np.ndarray | None) -> tuple[dict, np.ndarray]:
    from trt_seer.eval.teacher import _nll, teacher_forced_logits

    logits = teacher_forced_logits(onnx_path, rows)
    out = {"perplexity": float(np.exp(_nll(logits, rows[:, 1:]).mean()))}
    if ref is not None:
        out["agreement_vs_base_fp32"] = float((logits.argmax(-1) == ref.argmax(-1)).mean())
    return out, logits


def gate_summary(rec: dict | None) -> dict:
    if rec is None:
        return {"passed": False}
    m, q = rec["accuracy"]["onnx_vs_fp16"], rec["quantization"]
    return {"passed": True, "fp16_gemms": len(q["fp16_gemms"]), "int4_gemms": q["quantized_gemms"],
            "ppl_increase": m["ppl_increase"], "agreement": m["agreement"],
            "awq": "skipped (QAT)" if q.get("qat") else ("on" if q["awq"] else "off"),
            "all_int4": rec["accuracy"]["gate"]["table"][0][1]}


def run_one(label: str, ckpt: Path, out: Path, flags: list[str], rows: np.ndarray, ref) -> dict:
    """The gated build, then (in a sibling folder) the same build with the gate opened, so every
    GEMM is INT4: what the gate's first attempt measures, on the larger held-out rows."""
    rec = build(ckpt, out, flags)
    row = {"label": label, "gate": gate_summary(rec)}
    row["fp32"], own = quality(out / f"{ckpt.name}.fp32.onnx", rows, ref)
    if rec is not None:
        row["int4"], _ = quality(out / f"{ckpt.name}.int4.onnx", rows, ref)
    every = out.with_name(out.name + "-all-int4")
    build(ckpt, every, [*flags, "--min-agreement", "0", "--max-ppl-increase", "1e9"])
    row["all_int4"], logits = quality(every / f"{ckpt.name}.int4.onnx", rows, ref)
    row["all_int4"]["agreement_vs_own_fp32"] = float((logits.argmax(-1) == own.argmax(-1)).mean())
    row["all_int4"]["ppl_vs_own_fp32"] = row["all_int4"]["perplexity"] / row["fp32"]["perplexity"] - 1
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict], base_ppl: float) -> str:
    lines = ["| Checkpoint | AWQ | Gate: FP16 GEMMs kept (of 28) | Gate: all-INT4 attempt, ppl / agreement vs own "
             "FP16 | Gate: passing graph | Held-out FP32 ppl | Held-out gated INT4 ppl (vs BASE FP32) | Gated INT4 "
             "agreement with BASE FP32 | Held-out all-INT4: ppl / agreement vs own FP32 | All-INT4 agreement with "
             "BASE FP32 |", "|---" * 10 + "|"]
    for r in rows:
        g, a = r["gate"], r["all_int4"]
        every = f"{100 * a['ppl_vs_own_fp32']:+.2f}% / {a['agreement_vs_own_fp32']:.4f}"
        head = f"| {r['label']} | {g.get('awq', '-')} | "
        if not g["passed"]:
            lines.append(head + f"fail | - | - | {r['fp32']['perplexity']:.2f} | - | - | {every} | "
                         f"{a['agreement_vs_base_fp32']:.4f} |")
            continue
        first, int4 = g["all_int4"], r["int4"]
        lines.append(head + f"{g['fp16_gemms']} | {100 * first['ppl_increase']:+.2f}% / {first['agreement']:.4f} | "
                     f"{100 * g['ppl_increase']:+.2f}% / {g['agreement']:.4f} | {r['fp32']['perplexity']:.2f} | "
                     f"{int4['perplexity']:.2f} ({100 * (int4['perplexity'] / base_ppl - 1):+.2f}%) | "
                     f"{int4['agreement_vs_base_fp32']:.4f} | {every} | {a['agreement_vs_base_fp32']:.4f} |")
    return "\n".join(lines)


def _trained(base: Path) -> str:
    """How BASE was fine-tuned, from its training.json."""
    rec = json.loads((base / "training.json").read_text())
    s, steps = rec["settings"], rec["metrics"]["optimizer_steps"]
    return (f"`finetune --task causal-lm` on calib/default.txt: {s['epochs']} epochs ({steps} steps), batch {s['batch']}, "
            f"lr {s['lr']:g}, max-seq {s['data']['max_seq']}, amp {s['amp']['mode']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--base", type=Path, default=None, help="trained small LM (default: train one under --work)")
    ap.add_argument("--base-epochs", type=int, default=6, help="epochs of BASE when trained here (default 6: the "
                    "held-out perplexity stops improving there; later epochs overfit the 1316 texts)")
    ap.add_argument("--build-flags", default="", help="extra build flags for both PTQ and QAT, e.g. --no-awq")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--qat", nargs="+", choices=("labels", "distill", "labels:rounded", "distill:rounded"),
                    default=["labels"], help="QAT runs: loss[:rounded] (--qat-loss, --qat-weights rounded)")
    ap.add_argument("--control", action="store_true")
    ap.add_argument("--append", type=Path)
    args = ap.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    flags = shlex.split(args.build_flags)
    block = flags[flags.index("--int4-block") + 1] if "--int4-block" in flags else "128"
    base = base_checkpoint(args.work, args.base, args.base_epochs)
    rows = eval_rows(base, 128, 64)
    build(base, args.work / "ptq", flags)  # writes the FP32 graph every row is compared with
    base_q, ref = quality(args.work / "ptq" / f"{base.name}.fp32.onnx", rows, None)
    results = [run_one("BASE, PTQ INT4", base, args.work / "ptq", flags, rows, ref)]
    for seed in args.seeds:
        for variant in args.qat:
            loss, _, weights = variant.partition(":")
            name = f"qat-{loss}{'-' + weights if weights else ''}-s{seed}"
            ckpt = finetune(base, args.work / name, args.steps, seed, args.lr,
                            ["--qat", "int4", "--int4-block", block, "--qat-loss", loss,
                             "--qat-weights", weights or "latent"])
            results.append(run_one(f"QAT INT4 ({loss}{', ' + weights if weights else ''}, seed {seed})", ckpt,
                                   args.work / f"eng-{name}", flags, rows, ref))
        if args.control:
            ckpt = finetune(base, args.work / f"control-s{seed}", args.steps, seed, args.lr, [])
            results.append(run_one(f"control: BASE + {args.steps} steps without QAT, PTQ INT4 (seed {seed})", ckpt,
                                   args.work / f"eng-control-s{seed}", flags, rows, ref))
    text = table(results, base_q["perplexity"])
    print(text)
    (args.work / "bench_qat_lm.json").write_text(json.dumps({"base": base_q, "results": results}, indent=1))
    if args.append:
        from trt_seer.bench.report import append_benchmark

        from trt_seer.bench.host import machine_text

        shown = {str(args.work): "<dir>", str(args.base): "<small-lm>"}
        command = "python tools/bench_qat_lm.py " + " ".join(shlex.quote(shown.get(a, a)) for a in (argv or sys.argv[1:]))
        body = (f"BASE: the small Llama of tools/quality_generate.py (4 layers, hidden 256, 28 quantizable GEMMs + "
                f"the FP16 LM head), random init, then {_trained(base)}; FP32 held-out perplexity {base_q['perplexity']:.3f}. "
                f"Build flags for every row: `--int4 {args.build_flags}`. QAT: {args.steps} steps, batch 16, lr "
                f"{args.lr:g}, on calib/default.txt. Held-out: {rows.shape[0]} rows of {rows.shape[1]} tokens of "
                f"calib/heldout.txt after the gate's tokens (ONNX Runtime CPU, teacher-forced through the KV cache); "
                f"the gate compares each checkpoint's INT4 graph with its own FP16 graph.\n\n{text}\n")
        append_benchmark(args.append, "INT4 weight-only PTQ vs QAT (finetune --qat int4)", command, machine_text(), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
