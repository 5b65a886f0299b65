"""Training data: synthetic tokens, or local text/JSONL files packed into fixed-length sequences.

Every source is an indexable list of samples (``seq_len + 1`` tokens: inputs and shifted
targets). A global sample position walks that list; each rank takes its own slice of each
global micro-batch, so the order depends only on the seed and the whole job's position is one
integer, saved in checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from fsdpmon.errors import ConfigError, InputError

TEXT_SUFFIXES = (".txt", ".md")
JSONL_SUFFIXES = (".jsonl",)
_EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>", "<|end_of_text|>")


class SampleSource(Protocol):
    def __len__(self) -> int: ...
    def sample(self, index: int) -> torch.Tensor: ...


class SyntheticSource:
    """Learnable synthetic sequences: x[t+1] = x[t] + 7 mod V, with 10% random tokens.

    Infinite; sample ``i`` depends only on (seed, i), so any rank can draw any sample.
    """

    def __init__(self, vocab_size: int, seq_len: int, seed: int) -> None:
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def __len__(self) -> int:
        return 2**62

    def sample(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        n = self.seq_len + 1
        start = int(torch.randint(0, self.vocab_size, (1,), generator=gen))
        out = (start + 7 * torch.arange(n)) % self.vocab_size
        noise = torch.rand(n, generator=gen) < 0.1
        out[noise] = torch.randint(0, self.vocab_size, (int(noise.sum()),), generator=gen)
        return out


class PackedSource:
    """A token stream cut into ``seq_len + 1`` windows (stride seq_len), reshuffled each epoch."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, seed: int) -> None:
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.n_windows = (len(tokens) - 1) // seq_len
        if self.n_windows < 1:
            raise InputError(f"--data: only {len(tokens)} tokens, fewer than --seq-len + 1 "
                             f"({seq_len + 1})")
        self._epoch, self._order = -1, torch.empty(0, dtype=torch.long)

    def __len__(self) -> int:
        return self.n_windows

    def sample(self, index: int) -> torch.Tensor:
        epoch, offset = divmod(index, self.n_windows)
        if epoch != self._epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch, self._order = epoch, torch.randperm(self.n_windows, generator=gen)
        start = int(self._order[offset]) * self.seq_len
        return self.tokens[start : start + self.seq_len + 1]


@dataclass
class Tokenizer:
    """A HF ``tokenizers`` tokenizer, or raw UTF-8 bytes when ``hf`` is None."""

    hf: object | None
    vocab_size: int
    eos_id: int | None

    def encode(self, text: str) -> list[int]:
        if self.hf is None:
            return list(text.encode("utf-8"))
        return self.hf.encode(text, add_special_tokens=False).ids  # type: ignore[attr-defined]


def load_tokenizer(directory: str | None) -> Tokenizer:
    if directory is None:
        return Tokenizer(None, 256, None)
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(directory) / "tokenizer.json"
    try:
        hf = HFTokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for malformed files
        raise InputError(f"--tokenizer: cannot read {path}: {exc}") from None
    vocab = hf.get_vocab(with_added_tokens=True)
    eos = next((vocab[n] for n in _EOS_NAMES if n in vocab), None)
    return Tokenizer(hf, hf.get_vocab_size(with_added_tokens=True), eos)


def data_files(source: str) -> list[Path]:
    root = Path(source)
    suffixes = TEXT_SUFFIXES + JSONL_SUFFIXES
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes
    )
    if not files:
        raise InputError(f"--data: no {'/'.join(suffixes)} files under {source}")
    return files


def read_documents(path: Path) -> Iterator[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--data: cannot read {path} as UTF-8 text: {exc}") from None
    if path.suffix not in JSONL_SUFFIXES:
        yield text
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"--data: {path}:{lineno}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str):
            raise InputError(f"--data: {path}:{lineno}: expected an object with a 'text' string")
        yield record["text"]


def tokenize_files(source: str, tokenizer: Tokenizer) -> torch.Tensor:
    ids: list[int] = []
    for path in data_files(source):
        for doc in read_documents(path):
            ids.extend(tokenizer.encode(doc))
            if tokenizer.eos_id is not None:
                ids.append(tokenizer.eos_id)
    return torch.tensor(ids, dtype=torch.long)


def build_source(source: str, tokenizer_dir: str | None, vocab_size: int, seq_len: int,
                 seed: int) -> SampleSource:
    if source == "synthetic":
        return SyntheticSource(vocab_size, seq_len, seed)
    tokenizer = load_tokenizer(tokenizer_dir)
    if tokenizer.vocab_size > vocab_size:
        raise ConfigError("--tokenizer", f"vocabulary of {tokenizer.vocab_size} tokens does not "
                          f"fit the model's vocab_size {vocab_size}")
    return PackedSource(tokenize_files(source, tokenizer), seq_len, seed)


class BatchLoader:
    """This rank's micro-batches: (inputs, targets), each (batch_size, seq_len) int64."""

    def __init__(self, source: SampleSource, batch_size: int, rank: int, world_size: int,
                 position: int = 0) -> None:
        self.source, self.batch_size = source, batch_size
        self.rank, self.world_size = rank, world_size
        self.position = position  # global sample index of the next micro-batch

    def __iter__(self) -> BatchLoader:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        first = self.position + self.rank * self.batch_size
        rows = torch.stack([self.source.sample(first + i) for i in range(self.batch_size)])
        self.position += self.batch_size * self.world_size
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])


def batch_at(source: SampleSource, batch_size: int, rank: int, world_size: int, position: int,
             micro_batches: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (inputs, targets) micro-batches ``rank`` trained on in the step that began at loader
    ``position`` (the ``batch`` of the monitor's ``"kind": "nonfinite"`` JSONL record): to
    replay the batch that produced a NaN."""
    loader = BatchLoader(source, batch_size, rank, world_size, position)
    return [next(loader) for _ in range(micro_batches)]
