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
import tomllib
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
    # and still notices the drain (503 from SIGTERM on) early in it: a request sent just before it
    # notices still has most of the drain to finish.
    probe = c["readinessProbe"]
    assert probe["failureThreshold"] >= 2 and probe["timeoutSeconds"] >= 2
    notice = probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"]
    assert notice < drain / 2


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


GUARD_S = 60.0      # hang guard only: start-up of a real gateway


def _secret_refs(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The container's secretKeyRef env entries: {key in inferlb-secrets: ref}."""
    return {e["valueFrom"]["secretKeyRef"]["key"]: e["valueFrom"]["secretKeyRef"]
            for e in container["env"] if "valueFrom" in e}


def test_the_rendered_base_starts_and_is_ready(rendered: list[dict[str, Any]], tmp_path: Path) -> None:
    """The pod as Kubernetes would make it, on this machine: every mount of the gateway container
    under ``root`` (the rendered ConfigMaps' keys as files, as a configMap volume without ``items``
    mounts them; an empty directory for the journal claim and ``/tmp``), the container's env with
    its absolute paths moved under ``root``, the Secret's keys given test values (the database a
    temporary SQLite file, not PostgreSQL), the image's ENTRYPOINT + the container's args run in the
    image's WORKDIR, on 127.0.0.1 and a free port instead of 0.0.0.0:8080. It must answer the
    probes, serve /metrics at the scrape annotations' path to the Secret's metrics token only (auth is
    on), and write nothing outside its writable mounts (the root filesystem is read-only)."""
    sts = _one(rendered, "StatefulSet")
    pod, c = _pod_spec(sts), _container(sts)
    root = tmp_path / "root"
    volumes = {v["name"]: v for v in pod["volumes"]}
    config_maps = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "ConfigMap"}
    writable: list[Path] = []
    for m in c["volumeMounts"]:
        target = root / m["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        vol = volumes.get(m["name"])
        if vol is not None and "configMap" in vol:
            assert m.get("readOnly") is True and "items" not in vol["configMap"]
            for key, text in config_maps[vol["configMap"]["name"]]["data"].items():
                (target / key).write_text(text)
        else:   # an emptyDir or the journal's claim: empty and writable
            writable.append(target)
    (tmp_path / "db").mkdir()
    secret = {"database-url": f"sqlite:///{tmp_path / 'db' / 'inferlb.db'}", "admin-key": secrets.token_hex(24),
              "metrics-token": secrets.token_hex(24)}
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1",
           "HOME": str(root / "tmp"), "TMPDIR": str(root / "tmp")}
    for e in c["env"]:
        if "value" in e:
            value = str(e["value"])
            env[e["name"]] = str(root / value.lstrip("/")) if value.startswith("/") else value
        else:
            ref = e["valueFrom"]["secretKeyRef"]
            if ref["key"] in secret:
                env[e["name"]] = secret[ref["key"]]
            else:   # a key the Secret may lack (redis-url): then the variable is not set at all
                assert ref.get("optional") is True, ref
    assert env["INFERLB_HOST"] == "0.0.0.0" and env["INFERLB_AUTH"] == "true"
    port = free_port()
    # the pod's admin listener sits on port + 1 (the default), which may be taken on a busy machine
    env |= {"INFERLB_HOST": "127.0.0.1", "INFERLB_PORT": str(port), "INFERLB_ADMIN_PORT": str(free_port())}
    dockerfile = (REPO / "Dockerfile").read_text()
    runtime = dockerfile[dockerfile.rindex("\nFROM "):]
    workdir = root / re.findall(r"^WORKDIR\s+(\S+)", runtime, re.M)[-1].lstrip("/")
    workdir.mkdir(parents=True, exist_ok=True)
    before = {p for p in root.rglob("*")}
    assert re.search(r'^ENTRYPOINT \["inferlb"\]$', runtime, re.M)   # `inferlb` is inferlb.cli (pyproject.toml)
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "inferlb.cli", *c["args"]], cwd=workdir, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            deadline = time.monotonic() + GUARD_S
            while True:     # bounded: start-up (the first health round against the fleet's unreachable nodes)
                try:
                    if client.get(c["readinessProbe"]["httpGet"]["path"]).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "never ready:\n" + log.read_text()
                time.sleep(0.1)
            assert client.get(c["livenessProbe"]["httpGet"]["path"]).status_code == 200
            annotations = sts["spec"]["template"]["metadata"]["annotations"]
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert int(annotations["prometheus.io/port"]) == ports["http"]
            path = annotations["prometheus.io/path"]
            assert client.get(path).status_code == 401
            tenant_free = client.get(path, headers={"authorization": f"Bearer {secret['metrics-token']}"})
            assert tenant_free.status_code == 200 and "inferlb_requests_total" in tenant_free.text
        proc.terminate()        # SIGTERM: drains (nothing in flight) and exits 0
        assert proc.wait(timeout=GUARD_S) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    written = {p for p in root.rglob("*") if p.is_file()} - before
    outside = [p for p in written if not any(p.is_relative_to(w) for w in writable)]
    assert not outside, outside
    assert (tmp_path / "db" / "inferlb.db").is_file()     # the Secret's database URL was the one used


def test_the_gateway_needs_every_process_the_config_map_carries(rendered: list[dict[str, Any]],
                                                                 tmp_path: Path) -> None:
    """The other side of the start test: without the rollout process (what the base once shipped:
    the request and health processes only) the gateway refuses to start, naming the file."""
    from inferlb.app import check_startup_files
    from inferlb.errors import ProcessValidationError

    proc_cm = _one(rendered, "ConfigMap", "inferlb-processes")
    fleet_cm = _one(rendered, "ConfigMap", "inferlb-fleet")
    (tmp_path / "fleet.yaml").write_text(fleet_cm["data"]["fleet.yaml"])
    pdir = tmp_path / "processes"
    pdir.mkdir()
    for key, text in proc_cm["data"].items():
        if key != RolloutConfig().process:
            (pdir / key).write_text(text)
    settings = Settings(config=tmp_path / "fleet.yaml", processes_dir=pdir)
    with pytest.raises(ProcessValidationError, match=r"rollout\.bpmn.*cannot read"):
        check_startup_files(settings)
    (pdir / RolloutConfig().process).write_text(proc_cm["data"][RolloutConfig().process])
    check_startup_files(settings)


def test_one_image_name_set_in_the_kustomization(rendered: list[dict[str, Any]]) -> None:
    """The manifests name the placeholder ``inferlb`` only; the kustomization's ``images`` sets the
    name and tag (the one place to change them), its tag is the package's version, and the docs
    that build the image build that name."""
    kust = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    (image,) = kust["images"]
    ref = f"{image['newName']}:{image['newTag']}"
    for res in kust["resources"]:
        for doc in yaml.safe_load_all((BASE / res).read_text()):
            for c in _pod_spec(doc).get("containers", []) if doc else []:
                assert c["image"] == image["name"], (res, c["image"])
    assert {_container(_one(rendered, k))["image"] for k in ("StatefulSet", "Job")} == {ref}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert image["newTag"] == pyproject["project"]["version"]
    built = [m for doc in ("README.md", "docs/replicas.md")
             for m in re.findall(r"docker build -t (\S+)", (REPO / doc).read_text())]
    assert built and set(built) == {ref}


class _Relabel:
    """Prometheus' relabelling, limited to what deploy/prometheus/prometheus-kubernetes.yml uses:
    ``keep`` and ``replace`` (the default action) on ``;``-joined source labels, the regex fully
    anchored, ``$1``-style replacements (default ``$1``)."""

    @staticmethod
    def apply(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
        out = dict(labels)
        for rule in rules:
            value = ";".join(out.get(s, "") for s in rule.get("source_labels", []))
            match = re.fullmatch(rule.get("regex", "(.*)"), value)
            action = rule.get("action", "replace")
            if action == "keep":
                if match is None:
                    return None
            elif action == "replace":
                if match is not None:
                    # Prometheus' $1 is Python's \1
                    template = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
                    out[rule["target_label"]] = match.expand(template)
            else:
                raise AssertionError(f"action {action!r} is not modelled here")
        return out


def _meta(name: str, prefix: str) -> str:
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def test_the_kubernetes_scrape_job_sends_the_metrics_token_to_the_annotated_port(
        rendered: list[dict[str, Any]]) -> None:
    """With auth on, /metrics wants a bearer token (inferlb/api/auth.py); the pods carry the Secret's
    metrics-token as INFERLB_METRICS_TOKEN and the in-cluster scrape job sends a token from a file,
    at the address and path the pods' prometheus.io annotations give (relabelled as Prometheus would)."""
    sts = _one(rendered, "StatefulSet")
    c = _container(sts)
    env = {e["name"]: e for e in c["env"]}
    assert env["INFERLB_AUTH"]["value"] == "true"
    ref = env["INFERLB_METRICS_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "inferlb-secrets", "key": "metrics-token"}     # required: not optional
    prom = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus-kubernetes.yml").read_text())
    (job,) = [j for j in prom["scrape_configs"] if j["job_name"] == "inferlb"]
    assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    assert "credentials" not in job["authorization"]      # the token never sits in the config
    template = sts["spec"]["template"]["metadata"]
    pod_labels = {"__address__": "10.1.2.3", "__meta_kubernetes_pod_ip": "10.1.2.3",
                  "__meta_kubernetes_namespace": "default", "__meta_kubernetes_pod_name": "inferlb-0",
                  "__metrics_path__": "/metrics-default"}
    pod_labels |= {_meta(k, "__meta_kubernetes_pod_label_"): v for k, v in template["labels"].items()}
    pod_labels |= {_meta(k, "__meta_kubernetes_pod_annotation_"): v for k, v in template["annotations"].items()}
    target = _Relabel.apply(pod_labels, job["relabel_configs"])
    assert target is not None, "the scrape job drops the gateway's pods"
    assert target["__address__"] == f"10.1.2.3:{c['ports'][0]['containerPort']}"
    assert target["__metrics_path__"] == template["annotations"]["prometheus.io/path"] == "/metrics"
    # not the migration Job's pod, and not a gateway pod that stops asking to be scraped
    job_pod = pod_labels | {_meta(k, "__meta_kubernetes_pod_label_"): v
                            for k, v in _one(rendered, "Job")["spec"]["template"]["metadata"]["labels"].items()}
    assert _Relabel.apply(job_pod, job["relabel_configs"]) is None
    off = pod_labels | {"__meta_kubernetes_pod_annotation_prometheus_io_scrape": "false"}
    assert _Relabel.apply(off, job["relabel_configs"]) is None


def test_every_required_secret_key_is_in_the_documented_secret(rendered: list[dict[str, Any]]) -> None:
    """A pod whose Secret lacks a required key never starts (CreateContainerConfigError): each key the
    manifests need is in the ``kubectl create secret`` commands of the kustomization and the docs."""
    needed = {key for kind in ("StatefulSet", "Job")
              for key, ref in _secret_refs(_container(_one(rendered, kind))).items() if not ref.get("optional")}
    assert {"database-url", "admin-key", "metrics-token"} <= needed
    for doc in (BASE / "kustomization.yaml", REPO / "docs" / "replicas.md"):
        text = doc.read_text()
        assert "kubectl create secret generic inferlb-secrets" in text, doc
        assert needed <= set(re.findall(r"--from-literal=([a-z-]+)=", text)), doc


def test_the_migration_job_can_be_applied_again(rendered: list[dict[str, Any]]) -> None:
    """``kubectl apply`` refuses ``generateName``, and a Job's pod template cannot change: a stable
    name, removed some time after it ends, and the documented command deletes it before re-applying."""
    job = _one(rendered, "Job")
    name = job["metadata"]["name"]
    assert "generateName" not in job["metadata"] and name == "inferlb-db-upgrade"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0 and job["spec"]["activeDeadlineSeconds"] > 0
    again = f"kubectl delete job {name} --ignore-not-found && kubectl apply -k deploy/kubernetes"
    for doc in (BASE / "db-upgrade-job.yaml", REPO / "docs" / "replicas.md"):
        assert again in doc.read_text(), doc
    wait = f"kubectl wait --for=condition=complete --timeout=10m job/{name}"
    assert wait in (REPO / "docs" / "replicas.md").read_text()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_promtool_accepts_the_kubernetes_scrape_config() -> None:
    # --syntax-only: the token file and the rule file exist in Prometheus' pod, not here
    proc = subprocess.run(["promtool", "check", "config", "--syntax-only",
                           str(REPO / "deploy" / "prometheus" / "prometheus-kubernetes.yml")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
