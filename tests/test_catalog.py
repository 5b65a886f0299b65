"""The catalog obeys the project's metric conventions; every other component relies on that."""

import re

from fsdpmon import catalog
from fsdpmon.catalog import Kind

BASE_UNIT_SUFFIX = {
    "seconds": "_seconds",
    "bytes": "_bytes",
    "ratio": "_ratio",
    "celsius": "_celsius",
    "watts": "_watts",
    "joules": "_joules",
    "hertz": "_hertz",
}
RESERVED = {"job", "instance", "le", "quantile"}


def test_names_are_unique_and_prefixed():
    names = [m.name for m in catalog.ALL]
    assert len(names) == len(set(names))
    for name in names:
        assert re.fullmatch(r"fsdpmon_[a-z0-9_]+", name), name


def test_counters_end_in_total_and_nothing_else_does():
    for m in catalog.ALL:
        assert (m.kind is Kind.COUNTER) == m.name.endswith("_total"), m.name


def test_unit_is_in_the_name():
    for m in catalog.ALL:
        if m.unit:
            suffix = BASE_UNIT_SUFFIX[m.unit]
            stem = m.name.removesuffix("_total")
            assert stem.endswith(suffix), m.name


def test_info_metrics_are_gauges_and_labels_are_not_reserved():
    for m in catalog.ALL:
        if m.name.endswith("_info"):
            assert m.kind is Kind.GAUGE
        assert not RESERVED & set(m.labels), m.name
        assert len(set(m.labels)) == len(m.labels), m.name


def test_histograms_have_buckets_and_expand_to_series():
    hist = catalog.get("fsdpmon_train_step_duration_seconds")
    assert hist.buckets == tuple(sorted(hist.buckets))
    assert "fsdpmon_train_step_duration_seconds_bucket" in catalog.all_series_names()


def test_unknown_metric_is_named_in_the_error():
    try:
        catalog.get("fsdpmon_nope")
    except KeyError as exc:
        assert "fsdpmon_nope" in str(exc)
    else:
        raise AssertionError("expected KeyError")


def _symbol(name: str) -> str:
    """The catalog's naming rule for symbols (see the module docstring)."""
    stem = name.removeprefix("fsdpmon_").replace(":", "_").upper()
    return ("REC_" + stem) if ":" in name else stem


def test_every_metric_and_recorded_rule_has_its_symbol():
    for entry in (*catalog.ALL, *catalog.RECORDED):
        symbol = _symbol(entry.name)
        assert getattr(catalog, symbol, None) is entry, f"{entry.name}: no catalog.{symbol}"


def test_every_symbol_is_listed():
    """A symbol left out of ALL / RECORDED would be missing from dashboards checks and BY_NAME."""
    listed = {id(e) for e in (*catalog.ALL, *catalog.RECORDED)}
    loose = [k for k, v in vars(catalog).items()
             if isinstance(v, catalog.Metric | catalog.Recorded) and id(v) not in listed]
    assert not loose, f"symbols in no tuple: {loose}"


def test_recorded_names_are_level_metric_operations():
    names = [r.name for r in catalog.RECORDED]
    assert len(names) == len(set(names)), f"duplicates: {len(names) - len(set(names))}"
    for name in names:
        assert re.fullmatch(r"fsdpmon_[a-z]+:[a-z0-9_]+:[a-z0-9_]+", name), name
