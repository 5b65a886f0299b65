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

from typing import Any

import yaml

FILE = "alertmanager.yml"
GROUP_BY = ("namespace", "job_name", "cause")
# Alertmanager's own defaults for the timers, but group_wait: a hang's page must leave within
# 4 minutes of its start (the stall bound, the rule's `for`, scrape and evaluation, then this).
GROUP_WAIT, GROUP_INTERVAL, REPEAT_INTERVAL = "30s", "5m", "4h"
RECEIVER = "fsdpmon-oncall"
PLACEHOLDER_URL = "http://alert-receiver.example.invalid/fsdpmon"


def alertmanager_config(webhook_url: str = PLACEHOLDER_URL, *, group_wait: str = GROUP_WAIT,
                        group_interval: str = GROUP_INTERVAL,
                        repeat_interval: str = REPEAT_INTERVAL) -> dict[str, Any]:
    """The route (grouped by job and cause) and one webhook receiver; the timers can be
    shortened for a test, the grouping cannot."""
    return {
        "route": {
            "receiver": RECEIVER,
            "group_by": list(GROUP_BY),
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            # fsdpmon's alerts only: a cluster's other alerts keep their own routes above this
            "routes": [{"receiver": RECEIVER, "matchers": ['alertname=~"Fsdpmon.+"'],
                        "group_by": list(GROUP_BY)}],
        },
        "receivers": [{"name": RECEIVER,
                       "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }


def alertmanager_yaml(webhook_url: str = PLACEHOLDER_URL) -> str:
    head = ("# Alertmanager route for fsdpmon's alerts: one notification per job and cause.\n"
            f"# Replace the receiver's placeholder URL ({PLACEHOLDER_URL}) with your pager.\n")
    return head + yaml.safe_dump(alertmanager_config(webhook_url), sort_keys=False)
