"""``python -m dashboards``: regenerate ``dashboards/generated/`` (``--check``: only compare)."""

from __future__ import annotations

import argparse
import sys

from dashboards.generate import GENERATED, stale_files, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the committed files differ from a fresh generation")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files()
        for name in stale:
            print(f"stale: {GENERATED / name}", file=sys.stderr)
        return 1 if stale else 0
    for name in write():
        print(GENERATED / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
