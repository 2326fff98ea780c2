"""The outcome of a `diff` and its verdict: "passed" only when every comparison asked for ran here
and passed; "failed" when one that ran failed; "not verified" when none failed but one could not
run (an engine on a machine without a GPU it runs on, a missing graph).

    from trt_seer.eval.result import verdict
    verdict([{"passed": True}], [{"comparison": "tensorrt-fp16 vs onnxrt-fp32", "reason": "no GPU"}])
    # -> "not verified"
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trt_seer.eval.plan import Side, Target

PASSED, FAILED, NOT_VERIFIED = "passed", "failed", "not verified"
EXIT_CODES = {PASSED: 0, FAILED: 1, NOT_VERIFIED: 3}  # 2 is bad input (the CLI's errors)


def verdict(comparisons: list[dict], not_run: list[dict]) -> str:
    """FAILED if a comparison that ran failed, else NOT_VERIFIED if one asked for did not run (or
    none ran), else PASSED."""
    if any(not c["passed"] for c in comparisons):
        return FAILED
    if not_run or not comparisons:
        return NOT_VERIFIED
    return PASSED


@dataclass
class DiffResult:
    target: Target
    task: str
    against: str
    reference: Side
    candidates: list[Side]  # the sides that ran, in the order of `comparisons`
    not_run: list[dict]  # {"comparison", "reason"}: asked for, could not run here
    batches: list[dict]
    run_results: object  # polygraphy RunResults as produced: candidates first, the reference last
    compared: object = None  # the same with token-level outputs zeroed at padded positions
    backends: dict = field(default_factory=dict)  # side label -> what ran it ("onnxruntime CPU", ...)
    artifacts: dict = field(default_factory=dict)  # side label -> the file or checkpoint it ran
    comparisons: list[dict] = field(default_factory=list)
    histograms: dict = field(default_factory=dict)  # (candidate, output) -> counts over HIST_EDGES
    layers: list[dict] | None = None
    layer_pair: tuple[Path, Path] | None = None
    layers_not_run: str | None = None  # why the per-layer profile asked for was not made (no verdict)

    @property
    def verdict(self) -> str:
        return verdict(self.comparisons, self.not_run)

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def samples(self) -> int:
        return int(sum(len(next(iter(b.values()))) for b in self.batches))

    def ran(self) -> list[dict]:
        """Each comparison that ran: what ran on which backend, and whether it passed."""
        return [{"comparison": f"{c['candidate']} vs {c['reference']}", "passed": c["passed"],
                 "candidate": self._side(c["candidate"]), "reference": self._side(c["reference"])}
                for c in self.comparisons]

    def _side(self, label: str) -> dict:
        return {"label": label, "artifact": self.artifacts.get(label), "backend": self.backends.get(label)}
