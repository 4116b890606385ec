# optrace: `make demo` and `make test` are the two commands; both run `make setup` first.
PYTHON_SYS ?= /usr/bin/python3
VENV       := .venv
PY         := $(VENV)/bin/python
OPTRACE    := $(VENV)/bin/optrace
STAMP      := $(VENV)/.installed
WORKLOADS  := workloads/build

.PHONY: setup system venv bytecode demo test test-unit bench workloads cli-docs warm clean

setup: system venv bytecode workloads cli-docs warm

system:
	@if [ "$$(id -u)" -ne 0 ]; then echo "make setup needs root (system packages, kernel headers, tracefs): run with sudo" >&2; exit 1; fi
	@sh scripts/setup-system.sh
	@sh scripts/setup-sid-root.sh

$(PY):
	$(PYTHON_SYS) -m venv --system-site-packages $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

venv: $(STAMP)

# The editable install leaves the sources where they are and pip compiles nothing there; Python writes the
# bytecode cache at first import unless PYTHONDONTWRITEBYTECODE is set (it is on some CI and build machines).
# Compiled here, every run starts from the cache (0.03-0.04 s of imports less, on the way to the first sample).
PACKAGE_DIRS := optrace bpf frontend jitmaps exporters
bytecode: venv
	@$(PY) -m compileall -q -j 0 $(PACKAGE_DIRS) >/dev/null

workloads:
	@$(MAKE) -s -C workloads

# The BPF programs compiled once for this kernel and stored (bpf/programcache.py): the commands then load
# them without a compiler on the way to the first sample. Each kind is loaded by its command, once.
warm: venv bytecode
	@OPTRACE=$(OPTRACE) sh scripts/warm-programs.sh

# Man pages (optrace-COMMAND(1)) and bash/zsh/fish completion, generated from the CLI itself.
CLI_DOCS   := build/cli
MANDIR     ?= /usr/local/share/man/man1
BASHCOMPDIR ?= /usr/share/bash-completion/completions
ZSHCOMPDIR ?= /usr/local/share/zsh/site-functions
FISHCOMPDIR ?= /usr/share/fish/vendor_completions.d
cli-docs: venv
	@$(PY) scripts/cli_docs.py $(CLI_DOCS)
	@install -d $(MANDIR) $(BASHCOMPDIR) $(ZSHCOMPDIR) $(FISHCOMPDIR)
	@install -m 644 $(CLI_DOCS)/man/*.1 $(MANDIR)/
	@install -m 644 $(CLI_DOCS)/completion/optrace $(BASHCOMPDIR)/optrace
	@install -m 644 $(CLI_DOCS)/completion/_optrace $(ZSHCOMPDIR)/_optrace
	@install -m 644 $(CLI_DOCS)/completion/optrace.fish $(FISHCOMPDIR)/optrace.fish

demo: setup
	@echo "== optrace record: bundled workload (workloads/build/demo), 499 Hz =="
	$(OPTRACE) record -F 499 -o /tmp/optrace-demo.data -- $(WORKLOADS)/demo 3
	@echo "== optrace report =="
	$(OPTRACE) report -i /tmp/optrace-demo.data --percent-limit 1

test: setup
	$(PY) -m pytest --durations=25 tests

# The tests that need neither root nor BCC (no BPF program is loaded); runs as any user, needs only the venv.
test-unit: venv workloads
	$(PY) -m pytest -m "not bpf and not root" tests

bench: setup
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(WORKLOADS) $(CLI_DOCS) *.egg-info
	find $(PACKAGE_DIRS) -name __pycache__ -prune -exec rm -rf {} +
