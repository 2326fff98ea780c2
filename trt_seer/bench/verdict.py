"""Whether INT8 pays: its size and p50 latency against its base path (FP16 engine, FP32 graph),
for `bench`'s report and for `build --int8`, which reads the manifests' `bench` sections; and whether
each engine or ONNX Runtime path is faster than the fastest PyTorch path measured beside it."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from trt_seer.bench.paths import INT8_PAIRS

INT8_MIN_GAIN = 0.10  # INT8 should be at least this much faster or smaller than its base


@dataclass(frozen=True)
class Facts:
    """What decides whether an artifact is worth it: its size and its p50 latencies."""

    size_bytes: int | None
    p50_ms: dict  # (seq, batch) -> milliseconds
    where: object = None  # latencies compare only when measured on the same machine


def int8_comparison(int8: Facts, base: Facts) -> dict:
    """{"smaller": fraction or None, "faster": fraction or None, "points": [[seq, batch], ...]};
    faster is 1 - the geometric mean of the p50 ratios over the common (seq, batch) points."""
    smaller = None
    if int8.size_bytes and base.size_bytes:
        smaller = 1.0 - int8.size_bytes / base.size_bytes
    common = sorted(set(int8.p50_ms) & set(base.p50_ms)) if int8.where == base.where else []
    faster = None
    if common:
        logs = [math.log(int8.p50_ms[k] / base.p50_ms[k]) for k in common]
        faster = 1.0 - math.exp(sum(logs) / len(logs))
    return {"smaller": smaller, "faster": faster, "points": [list(k) for k in common]}


def has_int8_benefit(smaller: float | None, faster: float | None) -> bool:
    """At least INT8_MIN_GAIN faster, or that much smaller without being slower. Unknown is no
    evidence against it."""
    if smaller is None and faster is None:
        return True
    if faster is not None and faster >= INT8_MIN_GAIN:
        return True
    return smaller is not None and smaller >= INT8_MIN_GAIN and (faster is None or faster >= 0)


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**10:,.1f} KiB" if n < 2**20 else f"{n / 2**20:,.1f} MiB"


def fmt_smaller(x: float) -> str:
    return f"{x:.0%} smaller" if x >= 0 else f"{-x:.0%} larger"


def fmt_faster(x: float) -> str:
    """From `faster` (1 - latency ratio): '12% faster' or '1.31x the latency (slower)'."""
    return f"{x:.0%} faster" if x >= 0 else f"slower ({1 - x:.2f}x the latency)"


def int8_verdict(int8: Facts, base: Facts, base_name: str) -> str | None:
    """A plain warning when INT8 buys too little over `base_name`, else None."""
    c = int8_comparison(int8, base)
    if has_int8_benefit(c["smaller"], c["faster"]):
        return None
    parts = []
    if c["smaller"] is not None:
        parts.append(f"{fmt_smaller(c['smaller'])} ({fmt_bytes(int8.size_bytes)} vs {fmt_bytes(base.size_bytes)})")
    if c["faster"] is not None:
        where = ", ".join(f"b{b}" for _, b in c["points"])
        parts.append(f"{fmt_faster(c['faster'])} at p50 (seq {c['points'][0][0]}, {where})")
    else:
        parts.append("latency not measured yet (run trt-seer bench)")
    return (f"INT8 brings no real benefit over {base_name}: {' and '.join(parts)}; less than "
            f"{INT8_MIN_GAIN:.0%} gained for the accuracy INT8 costs, so prefer {base_name}")


def manifest_facts(data: dict) -> Facts:
    """Facts from an engine manifest (or ONNX record) and its `bench` section, if any."""
    size = data.get("engine", {}).get("size_bytes") or (data.get("stat") or [None])[0]
    bench = data.get("bench") or {}
    p50 = {(int(bench["seq"]), int(p["batch"])): float(p["p50_ms"]) for p in bench.get("points", [])}
    return Facts(size, p50, json.dumps(bench.get("machine"), sort_keys=True))


def int8_benefit_warning(int8_manifest: dict, fp16_manifest: dict) -> str | None:
    """For `build --int8`: a warning when the INT8 engine is not at least 10% faster (latency from
    the manifests' `bench` sections, when both have one) or 10% smaller than the FP16 engine."""
    return int8_verdict(manifest_facts(int8_manifest), manifest_facts(fp16_manifest), "FP16")


def _facts(row: dict, seq: int, machine: dict) -> Facts:
    where = json.dumps({**machine, "device": row["device"]}, sort_keys=True)
    return Facts(row.get("size_bytes"), {(seq, p["batch"]): p["p50_ms"] for p in row["points"]}, where)


def int8_findings(rows: list[dict], seq: int, machine: dict) -> list[dict]:
    """INT8 against its base for every pair where both ran: the numbers and the warning, if any."""
    by_key = {r["key"]: r for r in rows if r["status"] == "ok"}
    found = []
    for int8_key, base_key in INT8_PAIRS:
        if int8_key in by_key and base_key in by_key:
            a, b = _facts(by_key[int8_key], seq, machine), _facts(by_key[base_key], seq, machine)
            base_name = by_key[base_key]["label"]
            isa = machine.get("cpu_int8_isa") if by_key[int8_key]["device"] == "cpu" else None
            found.append({"int8": by_key[int8_key]["label"], "base": base_name, **int8_comparison(a, b),
                          "warning": int8_verdict(a, b, base_name), **({"cpu_int8_isa": isa} if isa else {})})
    return found


def against_pytorch(rows: list[dict]) -> list[dict]:
    """Per batch of every non-PyTorch path that ran: the fastest PyTorch path measured in the same
    run on the same device at that batch (end-to-end p50, compiled paths included) and whether the
    path beats it; `best` is None, with `reason`, where no PyTorch path ran there."""
    torch_points = [(q["p50_ms"], t["label"], t["device"], q["batch"]) for t in rows
                    if t["status"] == "ok" and t["backend"] == "torch" for q in t["points"]]
    found = []
    for r in (r for r in rows if r["status"] == "ok" and r["backend"] != "torch"):
        for p in r["points"]:
            rivals = [(ms, name) for ms, name, device, batch in torch_points
                      if device == r["device"] and batch == p["batch"]]
            entry = {"path": r["label"], "key": r["key"], "batch": p["batch"], "p50_ms": p["p50_ms"]}
            if not rivals:
                where = "GPU" if r["device"] == "cuda" else "CPU"
                found.append({**entry, "best": None, "reason": f"no PyTorch path ran on the {where} at this batch"})
                continue
            best_ms, best = min(rivals)
            found.append({**entry, "best": best, "best_p50_ms": best_ms, "speedup": best_ms / p["p50_ms"],
                          "faster": p["p50_ms"] < best_ms})
    return found


def against_pytorch_line(f: dict) -> str:
    """'- <path>, batch <b>: <p50> ms vs <p50> ms (<the fastest PyTorch path>): <ratio>x, faster than
    PyTorch's best here' (or 'NOT faster ...')."""
    head = f"- {f['path']}, batch {f['batch']}: {f['p50_ms']:.3g} ms"
    if f["best"] is None:
        return f"{head}; not compared: {f['reason']}"
    verdict = "faster than PyTorch's best here" if f["faster"] else "NOT faster than PyTorch's best here"
    return f"{head} vs {f['best_p50_ms']:.3g} ms ({f['best']}): {f['speedup']:.2f}x, {verdict}"
