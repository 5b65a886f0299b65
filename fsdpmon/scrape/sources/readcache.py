"""What the Prometheus source already holds of each target's newest samples, so that a refresh
reads again only what Prometheus has newer.

A target's samples in Prometheus change only when Prometheus scrapes it (as shipped, training
pods every 10 s and exporters every 5 s), and all the samples of one scrape carry its start
time, as its ``up`` does (they are committed together). `top` refreshes every 2 s, so at a
refresh most targets have not been scraped since the last one: ``timestamp(up)`` says which
have, and only those are read again. A name the cadence asks for only now and then (the static
facts, the process families) is read on its own for a target not scraped since.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from fsdpmon.scrape.expfmt import Sample

Key = tuple[str, str]  # (scrape job, instance): one scrape target in Prometheus
Plan = dict[Key, frozenset[str]]  # each target to read → the names to read for it


def _key_of(sample: Sample) -> Key:
    return sample.labels.get("job", ""), sample.labels.get("instance", "")


class ReadCache:
    """Per target, the samples of each name as read, and the scrape they came from."""

    def __init__(self) -> None:
        # name → the scrape time it was read at (None: not known)
        self._scrape: dict[Key, dict[str, float | None]] = {}
        self._samples: dict[Key, dict[str, list[Sample]]] = {}

    def plan(self, asked: Mapping[Key, frozenset[str]], scraped: Mapping[Key, float]) -> Plan:
        """Of the names ``asked`` of each target, those not read since its last scrape
        (``scraped``: each target's last scrape time, as ``timestamp(up)`` gives it). Any change
        of that time counts, backwards too (a Prometheus restored from a backup). A target
        without one is read every time: gone (its series are gone too, and it shows as down), or
        its `up` not yet visible where its series are (VictoriaMetrics answered so at times)."""
        plan: Plan = {}
        for key, names in asked.items():
            at = scraped.get(key)
            read = self._scrape.get(key, {})
            stale = frozenset(n for n in names if at is None or read.get(n) != at)
            if stale:
                plan[key] = stale
        return plan

    def store(self, plan: Plan, samples: Iterable[Sample],
              scraped: Mapping[Key, float]) -> None:
        """The answer to ``plan``: each planned name of each planned target now holds the
        samples read of it, none where none came (its series are gone)."""
        fresh: dict[Key, dict[str, list[Sample]]] = {
            key: {name: [] for name in names} for key, names in plan.items()}
        for sample in samples:
            held = fresh.get(_key_of(sample))
            if held is not None and sample.name in held:
                held[sample.name].append(sample)
        for key, by_name in fresh.items():
            self._samples.setdefault(key, {}).update(by_name)
            self._scrape.setdefault(key, {}).update(dict.fromkeys(by_name, scraped.get(key)))

    def samples(self, key: Key, names: Iterable[str]) -> list[Sample]:
        """The samples held of ``names`` for target ``key``."""
        held = self._samples.get(key, {})
        return [s for name in names for s in held.get(name, ())]

    def keep(self, keys: Iterable[Key]) -> None:
        """Forget every target but ``keys`` (the job's)."""
        kept = set(keys)
        for gone in [k for k in self._samples if k not in kept]:
            del self._samples[gone], self._scrape[gone]
