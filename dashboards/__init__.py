"""Grafana dashboards and Prometheus rules for FSDP jobs, generated from the metric catalog.

- ``promql``: catalog-checked selectors and the parser that finds metric names in PromQL.
- ``panels``: typed builders for Grafana panels, variables and layout.
- ``build``: the four dashboards (``all_dashboards()``).
- ``rules``: recording and alerting rules (``rule_groups()``, thresholds in ``RuleBounds``).
- ``dcgm``: recording rules mapping dcgm-exporter's metrics onto the catalog's GPU metrics.
- ``generate`` / ``python -m dashboards``: render and write ``dashboards/generated/``.
"""
