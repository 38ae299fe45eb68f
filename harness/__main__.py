"""`python -m harness COMMAND`: command-line tools of the harness (see `--help`)."""

from __future__ import annotations

import argparse
import sys

from harness import corpus, profile_view, signoff
from harness.history import cli as history_cli
from harness.reporting import report_cli


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a sub-command; return its exit code."""
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    profile_view.add_parser(sub)
    report_cli.add_parser(sub)
    signoff.add_parser(sub)
    corpus.add_parser(sub)
    history_cli.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
