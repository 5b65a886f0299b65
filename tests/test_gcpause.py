"""The collector around top's refreshes (fsdpmon.scrape.gcpause): held off during one, what
survives frozen only in top's own processes, and cyclic garbage among the frozen still collected
every UNFREEZE_EVERY-th refresh. Each case runs in a fresh interpreter: freezing is
process-wide, and this one is pytest's."""

from __future__ import annotations

import subprocess
import sys
import textwrap

_PRELUDE = """
import gc, weakref
from fsdpmon.scrape.gcpause import UNFREEZE_EVERY, collector_paused, top_owns_this_process

class Node:
    pass

def cycle():
    node = Node()
    node.me = node
    return node
"""


def _run(body: str) -> None:
    script = _PRELUDE + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr[-3000:]}"


def test_a_refresh_holds_off_the_collector_and_elsewhere_freezes_nothing():
    _run("""
        with collector_paused():
            assert not gc.isenabled(), "the collector ran during a refresh"
            kept = cycle()
        assert gc.isenabled(), "the collector was not switched back on"
        assert gc.get_freeze_count() == 0, f"{gc.get_freeze_count()} frozen outside top"
        ref = weakref.ref(kept)
        del kept
        gc.collect()
        assert ref() is None, "a cycle outside top waits for no one"
        gc.disable()
        with collector_paused():
            pass
        assert not gc.isenabled(), "a collector the caller had switched off came back on"
    """)


def test_in_top_the_survivors_are_frozen_and_their_cycles_collected_every_so_often():
    _run("""
        top_owns_this_process()
        with collector_paused():
            kept = cycle()
        frozen = gc.get_freeze_count()
        assert frozen > 0 and gc.isenabled(), f"{frozen} objects frozen after a refresh"
        ref = weakref.ref(kept)
        del kept
        gc.collect()
        assert ref() is not None, "a frozen cycle was collected before its time"
        for n in range(2, UNFREEZE_EVERY + 1):
            with collector_paused():
                pass
            gc.collect()
            if n < UNFREEZE_EVERY:
                assert ref() is not None, f"collected at refresh {n}"
        assert gc.get_freeze_count() == 0, "every UNFREEZE_EVERY-th refresh thaws them all"
        assert ref() is None, f"the cycle outlived refresh {UNFREEZE_EVERY}"
    """)
