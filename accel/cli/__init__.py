"""The `accel` command. Each subcommand lives in its own module here with add_parser(subparsers) and run(args).

A user's mistake (a bad plan, a missing file, a wrong number) prints one clear line and exits with 2, never a
traceback.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import pkgutil
import sys

from accel import __version__
from accel.errors import AccelError

__all__ = ["main"]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help shows its default, except an unset one (None, False): its help says what unset means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="accel", description="Make PyTorch training faster, measured and explained.",
                                     formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"accel {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="command",
                                       parser_class=functools.partial(argparse.ArgumentParser,
                                                                      formatter_class=HelpFormatter))
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        command = importlib.import_module(f"{__name__}.{module.name}")
        sub = command.add_parser(subparsers)
        sub.set_defaults(handler=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except AccelError as error:
        print(f"accel {args.command}: {error}", file=sys.stderr)
        return 2


def positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def parse_plan_argument(text: str):
    """A --plan argument: a plan file, 'auto', or comma-separated accelerator names."""
    if text == "auto" or text.endswith((".toml", ".yaml", ".yml")):
        return text
    return [n.strip() for n in text.split(",") if n.strip()]


if __name__ == "__main__":
    sys.exit(main())
