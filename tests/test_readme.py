"""The README's commands as written: CI runs its test command, every `trt-seer` example (there and in
the guides it links) uses a real subcommand and real flags, it stays short, and each benchmark figure
it gives is in the docs/BENCHMARKS.md section it links."""
import contextlib
import io
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

from trt_seer.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def code_blocks(text: str) -> list[str]:
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)
    return [body for lang, body in blocks if lang in ("bash", "sh", "")]


def test_ci_runs_exactly_the_readme_test_command():
    section = README.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    install, tests = code_blocks(section)[:2]
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines()
    assert "python -m trt_seer build --int8" in install
    for step in install.strip().split(" && ")[:-1]:  # the install steps CI repeats
        assert step.replace('"', "").split()[-1] in ci.replace('"', "")
    lines = ci.splitlines()
    venv = next(i for i, line in enumerate(lines) if line.startswith("python -m venv "))
    activate = next(i for i, line in enumerate(lines) if line.startswith("source ") and "bin/activate" in line)
    assert venv < activate < lines.index(tests.strip()), "CI runs the tests in a fresh virtualenv"


GUIDES = ("docs/GUIDE.md", "docs/LLM.md")  # the details the README links to; their examples are checked too


def examples() -> list[list[str]]:
    out = []
    for text in (README, *[(ROOT / g).read_text() for g in GUIDES]):
        for block in code_blocks(text):
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("trt-seer "):
                    out.append(line.split()[1:])
    return out


def help_text(sub: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        main([sub, "--help"])
    return buf.getvalue()


@pytest.mark.parametrize("words", examples(), ids=lambda w: " ".join(w)[:60])
def test_readme_examples_use_real_flags(words):
    sub, flags = words[0], [w.split("=")[0] for w in words[1:] if w.startswith("--")]
    text = help_text(sub)
    missing = [f for f in flags if f not in text]
    assert not missing, f"trt-seer {sub}: {missing} not in --help"


def test_readme_stays_a_short_guide():
    assert len(README.encode()) <= 15 * 1024, f"README.md is {len(README.encode())} bytes; move detail into docs/"


def heading_anchors(markdown: str) -> dict[str, str]:
    """Each `## ` heading's anchor as GitHub makes it (lower case, punctuation dropped, spaces to
    hyphens, -1, -2, ... on repeats) -> the section's text up to the next `## ` heading."""
    anchors, seen = {}, {}
    for section in markdown.split("\n## ")[1:]:
        title = section.split("\n", 1)[0]
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors[slug if n == 0 else f"{slug}-{n}"] = section
    return anchors


NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")  # 1,944 or 0.442; not the 16 of FP16


def numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in NUMBER.findall(text)]


def benchmark_rows() -> list[tuple[str, str, str]]:
    """(what, result, anchor) of every row of the README's benchmarks table."""
    section = README.split("## Benchmarks", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (.+?) \| \[[^]]+\]\(docs/BENCHMARKS\.md#([\w-]+)\) \|$", section, flags=re.M)
    assert len(rows) >= 5, "the benchmarks table links each row into docs/BENCHMARKS.md"
    return rows


@pytest.mark.parametrize("what,result,anchor", benchmark_rows(), ids=lambda v: v[:40])
def test_each_benchmark_figure_is_in_the_section_it_links(what, result, anchor):
    """Every number of a row's result is printed, to the README's precision, in the section it links."""
    sections = heading_anchors((ROOT / "docs" / "BENCHMARKS.md").read_text())
    assert anchor in sections, f"docs/BENCHMARKS.md has no section #{anchor}"
    found = [Decimal(n) for n in numbers(sections[anchor])]
    missing = []
    for n in numbers(result):
        step = Decimal(1).scaleb(Decimal(n).as_tuple().exponent)  # 0.1 for "47.2": rounded half up, as written
        if not any(f.quantize(step, rounding=ROUND_HALF_UP) == Decimal(n) for f in found):
            missing.append(n)
    assert not missing, f"{what}: {missing} not in docs/BENCHMARKS.md#{anchor}"
