"""The `fsdpmon` command: subcommand dispatch, and the one place errors become exit codes.

Each subcommand lives in its own module exposing ``configure(parser)`` and ``run(args) -> int``.
Modules are imported only when their command runs, so `fsdpmon --help` stays instant and the
exporter never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Sequence

from fsdpmon import __version__
from fsdpmon.errors import guarded
from fsdpmon.helpformat import HelpFormatter

# Long-running services log their INFO lines (start-up, what they serve) by default; the other
# commands print their results and only warnings and errors, unless -v asks for more.
SERVICES = frozenset({"exporter"})

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("fsdpmon.demo", "run a local 2-rank training with the exporter and `top` watching it"),
    "top": ("fsdpmon.top.cli", "live terminal view of a whole FSDP job across pods"),
    "diagnose": ("fsdpmon.diagnose.cli",
                 "name the rank, pod, node or GPU behind a stall or slowdown, and why"),
    "exporter": ("fsdpmon.exporters.cli",
                 "per-node exporter: GPUs, host and processes, with pod labels"),
    "manifests": ("fsdpmon.manifests.cli", "generate the Kubernetes job, exporter and monitoring"),
    "report": ("fsdpmon.report.cli", "scaling report (table + chart) from several runs"),
    "incidents": ("fsdpmon.incidents.cli",
                  "what went wrong in a run, on which rank/node, and what it cost"),
    "goodput": ("fsdpmon.incidents.goodput_cli",
                "where a run's wall-clock time went: productive time and badput by cause"),
}


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fsdpmon",
        description="Observability for PyTorch FSDP training on Kubernetes.",
        epilog="Run `fsdpmon COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"fsdpmon {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log info and debug messages (also accepted after the command)")
    lines = "\n".join(f"  {name:<10} {text}" for name, (_, text) in COMMANDS.items())
    parser.add_argument(
        "command", choices=list(COMMANDS), metavar="COMMAND", help="one of:\n" + lines
    )
    parser.formatter_class = argparse.RawTextHelpFormatter
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = _top_parser()
    # Split at the command so each command's own flags are parsed by its own parser.
    split = next((i for i, a in enumerate(argv) if a in COMMANDS), len(argv))
    ns = top.parse_args(argv[: split + 1])
    module_name, text = COMMANDS[ns.command]
    module = importlib.import_module(module_name)
    sub = argparse.ArgumentParser(prog=f"fsdpmon {ns.command}", description=text,
                                  formatter_class=HelpFormatter)
    module.configure(sub)
    with contextlib.suppress(argparse.ArgumentError):  # unless the command has its own -v
        sub.add_argument("-v", "--verbose", action="store_true", dest="_fsdpmon_verbose",
                         help="log info and debug messages")
    args = sub.parse_args(argv[split + 1 :])
    # Commands see only their own flags (manifests maps them onto its config one to one).
    verbose = vars(args).pop("_fsdpmon_verbose", False) or ns.verbose
    quiet = ns.command not in SERVICES
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO,
        format=(f"fsdpmon {ns.command}: %(levelname)s: %(message)s" if quiet and not verbose
                else "%(asctime)s %(levelname)s %(name)s: %(message)s"),
    )
    return guarded(lambda: module.run(args), prog=f"fsdpmon {ns.command}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
