"""The `hourglass` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hourglass", description="A disk-backed delay-message broker.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run a broker (not available yet in this version)")
    args = parser.parse_args(argv)
    if args.command == "serve":
        print("hourglass serve: the HTTP broker is not built yet; the storage engine is (see README).",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
