"""Where a NaN was born: the earliest rank and step over every rank's first non-finite loss and
grad norm (the loss first within a step), "every rank" only on a true tie."""

from __future__ import annotations

from top_snapshots import REFRESH_S, T0, diagnosis_history, ranks, results

from fsdpmon.conventions import DIAGNOSIS_EVIDENCE_SECONDS
from fsdpmon.diagnose import Finding, diagnose
from fsdpmon.scrape.aggregate import aggregate

N = int(DIAGNOSIS_EVIDENCE_SECONDS // 2) + 2


def nonfinite(specs: dict) -> Finding:
    """Every rank's loss NaN now (it spread), with the given first steps."""
    every = {f"r{r}": {"loss_nonfinite": True, **specs.get(f"r{r}", {})} for r in range(4)}
    found = diagnose(diagnosis_history(lambda i: {"specs": every}, N))
    assert [f.cause for f in found] == ["loss_nonfinite"], found
    return found[0]


def spread_from(rank: int, step: int) -> dict:
    """A NaN born in ``rank``'s logits at ``step``: its loss then, every grad norm then (the
    reduce-scatter), every other loss the step after."""
    return {f"r{r}": {"loss_first_nonfinite_step": step if r == rank else step + 1,
                      "grad_norm_first_nonfinite_step": step} for r in range(4)}


def test_the_rank_whose_loss_went_first_is_named_with_its_step():
    f = nonfinite(spread_from(2, 600))
    assert (f.rank, f.pod, f.node) == (2, "llama-worker-1", "node-1"), f
    assert f.summary == "loss became NaN/inf on rank 2 first, at step 600", f.summary
    assert any("then ranks 0, 1, 3 at step 600 (grad norm)" in e for e in f.evidence), (
        f.evidence)
    assert any('"kind": "nonfinite"' in e for e in f.evidence), f.evidence


def test_one_step_apart_is_not_a_tie_but_the_same_step_is():
    f = nonfinite({"r3": {"loss_first_nonfinite_step": 41},
                   **{f"r{r}": {"loss_first_nonfinite_step": 42} for r in range(3)}})
    assert f.rank == 3 and "at step 41" in f.summary, f
    f = nonfinite({f"r{r}": {"loss_first_nonfinite_step": 42} for r in range(4)})
    assert f.rank is None and f.summary == "loss became NaN/inf on every rank first, at step 42"


def test_the_loss_comes_before_the_grad_norm_within_a_step():
    """Rank 0's grad norm and rank 1's loss at step 7: the loss is computed first."""
    f = nonfinite({"r0": {"grad_norm_first_nonfinite_step": 7},
                   "r1": {"loss_first_nonfinite_step": 7}})
    assert f.rank == 1 and f.summary.startswith("loss became"), f
    f = nonfinite({"r0": {"grad_norm_first_nonfinite_step": 7},
                   "r1": {"loss_first_nonfinite_step": 8}})
    assert f.rank == 0 and f.summary == "grad norm became NaN/inf on rank 0 first, at step 7"


def test_two_ranks_tied_are_both_said_and_none_is_picked():
    f = nonfinite({"r1": {"loss_first_nonfinite_step": 9}, "r3": {"loss_first_nonfinite_step": 9}})
    assert f.rank is None and "ranks 1, 3 first" in f.summary, f


def test_without_first_steps_the_ranks_showing_it_are_named():
    found = diagnose(diagnosis_history(
        lambda i: {"specs": {"r1": {"loss_nonfinite": True}}}, N))
    assert [(f.cause, f.rank) for f in found] == [("loss_nonfinite", 1)]


def small_job(world: int, specs: dict) -> Finding:
    """A one-node job of ``world`` ranks, every loss NaN now, with the given first steps."""
    every = {f"r{r}": {"loss_nonfinite": True, **specs.get(f"r{r}", {})} for r in range(world)}
    snaps = []
    for i in range(N):
        scraped = results(ranks(n_nodes=1, per_node=world, **every), per_node=world)
        snaps.append(aggregate(scraped, now=T0 + REFRESH_S * i, source="targets",
                               previous=snaps[-1] if snaps else None))
    found = diagnose(snaps)
    assert [f.cause for f in found] == ["loss_nonfinite"], found
    return found[0]


def test_a_one_rank_job_names_its_rank_not_every_rank():
    f = small_job(1, {"r0": {"loss_first_nonfinite_step": 5}})
    assert f.summary == "loss became NaN/inf on rank 0 first, at step 5", f.summary
    assert f.rank == 0, f


def test_both_ranks_of_a_two_rank_job_at_once_is_every_rank():
    f = small_job(2, {f"r{r}": {"loss_first_nonfinite_step": 5} for r in range(2)})
    assert f.summary == "loss became NaN/inf on every rank first, at step 5", f.summary
    assert f.rank is None, f


def test_evidence_reads_first_the_origin_then_the_later_ranks_then_how_long():
    f = nonfinite({"r2": {"loss_first_nonfinite_step": 600},
                   "r0": {"grad_norm_first_nonfinite_step": 601},
                   "r1": {"loss_first_nonfinite_step": 603}})
    want = ('first non-finite loss: rank 2 at step 600; the batch is in the rank\'s JSONL '
            '("kind": "nonfinite")',
            "then rank 0 at step 601 (grad norm)",
            "then rank 1 at step 603 (loss)",
            f"non-finite loss on ranks 0, 1, 2, 3 for {DIAGNOSIS_EVIDENCE_SECONDS:.0f}s")
    assert f.evidence == want, f"{f.evidence!r} != {want!r}"
