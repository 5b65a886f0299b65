"""2-rank FSDP2 vs one plain process: gradient/parameter parity, and HF logits fidelity.

One torchrun run (tests/trainer_parity_worker.py) produces both; see that file.
"""

from __future__ import annotations

import pytest
import torch
from trainer_launch import REPO, run, torchrun_args

from fsdpmon.trainer.config import parse_config
from fsdpmon.trainer.data import BatchLoader, build_source
from fsdpmon.trainer.loop import build_optimizer
from fsdpmon.trainer.model import FLAVOURS, Transformer

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


WORLD = 2  # the worker's --nproc_per_node
F32_UNIT_ROUNDOFF = 2.0**-24


def per_rank_gradients(initial: dict[str, torch.Tensor]) -> dict[str, object]:
    """FSDP2's gradients replayed in one process, in FSDP2's own order of additions.

    Each rank backpropagates its own micro-batch on the full (all-gathered) weights; after each
    micro-batch the reduce-scatter adds the two ranks' gradients (a + b: one addition, exact
    whatever the order), and the sharded gradient accumulates the micro-batches in turn. Doing the
    same additions in the same order here makes every gradient bit-identical, so the comparison
    is exact; one thread, as the worker's OMP_NUM_THREADS=1, so each matmul sums in the same order.
    """
    from trainer_parity_worker import PARITY_FLAGS

    cfg = parse_config(PARITY_FLAGS)
    d = cfg.data
    global_tokens = d.batch_size * WORLD * d.seq_len * d.grad_accum
    loaders = [BatchLoader(build_source("synthetic", None, 512, d.seq_len, cfg.seed),
                           d.batch_size, rank=r, world_size=WORLD) for r in range(WORLD)]
    models = []
    for _ in range(WORLD):
        model = Transformer(FLAVOURS["tiny"])
        model.load_state_dict(initial)
        models.append(model)
    accumulated: dict[str, torch.Tensor] = {}
    rank_losses = [torch.zeros(()) for _ in range(WORLD)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(d.grad_accum):
            micro = []
            for r, (model, loader) in enumerate(zip(models, loaders, strict=True)):
                model.zero_grad(set_to_none=True)
                inputs, targets = next(loader)
                loss_sum = torch.nn.functional.cross_entropy(
                    model(inputs).float().flatten(0, 1), targets.flatten(), reduction="sum")
                (loss_sum / global_tokens).backward()
                rank_losses[r] += loss_sum.detach()
                micro.append({n: p.grad.clone() for n, p in model.named_parameters()})
            for name in micro[0]:
                reduced = micro[0][name] + micro[1][name]
                accumulated[name] = (accumulated[name] + reduced) if name in accumulated \
                    else reduced
    finally:
        torch.set_num_threads(threads)
    per_rank = [loss / (d.batch_size * d.seq_len * d.grad_accum) for loss in rank_losses]
    return {"grads": accumulated, "loss": float(per_rank[0] + per_rank[1]) / WORLD}


def replayed_step(initial: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                  grad_norm: float) -> dict[str, torch.Tensor]:
    """The trainer's optimiser step in one process, on the FSDP run's own gradients and norm.

    AdamW and the clipping multiply are elementwise, so on identical inputs every weight after
    the step must be bit-identical to the sharded one; only the norm (a reduction over shards,
    compared on its own below) is taken from the sharded run.
    """
    from trainer_parity_worker import PARITY_FLAGS

    cfg = parse_config(PARITY_FLAGS)
    model = Transformer(FLAVOURS["tiny"])
    model.load_state_dict(initial)
    for name, p in model.named_parameters():
        p.grad = grads[name].clone()
    optim, _ = build_optimizer(model, cfg)
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), cfg.optim.grad_clip,
                                         torch.tensor(grad_norm, dtype=torch.float32))
    optim.step()
    return model.state_dict()


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def test_sharded_init_equals_plain_init_for_the_same_seed(results):
    plain = Transformer(FLAVOURS["tiny"])
    plain.init_weights(seed=3)  # the worker's --seed
    for name, value in plain.state_dict().items():
        got = results["fsdp"]["initial"][name]
        assert torch.equal(got, value), f"{name}: max |diff| {max_abs_diff(got, value):.3g}"


def test_gradients_are_bit_identical_to_a_single_process_in_the_same_order(results):
    fsdp = results["fsdp"]
    ref = per_rank_gradients(fsdp["initial"])
    assert set(fsdp["grads"]) == set(ref["grads"])
    # A gloo "sum instead of mean" bug (pytorch issue 162338) would double every gradient.
    mismatched = {name: max_abs_diff(fsdp["grads"][name], grad)
                  for name, grad in ref["grads"].items()
                  if not torch.equal(fsdp["grads"][name], grad)}
    assert not mismatched, f"gradients differ (max |diff| per tensor): {mismatched}"
    assert fsdp["loss"] == ref["loss"], f"loss {fsdp['loss']!r} vs {ref['loss']!r}"


def test_grad_norm_matches_within_float32_summation_error(results):
    """The norm is the one value reduced in another order (per shard, then across ranks).

    Every term of the sum of squares is non-negative, so recursive float32 summation of n terms
    is off by at most n*u relative (u = 2**-24); the square root halves that, and the float64
    reference adds nothing of note. n = all gradient elements.
    """
    fsdp = results["fsdp"]
    grads = fsdp["grads"]
    exact = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))
    n = sum(g.numel() for g in grads.values())
    bound = n * F32_UNIT_ROUNDOFF * exact
    off = abs(fsdp["grad_norm"] - exact)
    assert off <= bound, \
        f"grad_norm {fsdp['grad_norm']!r} vs {exact!r}: off by {off:.3g} > bound {bound:.3g}"


def test_parameters_after_the_step_are_bit_identical_to_a_replayed_step(results):
    fsdp = results["fsdp"]
    after = replayed_step(fsdp["initial"], fsdp["grads"], fsdp["grad_norm"])
    mismatched = {name: max_abs_diff(fsdp["after"][name], value) for name, value in after.items()
                  if not torch.equal(fsdp["after"][name], value)}
    assert not mismatched, f"weights after the step differ (max |diff| per tensor): {mismatched}"
    # The step really moved the weights (so equality is not "nothing happened").
    moved = max_abs_diff(fsdp["after"]["output.weight"], fsdp["initial"]["output.weight"])
    from trainer_parity_worker import PARITY_FLAGS

    lr = parse_config(PARITY_FLAGS).optim.lr
    assert moved > lr / 2, f"output.weight moved by at most {moved:.3g}; AdamW's first step " \
        f"moves weights with non-zero gradient by about lr = {lr:g}"


def test_logits_match_transformers_llama_loaded_through_hf_checkpoint(results):
    assert len(list(results["hf_dir"].glob("*.safetensors"))) > 1  # sharded checkpoint
    ours, hf = results["ours"], results["hf"]
    assert ours.shape == hf.shape == (2, 24, 509)
    torch.testing.assert_close(ours, hf, rtol=0, atol=1e-4)
