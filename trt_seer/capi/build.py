"""Compiles libtrt_seer.so (and the example) with the system C compiler; prints the link flags.

    python -m trt_seer.capi.build --out build/capi [--example] [--cc gcc] [--sanitize address]

Writes DIR/libtrt_seer.so, DIR/trt_seer.h and, with --example, DIR/trt_seer_example. The library
embeds the Python that runs this command (its libpython, its site-packages, this trt_seer), so
build it with the interpreter the service should use; docs/RUNTIME.md explains the design.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from trt_seer.errors import DependencyError, TrtSeerError
from trt_seer.files import atomic_path, atomic_write_bytes, ensure_out_dir

SOURCES = Path(__file__).resolve().parent
LIBRARY, HEADER, EXAMPLE = "libtrt_seer.so", "trt_seer.h", "trt_seer_example"


@dataclass(frozen=True)
class Built:
    """What `build` wrote, and the flags a C/C++/cgo/Rust build adds to use it."""

    library: Path
    header: Path
    example: Path | None
    cflags: str
    ldflags: str


def find_cc(cc: str | None = None) -> str:
    """The C compiler: `cc`, $CC or `cc` on PATH; DependencyError naming what to install."""
    name = cc or os.environ.get("CC") or "cc"
    found = shutil.which(name)
    if found is None:
        raise DependencyError(f"no C compiler {name!r} on PATH; install one (apt-get install gcc) or pass --cc")
    return found


def python_flags() -> tuple[list[str], list[str]]:
    """(compile flags, link flags) to embed this interpreter: python3-config --embed, from sysconfig."""
    get = sysconfig.get_config_var
    if not get("Py_ENABLE_SHARED"):
        raise DependencyError(f"{sys.executable} was built without a shared libpython (Py_ENABLE_SHARED=0), "
                              "which embedding needs; use a Python with libpython3.x.so (e.g. Debian's "
                              "python3 + libpython3-dev, or pyenv with --enable-shared)")
    libdir = get("LIBDIR")
    version = f"{get('VERSION')}{getattr(sys, 'abiflags', '')}"
    here = str(Path(__import__("trt_seer").__file__).resolve().parent.parent)
    paths = sysconfig.get_paths()
    # Where this Python lives, checked at open: the library starts this interpreter, isolated from
    # the service's PYTHON* variables, imports this trt_seer, and finds this command's packages on
    # the sys.path it has now (PYTHONPATH and user-site entries included: they are recorded here).
    search = os.pathsep.join(p for p in sys.path if p and os.path.isabs(p))
    cflags = [f"-I{paths['include']}", f'-DTRT_SEER_PYTHON="{sys.executable}"', f'-DTRT_SEER_PREFIX="{sys.prefix}"',
              f'-DTRT_SEER_STDLIB="{paths["stdlib"]}"', f'-DTRT_SEER_PACKAGE_DIR="{here}"',
              f"-DTRT_SEER_SYS_PATH={json.dumps(search, ensure_ascii=False)}"]
    ldflags = [f"-L{libdir}", f"-Wl,-rpath,{libdir}", f"-lpython{version}", *(get("LIBS") or "").split(),
               *(get("SYSLIBS") or "").split(), "-lpthread"]
    return cflags, ldflags


def compile_to(dest: Path, argv: list[str]) -> Path:
    """Runs the compiler into a temp file renamed over `dest` on success (nothing half-written)."""
    with atomic_path(dest) as tmp:
        r = subprocess.run([*argv[:1], "-o", str(tmp), *argv[1:]], capture_output=True, text=True)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[:300])
            raise TrtSeerError(f"{Path(argv[0]).name} failed to build {dest.name}: {first}")
    return dest


def build(out: Path, *, example: bool = False, cc: str | None = None, sanitize: str | None = None) -> Built:
    """Compiles the library (and the example) into `out`; `sanitize` ("address", ...) builds both
    with that -fsanitize (a program linking the library then needs it too)."""
    compiler = find_cc(cc)
    out = ensure_out_dir(Path(out)).resolve()
    cflags, ldflags = python_flags()
    warn = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit-function-declaration"]
    if sanitize:
        warn += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"]
    atomic_write_bytes(out / HEADER, (SOURCES / HEADER).read_bytes())
    lib = compile_to(out / LIBRARY, [compiler, "-shared", "-fPIC", *warn, *cflags, f"-I{SOURCES}",
                                     str(SOURCES / "trt_seer.c"), *ldflags])
    user_cflags, user_ldflags = f"-I{out}", f"-L{out} -Wl,-rpath,{out} -ltrt_seer"
    exe = None
    if example:
        exe = compile_to(out / EXAMPLE, [compiler, *warn, f"-I{out}", str(SOURCES / "example.c"),
                                         *user_ldflags.split()])
    return Built(lib, out / HEADER, exe, user_cflags, user_ldflags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trt_seer.capi.build", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for libtrt_seer.so and trt_seer.h")
    parser.add_argument("--example", action="store_true", help="also build trt_seer_example from example.c")
    parser.add_argument("--cc", help="C compiler (default: $CC or cc)")
    parser.add_argument("--sanitize", metavar="KIND", help="build with -fsanitize=KIND (e.g. address) for testing")
    args = parser.parse_args(argv)
    try:
        built = build(args.out, example=args.example, cc=args.cc, sanitize=args.sanitize)
    except TrtSeerError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"library: {built.library}")
    if built.example:
        print(f"example: {built.example}")
    print(f"CFLAGS:  {built.cflags}")
    print(f"LDFLAGS: {built.ldflags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
