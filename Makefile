PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PEER_STAMP := $(VENV)/.installed-peer

.PHONY: run test test-slow test-torch lint bench train proto clean

# The floor declared in pyproject.toml (requires-python); checked before the venv
# is built, so an older interpreter fails with this message instead of pip's.
# openpi-client (tests/serve's client) pins numpy<2 but runs on numpy 2: it is
# installed without its deps, which [test] lists.
$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "jaxmesh needs Python >= 3.11; $(PY) is $$($(PY) -V 2>&1)." \
	    "Run: make PY=python3.11 ..." >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install -e '.[dev]'
	$(BIN)/pip install --no-deps 'openpi-client==0.1.2'
	touch $(STAMP)

# rlmesh (PyPI) for benchmarks/rlmesh_peer.py, envpool for benchmarks/hostsim.py.
$(PEER_STAMP): $(STAMP)
	$(BIN)/pip install -e '.[peer]'
	touch $(PEER_STAMP)

run: $(STAMP)
	$(BIN)/jaxmesh eval configs/cartpole.yaml

# Test files run on TEST_WORKERS processes (pytest-xdist; 0: one process); the
# slowest 20 tests are listed at the end, to keep the suite within its budget.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(BIN)/ruff check jaxmesh tests benchmarks
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=20 -rs -m "not slow and not torch"

# The tests marked slow, left out of make test and run by CI after it: those
# that start Jupyter kernels (the notebooks, 8 forced CPU devices), several
# processes (scripts interrupted with Ctrl-C, two-process jax.distributed, a
# second eval process on the compile cache, three servers of which two are
# lost) or render in software (LIBERO's cameras, a MuJoCo scene); LIBERO beyond
# its in-process run; a Menagerie robot's minutes of MJX compile on 2 cores;
# RemotePolicy's process, TLS and served variants; EnvPool's long and
# per-episode pools. make test checks the same behaviours in process on lighter
# envs (the Menagerie robot only on its error cases).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=20 -m slow

# A PyTorch module as a HostPolicy against plain loops: installs torch (PyPI's
# wheel, with its CUDA libraries: gigabytes), which CI's install leaves out.
test-torch: $(STAMP)
	$(BIN)/pip install -e '.[torch]'
	$(BIN)/python -m pytest --durations=20 -m torch tests/test_host_policy_torch.py

lint: $(STAMP)
	$(BIN)/ruff check jaxmesh tests benchmarks
	$(BIN)/ruff format --check jaxmesh tests benchmarks

bench: $(PEER_STAMP)
	$(BIN)/python benchmarks/run_all.py

train: $(STAMP)
	$(BIN)/python -m jaxmesh.zoo.train_cartpole

# Regenerates jaxmesh/remote/proto/*_pb2*.py* from the .proto (grpcio-tools, in
# [test]); the output is checked in, and tests/remote/test_codec.py checks it is current.
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. \
	  --grpc_python_out=. jaxmesh/remote/proto/jaxmesh_env.proto

clean:
	rm -rf $(VENV)
