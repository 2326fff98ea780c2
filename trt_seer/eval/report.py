"""What `diff` tells: the table the CLI prints, the summary recorded in the target's manifest /
record (accuracy["diff_vs_<against>"]), and the report directory (Markdown, JSON, error histograms,
the per-layer profile, Polygraphy inputs/outputs and the `polygraphy run` lines that reproduce it).

    from trt_seer.eval.report import format_table, record_accuracy, write_report
    print(format_table(result)); write_report(result, Path("out/")); record_accuracy(result)
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from trt_seer.engine import manifest
from trt_seer.eval.compare import HIST_EDGES, MASK_SCRIPT, task_output
from trt_seer.eval.result import FAILED, NOT_VERIFIED, PASSED, DiffResult
from trt_seer.eval.runners import polygraphy_logs

MASK_SCRIPT_NAME = "mask_padding.py"
VERDICT_TEXT = {PASSED: "PASS", FAILED: "FAIL", NOT_VERIFIED: "NOT VERIFIED"}


# --- the table and the manifest summary --------------------------------------------------------

def _cos(x: float) -> str:
    """Cosine with its distance from 1 readable: 0.998731, or 1-2.1e-08 when that close."""
    return f"{x:.6f}" if x < 0.999999 else f"1-{max(1.0 - x, 0.0):.1e}"


def _task_text(task: str, m: dict) -> str:
    if task == "feature-extraction":
        return f"cos {_cos(m['mean_cosine'])} (min {_cos(m['min_cosine'])})"
    return f"top-1 {m['top1_agreement']:.4f}, KL {m['mean_kl']:.2e}"


def _row_verdict(out: dict, gate: dict, is_task_output: bool) -> str:
    checks = [out["elementwise_passed"]] if out["gating"] else []
    if is_task_output and gate["gating"]:
        checks.append(gate["passed"])
    if not checks:
        return "info (%s)" % ("within tol" if out["elementwise_passed"] else "over tol")
    return "PASS" if all(checks) else "FAIL"


TABLE_HEADER = ("comparison", "output", "max abs", "mean abs", "max rel", "mean rel", "cosine", "task metric", "result")


def table_rows(result: DiffResult) -> list[tuple[str, ...]]:
    rows = []
    for c in result.comparisons:
        for name, o in c["outputs"].items():
            is_task = name == task_output(result.task)
            rows.append((f"{c['candidate']} vs {c['reference']}", name, f"{o['max_abs']:.2e}", f"{o['mean_abs']:.2e}",
                         f"{o['max_rel']:.2e}", f"{o['mean_rel']:.2e}", _cos(o["mean_cosine"]),
                         _task_text(result.task, c["task_metrics"]) if is_task else "-",
                         _row_verdict(o, c["task_gate"], is_task)))
    return rows


def _headline(result: DiffResult) -> str:
    t = result.target
    data = (f"{result.samples} held-out samples in {len(result.batches)} batches" if result.comparisons
            else "nothing could run here")
    return f"{t.name} {t.precision} ({t.kind}) vs {result.against}: {data}, task {result.task}"


def ran_lines(result: DiffResult) -> list[str]:
    """'ran: onnxrt-fp16 (x.fp16.onnx, onnxruntime CPU) vs onnxrt-fp32 (...)' per comparison that ran."""
    def side(s: dict) -> str:
        return f"{s['label']} ({s['artifact']}, {s['backend']})"

    return [f"ran: {side(r['candidate'])} vs {side(r['reference'])}" for r in result.ran()]


def verdict_line(result: DiffResult) -> str:
    """'result: PASS' / 'result: FAIL' / 'result: NOT VERIFIED (1 comparison asked for did not run)'."""
    text = VERDICT_TEXT[result.verdict]
    if result.verdict == NOT_VERIFIED:
        n = len(result.not_run)
        text += f" ({n} comparison{'s' if n != 1 else ''} asked for did not run)" if n else " (nothing ran)"
    return text


def format_table(result: DiffResult) -> str:
    """The per-output table printed by the CLI, what ran where, what did not run and the verdict."""
    lines = [_headline(result)]
    if result.comparisons:
        rows = [TABLE_HEADER, *table_rows(result)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(TABLE_HEADER))]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    lines += ran_lines(result)
    lines += [f"not run: {s['comparison']}: {s['reason']}" for s in result.not_run]
    if result.layers_not_run:
        lines.append(f"per-layer error profile not made: {result.layers_not_run}")
    for c in result.comparisons:
        for f in c["task_gate"]["failures"] if c["task_gate"]["gating"] else []:
            lines.append(f"{c['candidate']}: task gate failed: {f}")
    if result.layers:
        from trt_seer.eval.layers import first_jumps

        jumps = first_jumps(result.layers)
        lines.append("per-layer error: first jumps at " + (", ".join(
            f"{r['node']} (+{r['added_error']:.2e} -> {r['rel_error']:.2e})" for r in jumps) or "none"))
    lines.append("result: " + verdict_line(result))
    return "\n".join(lines)


def accuracy_summary(result: DiffResult) -> dict:
    """What goes into the manifest's accuracy["diff_vs_<against>"]: the verdict, each comparison
    that ran (what on which backend, its metrics) and each asked for that did not, with why."""
    keep = ("max_abs", "mean_abs", "max_rel", "mean_rel", "mean_cosine", "elementwise_passed")
    ran = {r["candidate"]["label"]: r for r in result.ran()}
    return {
        "verdict": result.verdict, "reference": result.reference.label, "samples": result.samples,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "ran": list(ran.values()), "not_run": result.not_run,
        "comparisons": {c["candidate"]: {"measured_on": _measured_on(ran[c["candidate"]]["candidate"]),
                                         "reference_measured_on": _measured_on(ran[c["candidate"]]["reference"]),
                                         "precision": c["precision"], "passed": c["passed"], "task": c["task_metrics"],
                                         "outputs": {n: {k: o[k] for k in keep} for n, o in c["outputs"].items()}}
                        for c in result.comparisons},
    }


def _measured_on(side: dict) -> dict:
    return {"artifact": side["artifact"], "backend": side["backend"]}


def record_accuracy(result: DiffResult) -> Path | None:
    """Writes the summary into the target's manifest / ONNX record (none for a bare .onnx)."""
    if result.target.record is None:
        return None
    manifest.update_accuracy(result.target.record, f"diff_vs_{result.against}", accuracy_summary(result))
    return result.target.record


# --- report directory -------------------------------------------------------------------------

def save_polygraphy_data(result: DiffResult, out: Path) -> dict:
    """inputs.json (the data loader's feeds), outputs.json (RunResults as produced) in Polygraphy's
    format, and the post-processing script that masks padding as the comparison did."""
    from polygraphy.json import save_json

    from trt_seer.files import atomic_write_text

    save_json(result.batches, str(out / "inputs.json"), description="diff inputs")
    result.run_results.save(str(out / "outputs.json"))
    atomic_write_text(out / MASK_SCRIPT_NAME, MASK_SCRIPT)
    return {"inputs": "inputs.json", "outputs": "outputs.json", "postprocess": MASK_SCRIPT_NAME}


def _tol_flags(c: dict) -> str:
    atol = " ".join(f"{n}:{o['atol']:g}" for n, o in c["outputs"].items())
    rtol = " ".join(f"{n}:{o['rtol']:g}" for n, o in c["outputs"].items())
    return f"--atol {atol} --rtol {rtol}"


def _check_flags(c: dict, task: str) -> str:
    """How Polygraphy should judge the comparison as trt-seer did. Element-wise tolerances when
    they decide; when only the task metric does (INT8) and that metric is an embedding cosine,
    Polygraphy's cosine check on the task output (its cosine spans a whole batch, so it is the
    closest check, not the same one) and no check (threshold -1) on the other outputs."""
    if any(o["gating"] for o in c["outputs"].values()) or task != "feature-extraction":
        return _tol_flags(c)
    out = task_output(task)
    least = {n: (c["task_gate"]["thresholds"]["min_cosine"] if n == out else -1) for n in c["outputs"]}
    return "--compare-func cosine_similarity --cosine-similarity-threshold " + " ".join(
        f"{n}:{v:g}" for n, v in least.items())


def reproduce_commands(result: DiffResult, out: Path) -> list[str]:
    """`polygraphy run` lines that rerun each candidate against the saved outputs, from `out`."""
    from trt_seer.engine import trt

    cmds = []
    for side, c in zip(result.candidates, result.comparisons):
        path = os.path.relpath(side.path.resolve(), out.resolve())
        io = (f"--load-inputs inputs.json --load-outputs outputs.json --postprocess-func-script {MASK_SCRIPT_NAME} "
              f"{_check_flags(c, result.task)}")
        if side.backend == "onnxrt":
            cmds.append(f"polygraphy run {path} --onnxrt {io}")
        else:
            env = "POLYGRAPHY_USE_TENSORRT_RTX=1 " if trt.load().is_rtx else ""
            cmds.append(f"{env}polygraphy run {path} --model-type engine --trt {io}")
    return cmds


def _figure(width: float = 7.0, height: float = 4.0):
    # No pyplot: no global backend to set, and Figure.savefig renders PNG with Agg.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    return fig, fig.subplots()


def plot_histograms(result: DiffResult, out: Path) -> list[str]:
    """error_hist_<output>.png: log10 |candidate - reference| per output, one series per candidate."""
    names = []
    for output in result.comparisons[0]["outputs"]:
        fig, ax = _figure()
        for c in result.comparisons:
            counts = result.histograms[(c["candidate"], output)]
            ax.stairs(counts, HIST_EDGES, label=f"{c['candidate']} vs {c['reference']}")
            ax.axvline(np.log10(max(c["outputs"][output]["atol"], 1e-30)), linestyle=":", color="grey")
        ax.set(title=f"{output}: absolute error", xlabel="log10 |error|", ylabel="elements", yscale="log")
        ax.legend(fontsize=8)
        name = f"error_hist_{output}.png"
        fig.savefig(out / name)
        names.append(name)
    return names


def plot_layers(result: DiffResult, out: Path) -> str | None:
    """layer_profile.png: relative error per MatMul/Gemm layer and the error each one adds."""
    if not result.layers:
        return None
    from trt_seer.eval.layers import first_jumps

    x = np.arange(len(result.layers))
    fig, ax = _figure(max(7.0, len(x) * 0.12), 4.0)
    ax.plot(x, [r["rel_error"] for r in result.layers], marker=".", label="relative error ||c-r||/||r||")
    ax.bar(x, [max(r["added_error"], 0.0) for r in result.layers], alpha=0.4, color="tab:orange", label="added error")
    for r in first_jumps(result.layers):
        ax.annotate(r["node"], (r["index"], r["rel_error"]), fontsize=6, rotation=45)
    ax.set(title=f"per-layer error: {result.layer_pair[1].name} vs {result.layer_pair[0].name}",
           xlabel="MatMul/Gemm layer (graph order)", ylabel="relative error")
    ax.legend(fontsize=8)
    fig.savefig(out / "layer_profile.png")
    return "layer_profile.png"


def report_json(result: DiffResult, files: dict, commands: list[str]) -> dict:
    from trt_seer.eval.layers import first_jumps

    t = result.target
    layers = None if result.layers is None else {
        "reference": result.layer_pair[0].name, "candidate": result.layer_pair[1].name,
        "profile": result.layers, "first_jumps": [r["node"] for r in first_jumps(result.layers)]}
    return {"schema": 1, "target": str(t.path), "kind": t.kind, "name": t.name, "precision": t.precision,
            "task": result.task, "against": result.against, "reference": result.reference.label,
            "candidates": [c.label for c in result.candidates], "samples": result.samples,
            "batches": len(result.batches), "verdict": result.verdict, "ran": result.ran(),
            "not_run": result.not_run, "comparisons": result.comparisons, "layers": layers,
            "layers_not_run": result.layers_not_run, "files": files, "reproduce": commands}


def report_markdown(result: DiffResult, files: dict, commands: list[str]) -> str:
    rows = [TABLE_HEADER, tuple("---" for _ in TABLE_HEADER), *table_rows(result)]
    lines = [f"# Accuracy diff: {result.target.name} {result.target.precision}", "", _headline(result) + ".", "",
             f"**Result: {verdict_line(result)}**", ""]
    lines += ["| " + " | ".join(r) + " |" for r in rows] if result.comparisons else []
    lines += ["", "## Ran", ""] + ([f"- {line.removeprefix('ran: ')}" for line in ran_lines(result)] or ["- nothing"])
    lines += ["", "## Not run", ""] + ([f"- {s['comparison']}: {s['reason']}" for s in result.not_run] or ["- none"])
    if result.layers_not_run:
        lines += ["", f"Per-layer error profile not made: {result.layers_not_run}."]
    if files.get("plots"):
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in files["plots"]]
    if result.layers:
        lines += ["", "## Per-layer error", "", "| # | node | rel error | received | added error |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {r['index']} | {r['node']} | {r['rel_error']:.3e} | {r['received_error']:.3e} | "
                  f"{r['added_error']:+.3e} |" for r in result.layers]
    if not commands:
        return "\n".join(lines + [""])
    lines += ["", "## Reproduce with Polygraphy", "", "```sh",
              "# From this directory: reruns each candidate on the saved inputs and compares it with the",
              "# saved outputs (candidates first, the reference last), with the tolerances used here.",
              f"# {MASK_SCRIPT_NAME} zeroes token-level outputs at padded positions, as trt-seer compared them.",
              *(["# Judged by the task metric only (INT8): Polygraphy checks the cosine similarity of the",
                 "# sentence embedding per batch (-1: not checked), the closest it has to the per-sentence gate."]
                if any("cosine_similarity" in c for c in commands) else []),
              *commands, "```", ""]
    return "\n".join(lines)


def write_report(result: DiffResult, out: Path) -> Path:
    """report.md, report.json, PNG plots and Polygraphy inputs/outputs in `out`; returns report.md."""
    from trt_seer.files import atomic_write_json, atomic_write_text, ensure_out_dir

    out = ensure_out_dir(out)
    files, commands = {}, []
    if result.comparisons:  # else nothing ran: the report says what did not, and why
        with polygraphy_logs(False):
            files = save_polygraphy_data(result, out)
        files["plots"] = plot_histograms(result, out) + [p for p in [plot_layers(result, out)] if p]
        commands = reproduce_commands(result, out)
    atomic_write_json(out / "report.json", report_json(result, files, commands))
    return atomic_write_text(out / "report.md", report_markdown(result, files, commands))
