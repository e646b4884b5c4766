# SpecServing developer entry points. `make test` is the one CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Everything heavy (Go-built control plane, SGLang venvs, wheels) lives outside the repo, keyed by version.
export SPECSERVING_CACHE ?= $(HOME)/.cache/specserving

.PHONY: help venv test test-unit test-decode-path test-fuzz test-offline test-cluster demo render cluster-up cluster-down cluster-env cluster-build crds bench reliability

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | column -t -s $$'\t'

$(PY): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip==25.3
	$(PY) -m pip install -q -e '.[test]'
	@touch $(PY)

venv: $(PY) ## create .venv with the operator and its test tools

# The decode_path tier keeps both cores busy with SGLang subprocesses while the cluster tier mostly waits on the
# control plane, so after the unit tier the two run side by side, and the fuzz tier follows the decode_path tier in
# its slot (test-offline), never holding the cluster tier back; each tier's output is printed whole when it ends.
test: test-unit ## run every test tier: unit, then decode_path and fuzz beside cluster
	$(MAKE) --no-print-directory --output-sync=target -j2 test-cluster test-offline

test-offline: $(PY) ## the decode_path tier, then the fuzz tier (the tiers that need no cluster)
	$(MAKE) --no-print-directory test-decode-path
	$(MAKE) --no-print-directory test-fuzz

test-unit: $(PY) ## pure tests: spec model, CRD, renderer golden files, validation; the layers and types
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy
	$(PY) -m pytest tests/unit

test-decode-path: $(PY) ## the real SGLang wheels of every supported version, on CPU
	bash hack/decode-path-env.sh
	$(PY) -m pytest --durations=5 tests/decode_path

test-fuzz: $(PY) ## 10,000 mutated, malformed and hostile inputs through the CLI: an answer for each, no traceback
	$(PY) -m pytest --durations=5 tests/fuzz

test-cluster: $(PY) cluster-build ## the real control plane on 127.0.0.1: operator, webhook, chart, reliability (CI size), bench smoke
	$(PY) -m pytest --durations=12 tests/cluster tests/reliability tests/bench

demo: $(PY) ## the user's path on the local cluster: helm install the operator image, apply the seed (Ready), a refused NGRAM
	bash hack/demo.sh

bench: $(PY) cluster-build ## full benchmarks (N = 1, 100, 1000; a 10-minute idle window at 1000) on the local control plane; writes docs/benchmarks.md
	$(PY) -m bench --sizes 1,100,1000 --idle-seconds 60,60,600

reliability: $(PY) cluster-build ## the full-size reliability and security suite on the local control plane
	SPECSERVING_RELIABILITY=full $(PY) -m pytest tests/reliability

crds: $(PY) ## regenerate crds/ from the Python API types
	$(VENV)/bin/specserving crd > crds/specserving.io_specservings.yaml

cluster-build: ## build (or reuse) the control-plane binaries in $SPECSERVING_CACHE
	bash hack/cluster.sh build

cluster-up: ## start the local control plane with fake 8-GPU RDMA nodes
	bash hack/cluster.sh up

cluster-down: ## stop the local control plane
	bash hack/cluster.sh down

cluster-env: ## print the KUBECONFIG export for the local control plane
	@bash hack/cluster.sh env
