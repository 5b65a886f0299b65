"""The bundled trainer with a loss spike patched in from outside (not through FSDPMON_FAULT), run
as torchrun's script: ``torchrun ... tests/spike_trainer.py <flags>``.

``OUTSIDE_SPIKE=rank=R,trigger=PATH``: while the file PATH exists, rank R's model multiplies
its logits by the number PATH holds (an activation blown up on one GPU, as issue 51's patched
model did with 30); the loss, its backward and the optimiser see what the model computed, so
the others feel it only through the averaged gradient. The first step it is on is written to
``PATH.step`` for the test to compare with what fsdpmon names. The model's class and the
trainer's step are patched by monkeypatching, as a user's debugging hook would be.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for `trainer`

SPIKE = "OUTSIDE_SPIKE"


def _scale(trigger: Path) -> float:
    try:
        return float(trigger.read_text() or 1.0)
    except (OSError, ValueError):  # absent, or being written
        return 1.0


def patch_scaled_logits(trigger: Path) -> None:
    from fsdpmon.trainer import loop, model

    scale = [1.0]
    accumulate, forward = loop.Trainer.accumulate_gradients, model.Transformer.forward

    def watched(self: Any, mon: Any) -> Any:
        # looked at once a step, before its forward: the spike begins and ends on a step
        now = _scale(trigger)
        if now != 1.0 and not trigger.with_suffix(".step").exists():
            trigger.with_suffix(".step").write_text(str(self.step + 1))
        scale[0] = now
        return accumulate(self, mon)

    def scaled(self: Any, tokens: Any) -> Any:
        out = forward(self, tokens)
        return out * scale[0] if scale[0] != 1.0 else out

    loop.Trainer.accumulate_gradients = watched  # type: ignore[method-assign]
    model.Transformer.forward = scaled  # type: ignore[method-assign]


def main() -> None:
    spec = os.environ.get(SPIKE)
    if spec:
        where = dict(p.split("=", 1) for p in spec.split(","))
        if os.environ.get("RANK") == where["rank"]:
            patch_scaled_logits(Path(where["trigger"]))
    from fsdpmon.trainer.parallel import exit_process
    from fsdpmon.trainer.train import main as train_main

    exit_process(train_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
