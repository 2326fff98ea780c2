"""Command line: `python -m trt_seer COMMAND --help` for each command in SUBCOMMANDS.

Each subcommand lives in its own module exposing `add_parser(subparsers, common)` and `run(args)`.
Nothing heavy is imported until a subcommand runs, so `--help` works with only the base install.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import sys
import traceback
import warnings

from trt_seer import __version__
from trt_seer.cli import common
from trt_seer.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, TrtSeerError
from trt_seer.resources import latch_interrupts

SUBCOMMANDS = ("export", "build", "run", "diff", "bench", "finetune", "generate", "serve", "triton")

EPILOG = """exit codes:
  0    success
  1    a check failed (export mismatch, INT8 accuracy gate, diff out of tolerance, TensorRT build)
  2    bad input (options, files, data, an engine for another TensorRT or GPU, missing dependency)
  3    not verified: a requested check could not run on this machine (diff)
  4    internal error (a bug; rerun with --debug for the traceback)
  5    a resource failed at run time: a CUDA error (out of memory, a lost device)
  130  interrupted (Ctrl-C); nothing half-written is left behind
every failure is one line on stderr: trt-seer: error: ..."""
DESCRIPTION = ("Build, check and run TensorRT engines from Hugging Face checkpoints: "
               f"trt-seer {{{','.join(SUBCOMMANDS)}}} --help")
DEBUG_HELP = "on failure, print the Python traceback as well"


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit code 2 (argparse prints the usage too)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _subcommand_modules():
    for name in SUBCOMMANDS:
        spec = importlib.util.find_spec(f"trt_seer.cli.{name}")
        if spec is not None:
            yield importlib.import_module(f"trt_seer.cli.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="trt-seer", description=DESCRIPTION, epilog=EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"trt-seer {__version__}")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for module in _subcommand_modules():
        module.add_parser(sub, common)
    for p in sub.choices.values():  # `trt-seer build --debug` too; SUPPRESS keeps the global value
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    return parser


def one_line(text: str) -> str:
    """Collapses a multi-line message (ONNX, TensorRT and protobuf errors often are) to one line."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip()) or "(no message)"


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except KeyboardInterrupt:
        print("trt-seer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    common.configure_logging(getattr(args, "verbose", False))
    warnings.showwarning = _warning_line
    try:
        with latch_interrupts():
            common.check_config(getattr(args, "model", None))  # every command's --model, before slow work
            return int(args.handler(args) or 0)
    except TrtSeerError as e:
        _traceback_if(args)
        print(f"trt-seer: error: {one_line(e)}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        _traceback_if(args)
        print("trt-seer: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # a bug: say so in one line instead of a traceback
        _traceback_if(args)
        print(f"trt-seer: internal error: {type(e).__name__}: {one_line(e)} "
              "(rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings reach the user as one log line ("warning: ..."), not Python's two-line form."""
    logging.getLogger("trt_seer").warning("warning: %s", one_line(message))


def _traceback_if(args) -> None:
    if getattr(args, "debug", False):
        traceback.print_exc()
