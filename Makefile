# Each target creates the virtual environment it needs. DEVICE=cuda installs fbgemm-gpu.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEVICE ?= cpu
STAMP := $(VENV)/.installed-$(DEVICE)

.PHONY: venv test demo bench gpu-check clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if [ "$(DEVICE)" = "cuda" ]; then \
	  sed 's/^fbgemm-gpu-cpu==/fbgemm-gpu==/' requirements.txt > $(VENV)/requirements.txt; \
	else cp requirements.txt $(VENV)/requirements.txt; fi
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	$(PY) -m pip install -q --no-deps torchrec==1.8.0
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m dlrm_scale.kernels.cpu_extension
	touch $(STAMP)

venv: $(STAMP)

# the tests not marked distributed on two workers, then the multi-rank ones (marked distributed) one at a time
test: $(STAMP)
	$(PY) -m pytest -q -n 2 -m "not distributed" tests
	$(PY) -m pytest -q -m distributed tests

demo: $(STAMP)
	mkdir -p out/demo
	$(VENV)/bin/dlrm-scale plan configs/tiny.yaml --out out/demo/plan.json --plot out/demo/plan.png
	$(VENV)/bin/dlrm-scale train --nproc-per-node 2 --config configs/tiny.yaml \
	  --plan out/demo/plan.json --steps 3000 --eval-every 1000 --out-dir out/demo

bench: $(STAMP)
	$(PY) -m benchmarks.planner_bench
	$(PY) -m benchmarks.train_bench

# On a fresh CUDA machine: the CUDA stack, then every CUDA path once (scripts/gpu_check.py).
gpu-check:
	$(MAKE) DEVICE=cuda venv
	$(PY) scripts/gpu_check.py --out out/gpu_check

clean:
	rm -rf $(VENV) out
