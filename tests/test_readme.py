"""The README's commands as written: CI runs its test command, and every `trt-seer` example uses a
real subcommand and real flags."""
import contextlib
import io
import re
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


def examples() -> list[list[str]]:
    out = []
    for block in code_blocks(README):
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
