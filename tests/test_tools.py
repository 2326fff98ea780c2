"""The benchmark tools' verdicts: what they print decides whether a target counts as met."""
import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def load_tool(name: str):
    sys.path.insert(0, str(TOOLS))
    try:
        spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(TOOLS))


def acc_row(precision, seed, accuracy, **extra):
    return {"precision": precision, "seed": seed, "eval_accuracy": accuracy, "eval_examples": 242,
            "seconds": 1.0, "samples_per_s": 100.0, "skipped_steps": 0, **extra}


def verdicts(table: str) -> dict:
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    return {r[0].strip(): (r[3].strip(), r[4].strip()) for r in rows}


def test_accuracy_table_judges_each_amp_mean_against_fp32():
    bench_finetune = load_tool("bench_finetune")
    rows = [acc_row("fp32", 0, 0.990), acc_row("fp32", 1, 0.980),   # mean 0.985
            acc_row("fp16", 0, 0.982), acc_row("fp16", 1, 0.979),   # mean 0.9805: -0.45 points
            acc_row("bf16", 0, 0.981), acc_row("bf16", 1, 0.978)]   # mean 0.9795: -0.55 points
    v = verdicts(bench_finetune.accuracy_table(rows))
    assert v["fp32"] == ("+0.00", "-")
    assert v["fp16"] == ("-0.45", "yes")
    assert v["bf16"] == ("-0.55", "NO")


def test_accuracy_table_reports_failed_runs_without_a_verdict():
    bench_finetune = load_tool("bench_finetune")
    rows = [acc_row("fp32", 0, 0.99), {"precision": "fp16", "seed": 0, "error": "out of memory"}]
    table = bench_finetune.accuracy_table(rows)
    assert "| fp16 | out of memory | | | | | |" in table


def zero1_row(mode, state, losses, **extra):
    return {"mode": mode, "optimizer": "AdamW", "processes": 2, "state_bytes_per_rank": state, "losses": losses,
            "peak_memory_gib": 1.0, "samples_per_s": 10.0, **extra}


def test_zero1_table_compares_the_largest_shard_and_the_loss_curves():
    bench_zero1 = load_tool("bench_zero1")
    mib = 2**20
    rows = [zero1_row("ddp", [800 * mib, 800 * mib], [1.0, 0.9, 0.8]),
            zero1_row("zero1", [450 * mib, 350 * mib], [1.0, 0.9005, 0.8])]
    lines = bench_zero1.table(rows).splitlines()
    ddp, zero1 = (line.split("|")[1:-1] for line in lines[2:])
    assert [c.strip() for c in ddp[3:5]] == ["800.0, 800.0", "1.00x"]
    assert [c.strip() for c in zero1[3:5]] == ["450.0, 350.0", "0.56x"]  # the fullest rank decides memory
    assert float(zero1[7]) == pytest.approx(5e-4)


SECTION = r"^## {}, \d{{4}}-\d\d-\d\d \d\d:\d\d UTC$"


def test_finetune_sections_go_through_the_one_benchmarks_writer(tmp_path):
    bench_finetune = load_tool("bench_finetune")
    md = tmp_path / "BENCHMARKS.md"
    hardware = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "torch": "2.11", "transformers": "5.0"}
    rows = [acc_row("fp32", 0, 0.99, hardware=hardware)]
    bench_finetune.append_report("Fine-tuning accuracy", "Intro.", "| t |", rows, path=md, argv=["--accuracy"])
    text = md.read_text()
    assert text.startswith("# Benchmarks\n") and re.search(SECTION.format("Fine-tuning accuracy"), text, re.M)
    assert "\n- Machine: NVIDIA H200 (compute capability 9.0), " in text
    assert "\n- Command: `python tools/bench_finetune.py --accuracy`\n" in text
    assert text.endswith("\n\nIntro.\n\n| t |\n")


def test_build_tools_emit_through_the_one_benchmarks_writer(tmp_path, capsys):
    bench_build = load_tool("bench_build")
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nolder section\n")
    bench_build.emit("Build stages", "bench_build.py", ["--append", "x.md"], "| step |", str(md))
    text = md.read_text()
    assert capsys.readouterr().out == "| step |\n"
    assert text.startswith("# Benchmarks\n\nolder section\n") and re.search(SECTION.format("Build stages"), text, re.M)
    assert "- Command: `python tools/bench_build.py --append x.md`" in text and text.endswith("| step |\n")
    bench_build.emit("Build stages", "bench_build.py", [], "| printed only |", None)
    assert md.read_text() == text


# append_benchmark itself, the two tool helpers built on it, or a `trt-seer bench --append` run
WRITERS = ("append_benchmark(", "emit(", "append_report(", '"trt_seer", "bench"')


def test_every_tool_that_appends_goes_through_the_one_writer():
    for tool in TOOLS.glob("*.py"):
        source = tool.read_text()
        assert not re.search(r"open\([^)]*[\"']a[\"']", source), f"{tool.name} appends with open(..., 'a')"
        if "--append" in source or "BENCHMARKS" in source:
            assert any(w in source for w in WRITERS), f"{tool.name} writes BENCHMARKS.md some other way"


def test_finetune_bench_repeats_report_the_median_run_and_its_spread():
    bench_finetune = load_tool("bench_finetune")
    runs = [{"model": "m", "precision": "fp16", "batch": 8, "samples_per_s": r, "tokens_per_s": r * 10,
             "peak_memory_gib": 1.0, "eval_accuracy": 0.5, "skipped_steps": 0} for r in (30.0, 10.0, 20.0)]
    row = bench_finetune.combine(runs)
    assert row["samples_per_s"] == 20.0 and row["spread"] == (10.0, 30.0)
    assert "20.0 (10-30, 3 runs)" in bench_finetune.table([row])
    assert bench_finetune.combine([{"model": "m", "error": "out of memory"}])["error"] == "out of memory"


def test_finetune_bench_reports_the_median_step_its_spread_outliers_and_the_steps_left_out():
    bench_finetune = load_tool("bench_finetune")
    ms = [900, 400] + [145] * 10 + [1464] + [146] * 7  # two warm-up steps, one slow step among 18 timed
    elapsed, steps = 0.0, []
    for i, m in enumerate(ms, start=1):
        elapsed += m / 1000
        steps.append({"kind": "step", "step": i, "examples": 8, "tokens": 800, "elapsed_s": elapsed})
    rate = bench_finetune.steady_rate(steps, warmup=2)
    assert rate["left_out"]["steps"] == 3 and max(rate["left_out"]["ms"]) == pytest.approx(900)
    assert "warm-up" in rate["left_out"]["reason"]
    assert rate["step_ms_median"] == pytest.approx(145) and rate["step_ms_max"] == pytest.approx(1464)
    assert rate["outliers"] == [{"step": 13, "ms": pytest.approx(1464)}]
    assert rate["samples_per_s"] == pytest.approx(17 * 8 / (sum(ms[3:]) / 1000))  # the outlier stays in
    row = {"model": "m", "precision": "bf16", "batch": 8, "peak_memory_gib": 1.0, "eval_accuracy": 0.5,
           "skipped_steps": 0, **rate}
    line = bench_finetune.table([row]).splitlines()[-1]
    assert "145 (p10-p90 145-146, max 1,464); outliers (> 3x median, kept): step 13 1,464 ms" in line
    assert "| 3 warm-up (900 ms max) |" in line


def test_finetune_bench_measures_a_causal_lm_at_every_precision_the_device_has(tmp_path, capsys):
    import torch

    bench_finetune = load_tool("bench_finetune")
    out = tmp_path / "rows.json"
    argv = ["--quick", "--models", "llama-tiny", "--batches", "4", "--warmup-runs", "1"]
    assert bench_finetune.main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    precisions = bench_finetune.supported_precisions(None, torch.cuda.is_available())
    assert [(r["precision"], r["batch"]) for r in rows] == [(p, 4) for p in precisions]
    args = bench_finetune.parse_args(argv)
    for r in rows:
        assert len(r["step_ms"]) == args.steps - args.warmup_steps - 1 and min(r["step_ms"]) > 0
        assert r["samples_per_s"] == pytest.approx(4 * len(r["step_ms"]) / (sum(r["step_ms"]) / 1000))
        assert r["task"] == "causal-lm" and r["max_seq"] == 128 and r["samples_per_s"] > 0
        assert r["mean_tokens"] == 128  # every document fills --max-seq: no padding
        assert r["tokens_per_s"] == pytest.approx(r["samples_per_s"] * 128)
        assert r["eval_perplexity"] == pytest.approx(math.exp(r["eval_loss"]))
        assert 1 < r["eval_perplexity"] < 2 * bench_finetune.LM_VOCAB  # random init: about the vocabulary size
        assert r["peak_memory_gib"] > 0 and r["params"] == 598336
    printed = capsys.readouterr().out
    assert printed.count('"warmup_run"') == len(precisions)  # one unmeasured run per case, first
    assert "Fine-tuning throughput by precision, causal LM (llama-tiny)" in printed
    assert "| peak memory GiB | eval loss | eval ppl | skipped |" in printed
    title, intro = bench_finetune.speed_intro(rows, args)
    assert "after 1 unmeasured run(s) of every case" in intro
    assert "tokens/s = samples/s x 128" in intro and "llama-tiny = hidden 64, 2 layers, 4 heads (2 KV)" in intro


def test_finetune_bench_rejects_an_unknown_model_with_exit_2(capsys):
    bench_finetune = load_tool("bench_finetune")
    with pytest.raises(SystemExit) as e:
        bench_finetune.parse_args(["--models", "llama-7b"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip().startswith("bench_finetune: unknown model 'llama-7b'; choose from")


def test_weight_only_probe_builds_every_form_and_compares_like_with_like():
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX's builder (it runs without a GPU)")
    import onnx

    probe = load_tool("probe_weightonly")
    for precision, dims, profiles in (("int8", 3, 2), ("int4", 2, 1)):
        case, blob, note = probe.build((precision, dims, profiles, 256, 2))
        assert blob, note
    graph = probe.stack(256, 2, 3)
    onnx.checker.check_model(graph)
    assert [d.dim_param or d.dim_value for d in graph.graph.input[0].type.tensor_type.shape.dim] == ["B", "S", 256]
    text = probe.table({("fp16", 3, 2, "eager"): 100.0, ("int8", 3, 2, "eager"): 50.0,
                        ("int8", 2, 2, "eager"): 40.0}, 256, 2)
    assert "| INT8 | 3-D | 2 | eager | 50.0 | 2.00x |" in text
    assert "| INT8 | 2-D | 2 | eager | 40.0 |" in text and "n/a" in text.splitlines()[-1]


def test_overhead_bench_refuses_what_it_cannot_time_with_exit_2(tmp_path, capsys):
    """The GPU measurement itself runs on a GPU machine (docs/BENCHMARKS.md, Per-call host overhead);
    here: bad arguments and an engine this machine cannot run end in one line and exit 2."""
    from trt_seer.runtime import tensorrt_unavailable_reason

    bench_overhead = load_tool("bench_overhead")
    with pytest.raises(SystemExit) as e:
        bench_overhead.main([str(tmp_path / "missing.engine")])
    assert e.value.code == 2 and "engine not found" in capsys.readouterr().err
    engine = tmp_path / "m.fp16.engine"
    engine.write_bytes(b"not an engine")
    with pytest.raises(SystemExit) as e:
        bench_overhead.main([str(engine), "--batch", "1,x"])
    assert e.value.code == 2 and "--batch takes comma-separated integers" in capsys.readouterr().err
    if tensorrt_unavailable_reason() is None:
        pytest.skip("this machine runs engines: the refusal below is for machines that cannot")
    assert bench_overhead.main([str(engine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench_overhead: cannot run m.fp16.engine on TensorRT")
def test_int4_qat_table_reads_the_gate_and_compares_with_the_base():
    bench = load_tool("bench_qat_lm")
    every = {"perplexity": 101.0, "agreement_vs_base_fp32": 0.95, "agreement_vs_own_fp32": 0.96,
             "ppl_vs_own_fp32": 0.01}
    record = {"accuracy": {"onnx_vs_fp16": {"ppl_increase": 0.002, "agreement": 0.97},
                           "gate": {"table": [["none", {"ppl_increase": 0.004, "agreement": 0.9}, False]]}},
              "quantization": {"fp16_gemms": ["a", "b"], "quantized_gemms": 26, "awq": None,
                               "qat": {"block": 256}}}
    passed = {"label": "qat", "gate": bench.gate_summary(record), "fp32": {"perplexity": 100.0},
              "int4": {"perplexity": 102.0, "agreement_vs_base_fp32": 0.9}, "all_int4": every}
    failed = {"label": "ptq", "gate": bench.gate_summary(None), "fp32": {"perplexity": 100.0}, "all_int4": every}
    rows = [line.split("|")[1:-1] for line in bench.table([passed, failed], base_ppl=200.0).splitlines()[2:]]
    assert [c.strip() for c in rows[0]] == ["qat", "skipped (QAT)", "2", "+0.40% / 0.9000", "+0.20% / 0.9700",
                                            "100.00", "102.00 (-49.00%)", "0.9000", "+1.00% / 0.9600", "0.9500"]
    assert [c.strip() for c in rows[1]][2:5] == ["fail", "-", "-"]


def test_attention_probe_forms_compute_the_same_attention_and_update_the_cache():
    """The three forms of tools/probe_attention.py on ONNX Runtime (FP32): the same output, and the
    in-place forms' present = the past with the new position written at the index."""
    import onnxruntime as ort

    probe = load_tool("probe_attention")
    rng = np.random.default_rng(0)
    batch, window, used, layers = 2, 512, 300, 2
    new = {n: rng.standard_normal((batch, h, 1, probe.D)).astype(np.float32)
           for n, h in (("q", probe.HQ), ("k", probe.HK), ("v", probe.HK))}
    caches = [rng.standard_normal((batch, probe.HK, window, probe.D)).astype(np.float32) for _ in range(2 * layers)]
    outs = {}
    for kind in ("exported", "in place", "chunked"):
        feeds = dict(new, **{f"p{t}{i}": caches[2 * i + (t == "v")] for i in range(layers) for t in "kv"})
        if kind == "exported":
            mask = np.full((batch, 1, 1, window + 1), -65504.0, np.float32)
            mask[..., :used] = 0
            mask[..., window] = 0
        else:
            mask = np.zeros((batch, 1, 1, window), bool)
            mask[..., :used + 1] = True
            feeds["idx"] = np.full(batch, used, np.int64)
        feeds["mask"] = mask
        model = probe._graph(kind, batch, window, layers, dtype=np.float32)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        y, ck0 = session.run(["y", "ck0"], feeds)
        outs[kind] = y
        if kind != "exported":
            want = caches[0].copy()
            want[:, :, used] = new["k"][:, :, 0]
            np.testing.assert_array_equal(ck0, want)
    np.testing.assert_allclose(outs["in place"], outs["exported"], atol=1e-5)
    np.testing.assert_allclose(outs["chunked"], outs["exported"], atol=1e-5)


def test_prompt_bench_compares_the_slices_with_the_whole_prompt_and_refuses_what_it_cannot_time(tmp_path, capsys):
    """tools/bench_prompt.py: the table gives each form's median and range, its peak GPU memory and
    the slices' logits against the whole prompt's; an engine that is missing is refused with exit 2."""
    bench_prompt = load_tool("bench_prompt")
    want = np.random.default_rng(0).standard_normal((2, 50)).astype(np.float32)
    assert bench_prompt.compare(want, want) == (0.0, 1.0)
    rel, top1 = bench_prompt.compare(want + 0.1 * want.std(), want)
    assert rel == pytest.approx(0.1, rel=0.01) and top1 == 1.0  # the spread is per row, the shift overall
    flipped = want.copy()
    flipped[0, want[0].argmin()] = want[0].max() + 1
    assert bench_prompt.compare(flipped, want)[1] == 0.5
    rows = [{"batch": 8, "slice": 512, "times_ms": [3105.5, 3096.0, 3098.0, 3099.2], "peak_mib": 8013,
             "rel_rms": 0.018, "top1": 1.0},
            {"batch": 8, "slice": 0, "times_ms": [4391.0, 4370.5, 4377.4], "peak_mib": None}]
    lines = bench_prompt.table(rows).splitlines()
    assert lines[2] == "| 8 | slices of 512 | 3,098.6 (3,096.0-3,105.5) | 7.8 GiB (8,013 MiB) | 0.018, 1.00 |"
    assert lines[3] == "| 8 | one step | 4,377.4 (4,370.5-4,391.0) | not read |  |"
    assert bench_prompt.main([str(tmp_path / "none.engine")]) == 2
    assert "engine not found" in capsys.readouterr().err
