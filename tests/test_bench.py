"""`trt-seer bench`: a real --quick sweep on a tiny checkpoint and its ONNX files (table, JSON,
PNG plots, manifest `bench` sections, BENCHMARKS.md append), the statistics and cost arithmetic,
the INT8-benefit warning on manifests written here, and GPU paths listed as skipped on a CPU box."""
import dataclasses
import json
import math
import re
import os
import subprocess
import sys

import numpy as np
import pytest

from tiny import make_tiny_checkpoint
from trt_seer.bench import host as benchhost
from trt_seer.bench import measure, paths, plan, report, run, verdict
from trt_seer.engine import manifest
from trt_seer.errors import InputError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
QUICK_PATHS = ("torch-fp32-cpu", "torch-int8-cpu", "ort-*", "*-gpu", "trt-*")


def cli(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "trt_seer", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "TQDM_DISABLE": "1"})


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """A tiny BERT, its FP32 + FP16 ONNX made by `export`, then one `bench --quick` over it."""
    root = tmp_path_factory.mktemp("bench")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", root / "tinybert")
    engines = root / "engines"
    r = cli("export", "--model", str(ckpt), "--fp16", "--out", str(engines))
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli("bench", "--model", str(ckpt), "--engines", str(engines), "--quick", "--threads", "1",
            "--report", str(root / "report"), "--append", str(root / "BENCHMARKS.md"), "--paths", *QUICK_PATHS)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((root / "report" / "report.json").read_text())
    return root, r, report


def rows_by_key(report):
    return {row["key"]: row for row in report["rows"]}


@pytest.mark.slow
def test_quick_prints_one_table_with_every_path_ran_or_skipped(quick_run):
    _, r, report = quick_run
    assert "| Path | Batch | e2e p50 ms | e2e p90 ms | e2e p99 ms | device p50 ms | CV | samples/s |" in r.stdout
    expected = set(paths.select_paths(list(QUICK_PATHS)))
    assert {row["key"] for row in report["rows"]} == expected  # nothing silently dropped
    ran = {k for k, row in rows_by_key(report).items() if row["status"] == "ok"}
    assert {"torch-fp32-cpu", "torch-int8-cpu", "ort-fp32-cpu", "ort-fp16-cpu"} <= ran
    assert "ort-fp32fused-cpu" in ran  # export writes the fused CPU graph beside the FP32 one
    for row in report["rows"]:
        if row["status"] == "ok":
            assert [p["batch"] for p in row["points"]] == [1, 2]
            lines = [line for line in r.stdout.splitlines() if line.startswith(f"| {row['label']} |")]
            assert len(lines) == 2
            assert all(line.split("|")[6].strip() == "n/a" for line in lines)  # CPU rows: no device time
        else:
            assert f"`{row['key']}`): {row['status']}: {row['reason']}" in r.stdout
    int8 = rows_by_key(report)["ort-int8-cpu"]
    assert int8["status"] == "skipped" and "no tinybert.int8.onnx" in int8["reason"]


@pytest.mark.slow
def test_gpu_paths_in_a_real_run_are_skipped_with_the_reason_on_a_cpu_machine(quick_run):
    if cuda_available():
        pytest.skip("a CUDA GPU is visible: GPU paths run here")
    _, _, report = quick_run
    for key, row in rows_by_key(report).items():
        path = paths.PATH_BY_KEY[key]
        if path.device == "cuda":
            why = "no CUDA GPU visible to PyTorch" if path.backend == "torch" else "engines cannot run here"
            assert row["status"] == "skipped" and why in row["reason"], row
            assert row["points"] == []


@pytest.mark.slow
def test_quick_report_numbers_are_consistent(quick_run):
    _, _, report = quick_run
    price = report["settings"]["price_per_hour"]
    assert report["settings"]["seq"] == 16 and report["settings"]["quick"] is True
    for row in (r for r in report["rows"] if r["status"] == "ok"):
        assert row["size_bytes"] > 0
        for p in row["points"]:
            assert 0 < p["p50_ms"] <= p["p90_ms"] <= p["p99_ms"]
            assert 3 <= p["iters"] <= report["settings"]["timing"]["max_iters"]
            assert p["noisy"] == (p["cv"] > measure.NOISY_CV)
            assert p["throughput"] == pytest.approx(p["batch"] * 1000 / p["p50_ms"])
            assert p["device_p50_ms"] is None  # only CPU paths ran: end to end is all there is
            assert p["cost_per_million"] == pytest.approx(price / (3600 * p["throughput"]) * 1e6)
            assert p["memory_bytes"] > 10 * 2**20  # a whole Python process's peak RSS
    rows = rows_by_key(report)
    assert rows["torch-fp32-cpu"]["accuracy_summary"] == "reference"
    assert rows["ort-fp32-cpu"]["accuracy"]["mean_cosine"] > 0.9999
    assert rows["ort-fp16-cpu"]["accuracy"]["samples"] == report["settings"]["eval_samples"]
    # per-path processes: ONNX Runtime's peak RSS is its own, without the PyTorch the others load
    peak = {k: rows[k]["points"][-1]["memory_bytes"] for k in ("ort-fp32-cpu", "torch-fp32-cpu")}
    assert peak["ort-fp32-cpu"] < 0.6 * peak["torch-fp32-cpu"]
    # dynamic INT8 stores the Linear weights in one byte instead of four
    assert rows["torch-int8-cpu"]["size_bytes"] < 0.8 * rows["torch-fp32-cpu"]["size_bytes"]


@pytest.mark.slow
def test_quick_report_writes_markdown_and_valid_pngs(quick_run):
    import matplotlib.image

    root, _, report = quick_run
    md = (root / "report" / "report.md").read_text()
    assert report["method"]["cost"] in md and "## INT8" in md and "Noisy points" in md
    for name in ("latency_vs_batch.png", "throughput.png", "memory.png", "cost.png"):
        path = root / "report" / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 400
        assert float(np.std(image)) > 0.01  # something is drawn, not a blank canvas


@pytest.mark.slow
def test_quick_run_records_bench_in_the_onnx_records_and_appends(quick_run):
    root, _, report = quick_run
    record = manifest.read(root / "engines" / "tinybert.fp16.onnx.json")
    section = record["bench"]
    assert section["path"] == "ort-fp16-cpu" and section["seq"] == 16
    assert [p["batch"] for p in section["points"]] == [1, 2]
    assert record["precision"] == "fp16" and "accuracy" in record  # the rest is untouched
    appended = (root / "BENCHMARKS.md").read_text()
    assert re.search(r"^## tinybert, seq 16, CPU only, \d{4}-\d\d-\d\d \d\d:\d\d UTC$", appended, re.M)
    assert "- Command: `python -m trt_seer bench --model" in appended
    assert report["machine"]["cpu"] in appended and "| Path | Batch |" in appended


def test_cost_and_throughput_arithmetic():
    assert measure.throughput(8, 4.0) == pytest.approx(2000.0)
    # $2.50/hour at 1000 samples/s: 3.6M samples an hour, so 1M cost 2.5 / 3.6
    assert measure.cost_per_million(2.5, 1000.0) == pytest.approx(2.5 / 3.6)
    assert measure.cost_per_million(2.5, 2000.0) == pytest.approx(measure.cost_per_million(2.5, 1000.0) / 2)


def test_summarize_percentiles_and_noise():
    times = [1.0] * 90 + [2.0] * 9 + [10.0]
    s = measure.summarize(times)
    assert s["p50_ms"] == 1.0 and s["p90_ms"] == pytest.approx(np.percentile(times, 90))
    assert s["p99_ms"] == pytest.approx(np.percentile(times, 99))
    assert s["cv"] == pytest.approx(np.std(times, ddof=1) / np.mean(times)) and s["noisy"]
    assert not measure.summarize([5.0, 5.1, 4.9, 5.0])["noisy"]


def test_measure_stops_on_a_stable_median_or_the_budget():
    spec = measure.TimingSpec(warmup=1, warmup_s=1.0, check_every=10, rtol=0.01, max_iters=1000, budget_s=60.0)
    times, why = measure.measure(lambda: 2.0, spec)
    assert why == "stable" and len(times) == 20
    drifting = iter(range(1, 10**6))
    times, why = measure.measure(lambda: float(next(drifting)), measure.TimingSpec(
        warmup=0, check_every=10, rtol=0.0, max_iters=50, budget_s=60.0))
    assert why == "max-iters" and len(times) == 50
    times, why = measure.measure(lambda: float(next(drifting)), measure.TimingSpec(
        warmup=0, check_every=10, rtol=0.0, max_iters=10**6, budget_s=0.05))
    assert why == "time-budget" and len(times) >= 3


def test_measure_watches_the_end_to_end_item_of_tuple_samples():
    spec = measure.TimingSpec(warmup=0, check_every=10, rtol=0.01, max_iters=1000, budget_s=60.0)
    device = iter(range(1, 10**6))  # a drifting second item must not keep the run going
    samples, why = measure.measure(lambda: (2.0, float(next(device))), spec)
    assert why == "stable" and len(samples) == 20 and samples[0] == (2.0, 1.0)


def test_summarize_point_keeps_end_to_end_and_device_apart():
    p = measure.summarize_point([(3.0, 1.0), (5.0, 2.0), (4.0, 1.5)])
    assert p["p50_ms"] == 4.0 and p["device_p50_ms"] == 1.5 and p["device_p99_ms"] == pytest.approx(1.99)
    cpu = measure.summarize_point([(3.0, None), (5.0, None), (4.0, None)])
    assert cpu["p50_ms"] == 4.0 and cpu["device_p50_ms"] is None and cpu["device_p90_ms"] is None


def worker_result(samples, batch=8):
    point = {"batch": batch, **measure.summarize_point(samples), "stopped_by": "stable", "memory_bytes": 5 * MIB}
    return {"points": [point], "eval_error": None, "size_bytes": 3 * MIB, "size_kind": "file on disk",
            "timing_kind": "t", "memory_kind": "m", "rss_before_load_bytes": 1, "rss_peak_bytes": 2}


def test_gpu_row_throughput_and_cost_come_from_end_to_end_and_the_table_shows_both(tmp_path):
    engine = plan.Planned(paths.PATH_BY_KEY["trt-fp16"], "TensorRT FP16 on H200", tmp_path / "m.fp16.engine", (8,))
    gpu = run.row(engine, worker_result([(4.0, 1.0), (4.0, 1.0), (4.0, 1.0)]), 3.6)
    p = gpu["points"][0]
    assert p["throughput"] == pytest.approx(2000.0)  # 8 samples / 4 ms end to end, not / 1 ms on the GPU
    assert p["cost_per_million"] == pytest.approx(0.5)  # $3.60/hour at 2000/s
    cpu_path = plan.Planned(paths.PATH_BY_KEY["ort-fp32-cpu"], "ONNX Runtime FP32 on CPU", tmp_path / "m.onnx", (8,))
    cpu = run.row(cpu_path, worker_result([(8.0, None)] * 3), 3.6)
    lines = report.table({"rows": [gpu, cpu]}).splitlines()
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines[2:4]}
    gpu_cells, cpu_cells = cells["TensorRT FP16 on H200"], cells["ONNX Runtime FP32 on CPU"]
    assert gpu_cells[header.index("e2e p50 ms")] == "4" and gpu_cells[header.index("device p50 ms")] == "1"
    assert cpu_cells[header.index("e2e p50 ms")] == "8" and cpu_cells[header.index("device p50 ms")] == "n/a"
    assert cpu_cells[header.index("samples/s")] == "1,000"


def test_main_output_is_the_tasks_kept_output_when_there_are_others():
    from trt_seer.bench.runners import main_output

    assert main_output("feature-extraction", ("last_hidden_state", "sentence_embedding")) == "sentence_embedding"
    assert main_output("text-classification", ("logits",)) is None  # nothing else to leave behind
    assert main_output("feature-extraction", ("last_hidden_state",)) is None


class TwoTimers:
    """A runner's timing interface with fixed times: all outputs 4 ms, main output only 3 ms."""

    main_output = "sentence_embedding"

    def timer(self, feeds):
        return lambda: (4.0, 1.0)

    def main_timer(self, feeds):
        return lambda: (3.0, 0.9)

    def reset_peak(self):
        pass

    def memory(self):
        return {"memory_bytes": 7}


@pytest.mark.parametrize("asked", [True, False])
def test_engine_points_carry_the_main_output_only_times_when_asked(asked, tmp_path):
    from trt_seer.bench import worker
    from trt_seer.export.families import resolve_model

    info = resolve_model(str(make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "t")))
    job = {"seq": 8, "timing": dataclasses.asdict(measure.QUICK_TIMING), "main_output": asked}
    point = worker._point(TwoTimers(), info, job, 2)
    assert point["p50_ms"] == 4.0 and point["device_p50_ms"] == 1.0
    if asked:
        assert point["main_output"] == "sentence_embedding"
        assert point["main_p50_ms"] == 3.0 and point["main_device_p50_ms"] == 0.9
    else:
        assert "main_output" not in point and "main_p50_ms" not in point


class ApartTimers(TwoTimers):
    """Plain calls take 4 ms (main output only: 3); with the device pass's events they take 9 ms."""

    def timer(self, feeds):
        return lambda: (4.0, None)

    def main_timer(self, feeds):
        return lambda: (3.0, None)

    def device_timer(self, feeds, outputs=None):
        self.device_passes = getattr(self, "device_passes", []) + [outputs]
        return lambda: (9.0, 1.0 if outputs is None else 0.9)


def test_end_to_end_times_come_from_plain_calls_and_device_times_from_their_own_pass(tmp_path):
    from trt_seer.bench import worker
    from trt_seer.export.families import resolve_model

    info = resolve_model(str(make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "t")))
    runner = ApartTimers()
    job = {"seq": 8, "timing": dataclasses.asdict(measure.QUICK_TIMING), "main_output": True}
    point = worker._point(runner, info, job, 2)
    assert point["p50_ms"] == 4.0 and point["p99_ms"] == 4.0 and point["device_p50_ms"] == 1.0
    assert point["main_p50_ms"] == 3.0 and point["main_device_p50_ms"] == 0.9
    assert runner.device_passes == [None, ["sentence_embedding"]]


def test_report_shows_all_outputs_and_main_output_only_side_by_side(tmp_path):
    engine = plan.Planned(paths.PATH_BY_KEY["trt-fp16"], "TensorRT FP16 on H200", tmp_path / "m.fp16.engine", (8,))
    result = worker_result([(4.0, 1.0)] * 3)
    result["points"][0].update(main_output="sentence_embedding", main_p50_ms=2.5, main_p90_ms=2.6,
                               main_p99_ms=2.7, main_device_p50_ms=0.9)
    row = run.row(engine, result, 2.5)
    lines = report.main_output_lines({"rows": [row]})
    assert lines[-1] == "| TensorRT FP16 on H200 | 8 | sentence_embedding | 4 | 2.5 | 1 / 0.9 |"
    cpu = run.row(plan.Planned(paths.PATH_BY_KEY["ort-fp32-cpu"], "ORT", tmp_path / "m.onnx", (8,)),
                  worker_result([(8.0, None)] * 3), 2.5)
    assert report.main_output_lines({"rows": [cpu]}) == [
        "- Main output only: not measured (no engine path ran, or --no-main-output)."]
    section = run.bench_section({"created_at": "t", "settings": {"seq": 8, "price_per_hour": 2.5},
                                 "machine": {"cpu": "x", "cores": 1, "threads": None, "gpu": "H200"}},
                                {**row, "accuracy": None})
    assert section["points"][0]["main_p50_ms"] == 2.5 and section["points"][0]["main_output"] == "sentence_embedding"


def test_cli_no_main_output_turns_the_second_timing_off():
    from trt_seer.cli import bench as benchcli
    from trt_seer.cli import build_parser

    on = build_parser().parse_args(["bench", "--model", "m"])
    off = build_parser().parse_args(["bench", "--model", "m", "--no-main-output"])
    assert benchcli.spec_from_args(on).main_output is True
    assert benchcli.spec_from_args(off).main_output is False
    assert benchcli.command_line(off).endswith("--no-main-output")  # the recorded command reproduces it


@pytest.mark.gpu
@pytest.mark.slow
def test_engine_path_reports_all_outputs_and_main_output_only(tmp_path):
    from trt_seer.runtime import tensorrt_unavailable_reason

    reason = tensorrt_unavailable_reason()
    if reason is not None:
        pytest.skip(f"engines cannot run here: {reason}")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "tinybert")
    r = cli("build", "--model", str(ckpt), "--fp16", "--batch", "1,2,4", "--seq", "8,16,32", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli("bench", "--model", str(ckpt), "--engines", str(tmp_path), "--quick", "--report", str(tmp_path / "rep"),
            "--paths", "trt-fp16", "--no-manifest")
    assert r.returncode == 0, r.stderr[-3000:]
    row = rows_by_key(json.loads((tmp_path / "rep" / "report.json").read_text()))["trt-fp16"]
    assert row["status"] == "ok", row
    for p in row["points"]:
        assert p["main_output"] == "sentence_embedding" and 0 < p["main_device_p50_ms"] <= p["main_p50_ms"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Main output only" in md and "| sentence_embedding |" in md


def test_an_engine_manifest_records_the_plain_run_not_the_cuda_graph_one(tmp_path):
    engine = tmp_path / "m.fp16.engine"
    manifest.write(manifest.engine_manifest_path(engine), {"precision": "fp16", "engine": {"size_bytes": 3}})
    plain = run.row(plan.Planned(paths.PATH_BY_KEY["trt-fp16"], "FP16", engine, (8,)),
                    worker_result([(4.0, 1.0)] * 3), 2.5)
    graph = run.row(plan.Planned(paths.PATH_BY_KEY["trt-fp16-graph"], "FP16 + graph", engine, (8,)),
                    worker_result([(3.0, 0.9)] * 3), 2.5)
    rep = {"created_at": "2026-12-01T09:00:00+0000", "rows": [plain, graph], "settings": {"seq": 128,
           "price_per_hour": 2.5}, "machine": {"cpu": "x", "cores": 1, "threads": None, "gpu": "NVIDIA H200"}}
    assert run.record_in_manifests(rep) == [manifest.engine_manifest_path(engine)]
    section = manifest.read(manifest.engine_manifest_path(engine))["bench"]
    assert section["path"] == "trt-fp16" and section["points"][0]["p50_ms"] == 4.0
    assert section["points"][0]["device_p50_ms"] == 1.0


def test_copy_bandwidth_section_says_when_it_was_not_measured():
    assert report.copy_lines({"copy_bandwidth": None}) == ["- Host<->device copies: not measured (no engine path ran)."]
    copies = {"path": "trt-fp16", "rows": [{"memory": "pinned", "direction": "HostToDevice", "bytes": 256 * MIB,
                                            "gb_per_s": 51.234}]}
    lines = report.copy_lines({"copy_bandwidth": copies})
    assert "256.0 MiB" in lines[0] and "`trt-fp16`" in lines[0] and lines[-1] == "| pinned | HostToDevice | 51.2 |"
    results = {"trt-fp32": {"points": []}, "trt-fp16": {"points": [], "copy_bandwidth": copies["rows"]}}
    assert run.copy_bandwidth(results) == copies


def test_append_benchmark_writes_the_header_and_keeps_what_was_there(tmp_path):
    import datetime

    md = tmp_path / "docs" / "BENCHMARKS.md"
    when = datetime.datetime(2026, 12, 1, 9, 5, tzinfo=datetime.timezone.utc)
    report.append_benchmark(md, "Build stages", "python tools/bench_build.py", "2 cores", "| a |\n|---|\n| 1 |\n", when)
    first = md.read_text()
    assert first.startswith("# Benchmarks\n")
    assert "\n## Build stages, 2026-12-01 09:05 UTC\n\n- Machine: 2 cores\n" in first
    assert "- Command: `python tools/bench_build.py`\n\n| a |\n|---|\n| 1 |\n" in first
    report.append_benchmark(md, "Second", "cmd", "m", "body", when)
    second = md.read_text()
    assert second.startswith(first.rstrip("\n")) and second.endswith("## Second, 2026-12-01 09:05 UTC\n\n"
                                                                       "- Machine: m\n- Command: `cmd`\n\nbody\n")
    assert second.count("# Benchmarks") == 1


def test_append_benchmark_leaves_the_file_as_it_was_when_the_write_fails(tmp_path, monkeypatch):
    import os as os_module

    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nold\n")

    def fail(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os_module, "replace", fail)
    with pytest.raises(OSError):
        report.append_benchmark(md, "t", "c", "m", "new")
    assert md.read_text() == "# Benchmarks\n\nold\n"
    assert [p.name for p in tmp_path.iterdir()] == ["BENCHMARKS.md"]  # no temp file left behind


def write_manifest(path, size_bytes, p50_by_batch=None, machine=None):
    data = {"name": "m", "precision": path.name.split(".")[1], "engine": {"file": path.name, "size_bytes": size_bytes}}
    if p50_by_batch:
        data["bench"] = {"seq": 128, "machine": machine or {"gpu": "NVIDIA H200", "device": "cuda"},
                         "points": [{"batch": b, "p50_ms": v} for b, v in p50_by_batch.items()]}
    manifest.write(path, data)
    return manifest.read(path)


MIB = 2**20


def test_int8_warning_triggers_when_int8_is_neither_faster_nor_smaller(tmp_path):
    fp16 = write_manifest(tmp_path / "m.fp16.manifest.json", 20 * MIB, {1: 1.00, 8: 2.00, 32: 6.0})
    int8 = write_manifest(tmp_path / "m.int8.manifest.json", int(19.6 * MIB), {1: 0.99, 8: 1.95, 32: 5.9})
    warning = verdict.int8_benefit_warning(int8, fp16)
    assert warning and "FP16" in warning
    assert "2% smaller" in warning and "2% faster" in warning and "b1, b8, b32" in warning


def test_int8_warning_triggers_when_int8_is_smaller_but_slower(tmp_path):
    fp16 = write_manifest(tmp_path / "m.fp16.manifest.json", 20 * MIB, {1: 1.0, 8: 2.0})
    int8 = write_manifest(tmp_path / "m.int8.manifest.json", 11 * MIB, {1: 1.3, 8: 2.4})
    warning = verdict.int8_benefit_warning(int8, fp16)
    assert warning and "45% smaller" in warning and "slower" in warning


def test_int8_warning_on_size_alone_says_latency_is_unmeasured(tmp_path):
    fp16 = write_manifest(tmp_path / "m.fp16.manifest.json", 20 * MIB)
    int8 = write_manifest(tmp_path / "m.int8.manifest.json", int(19.8 * MIB))
    warning = verdict.int8_benefit_warning(int8, fp16)
    assert warning and "1% smaller" in warning and "latency not measured" in warning


def test_int8_warning_silent_on_a_good_case(tmp_path):
    fp16 = write_manifest(tmp_path / "m.fp16.manifest.json", 20 * MIB, {1: 1.0, 8: 2.0, 32: 6.0})
    fast = write_manifest(tmp_path / "m.int8.manifest.json", 19 * MIB, {1: 0.8, 8: 1.5, 32: 4.0})
    assert verdict.int8_benefit_warning(fast, fp16) is None  # 26% faster: worth it though barely smaller
    small = write_manifest(tmp_path / "s.int8.manifest.json", 11 * MIB)
    assert verdict.int8_benefit_warning(small, fp16) is None  # 45% smaller, latency unknown


def test_int8_latencies_from_different_machines_are_not_compared(tmp_path):
    fp16 = write_manifest(tmp_path / "m.fp16.manifest.json", 20 * MIB, {1: 1.0}, {"gpu": "NVIDIA A10"})
    int8 = write_manifest(tmp_path / "m.int8.manifest.json", 11 * MIB, {1: 5.0}, {"gpu": "NVIDIA H200"})
    c = verdict.int8_comparison(verdict.manifest_facts(int8), verdict.manifest_facts(fp16))
    assert c["faster"] is None and c["smaller"] == pytest.approx(0.45)


def test_gpu_only_paths_are_planned_as_skipped_with_the_reason(tmp_path):
    host = benchhost.probe_host()
    if host.gpu:
        pytest.skip(f"{host.gpu} is visible: GPU paths are runnable here")
    spec = plan.BenchSpec(engines=tmp_path, batches=(1, 8))
    planned = {p.path.key: p for p in plan.plan(spec, "m", host)}
    assert set(planned) == set(paths.PATH_BY_KEY)
    for key in ("torch-fp32-gpu", "torch-tf32-gpu", "torch-amp-fp16-gpu", "torch-amp-bf16-gpu", "torch-half-gpu"):
        assert planned[key].batches == () and "no CUDA GPU" in planned[key].reason
    assert "no m.fp16.engine" in planned["trt-fp16"].reason
    assert "engines cannot run here" in planned["trt-fp16"].reason
    assert planned["torch-fp32-cpu"].reason is None and planned["torch-fp32-cpu"].batches == (1, 8)
    assert planned["trt-fp16"].label.endswith("FP16 on GPU")


def test_engine_label_comes_from_flavor_and_gpu_name():
    host = benchhost.Host(cpu="x", cores=1, gpu="NVIDIA H200", torch_gpu_reason=None, bf16=True, torch_int8=True,
                      onnxruntime="1", tensorrt={"flavor": "tensorrt_rtx", "version": "1.7"}, engine_reason=None,
                      versions={})
    assert paths.label(paths.PATH_BY_KEY["trt-fp16"], host) == "TensorRT-RTX FP16 on H200"
    host = benchhost.Host(**{**host.__dict__, "gpu": "NVIDIA GeForce RTX 4090",
                         "tensorrt": {"flavor": "tensorrt", "version": "10.9"}})
    assert paths.label(paths.PATH_BY_KEY["trt-int8"], host) == "TensorRT INT8 on GeForce RTX 4090"
    assert paths.label(paths.PATH_BY_KEY["torch-amp-bf16-gpu"], host) == "PyTorch AMP BF16 on GeForce RTX 4090"


def test_benchmark_header_names_the_gpu_and_the_tensorrt_that_ran(monkeypatch):
    monkeypatch.setattr(benchhost, "_engine_facts",
                        lambda: ({"flavor": "tensorrt_rtx", "version": "1.7.1"}, "NVIDIA H200", None))
    assert benchhost.engine_gpu_text() == "NVIDIA H200, tensorrt_rtx 1.7.1"
    assert "; NVIDIA H200, tensorrt_rtx 1.7.1; " in benchhost.machine_text(benchhost.engine_gpu_text())
    monkeypatch.setattr(benchhost, "_engine_facts", lambda: (None, "NVIDIA H200", "no TensorRT"))
    assert benchhost.engine_gpu_text() == "NVIDIA H200"
    monkeypatch.setattr(benchhost, "_engine_facts", lambda: ({"flavor": "tensorrt", "version": "10"}, None, "no GPU"))
    assert benchhost.engine_gpu_text() is None


def test_engine_profile_limits_the_batches(tmp_path):
    engine = tmp_path / "m.int8.engine"
    engine.write_bytes(b"not run here")
    manifest.write(manifest.engine_manifest_path(engine), {"profiles": [{"batch": [1, 4, 8], "seq": [8, 128, 256]}]})
    planned = plan.Planned(paths.PATH_BY_KEY["trt-int8"], "x", engine, (1, 8, 32))
    fitted = plan.fit_profile(planned, 128)
    assert fitted.batches == (1, 8) and fitted.skipped_batches[0][0] == 32
    assert "1..8" in fitted.skipped_batches[0][1]
    assert "outside the engine's profile" in plan.fit_profile(planned, 512).reason


def test_select_paths_takes_names_globs_and_commas():
    assert paths.select_paths(["trt-*"]) == ("trt-fp32", "trt-fp16", "trt-int8", "trt-fp16-graph")
    assert paths.select_paths(["ort-fp32-cpu,torch-fp32-cpu"]) == ("torch-fp32-cpu", "ort-fp32-cpu")
    assert paths.select_paths(None) == tuple(paths.PATH_BY_KEY)
    with pytest.raises(InputError, match="matches no path"):
        paths.select_paths(["tensorflow-*"])


def test_cli_rejects_model_and_model_config_together(capsys):
    from trt_seer.cli import main

    assert main(["bench", "--model", "x", "--model-config", "bert-base"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--model or --model-config" in err


@pytest.mark.gpu
@pytest.mark.slow
def test_pytorch_gpu_paths_run(tmp_path):
    if not cuda_available():
        pytest.skip("no CUDA GPU visible to PyTorch")
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "tinybert")
    r = cli("bench", "--model", str(ckpt), "--engines", str(tmp_path), "--quick", "--report", str(tmp_path / "rep"),
            "--paths", "*-gpu")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_by_key(json.loads((tmp_path / "rep" / "report.json").read_text()))
    for key in ("torch-fp32-gpu", "torch-tf32-gpu", "torch-amp-fp16-gpu", "torch-half-gpu"):
        assert rows[key]["status"] == "ok", rows[key]
        assert "device: CUDA events" in rows[key]["timing_kind"]
        assert all(0 < p["device_p50_ms"] <= p["p50_ms"] for p in rows[key]["points"])
        assert all(p["memory_bytes"] > 0 for p in rows[key]["points"])
        assert rows[key]["accuracy"]["mean_cosine"] > 0.99
    assert rows["torch-half-gpu"]["size_bytes"] == pytest.approx(rows["torch-fp32-gpu"]["size_bytes"] / 2, rel=0.01)
    assert math.isclose(rows["torch-fp32-gpu"]["accuracy"]["mean_cosine"], 1.0, abs_tol=1e-5)


def test_bench_modules_import_each_other_without_a_cycle():
    """Every `trt_seer.bench.*` import, at any depth in a module, forms a graph without cycles."""
    import ast
    import graphlib
    from pathlib import Path

    import trt_seer.bench

    folder = Path(trt_seer.bench.__file__).parent
    modules = {f.stem for f in folder.glob("*.py")} - {"__init__"}

    def targets(node) -> set:  # `from trt_seer.bench import x`: module x, else the package itself
        if node.module != "trt_seer.bench":
            return {node.module}
        return {f"trt_seer.bench.{a.name}" if a.name in modules else "trt_seer.bench" for a in node.names}

    graph = {}
    for f in folder.glob("*.py"):
        imports = [n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom)]
        deps = set().union(*(targets(n) for n in imports if (n.module or "").startswith("trt_seer.bench")))
        graph[f"trt_seer.bench.{f.stem}".removesuffix(".__init__")] = deps
    assert graph["trt_seer.bench"] == set()  # the package imports nothing
    tuple(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle


def test_bench_never_replaces_a_diff_report(tmp_path):
    """`diff --report out/` then `bench --quick`: bench's default is a directory of its own, and a
    directory holding another command's report is refused before anything runs."""
    from trt_seer.cli import build_parser

    args = build_parser().parse_args(["bench", "--quick"])
    assert args.report == "out/bench"
    theirs = tmp_path / "out"
    theirs.mkdir()
    diff_report = json.dumps({"schema": 1, "verdict": "passed", "comparisons": []})
    (theirs / "report.json").write_text(diff_report)
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "tinybert")
    r = cli("bench", "--model", str(ckpt), "--engines", str(tmp_path / "engines"), "--quick", "--paths",
            "torch-fp32-cpu", "--no-manifest", "--report", str(theirs))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "holds `trt-seer diff`'s report" in r.stderr
    assert (theirs / "report.json").read_text() == diff_report and sorted(os.listdir(theirs)) == ["report.json"]


def test_cpu_int8_instructions_are_read_from_cpuinfo_flags():
    vnni = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512bw avx512_vnni amx_tile amx_int8\n"
    assert benchhost.int8_isa(benchhost.cpu_flags(vnni)) == "AMX-INT8, AVX-512 VNNI, AVX-512BW, AVX2"
    avx2 = "flags\t\t: fpu sse avx avx2 fma\n"
    assert benchhost.int8_isa(benchhost.cpu_flags(avx2)).startswith("AVX2 (no VNNI/AMX")
    arm = "Features\t: fp asimd asimddp i8mm\n"
    assert benchhost.int8_isa(benchhost.cpu_flags(arm)) == "Arm I8MM, Arm dot product"
    assert benchhost.int8_isa(None).startswith("unknown")


@pytest.mark.slow
def test_quick_report_names_the_cpu_int8_instructions_next_to_cpu_int8_figures(quick_run):
    root, r, report = quick_run
    isa = benchhost.cpu_int8_isa()
    assert report["machine"]["cpu_int8_isa"] == isa
    assert f"ran with these INT8 instructions: {isa}" in r.stdout
    int8 = [f for f in report["int8"] if f["int8"].startswith("PyTorch dynamic INT8")]
    assert int8 and int8[0]["cpu_int8_isa"] == isa
    md = (root / "report" / "report.md").read_text()
    assert f"CPU INT8 instructions: {isa}" in md and f"(CPU INT8 instructions: {isa})." in md


def _ok_row(key: str, device: str, p50: dict) -> dict:
    spec = paths.PATH_BY_KEY[key]
    return {"key": key, "label": f"{spec.title} on {device}", "backend": spec.backend, "device": spec.device,
            "status": "ok", "points": [{"batch": b, "p50_ms": ms} for b, ms in p50.items()]}


def test_engine_is_judged_against_the_fastest_pytorch_path_of_the_run():
    """The README's H200 figures: the FP16 engine against eager FP32 and compiled FP16."""
    rows = [_ok_row("torch-fp32-gpu", "H200", {1: 3.51, 8: 3.49, 32: 4.60}),
            _ok_row("torch-compile-ro-fp16-gpu", "H200", {1: 0.425, 8: 0.464, 32: 0.727}),
            _ok_row("torch-compile-ma-fp16-gpu", "H200", {1: 0.51, 8: 0.50}),
            _ok_row("trt-fp16", "H200", {1: 0.365, 8: 0.483, 32: 1.19}),
            _ok_row("ort-fp32-cpu", "CPU", {1: 2.0})]
    found = {(f["key"], f["batch"]): f for f in verdict.against_pytorch(rows)}
    b1, b8, b32 = (found[("trt-fp16", b)] for b in (1, 8, 32))
    assert b1["best"].startswith("PyTorch FP16 torch.compile reduce-overhead") and b1["faster"]
    assert b1["speedup"] == pytest.approx(0.425 / 0.365)
    assert not b8["faster"] and not b32["faster"] and b32["speedup"] == pytest.approx(0.727 / 1.19)
    assert "0.61x, NOT faster than PyTorch's best here" in verdict.against_pytorch_line(b32)
    assert found[("ort-fp32-cpu", 1)]["best"] is None and "no PyTorch path ran on the CPU" in found[("ort-fp32-cpu", 1)]["reason"]


@pytest.mark.slow
def test_quick_bench_lists_the_compiled_pytorch_path_and_judges_against_it(tmp_path):
    """torch.compile on the CPU runs beside eager; a compile failure would be listed with its reason."""
    ckpt = make_tiny_checkpoint("bert", "feature-extraction", tmp_path / "tinybert")
    engines = tmp_path / "engines"
    r = cli("export", "--model", str(ckpt), "--out", str(engines))
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli("bench", "--model", str(ckpt), "--engines", str(engines), "--quick", "--threads", "1", "--batch", "1",
            "--paths", "torch-fp32-cpu", "torch-compile*", "ort-fp32-cpu", "--no-manifest", "--report", str(tmp_path / "rep"))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    rows = rows_by_key(report)
    assert {"torch-compile-cpu", "torch-compile-ro-fp16-gpu", "torch-compile-ma-fp16-gpu"} <= set(rows)
    compiled = rows["torch-compile-cpu"]
    assert compiled["status"] == "ok" or compiled["reason"], compiled
    for key in ("torch-compile-ro-fp16-gpu", "torch-compile-ma-fp16-gpu"):
        if not cuda_available():
            assert rows[key]["status"] == "skipped" and rows[key]["reason"]
            assert f"(`{key}`): skipped: " in r.stdout
    (ort,) = [f for f in report["vs_pytorch"] if f["key"] == "ort-fp32-cpu"]
    ran = [rows[k] for k in ("torch-fp32-cpu", "torch-compile-cpu") if rows[k]["status"] == "ok"]
    assert ort["best_p50_ms"] == min(row["points"][0]["p50_ms"] for row in ran)
    assert "PyTorch's best here" in r.stdout and "## Against PyTorch's best" in (tmp_path / "rep" / "report.md").read_text()


# --- generation speed (bench/generate.py): every path timed the same way ------------------------

def test_decode_time_is_the_whole_call_minus_a_one_token_call_after_untimed_warm_ups():
    from trt_seer.bench import generate as gen

    calls = []
    decode, prompt = gen.whole_minus_prompt(calls.append, new_tokens=16, runs=1)
    assert calls == [17, 1] + [17, 1] * gen.MIN_RUNS  # both shapes warmed, then at least 3 timed pairs
    assert len(decode) == len(prompt) == gen.MIN_RUNS
    row = gen.rate_row(8, 128, 128, [1.0, 2.0, 4.0])
    assert row["tokens_per_s"] == 512 and row["ms_per_step"] == pytest.approx(2000 / 128)
    assert row["spread"] == pytest.approx((1024 - 256) / 512) and row["runs"] == 3
    with pytest.raises(ValueError, match="not slower than its prompt step"):
        gen.rate_row(1, 8, 8, [-0.001, 0.0, -0.002])
    text = gen.table({"p": {"decode": [row], "ttft_ms": {}}}, gen.GenBenchSpec(batches=(8,), ttft_prompts=()))
    assert "| p | 512 ±75.0% |" in text


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A tiny Llama and its FP32 ONNX graph with a KV cache."""
    from trt_seer import pipeline
    from trt_seer.export.families import resolve_model

    root = tmp_path_factory.mktemp("gen")
    ckpt = make_tiny_checkpoint("llama", "causal-lm", root / "llama")
    info = resolve_model(ckpt)
    art = pipeline.Artifacts(root / "out", info.name)
    art.out.mkdir()
    pipeline.fp32_onnx(info, art)
    return ckpt, art.path("fp32.onnx")


class CountingStep:
    """The real decoder step, with the steps of each generation counted."""

    def __init__(self, inner):
        self.inner, self.steps = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def reset(self, batch):
        self.steps.append(0)
        self.inner.reset(batch)

    def step(self, *feeds):
        self.steps[-1] += 1
        return self.inner.step(*feeds)


def test_engine_and_pytorch_generation_are_timed_as_their_users_run_them(tiny_decoder):
    import torch
    import transformers

    from trt_seer.bench import generate as gen
    from trt_seer.runtime.generate import load_step

    ckpt, onnx = tiny_decoder
    spec = gen.GenBenchSpec(batches=(1, 2), prompt=8, new_tokens=6, ttft_prompts=(8,), repeats=3)
    step = CountingStep(load_step(onnx, backend="onnxruntime"))
    rows = gen.measure_step(step, 128, spec)
    # the product's own loop, whole: 7 then 1 steps per run (and the untimed ones), nothing between
    assert set(step.steps) == {spec.new_tokens + 1, 1}
    assert [(d["batch"], d["runs"]) for d in rows["decode"]] == [(1, 3), (2, 3)]
    assert all(d["tokens_per_s"] > 0 and d["spread"] >= 0 and d["device_ms_per_step"] is None for d in rows["decode"])

    model = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    model.generation_config.pad_token_id = 0
    seen = []
    real = model.generate
    model.generate = lambda *a, **kw: seen.append(kw) or real(*a, **kw)
    hf = gen.hf_generate_rows(model, 128, spec)
    assert [(d["batch"], d["runs"]) for d in hf["decode"]] == [(1, 3), (2, 3)] and set(hf["ttft_ms"]) == {8}
    assert {kw["max_new_tokens"] for kw in seen} == {spec.new_tokens + 1, 1}
    assert not any("logits_processor" in kw or "stopping_criteria" in kw for kw in seen)  # nothing in its loop
