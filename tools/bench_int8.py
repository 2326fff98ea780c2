"""INT8 on the default model: calibration cost, accuracy vs FP32, and `build --int8` end to end.

    python tools/bench_int8.py [--append docs/BENCHMARKS.md]

1. Calibration time and peak RSS at 256 vs 2,048 samples (whole processes; the histograms are
   streamed, so memory must not grow with the sample count).
2. `build --int8` end to end in a fresh directory (target <= 60 s on 2 cores), then the Q/DQ graph's
   accuracy vs FP32 on the held-out split, read from its record (target: mean cosine >= 0.995,
   min >= 0.98).
CPU latency of the FP32 / INT8 graphs next to torch is `trt-seer bench` (tools/bench_paths.py).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build import emit, stage_table, timed  # noqa: E402

CALIBRATE = """
import sys, itertools
from pathlib import Path
from trt_seer import data
from trt_seer.quantize import calibrate
from trt_seer.export import onnxio
from trt_seer.quantize import qdq as quantize
from trt_seer.export.families import ShapeProfile, resolve_model
info, onnx_path, n = resolve_model(None), Path(sys.argv[1]), int(sys.argv[2])
texts = list(itertools.islice(itertools.cycle(data.load_texts(data.default_corpus())), n))
batches = data.token_batches(info, texts, ShapeProfile(), 32)  # a generator: streamed
targets = quantize.find_targets(onnxio.load(onnx_path, False), quantize.QuantSpec(), info.task)
names = sorted(set(quantize.activation_tensors(onnxio.load(onnx_path, False), targets).values()))
calibrate.collect_ranges(onnx_path, batches, names, progress=False)
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--append", default=None)
    p.add_argument("--samples", default="256,2048")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        wall, rss, rc = timed([sys.executable, "-m", "trt_seer", "build", "--int8", "--out", tmp,
                               "--calib-cache", f"{tmp}/calibration.cache"])
        if rc:
            return rc
        rows.append(("`build --int8` end to end (fresh)", wall, rss))
        record = json.loads(Path(tmp, "all-MiniLM-L6-v2.int8.onnx.json").read_text())
        for n in args.samples.split(","):
            wall, rss, rc = timed([sys.executable, "-c", CALIBRATE, f"{tmp}/all-MiniLM-L6-v2.fp32.onnx", n])
            if rc:
                return rc
            rows.append((f"calibration, {n} samples (batch 32, entropy)", wall, rss))
    acc = record["accuracy"]["onnx_vs_fp32"]
    quant = record["quantization"]
    text = "\n".join([
        "Whole processes.", "",
        *stage_table(rows), "",
        f"Q/DQ INT8 vs FP32 on {acc['samples']} held-out samples (ONNX Runtime CPU): mean cosine "
        f"{acc['mean_cosine']:.4f}, min {acc['min_cosine']:.4f}, neighbour overlap@5 "
        f"{acc['neighbour_overlap@5']:.3f}; {quant['int8_gemms']['int8']} of {quant['int8_gemms']['total']} "
        f"GEMMs in INT8, {len(quant['int8_gemms']['fp16_fallback'])} kept in FP16 by the gate's fallback."])
    emit("INT8", "bench_int8.py", argv, text, args.append)
    return 0


if __name__ == "__main__":
    sys.exit(main())
