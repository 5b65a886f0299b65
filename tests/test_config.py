"""Trainer configuration: flags → typed dataclasses, and validation that names the field."""

from __future__ import annotations

import pytest

from fsdpmon.errors import ConfigError, InputError
from fsdpmon.trainer.config import TrainConfig, model_args_for, parse_config


def test_defaults_and_flags_fill_the_dataclass_tree():
    cfg = parse_config(["--model", "llama2-7b", "--n-layers", "2", "--batch-size", "8",
                        "--grad-accum", "4", "--checkpoint-dir", "/ck", "--checkpoint-every",
                        "50", "--activation-checkpointing", "--metrics-port", "0"])
    assert isinstance(cfg, TrainConfig)
    assert cfg.model.name == "llama2-7b" and cfg.model.overrides == {"n_layers": 2}
    assert (cfg.data.batch_size, cfg.data.grad_accum, cfg.data.source) == (8, 4, "synthetic")
    assert cfg.checkpoint.dir == "/ck" and cfg.checkpoint.every == 50
    assert cfg.parallel.activation_checkpointing and cfg.log.metrics_port == 0
    args = model_args_for(cfg)
    assert (args.dim, args.n_layers, args.vocab_size) == (4096, 2, 32000)
    assert cfg.to_json()["optim"]["lr"] == 3e-4


@pytest.mark.parametrize(("argv", "field"), [
    (["--model", "gpt5"], "--model"),
    (["--seq-len", "0"], "--seq-len"),
    (["--max-steps", "-1"], "--max-steps"),
    (["--lr", "0"], "--lr"),
    (["--metrics-port", "70000"], "--metrics-port"),
    (["--job-name", "Bad_Name"], "--job-name"),
    (["--min-lr-ratio", "2"], "--min-lr-ratio"),
    (["--dim", "0"], "--dim"),
    (["--batch-size", "two"], "command line"),
    (["--no-such-flag"], "command line"),
    (["--checkpoint-every", "5"], "--checkpoint-every"),
])
def test_bad_values_raise_config_error_naming_the_field(argv, field):
    with pytest.raises(ConfigError) as info:
        parse_config(argv)
    assert info.value.field == field


def test_inconsistent_shapes_are_rejected_by_name():
    with pytest.raises(ConfigError, match="--n-kv-heads"):
        model_args_for(parse_config(["--model", "custom", "--n-heads", "4", "--n-kv-heads", "3"]))
    with pytest.raises(ConfigError, match="--dim"):
        model_args_for(parse_config(["--model", "custom", "--dim", "66", "--n-heads", "4"]))
    with pytest.raises(ConfigError, match="--seq-len"):
        model_args_for(parse_config(["--seq-len", "5000"]))


def test_missing_paths_raise_input_error_naming_the_flag(tmp_path):
    with pytest.raises(InputError, match=r"--data: .* does not exist"):
        parse_config(["--data", str(tmp_path / "nope.txt")])
    with pytest.raises(InputError, match=r"--tokenizer: .* has no tokenizer\.json"):
        parse_config(["--tokenizer", str(tmp_path)])
    with pytest.raises(InputError, match=r"--hf-checkpoint: .* has no config\.json"):
        parse_config(["--hf-checkpoint", str(tmp_path)])
