"""The first non-finite value after the fact (fsdpmon/diagnose/after.py's first_nonfinite, which
`incidents` asks from the files): the earliest step, within it a loss before a gradient norm
(the live judge's order, fsdpmon/diagnose/loss_rules.py), then the lowest rank.

Found by tests/test_doors_agree.py on the recorded `nan-logits`: rank 1's logits went NaN at
step 60, so its loss did; through the gradient reduce rank 0's gradient norm went NaN in the
same step. The live judge named rank 1, the files rank 0 (step 60 on both, the lower rank).
"""

from __future__ import annotations

import pytest
from matrix_doors import recordings

from fsdpmon.diagnose.after import first_nonfinite
from fsdpmon.diagnose.replay import run_stragglers
from fsdpmon.incidents.incidents import incidents
from fsdpmon.job.run_goodput import goodput
from fsdpmon.job.runlog import load_run


@pytest.mark.parametrize("steps, gradient_first, rank", [
    ({0: 60, 1: 60}, frozenset({0}), 1),  # rank 0's gradient, rank 1's loss: the loss
    ({0: 60, 1: 60}, frozenset(), 0),  # both losses: the lower rank
    ({0: 59, 1: 60}, frozenset({0}), 0),  # an earlier step comes first, gradient or not
])
def test_the_earliest_step_then_a_loss_then_the_lowest_rank(steps, gradient_first, rank):
    assert first_nonfinite(steps, gradient_first).rank == rank


def test_the_recorded_nan_logits_run_names_the_rank_whose_loss_went_first(tmp_path):
    (rec,) = [r for r in recordings() if r.name == "nan-logits"]
    run = load_run(str(rec.write_files(tmp_path / "run")))
    found = [(i.cause, i.rank) for i in incidents(run, goodput(run, run_stragglers(run)))]
    assert found == [("loss_nonfinite", 1)], found
