"""A rank's collectives as the wrapper (fsdpmon.monitor.collectives) notes them: the call last
entered (op, its first tensor's elements and dtype, its number), the last completed, and the
open step's fingerprint (count, rolling hash of each call's key, the keys by position, which
the next step compares with). Plain integers, nothing allocated per call but the key.

A call's key: op | dtype << 8 | group << 16 | elements << 24. The group is the order of its
first use in a step (0: the default group), not its ranks or name: HSDP's ranks {0,1} and
{2,3} run one program on other groups of one role and must print alike.
"""

from __future__ import annotations

from _thread import get_ident
from typing import Any

from fsdpmon.conventions import DTYPE_NAMES

# The step's fingerprint: a polynomial rolling hash of each call's key (op | dtype << 8 | group
# << 16 | elements << 24), cut to 52 bits: exact in the float64 gauge it is published as.
HASH_MASK = (1 << 52) - 1
_HASH_PRIME = 1000003  # small: the product stays a short int (0.05 us less a call)
PATTERN_CAP = 512  # a step's calls whose keys the next step compares with (by position)
GROUP_CAP = 255  # group ordinals fill 8 bits of the key: the 255th group and later share one

_dtype_code: dict[Any, int] = {}  # torch.dtype -> DTYPE_NAMES index + 1 (know_tensors)


# The first tensor's parameter name, in the order the ops' signatures put them first: FSDP2
# calls reduce_scatter_tensor(output=..., input=...) with no positional argument at all.
_FIRST_TENSOR = ("tensor", "output", "output_tensor", "input_tensor", "input")


def by_keyword(kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The call's first tensor when every argument came by keyword, as ``note`` reads args."""
    return next(((kwargs[k],) for k in _FIRST_TENSOR if k in kwargs), ())


class Calls:
    """This process's collectives: the last one entered (op, number, and the code, elements and
    dtype of its first tensor), the number of the last one completed, how deep the wrapper is
    nested now, the timer it feeds (None: nothing is timed), and the open step's fingerprint:
    its calls so far, their rolling hash, and each call's key by position, which the next step
    compares with (``off_pattern``: this call's key differs from the previous step's there)."""

    __slots__ = ("code", "depth", "done", "dtype", "elems", "groups", "hash", "keys", "last_step",
                 "n", "off_pattern", "op", "prev_keys", "prev_n", "seq", "thread", "timer")

    def __init__(self) -> None:
        self.op: str | None = None
        self.seq = 0
        self.done = 0
        self.depth = 0
        self.timer: Any = None  # collectives.CollectiveTimer
        self.code = self.elems = self.dtype = self.off_pattern = 0
        self.n = self.hash = self.prev_n = 0
        self.keys, self.prev_keys = [0] * PATTERN_CAP, [0] * PATTERN_CAP
        self.last_step: tuple[int, int, int] | None = None  # (calls, hash, seq at its end)
        self.thread = 0  # the thread that opened the step: only its calls are fingerprinted
        # group -> ordinal. Keyed by the object, which the dict holds: its id is never reused
        # for another group, and torch hands back this same object for the group each time.
        self.groups: dict[Any, int] = {None: 0}

    def note(self, code: int, args: tuple[Any, ...], armed: bool, sized: bool = True,
             group: Any = None) -> None:
        """The call's op, first tensor's size and dtype; in a step also its fingerprint, with
        its group's ordinal (no allocation but the key's int)."""
        if args:  # the tensor is first, or second after all_gather's output list
            arg = args[1] if type(arg := args[0]) is list and len(args) > 1 else arg
            try:  # not isinstance(arg, torch.Tensor): its metaclass check costs 0.1 us
                elems, dtype = arg.numel(), _dtype_code.get(arg.dtype, 0)
            except AttributeError:  # an object collective's list or object
                elems = dtype = 0
        else:
            elems = dtype = 0
        self.code, self.elems, self.dtype = code, elems, dtype
        # Another thread's calls (an async checkpoint's) fall into the step at a different
        # point on each rank: in the fingerprint they would differ where nothing is wrong.
        if not armed or get_ident() != self.thread:
            self.off_pattern = 0
            return
        try:
            ordinal = self.groups[group]
        except KeyError:
            ordinal = self.first_use(group)
        except TypeError:  # unhashable: no group (torch will refuse the call)
            ordinal = GROUP_CAP
        key, at = code | dtype << 8 | ordinal << 16 | (elems << 24 if sized else 0), self.n
        self.n = at + 1
        self.hash = (self.hash * _HASH_PRIME + key) & HASH_MASK
        self.off_pattern = at >= self.prev_n or self.prev_keys[at] != key  # a bool: 0 or 1
        if at < PATTERN_CAP:
            self.keys[at] = key

    def first_use(self, group: Any) -> int:
        """A group's ordinal at its first use in a step: 0 for the world group, else the next."""
        from torch.distributed import distributed_c10d

        world = group is distributed_c10d.GroupMember.WORLD
        ordinal = 0 if world else min(max(self.groups.values()) + 1, GROUP_CAP)
        self.groups[group] = ordinal
        return ordinal

    def step_begin(self) -> None:
        self.n = self.hash = 0
        self.thread = get_ident()

    def step_end(self, completed: bool) -> None:
        """The step's fingerprint becomes the last step's; its keys the pattern for the next."""
        if completed:
            self.last_step = (self.n, self.hash, self.seq)
            self.keys, self.prev_keys = self.prev_keys, self.keys
            self.prev_n = min(self.n, PATTERN_CAP)
        self.n = self.hash = 0


def know_tensors() -> None:
    import torch

    _dtype_code.update({getattr(torch, n): i + 1 for i, n in enumerate(DTYPE_NAMES)
                        if hasattr(torch, n)})
