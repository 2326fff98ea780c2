"""The `bench` report as people read it: the table, report.md, report.json, PNG plots (latency vs
batch, throughput, memory and size, cost per 1M inferences), and `append_benchmark`, the one writer
of docs/BENCHMARKS.md (every benchmark tool appends through it). Reads the report dict
`trt_seer.bench.run.bench` returns; measures nothing.
"""
from __future__ import annotations

import datetime
import platform
from pathlib import Path

from trt_seer.bench.verdict import fmt_bytes, fmt_faster, fmt_smaller
from trt_seer.files import atomic_write_json, atomic_write_text, ensure_out_dir

COLUMNS = ("Path", "Batch", "e2e p50 ms", "e2e p90 ms", "e2e p99 ms", "device p50 ms", "CV", "samples/s",
           "Memory", "Size", "$ / 1M inf.", "Accuracy vs FP32")
BENCHMARKS_HEADER = ("# Benchmarks\n\nEach section is appended by a benchmark command and names its date, "
                     "machine and the exact command.\n")
PLOTS = ("latency_vs_batch.png", "throughput.png", "memory.png", "cost.png")


def _ms(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.3g}" if x < 100 else f"{x:,.0f}"


def _memory(row: dict, point: dict) -> str:
    where = "GPU" if row["device"] == "cuda" else "host"
    return "n/a" if point.get("memory_bytes") is None else f"{fmt_bytes(point['memory_bytes'])} {where}"


def _cells(row: dict, p: dict) -> list[str]:
    cv = f"{p['cv']:.1%}" + (" noisy" if p["noisy"] else "")
    return [row["label"], str(p["batch"]), _ms(p["p50_ms"]), _ms(p["p90_ms"]), _ms(p["p99_ms"]),
            _ms(p.get("device_p50_ms")), cv, f"{p['throughput']:,.0f}", _memory(row, p), fmt_bytes(row["size_bytes"]), f"{p['cost_per_million']:.3g}",
            row.get("accuracy_summary", "n/a")]


def table(report: dict) -> str:
    """A Markdown table of every measured point, then one line per skipped or failed path."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in report["rows"]:
        for p in row["points"]:
            lines.append("| " + " | ".join(_cells(row, p)) + " |")
    return "\n".join(lines + [""] + cpu_int8_note(report) + not_run(report))


def cpu_int8_note(report: dict) -> list[str]:
    """Beside CPU INT8 figures: the CPU's INT8 instructions, which their speed depends on."""
    isa = report.get("machine", {}).get("cpu_int8_isa")  # absent in reports of older versions
    ran = [r["label"] for r in report["rows"] if r["status"] == "ok" and r["device"] == "cpu"
           and r["precision"] == "int8"]
    return [f"- CPU INT8 rows ({', '.join(ran)}) ran with these INT8 instructions: {isa}."] if ran and isa else []


def not_run(report: dict) -> list[str]:
    """'- label: skipped (reason)' for every path or batch that did not run."""
    out = []
    for row in report["rows"]:
        if row["status"] != "ok":
            out.append(f"- {row['label']} (`{row['key']}`): {row['status']}: {row['reason']}")
        for s in row["skipped_batches"]:
            out.append(f"- {row['label']} (`{row['key']}`) at batch {s['batch']}: skipped: {s['reason']}")
        if row.get("accuracy_note"):
            out.append(f"- {row['label']} (`{row['key']}`): accuracy n/a: {row['accuracy_note']}")
    return out


def pytorch_lines(report: dict) -> list[str]:
    """Each engine / ONNX Runtime point against the fastest PyTorch path of the same run and device."""
    from trt_seer.bench.verdict import against_pytorch_line

    found = report.get("vs_pytorch") or []
    nothing = "- no engine or ONNX Runtime path ran, so there is nothing to compare with PyTorch."
    return [against_pytorch_line(f) for f in found] or [nothing]


def int8_lines(report: dict) -> list[str]:
    """INT8 against its base, stated plainly, with the warning when INT8 does not pay."""
    out = []
    for f in report["int8"]:
        smaller = "size n/a" if f["smaller"] is None else fmt_smaller(f["smaller"])
        faster = "latency n/a" if f["faster"] is None else fmt_faster(f["faster"]) + " at p50"
        cpu = f" (CPU INT8 instructions: {f['cpu_int8_isa']})" if f.get("cpu_int8_isa") else ""
        out.append(f"- {f['int8']} vs {f['base']}: {smaller}, {faster}{cpu}.")
        if f["warning"]:
            out.append(f"  **Warning:** {f['warning']}.")
    return out or ["- no INT8 path ran next to its base path, so there is nothing to compare."]


def copy_lines(report: dict) -> list[str]:
    """Host<->device copy bandwidth, as measured in the first engine path's process."""
    copies = report.get("copy_bandwidth")
    if not copies:
        return ["- Host<->device copies: not measured (no engine path ran)."]
    size = fmt_bytes(copies["rows"][0]["bytes"])
    lines = [f"Copies of {size} (CUDA events, measured in the `{copies['path']}` process):", "",
             "| host memory | direction | GB/s |", "|---|---|---:|"]
    return lines + [f"| {r['memory']} | {r['direction']} | {r['gb_per_s']:.1f} |" for r in copies["rows"]]


def main_output_lines(report: dict) -> list[str]:
    """Engine paths timed twice: every output copied back, and only the task's main output."""
    rows = [(r, p) for r in report["rows"] for p in r["points"] if p.get("main_output")]
    if not rows:
        return ["- Main output only: not measured (no engine path ran, or --no-main-output)."]
    lines = ["End to end p50 when the call returns every output and when it returns only the task's main "
             "output (`infer(..., outputs=[name])`: the others stay on the GPU):", "",
             "| Path | Batch | output | all outputs ms | main output only ms | device p50 ms (all / main only) |",
             "|---|---:|---|---:|---:|---:|"]
    for r, p in rows:
        device = f"{_ms(p.get('device_p50_ms'))} / {_ms(p.get('main_device_p50_ms'))}"
        lines.append(f"| {r['label']} | {p['batch']} | {p['main_output']} | {_ms(p['p50_ms'])} | "
                     f"{_ms(p['main_p50_ms'])} | {device} |")
    return lines


def machine_line(report: dict) -> str:
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    gpu = m["gpu"] or "no GPU"
    threads = f", {m['threads']} threads" if m["threads"] else ""
    isa = f"; CPU INT8 instructions: {m['cpu_int8_isa']}" if m.get("cpu_int8_isa") else ""
    return f"{m['cpu']} ({m['cores']} cores{threads}{isa}); {gpu}; {platform.system()}; {versions}"


def markdown(report: dict) -> str:
    """report.md: what ran where, the table, what did not run, INT8 findings, method, plots."""
    model, s = report["model"], report["settings"]
    random_init = f" (random init from the {model['random_init']} config)" if model["random_init"] else ""
    noisy = [f"{r['label']} b{p['batch']}" for r in report["rows"] for p in r["points"] if p["noisy"]]
    parts = [
        f"# Benchmark: {model['name']}{random_init}, {model['task']}, seq {s['seq']}", "",
        f"- Measured: {report['created_at']}", f"- Machine: {machine_line(report)}",
        f"- Command: `{report['command']}`", f"- Inputs: {s['inputs']}",
        f"- Price: ${s['price_per_hour']}/hour. Assumption: {report['method']['cost']}.", "",
        table(report), "", "## Against PyTorch's best", "",
        ("End-to-end p50 against the fastest PyTorch path measured in this run on the same device and "
         "batch (eager, AMP, .half() and torch.compile alike)."), "", *pytorch_lines(report), "",
        "## INT8", "", *int8_lines(report), "",
        "## Host<->device copies", "", *copy_lines(report), "",
        "## Main output only", "", *main_output_lines(report), "",
        "## Method", "", *method_lines(report),
        f"- Noisy points (CV > {report['method']['noisy_cv']:.0%}): {', '.join(noisy) or 'none'}.", "",
        "## Plots", "", *[f"![{p}]({p})" for p in PLOTS], "",
    ]
    return "\n".join(parts)


def method_lines(report: dict) -> list[str]:
    s = report["settings"]
    t = s["timing"]
    kinds = sorted({(r["label"], r["timing_kind"], r["memory_kind"], r["size_kind"])
                    for r in report["rows"] if r["status"] == "ok"})
    lines = [
        f"- Timing: {t['warmup']} warm-up runs (at most {t['warmup_s']} s), then timed runs until the median "
        f"moves less than {t['rtol']:.0%} between checks every {t['check_every']} runs, {t['max_iters']} runs or "
        f"{t['budget_s']} s; throughput = batch / end-to-end p50.",
        f"- Times: {report['method']['timing']}.",
        f"- Isolation: {report['method']['isolation']}.",
        f"- Accuracy: task metric vs `{report['method']['accuracy_reference']}` on {s['eval_samples']} held-out "
        "samples (cos = mean cosine of sentence embeddings; top-1 = argmax agreement).",
    ]
    lines += [f"- {label}: time = {tk}; memory = {mk}; size = {sk}." for label, tk, mk, sk in kinds]
    return lines


def write(report: dict, out_dir: Path) -> list[Path]:
    """report.json, report.md and the PNG plots into `out_dir`; returns their paths."""
    out = ensure_out_dir(out_dir)
    written = [atomic_write_json(out / "report.json", report), atomic_write_text(out / "report.md", markdown(report))]
    return written + plots(report, out)


def append_benchmark(path: Path, title: str, command: str, machine: str, body_markdown: str,
                     when: datetime.datetime | None = None) -> Path:
    """Appends one dated section to a BENCHMARKS.md-style file: `## {title}, {date time} UTC`, the
    machine, the command, then `body_markdown`. The file is rewritten atomically (old text plus the
    section), so a failed write leaves it as it was; a missing file starts with a short header."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.is_file() else BENCHMARKS_HEADER
    when = (when or datetime.datetime.now(datetime.timezone.utc)).astimezone(datetime.timezone.utc)
    section = "\n".join(["", f"## {title}, {when:%Y-%m-%d %H:%M} UTC", "", f"- Machine: {machine}",
                         f"- Command: `{command}`", "", body_markdown.strip("\n"), ""])
    return atomic_write_text(path, old.rstrip("\n") + "\n" + section)


def append(report: dict, md_path: Path) -> Path:
    """Appends the run's section (table, INT8 findings, copy bandwidth) to e.g. docs/BENCHMARKS.md."""
    model, s = report["model"], report["settings"]
    random_init = f" (random init, {model['random_init']} config)" if model["random_init"] else ""
    title = f"{model['name']}{random_init}, seq {s['seq']}, {report['machine']['gpu'] or 'CPU only'}"
    body = "\n".join([
        f"Inputs: {s['inputs']}; price ${s['price_per_hour']}/hour ({report['method']['cost']}). "
        f"Times: {report['method']['timing']}.", "",
        table(report), "", "Against PyTorch's best (the fastest PyTorch path of this run, same device and batch):", "",
        *pytorch_lines(report), "", *int8_lines(report), "", *copy_lines(report), "", *main_output_lines(report),
    ])
    return append_benchmark(md_path, title, report["command"], machine_line(report), body)


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg backend: no display needed)


def _measured(report: dict) -> list[dict]:
    return [r for r in report["rows"] if r["status"] == "ok" and r["points"]]


def _figure(title: str, xlabel: str, ylabel: str, rows: int = 1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, max(3.5, 0.45 * rows + 1.5)))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return plt, fig, ax


def _save(plt, fig, ax, dest: Path, empty: bool) -> Path:
    if empty:
        ax.text(0.5, 0.5, "no path ran on this machine", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)
    plt.close(fig)
    return dest


def plot_latency(report: dict, dest: Path) -> Path:
    """End-to-end p50 latency against batch size, one line per path; the bars reach p90."""
    rows = _measured(report)
    plt, fig, ax = _figure(f"{report['model']['name']}: latency vs batch (seq {report['settings']['seq']})",
                           "batch size", "end-to-end latency (ms), p50 with p90 bar")
    for r in rows:
        b = [p["batch"] for p in r["points"]]
        p50 = [p["p50_ms"] for p in r["points"]]
        up = [p["p90_ms"] - p["p50_ms"] for p in r["points"]]
        ax.errorbar(b, p50, yerr=[[0] * len(up), up], marker="o", capsize=3, label=r["label"])
    if rows:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        batches = sorted({p["batch"] for r in rows for p in r["points"]})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.legend(fontsize=7)
    return _save(plt, fig, ax, dest, not rows)


def _grouped_bars(ax, rows: list[dict], value, unit_fmt: str) -> None:
    """Horizontal bars, one group per path, one bar per batch size."""
    batches = sorted({p["batch"] for r in rows for p in r["points"]})
    height = 0.8 / max(1, len(batches))
    for i, batch in enumerate(batches):
        ys, xs = [], []
        for j, r in enumerate(rows):
            point = next((p for p in r["points"] if p["batch"] == batch), None)
            if point is not None and value(point) is not None:
                ys.append(j + i * height)
                xs.append(value(point))
        bars = ax.barh(ys, xs, height=height, label=f"batch {batch}")
        ax.bar_label(bars, fmt=unit_fmt, fontsize=6, padding=2)
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(rows))], [r["label"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.legend(fontsize=7)


def plot_throughput(report: dict, dest: Path) -> Path:
    rows = _measured(report)
    plt, fig, ax = _figure("throughput (samples/s at p50)", "samples / s", "", len(rows) * 2)
    if rows:
        _grouped_bars(ax, rows, lambda p: p["throughput"], "%.0f")
    return _save(plt, fig, ax, dest, not rows)


def plot_cost(report: dict, dest: Path) -> Path:
    rows = _measured(report)
    price = report["settings"]["price_per_hour"]
    plt, fig, ax = _figure(f"cost per 1M inferences at ${price}/hour", "$ per 1M inferences", "", len(rows) * 2)
    if rows:
        _grouped_bars(ax, rows, lambda p: p["cost_per_million"], "%.3g")
    return _save(plt, fig, ax, dest, not rows)


def plot_memory(report: dict, dest: Path) -> Path:
    """Peak memory at the largest batch (host RSS for CPU paths, GPU for GPU paths) and size."""
    rows = _measured(report)
    plt, fig, ax = _figure("memory at the largest batch, and model / engine size", "MiB", "", len(rows) * 2)
    if rows:
        ys = range(len(rows))
        peak = [(r["points"][-1].get("memory_bytes") or 0) / 2**20 for r in rows]
        size = [(r["size_bytes"] or 0) / 2**20 for r in rows]
        kinds = ["GPU" if r["device"] == "cuda" else "host" for r in rows]
        bars = ax.barh([y - 0.2 for y in ys], peak, height=0.4, label="peak memory (host RSS or GPU)")
        ax.bar_label(bars, labels=[f"{v:,.0f} {k}" for v, k in zip(peak, kinds)], fontsize=6, padding=2)
        bars = ax.barh([y + 0.2 for y in ys], size, height=0.4, label="weights / file size")
        ax.bar_label(bars, fmt="%.2f", fontsize=6, padding=2)
        ax.set_yticks(list(ys), [r["label"] for r in rows], fontsize=7)
        ax.invert_yaxis()
        ax.legend(fontsize=7)
    return _save(plt, fig, ax, dest, not rows)


def plots(report: dict, out_dir: Path) -> list[Path]:
    out = Path(out_dir)
    makers = (plot_latency, plot_throughput, plot_memory, plot_cost)
    return [make(report, out / name) for make, name in zip(makers, PLOTS)]
