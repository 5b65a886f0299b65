"""The scrape layer: reading a job's endpoints (plain targets, Kubernetes pods, Prometheus) into
job snapshots.

HTTP (``httpget``), the exposition parser (``expfmt``) and its filing of the few series a
snapshot needs (``fused``, ``filing``), the rows (``rows``, ``frozen``) and their aggregation
into a snapshot (``aggregate``); ``sources/`` holds one source per place a job can be read from,
and ``options`` the flags that choose one.
"""
