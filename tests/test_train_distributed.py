"""2-rank FSDP2 vs one plain process: gradient/parameter parity, and HF logits fidelity.

One torchrun run (tests/trainer_parity_worker.py) produces both; see that file.
"""

from __future__ import annotations

import pytest
import torch
from trainer_launch import REPO, run, torchrun_args

from trainer.config import parse_config
from trainer.data import BatchLoader, build_source
from trainer.model import FLAVOURS, Transformer
from trainer.train import build_optimizer, clip_gradients

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")


def make_hf_checkpoint(path) -> transformers.LlamaForCausalLM:
    """A random tiny Llama with GQA and uneven shard sizes, saved as several safetensors."""
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=175, vocab_size=509, max_position_embeddings=128,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )
    torch.manual_seed(11)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True, max_shard_size="100KB")
    return model


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity")
    hf_dir = out / "hf"
    hf_model = make_hf_checkpoint(hf_dir)
    tokens = torch.randint(0, 509, (2, 24), generator=torch.Generator().manual_seed(5))
    torch.save(tokens, out / "tokens.pt")
    worker = str(REPO / "tests" / "trainer_parity_worker.py")
    code, log = run(torchrun_args(2, [worker, str(out), str(hf_dir)]), out / "log.txt",
                    timeout=150)
    assert code == 0, log[-4000:]
    with torch.no_grad():
        hf_logits = hf_model(tokens).logits
    return {"fsdp": torch.load(out / "parity_fsdp.pt"), "ours": torch.load(out / "logits_ours.pt"),
            "hf": hf_logits, "hf_dir": hf_dir}


def reference_step(initial: dict[str, torch.Tensor]) -> dict[str, object]:
    """The same global batch and optimiser step in one process, without FSDP."""
    from trainer_parity_worker import PARITY_FLAGS

    cfg = parse_config(PARITY_FLAGS)
    model = Transformer(FLAVOURS["tiny"])
    model.load_state_dict(initial)
    d = cfg.data
    world = 2
    loader = BatchLoader(build_source("synthetic", None, 512, d.seq_len, cfg.seed),
                         d.batch_size * world, rank=0, world_size=1)
    global_tokens = d.batch_size * world * d.seq_len * d.grad_accum
    loss_total = 0.0
    for _ in range(d.grad_accum):
        inputs, targets = next(loader)
        loss_sum = torch.nn.functional.cross_entropy(
            model(inputs).flatten(0, 1), targets.flatten(), reduction="sum")
        (loss_sum / global_tokens).backward()
        loss_total += float(loss_sum.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    optim, _ = build_optimizer(model, cfg)
    grad_norm = clip_gradients(model, cfg.optim.grad_clip)
    optim.step()
    return {"grads": grads, "after": model.state_dict(), "loss": loss_total / global_tokens,
            "grad_norm": float(grad_norm)}


def test_sharded_init_equals_plain_init_for_the_same_seed(results):
    plain = Transformer(FLAVOURS["tiny"])
    plain.init_weights(seed=3)  # the worker's --seed
    for name, value in plain.state_dict().items():
        assert torch.equal(results["fsdp"]["initial"][name], value), name


def test_gradients_and_parameters_match_a_single_process(results):
    fsdp = results["fsdp"]
    ref = reference_step(fsdp["initial"])
    assert set(fsdp["grads"]) == set(ref["grads"])
    for name, grad in ref["grads"].items():
        # A gloo "sum instead of mean" bug would double every gradient: far outside 1e-5.
        torch.testing.assert_close(fsdp["grads"][name], grad, rtol=0, atol=1e-5, msg=name)
    for name, value in ref["after"].items():
        torch.testing.assert_close(fsdp["after"][name], value, rtol=0, atol=1e-5, msg=name)
    assert fsdp["loss"] == pytest.approx(ref["loss"], abs=1e-5)
    assert fsdp["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    # The step really moved the weights (so equality above is not trivially "nothing happened").
    moved = (fsdp["after"]["output.weight"] - fsdp["initial"]["output.weight"]).abs().max()
    assert moved > 1e-4


def test_logits_match_transformers_llama_loaded_through_hf_checkpoint(results):
    assert len(list(results["hf_dir"].glob("*.safetensors"))) > 1  # sharded checkpoint
    ours, hf = results["ours"], results["hf"]
    assert ours.shape == hf.shape == (2, 24, 509)
    torch.testing.assert_close(ours, hf, rtol=0, atol=1e-4)
