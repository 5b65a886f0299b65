"""The bundled trainer with a fault patched in from outside (not through FSDPMON_FAULT), run as
torchrun's script: ``torchrun ... tests/trainer_outside_faults.py <trainer flags>``.

``OUTSIDE_NAN_LOGITS=rank=R,step=S``: rank R's model returns NaN logits in step S (every
micro-batch of it; with ``OUTSIDE_NAN_INPUTS=PATH`` it saves their inputs there, for a test to
check the replayed batch against), as a numerically unstable layer on one rank would; nothing
else is touched,
so the NaN goes wherever real training takes it (its loss, then through the gradient
reduce-scatter into every rank's gradients and weights). The model's forward and the trainer's
step are wrapped by monkeypatching, the way a user's debugging hook would be.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for `trainer`

NAN_LOGITS = "OUTSIDE_NAN_LOGITS"
NAN_INPUTS = "OUTSIDE_NAN_INPUTS"


def _spec(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=", 1) for part in text.split(","))}


def patch_nan_logits(rank: int, step: int) -> None:
    import torch

    from fsdpmon.trainer import loop, model

    current = {"step": 0}
    train_step = loop.Trainer.train_step

    def counted(self: Any, mon: Any) -> None:
        current["step"] = self.step + 1  # the step being made, as the console counts it
        train_step(self, mon)

    forward = model.Transformer.forward

    def poisoned(self: Any, *args: Any, **kwargs: Any) -> Any:
        logits = forward(self, *args, **kwargs)
        if current["step"] == step and int(os.environ.get("RANK", "0")) == rank:
            logits = logits + torch.full_like(logits, float("nan"))
            if os.environ.get(NAN_INPUTS):
                torch.save(args[0], os.environ[NAN_INPUTS])
        return logits

    loop.Trainer.train_step = counted  # type: ignore[method-assign]
    model.Transformer.forward = poisoned  # type: ignore[method-assign]


def main() -> None:
    spec = os.environ.get(NAN_LOGITS)
    if spec:
        where = _spec(spec)
        patch_nan_logits(where["rank"], where["step"])
    from fsdpmon.trainer.parallel import exit_process
    from fsdpmon.trainer.train import main as train_main

    exit_process(train_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
