"""An XID the judge names only where the page does (FsdpmonGPUXidErrors pages no XID of a GPU
that is down, or that has uncorrected ECC errors): the loss or the ECC error is the finding,
the XID its evidence.

Found by tests/test_doors_agree.py on the recorded `gpu-lost` (XID 79 with the GPU down: the
judge named gpu_xid for the 10 s before the loss had held its window, the rules never) and
`ecc-uncorrected` (XID 94 with the uncorrected error: the judge named gpu_ecc and gpu_xid, the
rules gpu_ecc alone).
"""

from __future__ import annotations

from top_snapshots import diagnosis_history

from fsdpmon.diagnose import diagnose

N = 8  # snapshots: the XID and the error rise at the third


def test_an_xid_of_a_gpu_down_now_is_not_named_before_the_loss_is():
    def at(i: int) -> dict:
        rose = i >= N - 2  # down in the last two snapshots: not yet for the whole window
        return {"gpu": {(0, 1): {"up": not rose, "xids": ((79, 1),) if rose else ()}}}
    assert [f.cause for f in diagnose(diagnosis_history(at, N))] == []


def test_an_xid_of_a_gpu_up_is_named():
    def at(i: int) -> dict:
        return {"gpu": {(0, 1): {"xids": ((79, 1),) if i >= 2 else ()}}}
    assert [f.cause for f in diagnose(diagnosis_history(at, N))] == ["gpu_xid"]


def test_the_xid_of_an_uncorrected_error_is_its_evidence():
    def at(i: int) -> dict:
        rose = i >= 2
        return {"gpu": {(0, 1): {"ecc_uncorrected": 1 if rose else 0,
                                 "xids": ((94, 1),) if rose else ()},
                        (1, 1): {"xids": ((13, 1),) if rose else ()}}}
    found = diagnose(diagnosis_history(at, N))
    assert [(f.cause, f.node, f.gpu) for f in found] == [
        ("gpu_ecc", "node-0", "1"), ("gpu_xid", "node-1", "1")], found
    assert "XID 94 (0 → 1)" in found[0].evidence, found[0].evidence

