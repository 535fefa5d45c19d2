# make demo   2-rank Horovod training on the bundled synthetic corpus (installs what is missing)
# make test   the whole test suite (installs what is missing)
# make setup  only the install step; a second run skips finished steps in seconds
# make setup GPU=1  the CUDA variant: tensorflow[and-cuda] and Horovod with NCCL, built from pip's CUDA 12 wheels
# make check-gpu    builds that variant in .venv-gpu beside .venv and checks it without a GPU (not part of make test)
# make bench  the speed benchmark (writes BENCHMARKS.md); builds .venv-torch for the PyTorch reference
PY := .venv/bin/python
# LD_LIBRARY_PATH only when set: an unset one makes mpirun warn before the run's first line.
# One host: shared memory between the ranks (vader, which Open MPI 5 calls sm and still
# accepts), no network, so no interface or address family can get in the way.
MPIRUN := mpirun --allow-run-as-root --oversubscribe -bind-to none -map-by slot \
	-x PATH$(if $(LD_LIBRARY_PATH), -x LD_LIBRARY_PATH) -mca pml ob1 -mca btl self,vader
SYNTH := data/synthetic
TORCH_VENV := .venv-torch

.PHONY: setup test demo bench synthetic clean check-gpu

GPU ?= 0

setup:
	@GPU=$(GPU) bash scripts/setup.sh

$(SYNTH)/ptb.train.txt: synthetic_ptb.py | setup
	$(PY) synthetic_ptb.py $(SYNTH)

synthetic: $(SYNTH)/ptb.train.txt

# Three pytest workers: the tests on namespace hosts (two xdist groups) spend
# much of their time waiting out timeouts, so they run beside the others.
test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 3 --dist loadgroup tests

demo: setup synthetic
	@echo "demo: a fresh 2-rank run into output/demo (--overwrite replaces the previous demo's checkpoints and events)"
	$(MPIRUN) -np 2 $(PY) lm_ptb_distributed.py --config tests/config_tiny.py \
		--data_path $(SYNTH) --output_dir output/demo --overwrite --set num_epochs=2
	@echo "demo results (output/demo/results.json):" && cat output/demo/results.json | head -12

# The PyTorch reference's own venv (torch would not fit the pinned TensorFlow venv). A CPU-only
# wheel when pip can find one, PyPI's default build otherwise; without either the bench skips it.
$(TORCH_VENV)/bin/python:
	python3 -m venv $(TORCH_VENV).tmp && \
	{ $(TORCH_VENV).tmp/bin/pip install -q 'torch==2.13.0+cpu' 'numpy<2' 2>/dev/null || \
	  $(TORCH_VENV).tmp/bin/pip install -q torch 'numpy<2'; } && \
	mv $(TORCH_VENV).tmp $(TORCH_VENV) || \
	{ rm -rf $(TORCH_VENV).tmp; echo "[bench] PyTorch could not be installed: the bench runs without its reference"; }

bench: setup $(TORCH_VENV)/bin/python
	$(PY) bench.py

check-gpu:
	@bash scripts/check_gpu_build.sh

clean:
	rm -rf output .pytest_cache $(TORCH_VENV).tmp
