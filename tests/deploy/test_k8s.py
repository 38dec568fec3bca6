"""deploy/k8s: every kustomize build renders with kubectl, validates against the Kubernetes
schemas, and keeps the properties README "Run on Kubernetes" promises: the token only as a
mounted file, a NetworkPolicy that admits only workers to the master's gRPC port, non-root
read-only containers with no capabilities, requests and limits everywhere, gRPC probes, a
worker grace period long enough to hand tasks back, spot placement for workers only, a
noise-table cache on a volume that holds it without the pod being evicted, and a study (a file
from a ConfigMap, or a ready study by name) that reaches the master as a study it accepts, with
its study dir on the run's volume.

kubectl comes from $KUBECTL, PATH or .venv-k8s (`make k8s-tools`); this file installs nothing.
Without it the tests skip, except under CI=true, where they fail. The checkov scan of the same
renderings is `make k8s-lint`.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from neuro.noise import MAX_CACHE_BYTES, NoiseTableSpec
from tests.support.processes import REPO

K8S = REPO / "deploy" / "k8s"
BUILDS = ["base", *sorted(f"overlays/{p.name}" for p in (K8S / "overlays").iterdir() if p.is_dir())]
# The oldest Kubernetes the manifests support (native gRPC probes are GA from 1.27; 1.30 is the
# oldest the major clouds still run) and the newest the pinned validator ships schemas for.
SCHEMA_VERSIONS = ["1.30.0", "1.37.0"]
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}
MASTER_LABELS = {"app.kubernetes.io/name": "neuro", "app.kubernetes.io/component": "master"}
WORKER_LABELS = {"app.kubernetes.io/name": "neuro", "app.kubernetes.io/component": "worker"}
SPOT_LABELS = {
    "cloud.google.com/gke-spot": "true",
    "eks.amazonaws.com/capacityType": "SPOT",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
TOKEN_SECRET = "neuro-token"

Doc = dict[str, Any]


def _kubectl_path() -> str | None:
    if os.environ.get("KUBECTL"):
        return os.environ["KUBECTL"]
    local = REPO / ".venv-k8s" / "bin" / "kubectl"
    return shutil.which("kubectl") or (str(local) if local.exists() else None)


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = _kubectl_path()
    if path is None:
        message = "kubectl not found (KUBECTL, PATH, .venv-k8s): `make k8s-tools` installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


_RENDERED: dict[str, list[Doc]] = {}


@pytest.fixture(scope="session")
def render(kubectl: str):
    def render(build: str) -> list[Doc]:
        if build not in _RENDERED:
            out = subprocess.run(
                [kubectl, "kustomize", str(K8S / build)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, f"kubectl kustomize {build}: {out.stderr}"
            _RENDERED[build] = [d for d in yaml.safe_load_all(out.stdout) if d]
        return _RENDERED[build]

    return render


def _one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}/{name} rendered"
    return found[0]


def _pod(workload: Doc) -> Doc:
    return workload["spec"]["template"]["spec"]


def _containers(pod: Doc) -> list[Doc]:
    return pod.get("initContainers", []) + pod["containers"]


def _env(container: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _container(workload: Doc, name: str) -> Doc:
    return next(c for c in _pod(workload)["containers"] if c["name"] == name)


def _master(docs: list[Doc]) -> Doc:
    return _one(docs, "StatefulSet", "neuro-master")


def _worker(docs: list[Doc]) -> Doc:
    return _one(docs, "Deployment", "neuro-worker")


def _matches(selector: Doc, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"selector beyond matchLabels: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def test_builds_are_found():
    assert {"base", "overlays/spot", "overlays/tensorboard", "overlays/study"} <= set(BUILDS)


@pytest.mark.parametrize("build", BUILDS)
def test_renders_the_fleet(render, build):
    docs = render(build)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for expected in [
        ("Namespace", "neuro"),
        ("StatefulSet", "neuro-master"),
        ("Service", "neuro-master"),
        ("Deployment", "neuro-worker"),
        ("NetworkPolicy", "neuro-master"),
        ("PodDisruptionBudget", "neuro-master"),
        ("PodDisruptionBudget", "neuro-worker"),
    ]:
        assert expected in kinds, f"{build} lacks {expected}"
    # The token is created by hand (README), so no build may carry a Secret.
    assert not [d for d in docs if d["kind"] == "Secret"], f"{build} renders a Secret"
    for d in docs:
        if d["kind"] != "Namespace":
            assert d["metadata"].get("namespace") == "neuro", d["metadata"]


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("build", BUILDS)
def test_validates_against_the_kubernetes_schemas(render, build, version):
    for doc in render(build):
        # strict: a misspelt or misplaced field is an error, not silently dropped by the API.
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_catches_a_misplaced_field(render):
    bad = copy.deepcopy(_worker(render("base")))
    _pod(bad)["containers"][0]["readOnlyRootFilesystem"] = True  # belongs in securityContext
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, SCHEMA_VERSIONS[0], strict=True)


@pytest.mark.parametrize("build", BUILDS)
def test_every_pod_is_locked_down(render, build):
    workloads = [d for d in render(build) if d["kind"] in WORKLOADS]
    assert workloads
    for workload in workloads:
        where = f"{build}: {workload['kind']}/{workload['metadata']['name']}"
        pod = _pod(workload)
        assert pod.get("automountServiceAccountToken") is False, where
        assert pod.get("hostNetwork", False) is False, where
        pod_security = pod.get("securityContext", {})
        assert pod_security.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        for container in _containers(pod):
            at = f"{where} container {container['name']}"
            security = container.get("securityContext", {})
            assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, at
            assert security.get("runAsUser", pod_security.get("runAsUser", 0)) != 0, at
            assert security.get("allowPrivilegeEscalation") is False, at
            assert security.get("readOnlyRootFilesystem") is True, at
            assert security.get("privileged", False) is False, at
            assert security.get("capabilities", {}).get("drop") == ["ALL"], at
            assert not security.get("capabilities", {}).get("add"), at
            for bound in ("requests", "limits"):
                for resource in ("cpu", "memory"):
                    assert resource in container.get("resources", {}).get(bound, {}), (
                        f"{at}: no {resource} {bound}"
                    )
            image = container["image"]
            tag = image.rsplit("/", 1)[-1]
            assert "@sha256:" in image or (":" in tag and not tag.endswith(":latest")), at
            # A read-only root needs somewhere to write: /tmp is an emptyDir everywhere.
            mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
            assert "/tmp" in mounts, at


@pytest.mark.parametrize("build", BUILDS)
def test_the_token_is_only_a_mounted_file(render, build):
    docs = render(build)
    for workload, name in ((_master(docs), "master"), (_worker(docs), "worker")):
        pod = _pod(workload)
        secret_volumes = {v["name"]: v["secret"] for v in pod.get("volumes", []) if "secret" in v}
        assert [s["secretName"] for s in secret_volumes.values()] == [TOKEN_SECRET]
        for container in _containers(pod):
            for env in container.get("env", []):
                assert "secretKeyRef" not in env.get("valueFrom", {}), env
                assert env["name"] != "NEURO_TOKEN", "the token itself in an env var"
            for source in container.get("envFrom", []):
                assert "secretRef" not in source, source
        main = _container(workload, name)
        token_file = _env(main)["NEURO_TOKEN_FILE"]
        mount = next(m for m in main["volumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
        assert mount["name"] in secret_volumes and mount.get("readOnly") is True
        items = secret_volumes[mount["name"]]["items"]
        assert [(i["key"], i["path"]) for i in items] == [("token", Path(token_file).name)]
        # Not world-readable: uid 10001 reads it through the pod's fsGroup.
        assert secret_volumes[mount["name"]]["defaultMode"] & 0o007 == 0
        assert pod["securityContext"]["fsGroup"] == 10001


@pytest.mark.parametrize("build", BUILDS)
def test_only_workers_reach_the_master_grpc_port(render, build):
    docs = render(build)
    master_labels = _pod_labels(_master(docs))
    worker_labels = _pod_labels(_worker(docs))
    policies = [
        p
        for p in docs
        if p["kind"] == "NetworkPolicy" and _matches(p["spec"]["podSelector"], master_labels)
    ]
    assert len(policies) == 1, "exactly one NetworkPolicy selects the master"
    policy = policies[0]["spec"]
    assert not _matches(policies[0]["spec"]["podSelector"], worker_labels)
    assert "Ingress" in policy["policyTypes"]
    grpc_rules = []
    for rule in policy["ingress"]:
        ports = {p["port"] for p in rule.get("ports", [])}
        assert ports, f"an ingress rule open on every port: {rule}"
        assert rule.get("from"), f"an ingress rule open to everyone: {rule}"
        if 8080 in ports or "grpc" in ports:
            grpc_rules.append(rule)
    assert len(grpc_rules) == 1
    (rule,) = grpc_rules
    assert {p["port"] for p in rule["ports"]} == {8080}
    assert [p.get("protocol", "TCP") for p in rule["ports"]] == ["TCP"]
    # Worker pods of the policy's own namespace: no namespaceSelector, no ipBlock.
    assert len(rule["from"]) == 1 and set(rule["from"][0]) == {"podSelector"}
    peer = rule["from"][0]["podSelector"]
    assert peer["matchLabels"] == WORKER_LABELS
    assert _matches(peer, worker_labels) and not _matches(peer, master_labels)
    # The metrics rule admits its scraper on the metrics port alone.
    for other in policy["ingress"]:
        if other is not rule:
            assert {p["port"] for p in other["ports"]} == {9090}


def _pod_labels(workload: Doc) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


@pytest.mark.parametrize("build", BUILDS)
def test_master_statefulset_service_and_grpc_probes(render, build):
    docs = render(build)
    master = _master(docs)
    assert master["spec"]["replicas"] == 1
    assert _matches(master["spec"]["selector"], _pod_labels(master))
    container = _container(master, "master")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe].get("grpc") == {"port": 8080}, probe
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == 8080
    env = _env(container)
    assert env["NEURO_PORT"] == "8080" and env["NEURO_HOST"] == "0.0.0.0"
    assert env["NEURO_METRICS_PORT"] == str(ports["metrics"])
    # The run dir is on the claim template's volume, so a replaced pod resumes from it.
    (claim,) = master["spec"]["volumeClaimTemplates"]
    run_mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert env["NEURO_RUN_DIR"].startswith(run_mount["mountPath"] + "/")
    assert claim["spec"]["resources"]["requests"]["storage"]
    service = _one(docs, "Service", master["spec"]["serviceName"])
    assert _matches({"matchLabels": service["spec"]["selector"]}, _pod_labels(master))
    service_ports = {p["port"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert service_ports[8080] == "grpc"
    assert service_ports[ports["metrics"]] == "metrics"
    # The master stays off spot capacity in every build.
    terms = master["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 1
    excluded = {e["key"]: e["values"] for e in terms[0]["matchExpressions"]}
    for key, value in SPOT_LABELS.items():
        assert excluded[key] == [value]
    assert all(e["operator"] == "NotIn" for e in terms[0]["matchExpressions"])


@pytest.mark.parametrize("build", BUILDS)
def test_workers_drain_and_find_the_master(render, build):
    docs = render(build)
    worker = _worker(docs)
    pod = _pod(worker)
    # A worker needs a few seconds to hand its leases back after SIGTERM.
    assert pod["terminationGracePeriodSeconds"] >= 30
    container = _container(worker, "worker")
    env = _env(container)
    service = _one(docs, "Service", "neuro-master")
    assert env["NEURO_MASTER"] == "neuro-master:8080"
    assert 8080 in {p["port"] for p in service["spec"]["ports"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert env["NEURO_SHARED_DIR"] == "/dev/shm"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["sizeLimit"]
    assert "emptyDir" in volumes[mounts[env["NEURO_CACHE_DIR"]]]
    # Scaled with `kubectl scale`: nothing else in the build owns the replica count.
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


@pytest.mark.parametrize("build", BUILDS)
def test_disruption_budgets_let_drains_through(render, build):
    docs = render(build)
    master_pdb = _one(docs, "PodDisruptionBudget", "neuro-master")["spec"]
    # One replica: a budget of 0 would block every drain of its node; it resumes instead.
    assert master_pdb["maxUnavailable"] == 1 and "minAvailable" not in master_pdb
    assert _matches(master_pdb["selector"], _pod_labels(_master(docs)))
    worker_pdb = _one(docs, "PodDisruptionBudget", "neuro-worker")["spec"]
    assert worker_pdb["maxUnavailable"] not in (0, "0%")
    assert _matches(worker_pdb["selector"], _pod_labels(_worker(docs)))


def test_spot_overlay_tolerates_and_targets_spot_for_workers_only(render):
    docs = render("overlays/spot")
    pod = _pod(_worker(docs))
    tolerations = {(t["key"], t.get("value")) for t in pod["tolerations"]}
    assert set(SPOT_LABELS.items()) <= tolerations
    assert all(t["effect"] == "NoSchedule" for t in pod["tolerations"])
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    # One term per provider (terms are ORed), each requiring that provider's spot label.
    wanted = {
        (e["key"], tuple(e["values"]))
        for t in terms
        for e in t["matchExpressions"]
        if len(t["matchExpressions"]) == 1 and e["operator"] == "In"
    }
    assert {(k, (v,)) for k, v in SPOT_LABELS.items()} <= wanted
    for workload in (d for d in docs if d["kind"] in WORKLOADS):
        if workload["metadata"]["name"] != "neuro-worker":
            assert not _pod(workload).get("tolerations"), workload["metadata"]["name"]
    for build in ("base", "overlays/tensorboard"):
        for workload in (d for d in render(build) if d["kind"] in WORKLOADS):
            assert not _pod(workload).get("tolerations"), (build, workload["metadata"]["name"])


def test_tensorboard_overlay_reads_the_run_dir_read_only_beside_the_master(render):
    docs = render("overlays/tensorboard")
    master = _master(docs)
    board = _container(master, "tensorboard")
    (claim,) = master["spec"]["volumeClaimTemplates"]
    run_mount = next(m for m in board["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert run_mount["readOnly"] is True
    assert "--host=127.0.0.1" in board["args"]
    # A sidecar, not a second pod on the ReadWriteOnce volume.
    assert [d["metadata"]["name"] for d in docs if d["kind"] in WORKLOADS] == [
        "neuro-worker",
        "neuro-master",
    ]
    assert [c["name"] for c in _pod(_master(render("base")))["containers"]] == ["master"]


# -- a study ---------------------------------------------------------------------------------
STUDY_OVERLAY = K8S / "overlays" / "study"
CONFIGMAP_BYTES = 1 << 20
"""What one ConfigMap may hold (etcd's limit on an object)."""


def _master_env(docs: list[Doc]) -> dict[str, str]:
    """The master container's environment as the pod gets it: its ConfigMaps, then env."""
    container = _container(_master(docs), "master")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= _one(docs, "ConfigMap", source["configMapRef"]["name"])["data"]
    return env | _env(container)


def _dry_run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """neuro-master --dry-run configured by `env` alone, as the image's entrypoint is: the
    container's paths moved under tmp_path, nothing of this shell's NEURO_* variables."""
    local = {k: v for k, v in os.environ.items() if not k.startswith("NEURO_")}
    moved = {k: str(tmp_path / v.lstrip("/")) if v.startswith("/") else v for k, v in env.items()}
    return subprocess.run([sys.executable, "-m", "master", "--dry-run"], cwd=tmp_path,
                          env={**local, **moved, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_the_study_overlay_hands_the_master_its_study_file(render, tmp_path: Path) -> None:
    docs = render("overlays/study")
    master = _master(docs)
    container = _container(master, "master")
    env = _master_env(docs)
    # The file: a read-only mount of a generated ConfigMap (its name carries the file's hash,
    # so an edited study rolls the master) holding the overlay's study.toml as it is.
    study_path = PurePosixPath(env["NEURO_STUDY"])
    mount = mount_of(container, study_path)
    assert mount.get("readOnly") is True, mount
    volume = next(v for v in _pod(master)["volumes"] if v["name"] == mount["name"])
    configmap = _one(docs, "ConfigMap", volume["configMap"]["name"])
    assert configmap["metadata"]["name"].startswith("neuro-study-"), configmap["metadata"]
    (item,) = volume["configMap"]["items"]
    assert PurePosixPath(mount["mountPath"]) / item["path"] == study_path
    text = (STUDY_OVERLAY / "study.toml").read_text()
    assert configmap["data"][item["key"]] == text
    assert len(text.encode()) < CONFIGMAP_BYTES // 4, "room left in the ConfigMap"
    # The study dir is on the run's volume beside the run dir, so a replaced pod resumes it.
    (claim,) = master["spec"]["volumeClaimTemplates"]
    run_mount = next(m for m in container["volumeMounts"] if m["name"] == claim["metadata"]["name"])
    assert env["NEURO_STUDY_DIR"].startswith(run_mount["mountPath"] + "/")
    assert env["NEURO_STUDY_DIR"] != env["NEURO_RUN_DIR"]
    # The master, configured by that environment alone, accepts the file and lists its runs.
    local = tmp_path / study_path.relative_to("/")
    local.parent.mkdir(parents=True)
    local.write_text(configmap["data"][item["key"]])
    done = _dry_run(env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"study atari-three ({local}): 9 runs, at most 3 at once, study dir " in done.stdout
    assert re.search(r"^kangaroo-v4-s2 +Kangaroo-v4 +2 +200,000,000 frames .* queued$",
                     done.stdout, re.M), done.stdout  # fmt: skip
    # The base and the other overlays serve one run: no study reaches their master.
    for build in BUILDS:
        if build != "overlays/study":
            assert "NEURO_STUDY" not in _master_env(render(build)), build


@pytest.mark.parametrize("study", ["paper", "paper-v2"])
def test_a_ready_study_is_named_in_the_masters_configmap(
    kubectl: str, tmp_path: Path, study: str
) -> None:
    """The documented overlay: NEURO_STUDY merged into the base's ConfigMap; an unknown name
    is refused by the master, naming it."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S / "base", overlay)],
        "configMapGenerator": [{"name": "neuro-master", "behavior": "merge",
                                "literals": [f"NEURO_STUDY={study}"]}],
    }))  # fmt: skip
    out = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    env = _master_env([d for d in yaml.safe_load_all(out.stdout) if d])
    assert env["NEURO_STUDY"] == study and env["NEURO_ENV"], env
    done = _dry_run(env, tmp_path)
    if study == "paper":
        assert done.returncode == 0, done.stderr
        assert "study paper: 65 runs, at most 65 at once, study dir " in done.stdout
        assert f"study dir {tmp_path / env['NEURO_STUDY_DIR'].lstrip('/')}\n" in done.stdout
    else:
        assert done.returncode == 2, done.stdout
        assert "no study file 'paper-v2', and no ready study of that name" in done.stderr


def test_no_token_is_generated_from_a_file_in_the_tree():
    for kustomization in K8S.rglob("kustomization.yaml"):
        config = yaml.safe_load(kustomization.read_text())
        assert "secretGenerator" not in config, kustomization


# -- where the noise table is built ----------------------------------------------------------
# An ES-family master (es, ns-es, nsr-es) and every worker build the paper's 1 GB Atari noise
# table on first use, in NEURO_CACHE_DIR (else ~/.cache/neuro). A cache on an emptyDir smaller
# than the table, or emptyDirs that push a pod past its ephemeral-storage limit, get the pod
# evicted by the kubelet, and its StatefulSet or Deployment restarts it into the same eviction.

TABLE_BYTES = NoiseTableSpec().nbytes
"""The paper's Atari noise table, the largest a preset builds."""
UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip


def quantity(text: str | int) -> int:
    """Bytes of a Kubernetes quantity such as 512Mi or 10Gi."""
    match = re.fullmatch(r"(\d+)([kMGT]i?)?", str(text))
    assert match, f"unexpected quantity {text!r}"
    return int(match.group(1)) * UNITS[match.group(2) or ""]


def cache_dir(container: dict[str, Any]) -> PurePosixPath:
    """Where neuro.noise.default_cache_dir() puts the table in this container."""
    env = _env(container)
    if env.get("NEURO_CACHE_DIR"):
        return PurePosixPath(env["NEURO_CACHE_DIR"])
    assert env.get("HOME"), "no HOME: the image's would be on the read-only root"
    return PurePosixPath(env["HOME"]) / ".cache" / "neuro"


def mount_of(container: dict[str, Any], path: PurePosixPath) -> dict[str, Any]:
    """The volume mount that holds `path` (the deepest one)."""
    holding = [m for m in container.get("volumeMounts", [])
               if path == PurePosixPath(m["mountPath"])
               or PurePosixPath(m["mountPath"]) in path.parents]  # fmt: skip
    assert holding, f"{path} is on the read-only root filesystem"
    return max(holding, key=lambda m: len(m["mountPath"]))


def ephemeral_limit(pod: dict[str, Any]) -> int:
    """The pod's ephemeral-storage limit: the sum of its containers' (each must set one)."""
    limits = [c.get("resources", {}).get("limits", {}) for c in pod["containers"]]
    assert all("ephemeral-storage" in limit for limit in limits), limits
    return sum(quantity(limit["ephemeral-storage"]) for limit in limits)


def disk_empty_dirs(pod: dict[str, Any]) -> dict[str, int]:
    """Each disk-backed emptyDir's sizeLimit (memory-backed ones count as memory)."""
    found = {}
    for volume in pod.get("volumes", []):
        empty = volume.get("emptyDir")
        if empty is not None and empty.get("medium") != "Memory":
            assert "sizeLimit" in empty, f"emptyDir {volume['name']} has no sizeLimit"
            found[volume["name"]] = quantity(empty["sizeLimit"])
    return found


def where_the_table_goes(workload: dict[str, Any], name: str) -> tuple[str, int]:
    """('the claim' or 'an emptyDir', bytes the table's volume holds) for container `name`."""
    container = _container(workload, name)
    mount = mount_of(container, cache_dir(container))
    claims = {c["metadata"]["name"]: c for c in workload["spec"].get("volumeClaimTemplates", [])}
    if mount["name"] in claims:
        assert not mount.get("readOnly"), mount
        return "the claim", quantity(
            claims[mount["name"]]["spec"]["resources"]["requests"]["storage"]
        )
    volumes = disk_empty_dirs(_pod(workload))
    assert mount["name"] in volumes, f"the cache is on {mount['name']}, neither claim nor emptyDir"
    return "an emptyDir", volumes[mount["name"]]


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("role", ["master", "worker"])
def test_the_noise_table_has_room_where_it_is_built(render, build: str, role: str) -> None:
    docs = render(build)
    workload = _master(docs) if role == "master" else _worker(docs)
    kind, room = where_the_table_goes(workload, role)
    where = f"{build}: the {role}'s noise table ({TABLE_BYTES} bytes) on {kind} of {room} bytes"
    # The table, and its temp file while it is built (written beside it, then renamed).
    assert room >= TABLE_BYTES + 2**20, where
    if kind == "the claim":
        # The claim also holds the run: the cache must leave it most of the volume.
        assert room - MAX_CACHE_BYTES >= 4 * 2**30, where


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("role", ["master", "worker"])
def test_full_emptydirs_stay_under_the_pods_ephemeral_storage_limit(
    render, build: str, role: str
) -> None:
    """The kubelet evicts a pod whose emptyDirs and writable layers pass its limit: full ones
    must fit, with room for logs and the writable layer."""
    docs = render(build)
    pod = _pod(_master(docs) if role == "master" else _worker(docs))
    empty = sum(disk_empty_dirs(pod).values())
    assert empty + 128 * 2**20 <= ephemeral_limit(pod), (build, role, disk_empty_dirs(pod))
