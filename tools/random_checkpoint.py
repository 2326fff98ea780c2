"""Random-init Llama-shape checkpoints of named sizes, written shard by shard (no model is ever
whole in memory), with a word-level tokenizer: stand-ins for fine-tuned LLMs when measuring
build and decode cost, which do not depend on the weights' values.

    python tools/random_checkpoint.py --shape llama-7b --dest /data/llama-7b
    python tools/random_checkpoint.py --list

Weights are N(0, 0.02) in FP16 (norms 1), saved as safetensors shards of at most --shard-gb with
the index transformers reads. Random weights give near-uniform next-token distributions, so a
build of one needs loose gate thresholds (e.g. --min-agreement 0): the gate has nothing to protect.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SHAPES = {  # name -> transformers LlamaConfig keywords
    "llama-80m": dict(vocab_size=32000, hidden_size=512, intermediate_size=1536, num_hidden_layers=14,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048),
    "llama-0.1b": dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=4096),
    "llama-1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                       num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=4096),
    "llama-3b": dict(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                     num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=4096,
                     tie_word_embeddings=True),  # Llama-3.2-3B's shape
    "llama-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096),  # Llama-2-7B
    "mistral-7b": dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096),
    "llama-13b": dict(vocab_size=32000, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                      num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096),
}


def config_for(shape: str):
    import transformers

    kw = {"tie_word_embeddings": False, **SHAPES[shape]}
    return transformers.LlamaConfig(**kw, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def tensor_shapes(config) -> dict[str, tuple]:
    """Every parameter's name and shape, from a model made on the meta device (no memory)."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def write_tokenizer(dest: Path, vocab: int) -> None:
    """A word-level tokenizer: <pad> <s> </s> then w3 ... ; BOS first, as Llama's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, min(vocab, 4096))}}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "tokenizer_class": "PreTrainedTokenizerFast"}))


def write_checkpoint(shape: str, dest: Path, shard_gb: float = 2.0, seed: int = 0, device: str = "cpu") -> Path:
    """Writes the checkpoint shard by shard; returns `dest`. An existing one is kept. `device`
    "cuda" draws the values on the GPU (a 7B shape in seconds rather than a minute; other values
    than the CPU's for the same seed)."""
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm

    dest = Path(dest)
    if (dest / "config.json").is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    config = config_for(shape)
    gen = torch.Generator(device=device).manual_seed(seed)
    names, current, size, limit, total = [], {}, 0, int(shard_gb * 2**30), 0
    weight_map = {}

    def flush():
        names.append(f"part-{len(names) + 1:05d}.safetensors")
        save_file(current, str(dest / names[-1]), metadata={"format": "pt"})
        weight_map.update({k: names[-1] for k in current})

    for name, s in tqdm(tensor_shapes(config).items(), desc=f"random {shape}", unit="tensor"):
        t = torch.ones(s, dtype=torch.float16) if len(s) == 1 else \
            (torch.randn(s, generator=gen, dtype=torch.float32, device=device) * 0.02).to(torch.float16).cpu()
        current[name] = t
        size += t.numel() * 2
        total += t.numel() * 2
        if size >= limit:
            flush()
            current, size = {}, 0
    if current:
        flush()
    final = {n: (f"model-{i + 1:05d}-of-{len(names):05d}.safetensors" if len(names) > 1 else "model.safetensors")
             for i, n in enumerate(names)}
    for old, new in final.items():
        (dest / old).rename(dest / new)
    if len(names) > 1:
        (dest / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": {k: final[v] for k, v in weight_map.items()}}))
    config.dtype = "float16"
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(str(dest))
    write_tokenizer(dest, config.vocab_size)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--dest", type=Path)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--device", default="cpu", help="where the random values are drawn: cpu or cuda")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list or not args.shape:
        for k, v in SHAPES.items():
            n = sum(int(__import__("math").prod(s)) for s in tensor_shapes(config_for(k)).values())
            print(f"{k:12s} {n / 1e9:6.2f}B parameters  {v}")
        return
    print(write_checkpoint(args.shape, args.dest, args.shard_gb, device=args.device))


if __name__ == "__main__":
    main()
