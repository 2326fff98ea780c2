"""Artifacts and their records: where a model's files live, the JSON record beside each, and the
cache rule every stage uses (an artifact is up to date when its record's key matches and the file
is unchanged). Stages import this, never the pipeline that calls them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trt_seer.engine import manifest
from trt_seer.errors import InputError
from trt_seer.export import onnxio
from trt_seer.files import publish, sha256_file, sha256_json

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class Artifacts:
    """Where a model's artifacts live: `<out>/<name>.<suffix>`."""

    out: Path
    name: str

    def path(self, suffix: str) -> Path:
        return Path(self.out) / f"{self.name}.{suffix}"


def checkpoint_fingerprint(ckpt: Path, known: dict | None = None) -> dict:
    """The checkpoint's identity: its path and the hashes of config.json and the weight files.
    A 13 GB checkpoint takes a minute to hash, so the weights' hash in `known` (an earlier
    record's "source") is trusted while every weight file keeps its size and mtime."""
    ckpt = Path(ckpt)
    weights = sorted(p for p in ckpt.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    check_weights(ckpt, weights)
    stats = [[p.name, *stat_of(p)] for p in weights]
    same = bool(known) and known.get("weights_stat") == stats and bool(known.get("weights_sha256"))
    return {"checkpoint": str(ckpt.resolve()), "config_sha256": sha256_file(ckpt / "config.json"),
            "weights_sha256": known["weights_sha256"] if same else sha256_json([sha256_file(p) for p in weights]),
            "weights_stat": stats}


def source_identity(source: dict) -> dict:
    """What of a checkpoint fingerprint enters cache keys (not the file times it trusts)."""
    return {k: v for k, v in source.items() if k != "weights_stat"}


def check_weights(ckpt: Path, weights: list[Path]) -> None:
    """InputError before any slow import when the checkpoint has no weights or a safetensors file
    whose header is torn (loading would fail minutes later, deep inside transformers)."""
    from safetensors import SafetensorError, safe_open

    if not weights:
        raise InputError(f"no model weights in {ckpt} (expected {', '.join('*' + s for s in WEIGHT_SUFFIXES)})")
    for path in (p for p in weights if p.suffix == ".safetensors"):
        try:
            with safe_open(str(path), framework="numpy"):
                pass
        except (OSError, SafetensorError) as e:
            raise InputError(f"{path} is not a readable safetensors file (truncated or corrupt?): {e}") from e


def file_sha(path: Path, known: dict) -> str:
    """sha256 of `path`, trusting `known["sha256"]` when size and mtime match `known["stat"]`."""
    if known.get("stat") == stat_of(path) and known.get("sha256"):
        return known["sha256"]
    return onnxio.sha256(path)


def stat_of(path: Path) -> list[int]:
    st = Path(path).stat()
    return [st.st_size, st.st_mtime_ns]


def up_to_date(artifact: Path, record_file: Path, key: str) -> dict | None:
    """The artifact's record if it exists, matches `key` and the file is unchanged; else None."""
    record = manifest.read_if_exists(record_file)
    recorded_key = record and (record.get("key") or record.get("build", {}).get("key"))
    if recorded_key != key or not Path(artifact).is_file():
        return None
    known = record.get("engine", record)  # engine manifests keep hash and stat under "engine"
    if file_sha(artifact, known) != known.get("sha256"):
        return None
    return record


def present(artifact: Path) -> bool:
    """Whether `artifact` is there with its record beside it: an artifact without its record (left
    by an interrupted older build, or copied alone) counts as absent."""
    return Path(artifact).is_file() and manifest.record_path(artifact).is_file()


def publish_record(staged: Path, dest: Path, record: dict) -> dict:
    """Publishes the artifact written at `staged` (in files.staging_dir) as `dest`, with `record`
    (its hash and stat added) beside it; neither appears without the other (files.publish)."""
    record = {**record, "sha256": onnxio.sha256(staged), "stat": stat_of(staged)}
    publish(staged, dest, lambda: manifest.write(manifest.record_path(dest), record))
    return manifest.read(manifest.record_path(dest))


def write_record(artifact: Path, record: dict) -> dict:
    record = {**record, "sha256": onnxio.sha256(artifact), "stat": stat_of(artifact)}
    manifest.write(manifest.record_path(artifact), record)
    return manifest.read(manifest.record_path(artifact))


def inherit(record: dict) -> dict:
    """What a derived ONNX record takes over from the record it was made from."""
    keep = ("kind", "name", "task", "model_type", "source", "io", "decoder", "limits")
    return {k: record[k] for k in keep if k in record}




def token_limits(info) -> dict:
    """What valid token ids and lengths are for this checkpoint (the runtime checks feeds against
    them, and cuts texts to `max_length`): {vocab_size, type_vocab_size, max_positions, max_length,
    max_length_from}, those the checkpoint gives."""
    from trt_seer.export.families import max_positions
    from trt_seer.tokenizer import model_max_length

    lim = {"vocab_size": info.config.get("vocab_size"), "type_vocab_size": info.config.get("type_vocab_size"),
           "max_positions": max_positions(info)}
    lim = {k: int(v) for k, v in lim.items() if v}
    own = model_max_length(info.path)
    if own:
        lim.update(max_length=own[0], max_length_from=own[1])
    return lim
