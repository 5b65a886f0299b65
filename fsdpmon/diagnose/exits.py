"""How the ranks' previous lives ended, as their restarted processes said: the only witness of
which rank died when the elastic agent stops and restarts them all at once."""

from __future__ import annotations

from fsdpmon.conventions import EXIT_ERROR, EXIT_HOWS, EXIT_KILLED, EXIT_NORMAL, EXIT_SIGTERM
from fsdpmon.diagnose.findings import ranks_text

Exits = dict[int, tuple[str, int | None]]  # rank → (how, step)

_ENDED = {EXIT_KILLED: "died without exiting (killed: SIGKILL, the OOM killer or a segfault)",
          EXIT_SIGTERM: "stopped by a signal (the agent's SIGTERM)",
          EXIT_ERROR: "exited on an error", EXIT_NORMAL: "had finished"}


def killed(exits: Exits) -> list[int]:
    """The ranks whose previous lives ended without a word: the ones that died."""
    return sorted(r for r, (how, _) in exits.items() if how == EXIT_KILLED)


def died(exits: Exits) -> tuple[list[int], str]:
    """The ranks that brought the group down, and how they ended: those killed; else the one
    that ended on an error while every other rank was stopped by the agent's SIGTERM (the agent
    stops the others only when a worker has failed, so the error came first). ([], "") when
    nobody can be told: no report, everyone stopped alike, or several ranks failing on errors
    (each may be another's casualty)."""
    gone = killed(exits)
    if gone:
        return gone, EXIT_KILLED
    errors = sorted(r for r, (how, _) in exits.items() if how == EXIT_ERROR)
    others = [how for r, (how, _) in exits.items() if r not in errors]
    if len(errors) == 1 and others and all(how == EXIT_SIGTERM for how in others):
        return errors, EXIT_ERROR
    return [], ""


def exit_evidence(exits: Exits) -> list[str]:
    """One line per way of ending, killed first: 'rank 1 died without exiting (...) after
    step 60 (its last log step)', 'rank 0 stopped by a signal (the agent's SIGTERM) ...'."""
    out = []
    for how in EXIT_HOWS:
        ranks = sorted(r for r, (h, _) in exits.items() if h == how)
        if not ranks:
            continue
        steps = sorted({s for r in ranks if (s := exits[r][1]) is not None})
        at = "" if not steps else f" after step {steps[0]}" if len(steps) == 1 else (
            f" after steps {steps[0]}–{steps[-1]}")
        last = " (its last log step)" if how == EXIT_KILLED and steps else ""
        out.append(f"{ranks_text(ranks)} {_ENDED[how]}{at}{last}")
    return out
