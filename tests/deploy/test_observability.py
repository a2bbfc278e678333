"""Prometheus scrapes every service; the Grafana dashboard charts metrics the services really export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from zerobubble.buffer import metrics as buffer_metrics
from zerobubble.reward.metrics import RewardMetrics
from zerobubble.rollout.metrics import RolloutMetrics
from zerobubble.rollout.weight_receiver import ReceiverMetrics
from zerobubble.trainer.broadcaster import SyncMetrics
from zerobubble.trainer.metrics import TrainerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "zerobubble.json"
REQUIRED = [
    *(f"zerobubble_trainer_{name}" for name in (
        "loss", "reward_mean", "answer_accuracy", "kl", "entropy", "clip_fraction", "grad_norm", "lr",
        "response_length_mean", "staleness_mean", "staleness_max", "trainer_idle_fraction", "weight_sync_seconds_sum",
        "tokens_per_second", "policy_version")),
    *(f"zerobubble_rollout_{name}" for name in (
        "tokens_per_second", "policy_version", "reward_wait_seconds_total", "buffer_wait_seconds_total",
        "groups_pushed_total")),
    *(f"zerobubble_buffer_{name}" for name in (
        "queued_groups", "queued_bytes", "groups_in_total", "groups_out_total", "filtered_total",
        "stale_dropped_total")),
    "zerobubble_reward_items_total",
]
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
            "summary": ("_sum", "_count", "")}


def exposed(registry: CollectorRegistry) -> set[str]:
    """The series names a registry serves on /metrics, labelled families included before their first use."""
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]}


def service_metric_names() -> set[str]:
    names: set[str] = set()
    for metrics in (TrainerMetrics, SyncMetrics, RolloutMetrics, ReceiverMetrics, RewardMetrics):
        registry = CollectorRegistry()
        metrics(registry)
        names |= exposed(registry)
    prefix = buffer_metrics.PREFIX
    names |= {f"{prefix}_{name}" for name in buffer_metrics.GAUGES}
    names |= {f"{prefix}_{name}_total" for name in buffer_metrics.COUNTERS}
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_dashboard_charts_every_required_metric(dashboard):
    charted = {name for expr in expressions(dashboard) for name in re.findall(r"zerobubble_\w+", expr)}
    assert set(REQUIRED) <= charted, sorted(set(REQUIRED) - charted)


def test_dashboard_charts_only_metrics_the_services_export(dashboard):
    charted = {name for expr in expressions(dashboard) for name in re.findall(r"zerobubble_\w+", expr)}
    assert charted <= service_metric_names(), sorted(charted - service_metric_names())


def test_dashboard_panels_use_the_provisioned_datasource(dashboard):
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
                                .read_text())["datasources"][0]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["datasource"]["uid"] == datasource["uid"]
        assert all(t["datasource"]["uid"] == datasource["uid"] for t in panel["targets"])
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "zerobubble.yaml").read_text())
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mounted = {m.split(":")[1] for m in compose["services"]["grafana"]["volumes"]}
    assert provider["providers"][0]["options"]["path"] in mounted


def test_prometheus_scrapes_every_service_on_its_metrics_port():
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {target for job in prometheus["scrape_configs"] for group in job["static_configs"]
               for target in group["targets"]}
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    expected = set()
    for name, service in compose.items():
        if service.get("command", [None])[0] != "serve":
            continue
        source = next(m.split(":")[0] for m in service["volumes"] if m.split(":")[1].startswith("/etc/zerobubble/"))
        port = yaml.safe_load((DEPLOY / source).read_text())["server"]["metrics_port"]
        expected.add(f"{name}:{port}")
    assert targets == expected
