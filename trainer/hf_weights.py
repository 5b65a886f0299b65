"""Hugging Face Llama checkpoints (config.json + safetensors in a local directory) → our model.

Loading goes tensor by tensor, and each rank reads only the rows of its own FSDP shard
(``safe_open(...).get_slice``), so no rank ever holds the whole model. Nothing is fetched from
a hub: gated weights are downloaded beforehand (with HF_TOKEN from the environment).

HF stores ``q_proj``/``k_proj`` rows permuted for its rotate-half rotary; our model uses Meta's
interleaved pairs, so those two are un-permuted head by head on the way in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fsdpmon.errors import InputError
from fsdpmon.trainer.model import ModelArgs, local_rows

log = logging.getLogger(__name__)

_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attention.wq.weight",
    "self_attn.k_proj.weight": "attention.wk.weight",
    "self_attn.v_proj.weight": "attention.wv.weight",
    "self_attn.o_proj.weight": "attention.wo.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
    "input_layernorm.weight": "attention_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_config(directory: str | Path) -> tuple[ModelArgs, dict[str, Any]]:
    """ModelArgs from a HF Llama config.json (and the raw dict, for tie_word_embeddings)."""
    path = Path(directory) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InputError(f"--hf-checkpoint: cannot read {path}: {exc}") from None
    if raw.get("model_type") != "llama":
        raise InputError(f"--hf-checkpoint: {path} has model_type {raw.get('model_type')!r}, "
                         "expected 'llama'")
    if raw.get("rope_scaling"):
        raise InputError(f"--hf-checkpoint: {path}: rope_scaling is not supported")
    try:
        heads = int(raw["num_attention_heads"])
        args = ModelArgs(
            dim=int(raw["hidden_size"]), n_layers=int(raw["num_hidden_layers"]), n_heads=heads,
            n_kv_heads=int(raw.get("num_key_value_heads") or heads),
            vocab_size=int(raw["vocab_size"]), ffn_dim=int(raw["intermediate_size"]),
            norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            max_seq_len=int(raw.get("max_position_embeddings", 4096)),
        )
    except KeyError as exc:
        raise InputError(f"--hf-checkpoint: {path} lacks {exc.args[0]!r}") from None
    if raw.get("head_dim") not in (None, args.head_dim):
        raise InputError(f"--hf-checkpoint: {path}: head_dim {raw['head_dim']} != "
                         "hidden_size / num_attention_heads is not supported")
    return args, raw


def name_map(args: ModelArgs) -> dict[str, tuple[str, int | None]]:
    """HF tensor name → (our parameter name, heads to un-permute or None)."""
    mapping: dict[str, tuple[str, int | None]] = {
        "model.embed_tokens.weight": ("tok_embeddings.weight", None),
        "model.norm.weight": ("norm.weight", None),
        "lm_head.weight": ("output.weight", None),
    }
    for i in range(args.n_layers):
        for hf, ours in _LAYER_NAMES.items():
            heads = {"attention.wq.weight": args.n_heads,
                     "attention.wk.weight": args.n_kv_heads}.get(ours)
            mapping[f"model.layers.{i}.{hf}"] = (f"layers.{i}.{ours}", heads)
    return mapping


def unpermute_rotary(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo transformers' convert_llama_weights_to_hf permutation of q/k rows."""
    rows, cols = weight.shape
    return weight.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def safetensors_files(directory: str | Path) -> list[Path]:
    root = Path(directory)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return [root / name for name in sorted(set(weight_map.values()))]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise InputError(f"--hf-checkpoint: {root} has no *.safetensors files")
    return files


def _copy_tensor(handle: Any, hf_name: str, param: torch.Tensor, heads: int | None) -> None:
    shape = tuple(handle.get_slice(hf_name).get_shape())
    if shape != tuple(param.shape):
        raise InputError(f"--hf-checkpoint: {hf_name} has shape {shape}, the model expects "
                         f"{tuple(param.shape)}")
    local, start, stop = local_rows(param)
    rows = handle.get_slice(hf_name)
    if heads is None:
        piece = rows[start:stop]
    else:
        piece = unpermuted_rows(lambda a, b: rows[a:b], shape[0] // heads, start, stop)
    local.copy_(piece.to(device=local.device, dtype=local.dtype))


def unpermuted_rows(read: Callable[[int, int], torch.Tensor], head_dim: int, start: int,
                    stop: int) -> torch.Tensor:
    """Rows [start, stop) of the un-permuted q/k weight, reading only the heads they touch.

    The permutation mixes rows within a head only, so a shard that cuts a head in two needs
    that whole head, and nothing more.
    """
    first, last = start // head_dim, -(-stop // head_dim)
    if stop <= start:
        return read(start, start)
    block = unpermute_rotary(read(first * head_dim, last * head_dim), last - first)
    return block[start - first * head_dim : stop - first * head_dim]


@torch.no_grad()
def load_hf_weights(model: nn.Module, directory: str | Path) -> None:
    """Overwrite every parameter of ``model`` (plain or FSDP-sharded) from the checkpoint."""
    from safetensors import safe_open

    args, raw = read_config(directory)
    params = dict(model.named_parameters())
    mapping = name_map(args)
    loaded: set[str] = set()
    for path in safetensors_files(directory):
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for hf_name in handle.keys():  # noqa: SIM118 - safe_open is not a dict
                if hf_name.endswith(_IGNORED_SUFFIXES):
                    continue
                if hf_name not in mapping:
                    raise InputError(f"--hf-checkpoint: unexpected tensor {hf_name} in {path}")
                ours, heads = mapping[hf_name]
                _copy_tensor(handle, hf_name, params[ours], heads)
                loaded.add(ours)
            if raw.get("tie_word_embeddings") and "model.embed_tokens.weight" in handle.keys():  # noqa: SIM118
                _copy_tensor(handle, "model.embed_tokens.weight", params["output.weight"], None)
                loaded.add("output.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise InputError(f"--hf-checkpoint: {directory} lacks weights for {', '.join(missing)}")
    log.info("loaded %d tensors from %s", len(loaded), directory)
