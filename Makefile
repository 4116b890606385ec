# optrace: `make demo` and `make test` are the two commands; both run `make setup` first.
PYTHON_SYS ?= /usr/bin/python3
VENV       := .venv
PY         := $(VENV)/bin/python
OPTRACE    := $(VENV)/bin/optrace
STAMP      := $(VENV)/.installed
WORKLOADS  := workloads/build

.PHONY: setup system venv demo test test-unit bench workloads clean

setup: system venv workloads

system:
	@if [ "$$(id -u)" -ne 0 ]; then echo "make setup needs root (system packages, kernel headers, tracefs): run with sudo" >&2; exit 1; fi
	@sh scripts/setup-system.sh

$(PY):
	$(PYTHON_SYS) -m venv --system-site-packages $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

workloads:
	@$(MAKE) -s -C workloads

demo: setup
	@echo "== optrace record: bundled workload (workloads/build/demo), 499 Hz =="
	$(OPTRACE) record -F 499 -o /tmp/optrace-demo.data -- $(WORKLOADS)/demo 3
	@echo "== optrace report =="
	$(OPTRACE) report -i /tmp/optrace-demo.data --percent-limit 1

test: setup
	$(PY) -m pytest tests

# The tests that need neither root nor BCC (no BPF program is loaded); runs as any user, needs only the venv.
test-unit: venv workloads
	$(PY) -m pytest -m "not bpf and not root" tests

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(WORKLOADS) *.egg-info
