"""deploy/kubernetes (kustomize base) and the Dockerfile: rendered with ``kubectl kustomize`` (where
kubectl is absent, :func:`_render_python`, a small renderer of only what this base uses: resources,
configMapGenerator with files, one ``labels`` entry and ``images``; it does not add kustomize's
content hash to the ConfigMap names), every object validated against the Kubernetes JSON schemas
(kubernetes-validate, shipped with the package: no network), checked against the gateway itself
(probe routes, drain times, settings names, the processes it loads), and started: the rendered
ConfigMaps written out as the pod mounts them and ``inferlb serve`` run with the container's
environment until ``/readyz`` answers 200."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml

from inferlb.api.health import router as health_router
from inferlb.config.admission import AdmissionSettings
from inferlb.config.rollout import RolloutConfig
from inferlb.config.settings import Settings, fleet_from_mapping, load_settings
from tests.support import free_port

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "kubernetes"
# The oldest Kubernetes minor the base targets (autoscaling/v2, policy/v1, batch/v1 ttl all GA by then).
K8S_VERSION = "1.27.0"


def _render_python() -> list[dict[str, Any]]:
    """What ``kubectl kustomize`` makes of this base, for machines without kubectl: the resources
    and the ConfigMap generators (names without kustomize's content hash), labels and images."""
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for res in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((BASE / res).read_text()) if d]
    for gen in kust.get("configMapGenerator", []):
        data = {Path(f).name: (BASE / f).read_text() for f in gen["files"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kust.get("images", [])}
    for d in docs:
        d["metadata"].setdefault("labels", {}).update(kust["labels"][0]["pairs"])
        for c in _pod_spec(d).get("containers", []) if _pod_spec(d) else []:
            c["image"] = images.get(c["image"], c["image"])
    return docs


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc.get("spec", {}).get("template", {}).get("spec", {}) if doc["kind"] in ("StatefulSet", "Job") else {}


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return _render_python()
    out = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60,
                         check=False, env={**os.environ, "KUBECONFIG": os.devnull})
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    # a generated ConfigMap's name ends in kustomize's content hash (-m5hhc76chm)
    found = [d for d in docs if d["kind"] == kind and (
        name is None or re.fullmatch(re.escape(name) + r"(-[a-z0-9]{10})?", d["metadata"]["name"]))]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def _container(doc: dict[str, Any]) -> dict[str, Any]:
    containers = _pod_spec(doc)["containers"]
    assert len(containers) == 1
    return dict(containers[0])


def test_every_object_is_valid_against_the_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == ["ConfigMap", "ConfigMap", "HorizontalPodAutoscaler", "Job", "PodDisruptionBudget", "Role",
                     "RoleBinding", "Service", "Service", "ServiceAccount", "StatefulSet"]
    for doc in rendered:
        # strict: unknown fields (a typo such as readinesProbe) are errors, not silently dropped
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    broken = _one(rendered, "StatefulSet") | {}
    broken = {**broken, "spec": {**broken["spec"], "replicas": "two"}}
    with pytest.raises(kubernetes_validate.ValidationError):   # the validator does reject bad objects
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_probes_use_routes_the_gateway_serves(rendered: list[dict[str, Any]]) -> None:
    c = _container(_one(rendered, "StatefulSet"))
    routes = {getattr(r, "path", None) for r in health_router.routes}
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" in routes
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" in routes
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"]["port"] in port_names
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert int(env["INFERLB_PORT"]) == port_names["http"] and env["INFERLB_HOST"] == "0.0.0.0"


def test_drain_fits_in_the_grace_period(rendered: list[dict[str, Any]]) -> None:
    dep = _one(rendered, "StatefulSet")
    c = _container(dep)
    env = {e["name"]: e.get("value") for e in c["env"]}
    drain = float(env.get("INFERLB_DRAIN_TIMEOUT_S", Settings.model_fields["drain_timeout_s"].default))
    cmd = c["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[0] == "sleep"
    pre_stop = float(cmd[1])
    # server/lifecycle.py: drain, then 2 s stop grace; app.py: the audit flush waits ≤ 10 s.
    assert pre_stop + drain + 2 + 10 <= _pod_spec(dep)["terminationGracePeriodSeconds"]
    # Readiness tolerates one slow answer (a timeout counts as a failure: one alone leaves the pod in)
    # and still notices the drain (503 from SIGTERM on) within a few seconds, long before it ends.
    probe = c["readinessProbe"]
    assert probe["failureThreshold"] >= 2 and probe["timeoutSeconds"] >= 2
    notice = probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"]
    assert notice <= pre_stop + 2 < drain


def test_runs_as_non_root_with_a_read_only_root(rendered: list[dict[str, Any]]) -> None:
    for kind in ("StatefulSet", "Job"):
        doc = _one(rendered, kind)
        pod, c = _pod_spec(doc), _container(doc)
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/tmp"]]
    sts = _one(rendered, "StatefulSet")
    c = _container(sts)
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    journal = mounts[env["INFERLB_JOURNAL_DIR"]]
    assert not journal.get("readOnly")                                # the audit journal is writable
    # and on the pod's own claim, so it survives rescheduling: a claim template, not a pod volume
    assert journal["name"] not in {v["name"] for v in _pod_spec(sts)["volumes"]}
    claims = {t["metadata"]["name"]: t["spec"] for t in sts["spec"]["volumeClaimTemplates"]}
    assert claims[journal["name"]]["accessModes"] == ["ReadWriteOnce"]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    assert _pod_spec(sts)["securityContext"]["fsGroup"] == _pod_spec(sts)["securityContext"]["runAsGroup"]


def test_env_names_are_settings_and_their_values_load(rendered: list[dict[str, Any]],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    known = {"INFERLB_" + n.upper() for n in Settings.model_fields} | {
        "INFERLB_" + n.upper() for n in AdmissionSettings.model_fields}
    for kind in ("StatefulSet", "Job"):
        c = _container(_one(rendered, kind))
        names = [e["name"] for e in c["env"]]
        assert set(names) <= known, set(names) - known
        assert len(names) == len(set(names))
        for e in c["env"]:
            if "value" in e:
                monkeypatch.setenv(e["name"], e["value"])
            else:   # secrets: the admin key and the database URL never sit in a manifest
                ref = e["valueFrom"]["secretKeyRef"]
                assert ref["name"] == "inferlb-secrets"
                monkeypatch.setenv(e["name"], "postgresql://u@db/inferlb" if "DATABASE" in e["name"] else "x" * 32)
        settings = load_settings()     # every literal value is a valid setting
        assert settings.database_url.startswith("postgresql")
    dep_env = {e["name"] for e in _container(_one(rendered, "StatefulSet"))["env"]}
    assert {"INFERLB_DATABASE_URL", "INFERLB_ADMIN_KEY", "INFERLB_CONFIG", "INFERLB_PROCESSES_DIR"} <= dep_env


def test_config_maps_hold_a_valid_fleet_and_the_shipped_processes(rendered: list[dict[str, Any]]) -> None:
    dep = _one(rendered, "StatefulSet")
    c = _container(dep)
    env = {e["name"]: e.get("value") for e in c["env"]}
    volumes = {v["name"]: v for v in _pod_spec(dep)["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"] if m["name"] in volumes}
    fleet_cm = _one(rendered, "ConfigMap", "inferlb-fleet")
    fleet_dir, fleet_file = env["INFERLB_CONFIG"].rsplit("/", 1)
    assert mounts[fleet_dir]["configMap"]["name"] == fleet_cm["metadata"]["name"]   # the hashed name
    fleet = fleet_from_mapping(yaml.safe_load(fleet_cm["data"][fleet_file]))
    proc_cm = _one(rendered, "ConfigMap", "inferlb-processes")
    assert mounts[env["INFERLB_PROCESSES_DIR"]]["configMap"]["name"] == proc_cm["metadata"]["name"]
    # what the gateway loads from the processes directory is there (inferlb/live/startup.py: the
    # request and health processes, the rollout process always, autoscale.bpmn with `autoscale:` on,
    # which an overlay's fleet may turn on), every shipped process, each equal to the repo's copy
    loaded = {Settings.model_fields["request_process"].default, fleet.health.process,
              fleet.rollouts.process, RolloutConfig().process, "autoscale.bpmn"}
    assert loaded <= set(proc_cm["data"])
    assert set(proc_cm["data"]) == {p.name for p in (REPO / "processes").glob("*.bpmn")}
    for name, text in proc_cm["data"].items():
        assert text == (REPO / "processes" / name).read_text(), f"deploy/kubernetes/processes/{name} drifted"


def test_service_pdb_hpa_and_job_point_at_the_gateway(rendered: list[dict[str, Any]]) -> None:
    dep = _one(rendered, "StatefulSet")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    svc = _one(rendered, "Service", "inferlb")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    pdb = _one(rendered, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    hpa = _one(rendered, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "inferlb"}
    # the StatefulSet's governing Service is headless and selects the same pods
    headless = _one(rendered, "Service", dep["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["selector"] == svc["spec"]["selector"]
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]   # a voluntary eviction can always proceed
    job = _one(rendered, "Job")
    assert _container(job)["args"] == ["db", "upgrade"]
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    assert not svc["spec"]["selector"].items() <= job_labels.items()   # the Service never sends to the Job
    assert _container(job)["image"] == _container(dep)["image"]


def test_the_gateway_account_may_watch_endpointslices_and_scale_workloads_only(
        rendered: list[dict[str, Any]]) -> None:
    """rbac.yaml: what discovery (list/watch EndpointSlices) and the kubernetes actuator
    (get/patch deployments/scale, statefulsets/scale) call, and nothing more."""
    sa, role, binding = (_one(rendered, k) for k in ("ServiceAccount", "Role", "RoleBinding"))
    rules = {(g, r): sorted(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
             for r in rule["resources"]}
    assert rules == {("discovery.k8s.io", "endpointslices"): ["get", "list", "watch"],
                     ("apps", "deployments/scale"): ["get", "patch"],
                     ("apps", "statefulsets/scale"): ["get", "patch"]}
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert [(s["kind"], s["name"]) for s in binding["subjects"]] == [("ServiceAccount", sa["metadata"]["name"])]
    pod = _pod_spec(_one(rendered, "StatefulSet"))
    assert pod["serviceAccountName"] == sa["metadata"]["name"] and pod["automountServiceAccountToken"] is True
    job = _pod_spec(_one(rendered, "Job"))     # the migration Job gets no API token
    assert job.get("serviceAccountName") is None and job["automountServiceAccountToken"] is False
    # the calls the code makes are the ones granted
    from inferlb.autoscale import actuator_kubernetes as actuator
    from inferlb.discovery import kubernetes as discovery

    assert "list_namespaced_endpoint_slice" in Path(discovery.__file__).read_text()
    src = Path(actuator.__file__).read_text()
    assert all(f"{verb}_namespaced_{{kind}}_scale" in src for verb in ("read", "patch"))


def test_dockerfile_is_multi_stage_non_root_and_serves() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", text, re.M)
    assert len(stages) >= 2 and "build" in stages
    runtime = text[text.rindex("\nFROM "):]
    assert "COPY --from=build" in runtime
    user = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert re.search(r'^ENTRYPOINT \["inferlb"\]$', runtime, re.M)
    assert re.search(r'^CMD \["serve"\]$', runtime, re.M)
    # the files the wheel force-includes (pyproject.toml) are in the build context
    ignored = (REPO / ".dockerignore").read_text().split()
    for needed in ("inferlb", "processes", "migrations", "alembic.ini", "pyproject.toml", "README.md"):
        assert needed not in ignored
        assert f"COPY {needed}" in text or f" {needed} " in text or f" {needed}\n" in text
    # the StatefulSet runs the image's user
    deployment = yaml.safe_load((BASE / "statefulset.yaml").read_text())
    assert str(deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"]) == user[-1].split(":")[0]
