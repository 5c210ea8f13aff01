# Every target creates .venv and installs the pinned dependencies first, so each works on a fresh machine.
#
# ACCEL picks the accelerator the environment is for (docs/gpu.md):
#   make install                 cpu (the default): requirements.lock, PyTorch's CPU wheel
#   make install ACCEL=cuda12    NVIDIA GPUs, CUDA 12: requirements-cuda12.lock (JAX's CUDA 12 plugin), CUDA PyTorch
#   make install ACCEL=cuda13    NVIDIA GPUs, CUDA 13: requirements-cuda13.lock (JAX's CUDA 13 plugin, CUDA PyTorch)
# The environment remembers its accelerator (.venv/.accelerator): later targets (make test, make bench-accelerator)
# reuse it without ACCEL; naming another ACCEL replaces the environment with a fresh one.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ACCELS := cpu cuda12 cuda13
VENV_ACCEL := $(or $(shell cat $(VENV)/.accelerator 2>/dev/null),cpu)
ACCEL ?= $(VENV_ACCEL)
ifneq ($(words $(ACCEL)):$(filter $(ACCELS),$(ACCEL)),1:$(strip $(ACCEL)))  # one known word, nothing beside it
$(error ACCEL: unknown accelerator '$(ACCEL)' (allowed: cpu, cuda12, cuda13))
endif
LOCK := $(if $(filter cpu,$(ACCEL)),requirements.lock,requirements-$(ACCEL).lock)
# PyTorch for the speed studies' baselines, after the lock: cpu, the local CPU wheel (never the multi-GB CUDA build
# from the index); cuda12, the CUDA 12.8 build from the PyTorch index (not on PyPI; not verified where the locks
# were made); cuda13: in requirements-cuda13.lock (PyPI's torch 2.13.0 is the CUDA 13.0 build).
TORCH_cpu := "torch==2.13.0+cpu"
TORCH_cuda12 := --extra-index-url https://download.pytorch.org/whl/cu128 "torch==2.13.0+cu128"
TORCH_cuda13 :=
export XLA_PYTHON_CLIENT_PREALLOCATE := false

.PHONY: install run test test-long test-slow test-processes lint docs bench bench-accelerator results clean
ifneq ($(ACCEL),$(VENV_ACCEL))
.PHONY: $(STAMP)  # the environment is for another accelerator: install afresh
endif

$(STAMP): pyproject.toml benchmarks/pyproject.toml requirements.lock requirements-envs.lock $(LOCK)
	if [ -e $(STAMP) ] && [ "$(VENV_ACCEL)" != "$(ACCEL)" ]; then rm -rf $(VENV); fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r $(LOCK)
	$(BIN)/pip install -q --no-deps -r requirements-envs.lock  # env families: see the file's header
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip install -q --no-deps -e benchmarks
	$(if $(TORCH_$(ACCEL)),$(BIN)/pip install -q $(TORCH_$(ACCEL)) || echo "PyTorch ($(ACCEL)) not available: the PyTorch benchmark baselines and their tests will be skipped")
	$(if $(TORCH_$(ACCEL)),$(BIN)/pip install -q --no-deps "stable-baselines3==2.9.2" || echo "Stable-Baselines3 not available: experiments/parity_sb3.py cannot run its reference side")
	echo $(ACCEL) > $(VENV)/.accelerator
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/popjax train --config experiments/default.yaml --out runs/default --overwrite

# The tests come in four groups (markers in pyproject.toml); each target runs one of them:
#   make test            the default suite: everything not marked `slow`, `long` or `processes` (under 10 minutes
#                        on 2 cores)
#   make test-long       `long`: whole runs trained, killed and resumed, studies run at tiny sizes (each over about
#                        15 s on 2 cores); CI runs them after `make test` (.ci/run)
#   make test-slow       `slow`: long learning runs (a test that is also `processes` or `long` runs here)
#   make test-processes  `processes`: tests that start subprocesses or several processes/devices (multi-process
#                        jobs, forced multi-device runs, CLI runs of whole examples); CI runs them after
#                        `make test` when time allows (.ci/run)
# A DeprecationWarning caused by popjax's own code (or a test's) fails the test (filterwarnings in pyproject.toml).
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

test-long: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "long and not slow and not processes"

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

test-processes: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile -m "processes and not slow"

lint: $(STAMP)
	$(BIN)/ruff check popjax tests benchmarks experiments

# The user guide (docs/, mkdocs.yml): the option reference regenerated from the schema, then the site built into
# site/ with every link and anchor checked (tests/test_docs.py runs the same build and every documented command).
docs: $(STAMP)
	$(BIN)/python tests/docs_reference.py
	$(BIN)/mkdocs build --strict

# The fast-PBT speed studies at sizes that fit a 2-core CPU in about 70 minutes (quiet machine: ~52 min of
# measurement, ~8 min of waiting between studies, see below); each writes
# benchmarks/results/<study>[_variant].json + .png, then RESULTS.md is regenerated from them and judged
# against benchmarks/targets.yaml. Every study refuses to start when the 1-minute load average exceeds
# half the cores; QUIET lets each one first wait (up to 5 minutes) for the previous study's own load to
# decay (about a minute on 2 cores), so run `make bench` alone: if anything else keeps the machine busy,
# the study stops with a one-line error instead of recording meaningless numbers. Every point gets at
# least 10 timed calls (K-step calls included), the PyTorch baseline is the faster of 1 and 2 threads,
# and each study measures the machine's ceilings in the same run. PyTorch (the paper's Torch-sequential
# baseline) comes from popjax-bench's `torch` extra (torch==2.13.0); it is installed as the local CPU wheel
# `torch==2.13.0+cpu`, which satisfies that pin and can never pull the multi-GB CUDA build from the index.
# Options: `popjax bench <study> --help`.
BENCH := $(BIN)/popjax bench
QUIET := --wait-quiet 300
RESULTS := benchmarks/results
bench: $(STAMP)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==2.13.0+cpu" || \
		echo "make bench: no PyTorch CPU wheel; the PyTorch-sequential baseline will be reported as skipped"
	$(BENCH) update --learner td3,sac --pop 1,4,16,64 --max-seconds 200 --memory-fit $(QUIET)
	$(BENCH) update --learner dqn --pop 1,4,8 --max-seconds 60 --memory-fit $(QUIET) --out $(RESULTS)/update_dqn.json
	$(BENCH) update --learner td3 --impl vmap,vmap_scan --pop 4,16 --devices 1,2 $(QUIET) \
		--out $(RESULTS)/update_devices.json
	$(BENCH) update --learner td3 --impl vmap,vmap_scan --pop 4,16 --processes 2 $(QUIET) \
		--out $(RESULTS)/update_processes.json
	$(BENCH) roofline --learner td3,sac --pop 1,4,16,64 --devices 1,2 $(QUIET)
	$(BENCH) compile --learner td3,sac --pop 1,4,16,64 $(QUIET)
	$(BENCH) envstep --gym HalfCheetah-v5,Hopper-v5,Walker2d-v5,Ant-v5,Humanoid-v5 --brax halfcheetah --pop 1,4,16 \
		$(QUIET)
	$(BENCH) train --env gym:HalfCheetah-v5 --pop 1,4,16 --overlap off,on --env-steps 1000 --warmup 250 $(QUIET)
	$(BENCH) train --env brax:halfcheetah --pop 4 --env-steps 1000 --warmup 250 $(QUIET) --out $(RESULTS)/train_brax.json
	$(BENCH) shared_critic --pop 1,2,4,8,16 $(QUIET)
	$(BENCH) drivers --devices 1,2 $(QUIET)
	$(BENCH) per $(QUIET)
	$(BENCH) spo $(QUIET)
	$(BENCH) hts $(QUIET)
	$(BENCH) sparse_inference $(QUIET)
	$(BENCH) report

# Every generated table of experiments/RESULTS.md (between `<!-- table: NAME -->` and `<!-- /table -->`) rebuilt
# from the committed JSON in experiments/results/ (and benchmarks/results/); benchmarks/RESULTS.md is rebuilt from
# benchmarks/results/ by `popjax bench report`. On a clean checkout both leave the files unchanged
# (tests/test_results.py fails when a committed table differs from what its JSON gives).
results: $(STAMP)
	$(BIN)/python experiments/results.py
	$(BIN)/popjax bench report

# The fast-PBT paper's Fig. 2 (update vs N up to 256, TD3 and SAC, popjax against JAX sequential and the PyTorch
# variants on the same device) on whatever accelerator JAX sees; writes benchmarks/results/update_<device>.json
# (+ .png) naming the device. On a GPU machine install for it first: make install ACCEL=cuda12 (or cuda13).
bench-accelerator: $(STAMP)
	$(BENCH) accelerator $(QUIET)
	$(BENCH) report

clean:
	rm -rf $(VENV) runs site
