"""`trt-seer triton`: a Triton Inference Server model repository entry for an engine or ONNX artifact:
`REPO/<name>/config.pbtxt` (max_batch_size, dims, data types, one instance group per optimization
profile, dynamic batching, all read from the manifest) and `REPO/<name>/1/model.plan` (or
`1/model.onnx` for ONNX Runtime on CPU).

    trt-seer triton engines/all-MiniLM-L6-v2.fp16.engine --repo models --preferred-batch 4,8
    tritonserver --model-repository models
"""
from __future__ import annotations

import argparse


def add_parser(subparsers, common):
    p = subparsers.add_parser("triton", help="write a Triton model repository entry for an artifact",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", metavar="ARTIFACT",
                   help="<name>.<prec>.engine (or its .manifest.json), or an .onnx artifact (or its .onnx.json record)")
    p.add_argument("--repo", metavar="DIR", required=True, help="model repository (created if missing)")
    p.add_argument("--name", default=None, help="model name (default: <name>-<precision> from the manifest)")
    p.add_argument("--instances", type=common.positive_int, default=1, metavar="N",
                   help="execution instances per optimization profile (default: 1)")
    p.add_argument("--max-queue-delay-us", type=int, default=100, metavar="N",
                   help="dynamic batcher's wait to fill a batch, in microseconds (default: 100)")
    p.add_argument("--preferred-batch", type=common.int_list, default=None, metavar="B,B",
                   help="dynamic batcher's preferred batch sizes, within the profile "
                        "(default: the profile's opt and max batch)")
    p.add_argument("--max-batch-size", type=common.positive_int, default=None, metavar="N",
                   help="Triton's max_batch_size, at most the profile's max batch (default: that max; "
                        "ONNX artifacts: 32)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing model of the same name")
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from trt_seer.serve.config import TritonSpec
    from trt_seer.serve.triton import triton_repo_from_artifact

    spec = TritonSpec(name=args.name, instances=args.instances, max_queue_delay_us=args.max_queue_delay_us,
                      preferred_batch=args.preferred_batch, max_batch_size=args.max_batch_size,
                      overwrite=args.overwrite)
    dest = triton_repo_from_artifact(args.artifact, args.repo, spec)
    print(dest)
    return 0
