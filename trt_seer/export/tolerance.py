"""How close an exported graph must come to PyTorch: shared by the encoder and decoder exports."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-4
    rtol: float = 2e-4  # relative to the largest |reference| value of the output
