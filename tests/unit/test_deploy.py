"""The deploy/ files: the fields the drain and the balancing rely on. No cluster or container runtime is
available where these tests run, so the manifests are parsed, not applied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _load(name: str) -> Any:
    return yaml.safe_load((DEPLOY / name).read_text())


def _container() -> dict[str, Any]:
    spec = _load("kubernetes/deployment.yaml")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return dict(container)


def test_deployment_asks_for_one_gpu_and_probes_readiness_on_healthz() -> None:
    """One GPU per pod; ready means /healthz 200 (a full or draining pod leaves the endpoints)."""
    c = _container()
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    probe = c["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] == c["ports"][0]["name"]
    assert c["readinessProbe"]["failureThreshold"] == 1
    assert "/healthz" not in str(c["livenessProbe"])  # a full pod is alive: never restart it for that


def test_the_drain_fits_in_the_termination_grace_period() -> None:
    """preStop pause + --grace < terminationGracePeriodSeconds, so SIGKILL never cuts a draining stream."""
    pod = _load("kubernetes/deployment.yaml")["spec"]["template"]["spec"]
    c = _container()
    pause = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    grace = float(c["args"][c["args"].index("--grace") + 1])
    assert pause + grace < pod["terminationGracePeriodSeconds"]
    assert "--public-healthz" in c["args"]  # the kubelet's probe sends no token


def test_service_and_budget_select_the_pods() -> None:
    """The Service and the PodDisruptionBudget select the Deployment's pods; one pod at a time may go."""
    labels = _load("kubernetes/deployment.yaml")["spec"]["template"]["metadata"]["labels"]
    service, pdb = _load("kubernetes/service.yaml"), _load("kubernetes/pdb.yaml")
    assert service["spec"]["selector"].items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    assert service["spec"]["ports"][0]["targetPort"] == _container()["ports"][0]["name"]


def test_compose_stops_replicas_after_their_grace() -> None:
    """docker compose waits longer than --grace before it kills a replica."""
    services = _load("compose.yaml")["services"]
    for name in ("replica1", "replica2"):
        args = services[name]["command"]
        grace = float(args[args.index("--grace") + 1])
        assert float(services[name]["stop_grace_period"].rstrip("s")) > grace


@pytest.mark.parametrize("needle", ["balance leastconn", "timeout tunnel", "http-check expect status 200",
                                    "uri /healthz"])  # fmt: skip
def test_haproxy_config_balances_by_connections_and_checks_health(needle: str) -> None:
    """The settings the scale-out tests depend on are in the shipped config."""
    assert needle in (DEPLOY / "haproxy.cfg").read_text()
