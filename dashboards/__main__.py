"""``python -m fsdpmon.dashboards``: regenerate ``dashboards/generated/``
(``--check``: only compare).

``--runbook-url`` (default: ``FSDPMON_RUNBOOK_URL``, else the fsdpmon repository's
docs/runbook.md) is where each alert's ``runbook_url`` points, ``#<cause>`` appended. The
committed files use the default; ``--output`` writes a team's own variant elsewhere.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fsdpmon.conventions import RUNBOOK_URL_ENV
from fsdpmon.dashboards.generate import GENERATED, stale_files, write
from fsdpmon.dashboards.rulebase import DEFAULT_RUNBOOK_URL, runbook_base


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fsdpmon.dashboards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when the files differ from a fresh generation")
    parser.add_argument("--runbook-url", default=os.environ.get(RUNBOOK_URL_ENV) or None,
                        help=f"address of the runbook page; alerts link to URL#<cause> "
                             f"(env {RUNBOOK_URL_ENV}; default {DEFAULT_RUNBOOK_URL})")
    parser.add_argument("--output", type=Path, default=GENERATED,
                        help=f"directory to write or check (default {GENERATED})")
    args = parser.parse_args(argv)
    try:
        url = runbook_base(args.runbook_url or DEFAULT_RUNBOOK_URL)
    except ValueError as exc:
        parser.error(f"--runbook-url / {RUNBOOK_URL_ENV}: {exc}")
    if args.check:
        stale = stale_files(args.output, url)
        for name in stale:
            print(f"stale: {args.output / name}", file=sys.stderr)
        return 1 if stale else 0
    for name in write(args.output, url):
        print(args.output / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
