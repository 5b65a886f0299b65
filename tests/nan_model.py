"""A model that goes bad on its own: on the rank named by $NAN_MODEL_RANK, the bundled
Transformer's output becomes NaN from its $NAN_MODEL_FROM_CALL-th forward on, the way an
overflowing activation poisons a run. Nothing goes through the trainer's fault injector: the
loss, its backward and the optimizer see what the model computed (so NaN spreads to every rank
through the gradient all-reduce, as it does in real data-parallel training).

Installed by a sitecustomize the test writes (`import nan_model; nan_model.install()`), which
every Python process on that PYTHONPATH runs at start: torchrun's workers patch the class
before the trainer builds the model; every other process leaves it alone.
"""

from __future__ import annotations

import os


def install() -> None:
    rank, start = os.environ.get("NAN_MODEL_RANK"), os.environ.get("NAN_MODEL_FROM_CALL")
    if rank is None or start is None or os.environ.get("RANK") != rank:
        return
    from fsdpmon.trainer import model

    forward = model.Transformer.forward
    calls = [0]

    def poisoned(self, tokens):  # type: ignore[no-untyped-def]
        out = forward(self, tokens)
        calls[0] += 1
        return out * float("nan") if calls[0] >= int(start) else out

    model.Transformer.forward = poisoned  # type: ignore[method-assign]
