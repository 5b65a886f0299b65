"""The one small error hierarchy of the project.

Every error a user can cause (a bad flag, a bad config file, an unreachable target) is raised as
one of these; ``guarded`` (below) turns them into a one-line message and an exit code, so no
user ever sees a traceback for their own mistake.
"""

from __future__ import annotations

import sys
from collections.abc import Callable


class FsdpmonError(Exception):
    """Base of every error fsdpmon reports to a user."""

    exit_code = 1


class ConfigError(FsdpmonError):
    """A bad flag, environment variable or config value; the message names the field."""

    exit_code = 2

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class UsageError(FsdpmonError):
    """The command cannot run the way it was asked (e.g. a live view with no terminal)."""

    exit_code = 2


class InputError(FsdpmonError):
    """A file or directory the user pointed at is missing, empty or malformed."""

    exit_code = 2


class MissingExtraError(FsdpmonError):
    """A command needs a package of an optional extra that is not installed."""

    exit_code = 2

    def __init__(self, what: str, extra: str) -> None:
        super().__init__(f"{what} needs the '{extra}' extra: pip install 'fsdpmon[{extra}]'")


class UnreachableError(FsdpmonError):
    """A target, API server or Prometheus could not be reached or refused the request."""

    exit_code = 3


class JobUnhealthyError(FsdpmonError):
    """``--once`` found the job stalled or down (documented exit status for cron checks)."""

    exit_code = 4


def guarded(fn: Callable[[], int], prog: str = "fsdpmon") -> int:
    """Run ``fn``; turn FsdpmonError into one line on stderr and its exit code.

    Ctrl-C exits 130 quietly. Anything else is a bug and keeps its traceback.
    """
    try:
        return fn()
    except FsdpmonError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
