# rlfleet developer commands. `make train` and `make test` do all the set-up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: train train-llm test test-all test-long test-hosts test-slow test-vllm test-torchvision test-ray soak lint protos bench torchrl-scripts gpu-check clean

# Virtual environment with torch pinned to the CPU wheel, then rlfleet and its extras.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev,test,train,llm,lora]'
	touch $(STAMP)

## The main job: train PPO on CartPole-v1 against a local actor fleet it starts itself.
train: $(STAMP)
	$(BIN)/rlfleet-train $(ARGS)

## The LLM job: GRPO on one-digit sums against 2 local LLM actors, to 0.9 greedy accuracy.
train-llm: $(STAMP)
	$(BIN)/rlfleet-grpo --task arith $(ARGS)

## The whole test suite, as CI runs it (.ci/run calls this): every target below, each always
## run; it fails naming the targets that failed (pytest's exit 5, no test collected, fails too).
CI_TARGETS := lint test test-long test-hosts test-vllm test-ray test-torchvision
test-all:
	@failed=""; for target in $(CI_TARGETS); do \
	  $(MAKE) --no-print-directory $$target || failed="$$failed $$target"; \
	done; \
	if [ -n "$$failed" ]; then echo "failed:$$failed" >&2; exit 1; fi

## The quick suite (under 10 minutes on 2 cores): every test but those marked slow, long or hosts.
test: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not long and not hosts" $(ARGS)

## The tests marked long: whole fleets, training entry points and the docs' examples run end to
## end, and fleet, subprocess and fault tests of 6 s or more (~19 minutes on 2 cores).
test-long: $(STAMP)
	$(BIN)/python -m pytest -m "long and not slow and not hosts" $(ARGS)

## The tests across hosts (tests/hosts, marked hosts): network namespaces on a bridge as hosts,
## real actors in them, silent cuts and link rates. Needs root; skipped with the reason otherwise.
test-hosts: $(STAMP)
	$(BIN)/python -m pytest -m "hosts and not slow" tests/hosts tests/bench/test_hosts_bench.py $(ARGS)

## The slow tests: full training runs, long fault scenarios, benchmark smoke runs.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow $(ARGS)

## The three targets below each test in a venv of their own. With DROP_VENVS=1 (.ci/run sets
## it) each one's venv is removed once its tests ran, so a CI disk holds one at a time (the
## torchvision one alone takes ~5.5 GB).
drop_venv = $(if $(DROP_VENVS),rm -rf $(1),true)

## The vLLM engine's tests (marked vllm, in test_*vllm*.py files), in their own venv:
## scripts/vllm_venv.sh makes it. Only those files are collected there (with vLLM installed,
## torchrl imports it, and its warnings would fail the other files' collection).
VLLM_VENV ?= .venv-vllm
test-vllm:
	status=0; PYTHON=$(PYTHON) scripts/vllm_venv.sh $(VLLM_VENV) && \
	$(VLLM_VENV)/bin/python -m pytest -m vllm $(wildcard tests/*/test_*vllm*.py tests/actor_service/*/test_*vllm*.py tests/actor_service/kinds/*/test_*vllm*.py) $(ARGS) \
	|| status=$$?; $(call drop_venv,$(VLLM_VENV)); exit $$status

## The tests of TorchRL's torchvision-backed transforms (marked torchvision: `Resize`, dqn_atari.py
## on a fleet, and the dqn_with_rnn.py tutorial where RLFLEET_TORCHRL_SOURCE names a pytorch/rl checkout) in their
## own venv: torchvision does not import beside the pinned CPU torch, so
## scripts/torchvision_venv.sh makes one with torch 2.14.1, torchvision 0.29.1 and ale-py 0.12.1.
TV_VENV ?= .venv-tv
TV_TESTS := tests/actor_service/kinds/torchrl/test_torchrl_pixels_agents.py tests/bench/test_torchrl_scripts.py
test-torchvision:
	status=0; PYTHON=$(PYTHON) scripts/torchvision_venv.sh $(TV_VENV) && \
	$(TV_VENV)/bin/python -m pytest -m "torchvision and not slow" $(TV_TESTS) $(ARGS) \
	|| status=$$?; $(call drop_venv,$(TV_VENV)); exit $$status

## The tests marked ray (learner_client.RayFleet on a local Ray cluster each test module starts,
## in tests/*/test_*ray*.py), in their own venv: scripts/ray_venv.sh makes it (ray 2.60.0
## beside the pinned torch), so the main venv stays without Ray.
RAY_VENV ?= .venv-ray
test-ray:
	status=0; PYTHON=$(PYTHON) scripts/ray_venv.sh $(RAY_VENV) && \
	$(RAY_VENV)/bin/python -m pytest -m ray $(wildcard tests/*/test_*ray*.py) $(ARGS) \
	|| status=$$?; $(call drop_venv,$(RAY_VENV)); exit $$status

## An hour of mixed faults against two real actors; a report at the end (ARGS="--minutes 2").
soak: $(STAMP)
	$(BIN)/python tests/soak.py $(ARGS)

## Regenerate the gRPC stubs from protos/ (commit the result).
protos: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iprotos --python_out=. --pyi_out=. --grpc_python_out=. \
		protos/common/rlfleet/v1/actor_service.proto

## Benchmarks against TorchRL's collectors.
bench: $(STAMP)
	$(BIN)/python -m bench.run_all $(ARGS)

## TorchRL's own training scripts on TorchRL's collector and on a fleet: final returns and wall
## times (bench/torchrl_scripts; ARGS="--only dqn_cartpole").
torchrl-scripts: $(STAMP)
	$(BIN)/python -m bench.torchrl_scripts $(ARGS)

## The GPU checks (CUDA tests and GPU benchmarks, ~7 min) on a machine with CUDA; logs in OUT.
gpu-check:
	$(PYTHON) -m bench.gpu_check $(ARGS)

## Lint and types: ruff's rules, ruff's formatting, mypy (configuration in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(RAY_VENV) $(TV_VENV) .pytest_cache
