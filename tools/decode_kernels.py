"""Kernel launches and device time per decode step of a decoder engine (GPU; torch.profiler/CUPTI):

    PYTHONPATH=. python tools/decode_kernels.py out/gen/<name>.fp16.engine --batches 1,8 --context 128

Prints launches per step (kernels, memsets, memory copies) and the costliest kernels per batch;
`--append docs/BENCHMARKS.md` records them. Needs torch with CUDA beside TensorRT.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("engine", type=Path)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--context", type=int, default=128, help="prompt tokens before the profiled steps")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--cache", default="window", choices=["window", "grow"])
    ap.add_argument("--align", choices=["left", "right"], default=None,
                    help="window layout (default: from the manifest; left for full attention)")
    ap.add_argument("--append", type=Path)
    args = ap.parse_args(argv)
    from trt_seer.bench.kernels import decode_kernels, kernels_text
    from trt_seer.runtime.decoder_trt import TensorRTDecoder

    found = []
    with TensorRTDecoder(args.engine, cache=args.cache, align=args.align) as dec:
        for b in (int(x) for x in args.batches.split(",")):
            dec.warm_up(b)
            found.append(decode_kernels(dec, dec.vocab, b, args.context, args.steps))
    text = kernels_text(found)
    print(text)
    if args.append:
        from trt_seer.bench.host import engine_gpu_text, machine_text
        from trt_seer.bench.report import append_benchmark

        append_benchmark(args.append, f"Kernels per decode step, {args.engine.name} ({args.cache} cache)",
                         "python " + " ".join(sys.argv), machine_text(engine_gpu_text()), text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
