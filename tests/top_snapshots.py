"""Fixed job snapshots for the `top` tests, built the way the sources build them: from
catalog-shaped expositions rendered by prometheus_client, parsed and aggregated."""

from __future__ import annotations

import functools
from dataclasses import asdict, replace

from synthetic_job import GpuSpec, RankSpec, exporter_exposition, training_exposition

from fsdpmon.job.snapshot import JobSnapshot
from fsdpmon.scrape.aggregate import ScrapeResult, Target, aggregate
from fsdpmon.scrape.wanted import new_parser

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC: fixed so rendered clocks are stable
JOB = "llama"


def ranks(n_nodes: int = 2, per_node: int = 2, **overrides: dict[int, dict]) -> list[RankSpec]:
    """``overrides`` maps ``r<rank>`` to RankSpec fields, e.g. r3={"step_time_s": 0.9}."""
    world = n_nodes * per_node
    out = []
    for r in range(world):
        spec = RankSpec(rank=r, local_rank=r % per_node, node=f"node-{r // per_node}",
                        world_size=world, nodes=n_nodes, step_time_s=0.5 + 0.002 * r,
                        loss=2.5 - 0.01 * r)
        out.append(replace(spec, **overrides.get(f"r{r}", {})))
    return out


# Rendering is most of a built snapshot's cost and histories repeat the same specs: keep them.
@functools.lru_cache(maxsize=256)
def _training(mine: tuple[RankSpec, ...], specs: tuple[RankSpec, ...]) -> bytes:
    return training_exposition(JOB, mine, specs)


@functools.lru_cache(maxsize=256)
def _exporter(node: str, gpus: tuple[GpuSpec, ...]) -> bytes:
    return exporter_exposition(node, gpus)


def results(specs: list[RankSpec], per_node: int = 2, down: tuple[int, ...] = (),
            gpu_util: dict[tuple[int, int], float] | None = None,
            gpu: dict[tuple[int, int], dict] | None = None) -> list[ScrapeResult]:
    """One training target and one exporter target per node; nodes in ``down`` don't answer.
    ``gpu`` maps (node index, GPU index) to GpuSpec fields, e.g. {(1, 0): {"up": False}}."""
    parser = new_parser()
    out = []
    for n in range(len(specs) // per_node):
        node = f"node-{n}"
        train = Target(f"http://10.0.0.{n + 1}:9520/metrics", pod=f"{JOB}-worker-{n}", node=node)
        exp = Target(f"http://10.0.1.{n + 1}:9521/metrics", pod=f"fsdpmon-exporter-{n}",
                     node=node)
        if n in down:
            out += [ScrapeResult(train, None, "timed out"), ScrapeResult(exp, None, "timed out")]
            continue
        mine = [s for s in specs if s.node == node]
        gpus = [GpuSpec(gpu=s.local_rank, pod=f"{JOB}-worker-{n}", pid=4000 + s.rank,
                        rank=s.rank,
                        utilization_ratio=(gpu_util or {}).get((n, s.local_rank), 0.97),
                        **(gpu or {}).get((n, s.local_rank), {}))
                for s in mine]
        body = _training(tuple(mine), tuple(specs))
        out.append(ScrapeResult(train, parser.parse(body.decode())))
        out.append(ScrapeResult(exp, parser.parse(_exporter(node, tuple(gpus)).decode())))
    return out


def snapshot(specs: list[RankSpec] | None = None, refreshes: int = 3, **kw) -> JobSnapshot:
    """Several refreshes of the same job so history (sparklines) has points."""
    specs = specs or ranks()
    snap = None
    for i in range(refreshes):
        snap = aggregate(results(specs, **kw), now=T0 + 2 * i, source="targets", previous=snap)
    assert snap is not None
    return snap


REFRESH_S = 2.0  # seconds between refreshes, as top's default interval


def diagnosis_history(at, n: int) -> list[JobSnapshot]:
    """``n`` refreshes REFRESH_S apart; ``at(i)`` gives results() keyword arguments for refresh
    i, where ``specs`` (RankSpec overrides per rank, as ranks() takes them) defaults to a
    healthy job."""
    snaps: list[JobSnapshot] = []
    for i in range(n):
        kw = dict(at(i))
        specs = ranks(**kw.pop("specs", {}))
        snaps.append(aggregate(results(specs, **kw), now=T0 + REFRESH_S * i, source="targets",
                               previous=snaps[-1] if snaps else None))
    return snaps


def scraped_rows(snap) -> list[list[str]]:
    """Every row's figures, without where and when it was scraped (nor the history, which
    grows by one each refresh)."""
    where = ("seen_at", "gone_at", "target", "url")
    return [sorted(repr({k: v for k, v in asdict(row).items()
                         if k not in where and not k.endswith("_history")})
                   for row in rows) for rows in (snap.ranks, snap.gpus, snap.processes)]
