"""The Grafana dashboards and alert rules, as data: `python -m clocktower.dashboards` writes grafana/ from them."""

from __future__ import annotations

from clocktower.dashboards import clock_sync, control, fleet, gpu_health, job, network, pipeline_health
from clocktower.dashboards.layout import Dashboard

DASHBOARDS: tuple[Dashboard, ...] = (fleet.DASHBOARD, network.DASHBOARD, job.DASHBOARD, gpu_health.DASHBOARD,
                                     clock_sync.DASHBOARD, control.DASHBOARD, pipeline_health.DASHBOARD)
