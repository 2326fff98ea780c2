"""What the quantization stages (INT8 for encoders, weight-only INT8 / INT4 for decoders) take from
the user, as one frozen value: the CLI builds it, the stages read it, nothing else travels."""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class QuantStageSpec:
    out: Path  # where artifacts (and, by default, the calibration cache) go
    batch: tuple[int, int, int] = (1, 8, 32)  # the engines' profile: calibration batches fit it
    seq: tuple[int, int, int] = (8, 128, 256)
    model: str | None = None  # the checkpoint (a `finetune --qat` one brings its ranges)
    force: bool = False
    # calibration and held-out data
    calib: str | None = None
    text_field: str = "text"
    calib_samples: int = 256
    calib_batch: int = 16
    calib_method: str = "entropy"
    calib_cache: str | None = None
    from_cache: str | None = None
    # encoder INT8
    int8_mode: str = "auto"
    int8_attention: bool = False
    smooth_alpha: float = 0.5
    min_cosine: float = 0.99
    min_cosine_each: float = 0.97
    min_top1: float = 0.99
    allow_no_int8: bool = False
    # decoder weight-only INT8 / INT4
    int4_block: int = 128
    quantize_lm_head: bool = False
    no_awq: bool = False
    max_ppl_increase: float | None = None
    min_agreement: float | None = None

    @classmethod
    def from_args(cls, args) -> "QuantStageSpec":
        """The fields an argparse namespace has (the build command's), defaults for the rest."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        for name in ("batch", "seq"):
            if name in given:
                given[name] = tuple(given[name])
        return cls(**given)
