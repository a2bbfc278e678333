"""deploy/k8s: every manifest is valid against the Kubernetes schemas (kubernetes-validate, offline, strict: no
unknown fields), and the manifests agree with the service configs they mount (deploy/compose/).

Not validated: anything a cluster decides at apply time (admission, the storage class behind a claim, whether a
hostPath and a node's local seccomp profile are allowed and present, the NVIDIA device plugin's nvidia.com/gpu),
and the pods' behaviour."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted((DEPLOY / "k8s").glob("*.yaml"))
K8S_VERSION = "1.33.0"


def documents() -> list[dict]:
    return [doc for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_is_valid_against_the_kubernetes_schemas(path):
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validation_means_something():
    (deployment,) = [d for d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "reward"]
    deployment["spec"]["replicas"] = "one"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    deployment["spec"]["replicas"] = 1
    deployment["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def containers() -> dict[str, dict]:
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
            for d in documents() if d["kind"] in ("Deployment", "StatefulSet")}


def test_every_service_runs_and_the_addresses_its_configs_call_are_services():
    assert set(containers()) == {"reward", "environment", "teacher", "buffer", "trainer", "rollout"}
    services = {d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]}
                for d in documents() if d["kind"] == "Service"}
    for name, container in containers().items():
        config = yaml.safe_load((DEPLOY / "compose" / f"{name if name != 'rollout' else 'rollout-2'}.yaml").read_text())
        for client in ("buffer", "reward_service", "trainer", "environment", "teacher"):
            if isinstance(config.get(client), dict):
                host, port = config[client]["address"].rsplit(":", 1)
                assert int(port) in services[host], f"{name} calls {host}:{port}, which no Service serves"
        ports = {p["containerPort"] for p in container["ports"]}
        assert int(config["server"]["listen"].rsplit(":", 1)[1]) in ports, name
        assert config["server"]["metrics_port"] in ports, name
        assert config["server"]["auth_token_file"].startswith("/run/secrets/"), name


def test_sandboxed_pods_are_not_privileged_and_gpus_go_to_trainer_rollout_and_teacher():
    for name, container in containers().items():
        security = container.get("securityContext", {})
        assert not security.get("privileged"), name
        gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        assert (gpus == 1) == (name in ("trainer", "rollout", "teacher")), name
    cgroups = set()
    for name in ("reward", "environment"):
        security = containers()[name]["securityContext"]
        assert security["capabilities"]["add"] == ["SYS_ADMIN", "NET_ADMIN"], name
        assert security["seccompProfile"] == {"type": "Localhost", "localhostProfile": "zerobubble/sandbox.json"}
        (pod,) = [d for d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == name]
        (cgroup,) = [v["hostPath"]["path"] for v in pod["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
        cgroups.add(cgroup)
    assert len(cgroups) == 2, "each sandboxed service a memory cgroup of its own"
    assert (DEPLOY / "seccomp" / "sandbox.json").is_file()


def test_the_environment_pod_is_bounded_and_reached_only_by_rollout_pods():
    limits = containers()["environment"]["resources"]["limits"]
    assert set(limits) == {"memory"}
    (policy,) = [d for d in documents() if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "environment"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "environment"}
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    grpc = [rule for rule in policy["spec"]["ingress"] if {"port": 50056} in rule["ports"]]
    rollout = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "rollout"}}}
    assert [rule["from"] for rule in grpc] == [[rollout]]
    # Egress: name lookups only, so a user's environment reaches nothing else unless a rule says so.
    assert {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]} == {53}


def test_the_teacher_pod_is_optional_bounded_and_reached_only_by_the_trainer():
    """The trainer's teacher section (commented in compose/trainer.yaml, the ConfigMap's) calls teacher:50058;
    tests/deploy/test_deploy_configs.py checks that section against compose/teacher.yaml."""
    (deployment,) = [d for d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "teacher"]
    assert deployment["spec"]["replicas"] == 0, "no teacher (nor its model) unless a run distils"
    assert "memory" in containers()["teacher"]["resources"]["limits"]
    listen = yaml.safe_load((DEPLOY / "compose" / "teacher.yaml").read_text())["server"]["listen"]
    (service,) = [d for d in documents() if d["kind"] == "Service" and d["metadata"]["name"] == "teacher"]
    assert int(listen.rsplit(":", 1)[1]) == 50058 in {p["port"] for p in service["spec"]["ports"]}
    (policy,) = [d for d in documents() if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "teacher"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "teacher"}
    assert set(policy["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    grpc = [rule for rule in policy["spec"]["ingress"] if {"port": 50058} in rule["ports"]]
    trainer = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "trainer"}}}
    assert [rule["from"] for rule in grpc] == [[trainer]]
    assert {port["port"] for rule in policy["spec"]["egress"] for port in rule["ports"]} == {53}


def test_each_rollout_replica_has_its_own_worker_id():
    rollout = containers()["rollout"]
    assert "worker_id=$(POD_NAME)" in rollout["args"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in rollout["env"]
