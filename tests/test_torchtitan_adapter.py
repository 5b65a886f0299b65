"""The torchtitan adapter (fsdpmon.monitor.torchtitan) against torchtitan's real source.

torchtitan cannot run here (it needs CUDA and triton: docs/integrations/torchtitan.md), so
scripts/setup.sh --test installs its wheel without dependencies and these tests read it:
- the names and call shapes the adapter relies on, from the source with ``ast`` (each check
  compares with what the adapter assumes, so a renamed or reordered name fails it);
- a run of the adapter's subclass on a stand-in Trainer whose ``train``, ``train_step``,
  ``batch_generator``, ``should_continue_training``, the LR container's ``get_metrics``/``step``
  and ``MetricsProcessor.should_log``/``log`` are compiled from torchtitan's own source, with
  small stand-ins for what those bodies call (the model's forward and backward, the checkpointer,
  structured logging, the distributed helpers a single process does not need).
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import copy
import importlib.util
import json
import logging
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from support import rounded

from fsdpmon.monitor import MonitorConfig
from fsdpmon.monitor import torchtitan as adapter

_SPEC = importlib.util.find_spec("torchtitan")
if _SPEC is None or _SPEC.origin is None:
    pytest.skip("torchtitan is not installed (scripts/setup.sh --test installs it --no-deps)",
                allow_module_level=True)
TITAN = Path(_SPEC.origin).parent
ADAPTER = Path(adapter.__file__)


def _tree(rel: str) -> ast.Module:
    return ast.parse((TITAN / rel).read_text())


TRAINER = _tree("trainer.py")
METRICS = _tree("components/metrics.py")


def _class(tree: ast.AST, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert len(found) == 1, f"{len(found)} classes named {name}"
    return found[0]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert len(found) == 1, f"{cls.name}.{name}: {len(found)} definitions"
    return found[0]


def _params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.args + fn.args.kwonlyargs]


def _calls(node: ast.AST, callee: str) -> list[ast.Call]:
    return [n for n in ast.walk(node)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == callee]


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _self_assigned(fn: ast.FunctionDef) -> set[str]:
    """``self.X`` (and ``self.X.Y``) targets assigned in ``fn``, tuple targets included."""
    targets = [t for n in ast.walk(fn) if isinstance(n, (ast.Assign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    names = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return {ast.unparse(e).removeprefix("self.") for e in names
            if isinstance(e, ast.Attribute) and ast.unparse(e).startswith("self.")}


TRAINER_CLS = _class(TRAINER, "Trainer")
TRAIN = _method(TRAINER_CLS, "train")
TRAIN_STEP = _method(TRAINER_CLS, "train_step")
PROCESSOR = _class(METRICS, "MetricsProcessor")


# --- what the adapter relies on, read from torchtitan's source ---------------------------------

def test_train_counts_the_step_then_calls_train_step_after_loading_a_checkpoint():
    assert _params(TRAIN) == ["self"]
    loops = [n for n in ast.walk(TRAIN) if isinstance(n, ast.While)]
    assert [ast.unparse(n.test) for n in loops] == ["self.should_continue_training()"]
    body = loops[0]
    # The adapter's Monitor starts at self.step - 1 in the first train_step: train() has counted
    # the step (after checkpointer.load restored it), and the save runs outside the monitor step.
    marks = sorted((n.lineno, n.col_offset, ast.unparse(n)) for n in ast.walk(body)
                   if isinstance(n, (ast.AugAssign, ast.Call)))
    order = [s.split("(")[0] for _, _, s in marks
             if s.startswith(("self.step +=", "self.train_step(", "self.checkpointer.save("))]
    assert order == ["self.step += 1", "self.train_step", "self.checkpointer.save"], order
    assert [ast.unparse(c.args[0]) for c in _calls(body, "self.train_step")] == ["data_iterator"]
    load = _calls(TRAIN, "self.checkpointer.load")
    assert len(load) == 1 and load[0].lineno < body.lineno, "the checkpoint loads before the loop"


def test_train_step_fetches_its_batches_and_logs_in_the_order_the_wrapper_assumes():
    assert _params(TRAIN_STEP) == ["self", "data_iterator"]
    fetches = _calls(TRAIN_STEP, "next")
    assert [ast.unparse(c.args[0]) for c in fetches] == ["data_iterator"], "fetch inside step"
    logs = _calls(TRAIN_STEP, "self.metrics_processor.log")
    assert len(logs) == 1, f"{len(logs)} log calls"
    # The wrapper records the 2nd argument as the loss and the 4th as the grad norm.
    assert [ast.unparse(a) for a in logs[0].args] == [
        "self.step", "global_avg_loss", "global_max_loss", "float(grad_norm.item())"]
    assert [k.arg for k in logs[0].keywords] == ["extra_metrics"]
    # Every rank logs: no rank test in train_step, only should_log(step).
    names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(TRAIN_STEP)
             if isinstance(n, (ast.Name, ast.Attribute))}
    assert not {n for n in names if "rank" in n}, names
    [should] = _calls(TRAIN_STEP, "self.metrics_processor.should_log")
    assert _params(_method(PROCESSOR, "should_log")) == ["self", "step"]
    assert [ast.unparse(a) for a in should.args] == ["self.step"]
    # The learning rates reach extra_metrics as "lr/<optimizer>[/<group>]" keys.
    assert _calls(TRAIN_STEP, "self.lr_schedulers.get_metrics")
    container = _class(_tree("components/optimizer/lr_scheduler.py"), "LRSchedulersContainer")
    keys = [n for n in ast.walk(_method(container, "get_metrics"))
            if isinstance(n, ast.JoinedStr)]
    assert keys and all(isinstance(k.values[0], ast.Constant) and k.values[0].value == "lr/"
                        for k in keys), [ast.unparse(k) for k in keys]


def test_the_log_wrapper_takes_metrics_processor_log_s_parameters():
    real = _method(PROCESSOR, "log")
    assert _params(real) == ["self", "step", "global_avg_loss", "global_max_loss", "grad_norm",
                             "extra_metrics"]
    wrapper = [n for n in ast.walk(ast.parse(ADAPTER.read_text()))
               if isinstance(n, ast.FunctionDef) and n.name == "logged"]
    assert len(wrapper) == 1
    assert _params(wrapper[0]) == _params(real)[1:], "a caller by keyword must reach the wrapper"


def _adapter_reads() -> set[str]:
    """Every ``self.X...`` and ``config.X...`` chain the mixin reads, its own names left out."""
    mixin = _class(ast.parse(ADAPTER.read_text()), "FsdpmonTrainer")
    chains = {ast.unparse(n) for n in ast.walk(mixin) if isinstance(n, ast.Attribute)}
    own = ("self.fsdpmon", "self._fsdpmon", "self._wrap")
    return {c.replace("self.config.", "config.") for c in chains
            if c.startswith(("self.", "config.")) and not c.startswith(own)
            and not any(o != c and o.startswith(c + ".") for o in chains)}


PINNED_READS = {"self.step", "self.model_parts", "self.metrics_processor.num_flops_per_token",
                "config.model_spec",
                "config.metrics.log_freq", "config.training.steps", "config.training.seq_len",
                "config.training.local_batch_size"}


def test_every_name_the_adapter_reads_is_pinned():
    """What test_the_names_the_adapter_reads_exist_in_torchtitan checks is all the mixin reads
    (``metrics_processor.log`` is pinned by the log tests above)."""
    assert _adapter_reads() == PINNED_READS


def _torchtitan_has(read: str) -> bool:
    """``self.X[.Y]``: annotated on Trainer (X) and assigned in its __init__; ``config.X[.Y]``: a
    field of Trainer.Config (X) and of the config class that field holds (Y)."""
    head, *rest = read.split(".")
    if head == "self":
        assigned = _self_assigned(_method(TRAINER_CLS, "__init__"))
        return ".".join(rest) in assigned and rest[0] in _fields(TRAINER_CLS)
    sections = {"training": _class(_tree("config/configs.py"), "TrainingConfig"),
                "metrics": _class(PROCESSOR, "Config")}
    return rest[0] in _fields(_class(TRAINER_CLS, "Config")) and (
        len(rest) == 1 or rest[1] in _fields(sections[rest[0]]))


def test_the_names_the_adapter_reads_exist_in_torchtitan():
    missing = sorted(r for r in PINNED_READS if not _torchtitan_has(r))
    assert not missing, f"{len(missing)} of {len(PINNED_READS)} not in torchtitan: {missing}"
    assert _params(_method(TRAINER_CLS, "__init__")) == ["self", "config"]
    assert {"name", "flavor"} <= _fields(_class(_tree("protocols/model_spec.py"), "ModelSpec"))
    # torchtitan's own entry point builds with config.build(), i.e. Config._owner(config=...):
    # a subclass is not the owner, hence the documented monitored(Trainer)(config=config).
    assert _calls(_tree("train.py"), "config.build")


# --- a run of the adapter on torchtitan's compiled loop ----------------------------------------

def _compiled(tree: ast.Module, path: str, cls: str, names: list[str],
              namespace: dict[str, Any]) -> dict[str, Any]:
    """``cls``'s methods ``names`` compiled from torchtitan's source into ``namespace`` (their
    globals), decorators dropped, annotations left unevaluated."""
    fns = []
    for name in names:
        fn = copy.deepcopy(_method(_class(tree, cls), name))
        fn.decorator_list = []
        fns.append(fn)
    code = compile(ast.Module(body=fns, type_ignores=[]), str(TITAN / path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)
    return {name: namespace[name] for name in names}


class _Sl:
    """torchtitan.observability.structured_logger: off unless a run enables it."""

    log_trace_span = staticmethod(lambda name: contextlib.nullcontext())
    log_trace_instant = log_trace_scalar = set_step = staticmethod(lambda *a, **k: None)


class _DistUtils:
    """torchtitan.distributed.utils for one process without data parallelism."""

    @staticmethod
    def clip_grad_norm_(params, max_norm, foreach, pp_mesh, ep_enabled):
        return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)

    @staticmethod
    def set_pg_timeouts(timeout, parallel_dims):
        pass


class DataloaderExhaustedError(Exception):
    pass


SLEEPS: list[float] = []
LOGGER = logging.getLogger("tests.torchtitan")
COMMON = {"sl": _Sl, "logger": LOGGER, "dist_utils": _DistUtils,
          "DataloaderExhaustedError": DataloaderExhaustedError}
# train() ends with rank 0 sleeping 2 s for the others: one process is rank 0 of 1, no sleep.
LOOP = _compiled(TRAINER, "trainer.py", "Trainer", ["train", "should_continue_training"], {
    **COMMON, "time": SimpleNamespace(sleep=SLEEPS.append), "timedelta": timedelta,
    "torch": SimpleNamespace(distributed=SimpleNamespace(get_rank=lambda: 0))})
STEP = _compiled(TRAINER, "trainer.py", "Trainer", ["train_step", "batch_generator"], {
    **COMMON, "torch": torch, "time": time, "math": __import__("math"),
    "IGNORE_INDEX": -100})
PROCESSOR_FNS = _compiled(METRICS, "components/metrics.py", "MetricsProcessor",
                          ["should_log", "log"], {"time": time, "logger": LOGGER})
LR_FNS = _compiled(_tree("components/optimizer/lr_scheduler.py"),
                   "components/optimizer/lr_scheduler.py", "LRSchedulersContainer",
                   ["get_metrics", "step"], {})

SEQ, BATCH, ACCUM, VOCAB, STEPS, LOG_FREQ = 16, 2, 2, 64, 6, 3


class _MetricsProcessor:
    should_log, log = PROCESSOR_FNS["should_log"], PROCESSOR_FNS["log"]

    def __init__(self, flops_per_token: float) -> None:
        self.config = SimpleNamespace(log_freq=LOG_FREQ)
        self.parallel_dims = SimpleNamespace(non_data_parallel_size=1)
        self.num_flops_per_token, self.has_quantization, self.gpu_peak_flops = (
            flops_per_token, False, 1e12)
        self.time_last_log, self.ntokens_since_last_log = time.perf_counter(), 0
        self.data_loading_times: list[float] = []
        memory = SimpleNamespace(max_active_gib=0.0, max_active_pct=0.0, max_reserved_gib=0.0,
                                 max_reserved_pct=0.0, num_alloc_retries=0, num_ooms=0)
        self.device_memory_monitor = SimpleNamespace(get_peak_stats=lambda: memory,
                                                     reset_peak_stats=lambda: None)
        self.logged: list[tuple[int, dict[str, Any]]] = []
        self.logger = SimpleNamespace(log=lambda metrics, step: self.logged.append((step, metrics)))
        self.color = SimpleNamespace(**dict.fromkeys(
            ["red", "green", "orange", "turquoise", "blue", "cyan", "magenta", "reset"], ""))


class _Checkpointer:
    def __init__(self, trainer: Any, resume_at: int) -> None:
        self.trainer, self.resume_at, self.saved = trainer, resume_at, []

    def load(self, step: int) -> None:
        self.trainer.step = self.resume_at

    def save(self, step: int, last_step: bool) -> None:
        self.saved.append(step)

    def maybe_wait_for_staging(self) -> None:
        pass


class _StandInTrainer:
    """torchtitan's Trainer after __init__, one process, CPU, a tiny model."""

    train, should_continue_training = LOOP["train"], LOOP["should_continue_training"]
    train_step, batch_generator = STEP["train_step"], STEP["batch_generator"]

    def __init__(self, config: Any = None, *, resume_at: int = 0) -> None:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 32), torch.nn.Linear(32, VOCAB))
        training = SimpleNamespace(steps=STEPS, seq_len=SEQ, local_batch_size=BATCH,
                                   max_norm=1.0, disable_cuda_graphs=True)
        self.config = SimpleNamespace(
            training=training, metrics=SimpleNamespace(log_freq=LOG_FREQ),
            model_spec=SimpleNamespace(name="llama3", flavor="debugmodel"),
            checkpoint=SimpleNamespace(load_step=-1), dump_folder="",
            profiler=SimpleNamespace(build=lambda **kw: contextlib.nullcontext(
                SimpleNamespace(step=lambda: None))),
            validator=SimpleNamespace(enable=False), comm=SimpleNamespace(train_timeout_seconds=1))
        self.parallel_dims = SimpleNamespace(dp_enabled=False, pp_enabled=False,
                                             dp_cp_enabled=False, ep_enabled=False,
                                             get_optional_mesh=lambda name: None)
        self.model_parts, self.device = [model], torch.device("cpu")
        self.gradient_accumulation_steps, self.num_pipeline_parallel_microbatches = ACCUM, 1
        self.optimizers = torch.optim.AdamW(model.parameters(), lr=1e-2)
        self.lr_schedulers = SimpleNamespace(schedulers=[torch.optim.lr_scheduler.LambdaLR(
            self.optimizers, lambda step: 1 / (1 + step))])
        self.lr_schedulers.get_metrics = LR_FNS["get_metrics"].__get__(self.lr_schedulers)
        self.lr_schedulers.step = LR_FNS["step"].__get__(self.lr_schedulers)
        self.metrics_processor = _MetricsProcessor(6.0 * sum(p.numel() for p in
                                                             model.parameters()))
        self.checkpointer = _Checkpointer(self, resume_at)
        self.gc_handler = SimpleNamespace(run=lambda step: None)
        self.step = self.ntokens_seen = 0
        g = torch.Generator().manual_seed(1)
        self.dataloader = [({"input": t[:, :-1]}, t[:, 1:]) for t in
                           torch.randint(0, VOCAB, (STEPS * ACCUM, BATCH, SEQ + 1), generator=g)]

    def forward_backward_step(self, input_dict, labels, global_valid_tokens):
        logits = self.model_parts[0](input_dict["input"])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                 reduction="sum") / global_valid_tokens
        loss.backward()
        return loss


@pytest.mark.parametrize("resume_at", [0, 2], ids=["fresh", "resumed-at-2"])
def test_the_monitor_follows_torchtitans_compiled_loop(tmp_path, resume_at):
    config = MonitorConfig(port=0, job_name="titan-test", jsonl_path=str(tmp_path / "t.jsonl"),
                           state_dir=str(tmp_path / "state"))
    trainer = adapter.monitored(_StandInTrainer, config)(resume_at=resume_at)
    SLEEPS.clear()
    trainer.train()

    assert trainer.checkpointer.saved == list(range(resume_at + 1, STEPS + 1))
    titan = trainer.metrics_processor.logged  # what torchtitan's own MetricsProcessor.log got
    expected_steps = [s for s in range(resume_at + 1, STEPS + 1) if s == 1 or s % LOG_FREQ == 0]
    assert [step for step, _ in titan] == expected_steps
    lines = [json.loads(x) for x in (tmp_path / "t.rank0.jsonl").read_text().splitlines()]
    run, steps = lines[0], [x for x in lines[1:] if x["kind"] == "step"]
    assert run["model"] == "llama3 debugmodel" and run["config"]["seq_len"] == SEQ
    assert run["flops_per_token"] == trainer.metrics_processor.num_flops_per_token
    assert [s["step"] for s in steps] == expected_steps, "logged at torchtitan's log steps"
    # JSONL floats are the recorded values (python floats from torchtitan), rounded on writing.
    assert [s["loss"] for s in steps] == rounded(
        [m["loss_metrics/global_avg_loss"] for _, m in titan])
    assert [s["grad_norm"] for s in steps] == rounded([m["grad_norm"] for _, m in titan])
    assert [s["lr"] for s in steps] == rounded([m["lr/AdamW"] for _, m in titan])
    # tokens: labels' elements of every micro-batch, as torchtitan counts them (exact)
    per_step = ACCUM * BATCH * SEQ
    assert steps[-1]["tokens_total"] == (STEPS - resume_at) * per_step, steps[-1]
    assert all(s["tokens_per_second"] > 0 for s in steps), steps
    assert all(s["phase_seconds"].get("data", 0) > 0 for s in steps), "fetch timed as data"
    assert SLEEPS == [2], "torchtitan's rank-0 end of train() ran"
    assert trainer.fsdpmon is not None and trainer.fsdpmon.step_number == STEPS


def test_a_step_that_raises_closes_the_monitor_and_counts_no_step(tmp_path):
    """torchtitan ends the loop on DataloaderExhaustedError from the batch fetch: the open
    monitor step is dropped, and train() still closes the monitor."""
    config = MonitorConfig(port=0, jsonl_path=str(tmp_path / "t.jsonl"),
                           state_dir=str(tmp_path / "state"))
    trainer = adapter.monitored(_StandInTrainer, config)()
    trainer.dataloader = trainer.dataloader[:3 * ACCUM + 1]  # step 4 runs out mid-step
    trainer.train()
    assert trainer.checkpointer.saved == [1, 2, 3]
    assert trainer.fsdpmon.steps_done == 3 and trainer.fsdpmon.step_number == 3
    assert trainer.fsdpmon._closed
