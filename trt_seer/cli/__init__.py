"""Command line: `python -m trt_seer {export,build,run,diff,bench,finetune} --help`.

Each subcommand lives in its own module exposing `add_parser(subparsers, common)` and `run(args)`.
Nothing heavy is imported until a subcommand runs, so `--help` works with only the base install.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from trt_seer import __version__
from trt_seer.cli import common
from trt_seer.errors import TrtSeerError

SUBCOMMANDS = ("export", "build", "run", "diff", "bench", "finetune", "generate")


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
    parser = OneLineParser(prog="trt-seer", description=__doc__.splitlines()[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"trt-seer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for module in _subcommand_modules():
        module.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    common.configure_logging(getattr(args, "verbose", False))
    try:
        return int(args.handler(args) or 0)
    except TrtSeerError as e:
        print(f"trt-seer: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("trt-seer: interrupted", file=sys.stderr)
        return 130
