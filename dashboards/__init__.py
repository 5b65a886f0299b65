"""Grafana dashboards and Prometheus rules for FSDP jobs, generated from the metric catalog.

- ``promql``: catalog-checked selectors and the parser that finds metric names in PromQL.
- ``panels``: typed builders for Grafana panels, variables and layout.
- ``scope``: what the dashboards share (variables, selectors, legends, links).
- ``jobs``, ``ranks``, ``nodes``: the dashboards; ``build``: all four (``all_dashboards()``).
- ``rulebase``: what every rule is built from (thresholds in ``RuleBounds``, the runbook address).
- ``alerts`` / ``rules``: the alerting rules / every rule group (``rule_groups()``).
- ``dcgm``: recording rules mapping dcgm-exporter's metrics onto the catalog's GPU metrics.
- ``generate`` / ``python -m fsdpmon.dashboards``: render and write ``dashboards/generated/``.
"""
