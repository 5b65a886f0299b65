"""The Alertmanager route fsdpmon's alerts are meant for: one notification per incident.

Every fsdpmon alert carries its diagnosis cause in the ``cause`` label and its job in
``job_name`` (the stall culprit, the straggler, the NaN's origin ...), so grouping by
``namespace, job_name, cause`` puts an incident's alerts in one notification: a hang is one page
naming its culprit, whatever the job's size. GPU alerts carry no job: they group per cause.

Written as a plain ``alertmanager.yml`` (``fsdpmon manifests --out DIR`` puts it beside the
manifests, not in the kustomization: Alertmanager's configuration is the cluster's, usually a
Helm value of kube-prometheus-stack or a Secret); the receiver is a placeholder to replace.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from fsdpmon import conventions as conv

FILE = "alertmanager.yml"
GROUP_BY = ("namespace", "job_name", "cause")
# Alertmanager's own defaults but group_wait, which conventions holds per severity: critical
# causes (a hang) leave after CRITICAL_GROUP_WAIT_SECONDS, warnings after the longer wait.
GROUP_WAIT = f"{conv.WARNING_GROUP_WAIT_SECONDS}s"
CRITICAL_GROUP_WAIT = f"{conv.CRITICAL_GROUP_WAIT_SECONDS}s"
GROUP_INTERVAL, REPEAT_INTERVAL = "5m", "4h"
RECEIVER = "fsdpmon-oncall"
PLACEHOLDER_URL = "http://alert-receiver.example.invalid/fsdpmon"
CRITICAL = f'severity="{conv.Severity.CRITICAL.value}"'
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def seconds(duration: str) -> float:
    """A plain duration of the route's ("5s", "2m", "250ms") in seconds."""
    match = re.fullmatch(r"([0-9]+)(ms|s|m|h)", duration)
    if match is None:
        raise ValueError(f"{duration!r} is not a duration such as 5s, 2m or 250ms")
    return int(match[1]) * _UNIT_SECONDS[match[2]]


def alertmanager_config(webhook_url: str = PLACEHOLDER_URL, *, group_wait: str = GROUP_WAIT,
                        group_interval: str = GROUP_INTERVAL,
                        repeat_interval: str = REPEAT_INTERVAL) -> dict[str, Any]:
    """The route (grouped by job and cause) and one webhook receiver; the timers can be
    shortened for a test, the grouping cannot. Critical alerts wait the shorter of
    CRITICAL_GROUP_WAIT and ``group_wait``, so a test's shortened wait shortens both."""
    critical_wait = min(group_wait, CRITICAL_GROUP_WAIT, key=seconds)
    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": list(GROUP_BY),
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            # fsdpmon's alerts only: a cluster's other alerts keep their own routes above this
            "routes": [{"receiver": RECEIVER, "matchers": ['alertname=~"Fsdpmon.+"'],
                        "group_by": list(GROUP_BY),
                        # the page first: a critical cause waits only to batch one evaluation
                        "routes": [{"receiver": RECEIVER, "matchers": [CRITICAL],
                                    "group_wait": critical_wait}]}],
        },
        "receivers": [{"name": RECEIVER,
                       "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }


def alertmanager_yaml(webhook_url: str = PLACEHOLDER_URL) -> str:
    head = ("# Alertmanager route for fsdpmon's alerts: one notification per job and cause.\n"
            f"# Replace the receiver's placeholder URL ({PLACEHOLDER_URL}) with your pager.\n")
    return head + yaml.safe_dump(alertmanager_config(webhook_url), sort_keys=False)
