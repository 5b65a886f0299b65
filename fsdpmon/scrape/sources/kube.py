"""The Kubernetes source (`--job NAME` / `--selector SEL`): find the job's pods and the exporters
on their nodes with the official client, scrape them, and tail a pod's training log.

Outside the cluster every scrape goes through the API server's pod proxy (no port-forward, no
network path to the pods needed); inside (in-cluster config) pods are scraped by IP. API errors
become one line with a hint: 403 names the RBAC Role to apply, a missing job lists the jobs that
do exist. Transient errors (timeouts, 5xx, 429) are retried with backoff before giving up.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from fsdpmon.conventions import EXPORTER_APP_LABEL, EXPORTER_APP_NAME
from fsdpmon.errors import ConfigError, UnreachableError
from fsdpmon.job.health import with_conditions
from fsdpmon.job.snapshot import JobSnapshot, TargetStatus
from fsdpmon.scrape import discovery
from fsdpmon.scrape.aggregate import JobAggregator, Target
from fsdpmon.scrape.fetch import scrape_all, scrape_urls
from fsdpmon.scrape.fused import new_filing_parser
from fsdpmon.scrape.gcpause import collector_paused
from fsdpmon.scrape.httpget import IN_FLIGHT, ScrapeError, http_get
from fsdpmon.scrape.sources.kube_client import (
    BACKOFF_S,
    KubeSourceConfig,
    LogFollower,
    describe,
    load,
    transient,
)
from fsdpmon.scrape.wanted import WANTED

TOP_ROLE = "fsdpmon-top"  # the Role `fsdpmon manifests` generates for people who run top
RBAC_HINT = (f"apply the RBAC Role '{TOP_ROLE}' from `fsdpmon manifests` in this namespace and "
             "bind it to you (kubectl create rolebinding fsdpmon-top --role fsdpmon-top "
             "--user YOU)")
RETRIES = 3
# The job kinds whose status top reads (the Role from `fsdpmon manifests` may get both).
JOB_KINDS = (("kubeflow.org", "v1", "pytorchjobs"), ("trainer.kubeflow.org", "v1alpha1",
                                                     "trainjobs"))
LOG_IDLE_S = 600.0  # a followed log silent this long is reopened
REDISCOVER_EVERY = 10  # refreshes between pod lists when nothing changed
T = TypeVar("T")


class KubeSource:
    """Finds and scrapes a job's pods through the Kubernetes API; ``fetch()`` → JobSnapshot."""

    def __init__(self, cfg: KubeSourceConfig) -> None:
        if not (cfg.job or cfg.selector):
            raise ConfigError("--job", "give --job NAME or --selector SELECTOR")
        if not cfg.timeout_s > 0:
            raise ConfigError("--timeout", f"must be > 0, got {cfg.timeout_s!r}")
        self.cfg = cfg
        conf, self.namespace, self.inside = load(cfg)
        conf.retries = False  # we retry ourselves, with backoff and a clear final message
        conf.connection_pool_maxsize = cfg.max_workers
        self.host = conf.host
        self.api = client.CoreV1Api(client.ApiClient(conf))
        self.custom = client.CustomObjectsApi(self.api.api_client)
        self._parser = new_filing_parser()  # files as it reads in the cluster (scrape_urls)
        self._pool = ThreadPoolExecutor(max_workers=cfg.max_workers,
                                        thread_name_prefix="fsdpmon-kube")
        self._targets: list[Target] = []
        self._train_pods: list[dict[str, Any]] = []
        self._refreshes = 0
        self._previous: JobSnapshot | None = None
        self._logs: LogFollower | None = None
        self._notice = ""
        self._job_kind: tuple[str, str, str] | None = None

    @property
    def description(self) -> str:
        what = f"job {self.cfg.job}" if self.cfg.job else f"pods {self.cfg.selector}"
        return f"{what} in namespace {self.namespace} ({self.host})"

    # --- API calls -------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run an API call; retry transient failures with backoff; raise one clear line."""
        for attempt in range(RETRIES):
            try:
                return fn()
            except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
                if isinstance(exc, ApiException) and exc.status in (401, 403):
                    raise UnreachableError(self._denied(what, exc)) from None
                if not transient(exc) or attempt == RETRIES - 1:
                    raise UnreachableError(
                        f"Kubernetes API at {self.host}: {what}: {describe(exc)}") from None
                time.sleep(BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _denied(self, what: str, exc: ApiException) -> str:
        if exc.status == 401:
            return (f"Kubernetes API at {self.host}: {what}: unauthorized (HTTP 401): the "
                    "credentials in your kubeconfig were rejected")
        return f"Kubernetes API: {what}: forbidden (HTTP 403): {RBAC_HINT}"

    def _list(self, selector: str, namespace: str | None) -> list[dict[str, Any]]:
        timeout = self.cfg.timeout_s
        if namespace is None:
            response = self._call("list pods in all namespaces", lambda: (
                self.api.list_pod_for_all_namespaces(label_selector=selector,
                                                     _preload_content=False,
                                                     _request_timeout=timeout)))
        else:
            response = self._call(f"list pods in namespace {namespace}", lambda: (
                self.api.list_namespaced_pod(namespace, label_selector=selector,
                                             _preload_content=False, _request_timeout=timeout)))
        try:
            items = json.loads(response.data).get("items")
        except (ValueError, AttributeError):
            raise UnreachableError(f"Kubernetes API at {self.host}: malformed pod list") from None
        return [p for p in items or [] if isinstance(p, dict)]

    # --- discovery -------------------------------------------------------------------------

    def _job_pods(self) -> list[dict[str, Any]]:
        if self.cfg.selector:
            pods = self._list(self.cfg.selector, self.namespace)
            if not pods:
                raise ConfigError("--selector", f"no pods match {self.cfg.selector!r} in "
                                                f"namespace {self.namespace}")
            return sorted(pods, key=discovery.pod_name)
        for selector in discovery.label_selectors_for_job(self.cfg.job):
            pods = self._list(selector, self.namespace)
            if pods:
                return discovery.find_job_pods(pods, self.cfg.job)
        existing = discovery.job_names(self._list("", self.namespace))
        listing = ", ".join(existing) if existing else "none"
        raise ConfigError("--job", f"no PyTorchJob or TrainJob {self.cfg.job!r} has pods in "
                                   f"namespace {self.namespace}; jobs there: {listing}")

    def _exporter_pods(self, nodes: list[str]) -> list[dict[str, Any]]:
        """Exporters usually live in a monitoring namespace; a namespaced Role may not see them."""
        selector = f"{EXPORTER_APP_LABEL}={EXPORTER_APP_NAME}"
        self._notice = ""
        try:
            return discovery.exporters_for_nodes(self._list(selector, None), nodes)
        except UnreachableError as exc:
            cluster_error = exc
        try:
            found = discovery.exporters_for_nodes(self._list(selector, self.namespace), nodes)
        except UnreachableError as exc:
            found, cluster_error = [], exc
        if not found:
            self._notice = f"no GPU data: exporter pods not visible ({cluster_error})"
        return found

    def _target(self, pod: dict[str, Any], port: int) -> Target:
        name, namespace = discovery.pod_name(pod), pod["metadata"].get("namespace", self.namespace)
        if self.inside:
            url = f"http://{discovery.pod_ip(pod)}:{port}/metrics"
        else:
            url = f"{self.host}/api/v1/namespaces/{namespace}/pods/{name}:{port}/proxy/metrics"
        return Target(url, pod=name, node=discovery.pod_node(pod), namespace=namespace)

    def discover(self) -> list[Target]:
        try:
            pods = self._job_pods()
        except ConfigError:
            if not self.job_conditions():  # a finished job's pods may be cleaned up
                raise
            pods = []
        train = [p for p in pods if discovery.is_running(p)]
        targets = []
        for pod in train:
            port = discovery.training_metrics_port(pod)
            if port is not None:
                targets.append(self._target(pod, port))
        nodes = sorted({discovery.pod_node(p) for p in train} - {""})
        for pod in self._exporter_pods(nodes):
            port = discovery.exporter_metrics_port(pod)
            if port is not None and discovery.is_running(pod):
                targets.append(self._target(pod, port))
        self._train_pods = train
        return targets

    # --- scraping --------------------------------------------------------------------------

    def _fetch_target(self, target: Target, path: str = "metrics") -> bytes:
        port = target.url.rsplit(":", 1)[-1].split("/", 1)[0]
        try:
            response = self.api.connect_get_namespaced_pod_proxy_with_path(
                f"{target.pod}:{port}", target.namespace, path, _preload_content=False,
                _request_timeout=self.cfg.timeout_s)
            return bytes(response.data)
        except ApiException as exc:
            raise ScrapeError(describe(exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ScrapeError(describe(exc)) from None

    def get_path(self, status: TargetStatus, path: str) -> bytes:
        """Another path of a scraped pod's listener (`/stacks`), through the pod proxy."""
        target = next((t for t in self._targets if t.url == status.url), None)
        if self.inside and target is not None:  # pod IPs: straight to the listener
            return http_get(target.url.rsplit("/", 1)[0] + "/" + path, self.cfg.timeout_s)
        if target is None:
            raise ScrapeError("not a current target")
        return self._fetch_target(target, path)

    def fetch(self) -> JobSnapshot:
        with collector_paused():  # see there: a large job's refresh would run a full GC pass
            self._previous = self._refresh()
        return self._previous

    def _refresh(self) -> JobSnapshot:
        previous = self._previous
        stale = previous is not None and previous.targets_up < len(previous.targets)
        if not self._targets or stale or self._refreshes % REDISCOVER_EVERY == 0:
            self._targets = self.discover()
        self._refreshes += 1
        aggregator = JobAggregator()
        if self.inside:  # pod IPs: one selector loop for every scrape, as for --targets
            scrape_urls(self._targets, self._parser, self.cfg.timeout_s, IN_FLIGHT,
                        self._pool, aggregator.add, WANTED, lambda: aggregator.acc)
        else:  # through the API server's pod proxy, with the client's auth
            scraped = scrape_all(self._targets, self._fetch_target, self._parser, self._pool)
            for i, result in enumerate(scraped):
                aggregator.add(i, result)
        follower = self._logs
        snap = aggregator.snapshot(
            now=time.time(), source="kubernetes", previous=previous,
            job_name=self.cfg.job, logs=tuple(follower.lines) if follower else (),
            log_pod=follower.pod if follower else "",
        )
        return with_conditions(snap, self.job_conditions())

    def job_conditions(self) -> list[dict[str, Any]]:
        """The job's own conditions, as `kubectl describe` shows them: the PyTorchJob's, else
        the TrainJob's of that name; [] when neither can be read (no --job, not found, not
        allowed): the state then comes from the metrics alone."""
        if not self.cfg.job:
            return []
        kinds = [k for k in JOB_KINDS if k == self._job_kind] or list(JOB_KINDS)
        for group, version, plural in kinds:
            try:
                obj = self.custom.get_namespaced_custom_object(
                    group, version, self.namespace, plural, self.cfg.job,
                    _request_timeout=self.cfg.timeout_s)
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
                continue
            self._job_kind = (group, version, plural)  # ask only this kind from now on
            status = obj.get("status") if isinstance(obj, dict) else None
            conditions = status.get("conditions") if isinstance(status, dict) else None
            return [c for c in conditions or [] if isinstance(c, dict)]
        return []

    @property
    def notice(self) -> str:
        return self._notice

    # --- logs ------------------------------------------------------------------------------

    def follow_logs(self, index: int | str | None) -> None:
        """Tail the training container of the job's ``index``-th pod (or the pod of that name);
        None stops following."""
        pods = self._train_pods
        if index is None or not pods:
            self._stop_logs()
            return
        if isinstance(index, str):
            named = [i for i, p in enumerate(pods) if discovery.pod_name(p) == index]
            index = named[0] if named else 0
        pod = pods[min(index, len(pods) - 1)]
        name = discovery.pod_name(pod)
        if self._logs is not None and self._logs.pod == name:
            return
        self._stop_logs()
        namespace = pod["metadata"].get("namespace", self.namespace)
        container = discovery.training_container(pod) or None

        opened = []

        def open_stream() -> Any:
            # Reopening after a dropped stream must not repeat the tail already shown.
            tail = 0 if opened else self.cfg.log_tail_lines
            opened.append(True)
            return self.api.read_namespaced_pod_log(
                name, namespace, container=container, follow=True, tail_lines=tail,
                _preload_content=False, _request_timeout=(self.cfg.timeout_s, LOG_IDLE_S))

        self._logs = LogFollower(open_stream, name, keep=max(100, self.cfg.log_tail_lines))
        self._logs.start()

    def _stop_logs(self) -> None:
        if self._logs is not None:
            self._logs.stop()
            self._logs = None

    def close(self) -> None:
        self._stop_logs()
        self._pool.shutdown(wait=False, cancel_futures=True)
