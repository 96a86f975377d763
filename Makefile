# Everything a fresh machine needs is set up by the targets below; each is one command.
#   make pretrain   the main job: tiny BERT pretraining on the embedded Shakespeare corpus (CPU, minutes)
#   make test       the full test suite, as CI runs it
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
WORKDIR ?= runs/pretrain_tiny
PRETRAIN_ARGS ?=

.PHONY: setup pretrain test lint

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch is pinned to the CPU build that installs from local disk; an unpinned torch pulls a CUDA build.
# jax[tpu] (the `tpu` extra) at the installed jax's version brings the matching libtpu: TPU runs and
# compiling the train step for a TPU slice on this machine (train.py --mode=compile).
# JAX's CUDA plugin, ptxas and cuDNN go to $(VENV)/cuda-compile, off the import path (on a machine
# without a GPU the plugin would announce the missing driver on every run): bert_jax.aot loads
# them to compile for GPUs without one (--topology=gpu:CARD). They run nothing on a GPU.
$(VENV)/.installed: pyproject.toml Makefile | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0"
	$(BIN)/python -m pip install -q -e ".[torch,tf,finetune,test]"
	$(BIN)/python -m pip install -q "jax[tpu]==$$($(BIN)/python -c 'import jax; print(jax.__version__)')"
	V=$$($(BIN)/python -c 'import jax; print(jax.__version__)') && $(BIN)/python -m pip install -q \
	  --no-deps --upgrade --target $(VENV)/cuda-compile "jax-cuda12-plugin==$$V" \
	  "jax-cuda12-pjrt==$$V" "nvidia-cuda-nvcc-cu12==12.9.86" "nvidia-cudnn-cu12==9.28.0.42"
	touch $@

setup: $(VENV)/.installed

pretrain: setup
	$(BIN)/python train.py --config=configs/pretrain.py:size=tiny --workdir=$(WORKDIR) $(PRETRAIN_ARGS)

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -n 2 -q
