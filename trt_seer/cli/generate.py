"""`trt-seer generate`: text from a causal-LM artifact (ONNX Runtime on CPU, or a TensorRT engine).

    python -m trt_seer generate engines/my-llama.fp16.onnx --prompt "Once upon a time" --max-new-tokens 40
    python -m trt_seer generate engines/my-llama.fp16.onnx --prompt "Hi" --temperature 0.8 --top-p 0.9 --seed 0 --stream
    python -m trt_seer generate engines/my-llama.fp16.engine --prompt "Hi" --stats    # TTFT, tokens/s, device ms

Greedy unless --temperature > 0. Prompts of different lengths run as one left-padded batch.
"""
from __future__ import annotations

import argparse
import json
import sys

from trt_seer.cli.run import read_texts
from trt_seer.errors import InputError


def add_parser(subparsers, common):
    p = subparsers.add_parser("generate", help="generate text with a causal-LM artifact", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", metavar="ENGINE_OR_ONNX", help="<name>.<precision>.engine or .onnx (causal-lm)")
    p.add_argument("--prompt", dest="text", action="append", default=[], metavar="TEXT",
                   help="a prompt (repeatable)")
    p.add_argument("--file", metavar="PATH", help="prompts, one per line")
    p.add_argument("--max-new-tokens", type=common.positive_int, default=32, metavar="N",
                   help="tokens to generate per prompt at most (default 32)")
    g = p.add_argument_group("sampling (default: greedy)")
    g.add_argument("--temperature", type=float, default=0.0, metavar="T", help="> 0 samples (default 0: greedy)")
    g.add_argument("--top-k", type=int, default=0, metavar="K", help="sample among the K likeliest (0: all)")
    g.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus mass (default 1: all)")
    g.add_argument("--seed", type=int, default=None, metavar="S", help="seed for reproducible sampling")
    p.add_argument("--json", action="store_true", help="print one JSON document: token ids and text per prompt")
    p.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    p.add_argument("--stats", action="store_true",
                   help="also print time to first token, decode tokens/s and device ms per step (where the "
                        "backend measures it); with --json, a `stats` object")
    common.add_decoder_runtime_args(p)
    common.add_verbosity(p)
    p.set_defaults(handler=run)
    return p


def run(args) -> int:
    from trt_seer.runtime.generate import Sampling, load_generator

    if not args.text and not args.file:
        raise InputError("nothing to generate from: pass --prompt TEXT or --file PATH")
    texts = read_texts(args)
    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed)
    generator = load_generator(args.artifact, tokenizer_dir=args.tokenizer, threads=args.threads)
    timed = None
    if args.stats:
        from trt_seer.runtime.gen_stats import TimedStep
        from trt_seer.runtime.generate import Generator

        timed = TimedStep(generator.step)
        generator = Generator(timed, generator.decoder, generator.tokenizer)
    if args.stream:
        _stream(generator, texts, sampling, args.json)
        return _print_stats(timed, args.json)
    results = generator.generate(texts, sampling)
    if args.json:
        doc = {"artifact": str(args.artifact), "results": [_as_dict(r) for r in results]}
        print(json.dumps({**doc, "stats": timed.stats()} if timed else doc))
    else:
        for r in results:
            print(f"{r.prompt!r} -> {r.text!r}")
        _print_stats(timed, False)
    return 0


def _print_stats(timed, as_json: bool) -> int:
    """After streamed or plain output: one `{"stats": ...}` JSON line, or one text line."""
    from trt_seer.runtime.gen_stats import stats_text

    if timed is not None:
        print(json.dumps({"stats": timed.stats()}) if as_json else stats_text(timed.stats()))
    return 0


def _as_dict(r) -> dict:
    return {"prompt": r.prompt, "prompt_ids": r.prompt_ids, "token_ids": r.token_ids, "text": r.text,
            "finish_reason": r.finish_reason}


def _stream(generator, texts: list[str], sampling, as_json: bool) -> int:
    """One JSON line per token ({"row", "token_id", "text"}); as text, one prompt's pieces as they
    come, or one `[row] piece` line per token for several prompts."""
    for row, token, piece in generator.stream(texts, sampling):
        if as_json:
            line = json.dumps({"row": row, "token_id": token, "text": piece}) + "\n"
        else:
            line = piece if len(texts) == 1 else f"[{row}] {piece!r}\n"
        sys.stdout.write(line)
        sys.stdout.flush()
    if not as_json and len(texts) == 1:
        sys.stdout.write("\n")
    return 0
