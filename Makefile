# make demo   2-rank Horovod training on the bundled synthetic corpus (installs what is missing)
# make test   the whole test suite (installs what is missing)
# make setup  only the install step; a second run skips finished steps in seconds
# make bench  the speed benchmark (writes BENCHMARKS.md)
PY := .venv/bin/python
MPIRUN := mpirun --allow-run-as-root --oversubscribe -bind-to none -map-by slot \
	-x PATH -x LD_LIBRARY_PATH -mca pml ob1 -mca btl tcp,self
SYNTH := data/synthetic

.PHONY: setup test demo bench synthetic clean

setup:
	@bash scripts/setup.sh

$(SYNTH)/ptb.train.txt: synthetic_ptb.py | setup
	$(PY) synthetic_ptb.py $(SYNTH)

synthetic: $(SYNTH)/ptb.train.txt

test: setup
	$(PY) -m pytest -q tests

demo: setup synthetic
	$(MPIRUN) -np 2 $(PY) lm_ptb_distributed.py --config tests/config_tiny.py \
		--data_path $(SYNTH) --output_dir output/demo --set num_epochs=2
	@echo "demo results (output/demo/results.json):" && cat output/demo/results.json | head -12

bench: setup
	$(PY) bench.py

clean:
	rm -rf output .pytest_cache
