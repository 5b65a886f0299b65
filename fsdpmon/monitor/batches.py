"""What the adapters count as a batch's tokens, from the batch a library hands its hooks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def batch_tokens(batch: Any) -> int:
    """Tokens in one micro-batch: the input ids' element count. Input ids are a tensor alone,
    the first item of a tuple or list (``(inputs, targets)``), or ``input_ids`` in a mapping
    (HF style). 0 when the batch holds none of these (tokens/s then reads 0: pass a count)."""
    if isinstance(batch, Mapping):
        batch = batch.get("input_ids")
    elif isinstance(batch, (tuple, list)) and batch:
        batch = batch[0]
    numel = getattr(batch, "numel", None)
    return int(numel()) if callable(numel) else 0
