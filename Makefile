# Two entry points for a fresh machine: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# jax >= 0.11 needs Python >= 3.12: the venv is made with the first interpreter found that is new enough
# (pyenv's, where the system's python3 is older); `make PYTHON=/path/to/python3.12 ...` chooses one.
NEW_ENOUGH := import sys; sys.exit(sys.version_info < (3, 12))
PYTHON ?= $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3 python3 python3.13 $(HOME)/.pyenv/versions/3.13*/bin/python3; do \
  command -v $$p >/dev/null 2>&1 && $$p -c '$(NEW_ENOUGH)' 2>/dev/null && { command -v $$p; break; }; done)
# Re-install only when setup.py changes; one stamp per install set (`make demo` installs less than `make test`).
SETUP_HASH := $(shell cat setup.py | md5sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(SETUP_HASH)
DEMO_STAMP := $(VENV)/.demo-installed-$(SETUP_HASH)
# Debian packages: bubblewrap isolates untrusted code for the code reward (util-linux's setpriv drops each sandbox
# to its own uid): the demo grades code with it. shellcheck lints the launchers: the suite only.
DEMO_APT_PACKAGES := bubblewrap util-linux
APT_PACKAGES := $(DEMO_APT_PACKAGES) shellcheck
# apt waits this long for a dpkg lock another apt holds (unattended-upgrades on a fresh machine), then gives up.
APT_LOCK_TIMEOUT ?= 600
# `make demo ARGS=--fresh` (or any `vt demo` flags); `make demo HF_CHECK=1` also installs torch (PyPI's CUDA
# wheel, ~4.6 GB) so the demo's export check runs transformers' generate, not only AutoTokenizer.
ARGS ?=
HF_CHECK ?=

.PHONY: test test-compat demo install install-demo system-deps demo-system-deps qwen-tokenizer bench clean

# $(1): the Debian packages to make sure of.
define apt_install
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing (waiting up to $(APT_LOCK_TIMEOUT) s if another apt/dpkg holds its lock)"; \
	    apt_opts="-o DPkg::Lock::Timeout=$(APT_LOCK_TIMEOUT) -qq"; \
	    (apt-get $$apt_opts update && DEBIAN_FRONTEND=noninteractive apt-get $$apt_opts install -y $$missing) >/dev/null \
	      || { echo "error: apt-get could not install$$missing (a dpkg lock held over $(APT_LOCK_TIMEOUT) s? APT_LOCK_TIMEOUT=... waits longer)" >&2; exit 2; }; \
	  else echo "warning: missing Debian packages$$missing (run as root or install them)"; fi; \
	fi
endef

system-deps:
	$(call apt_install,$(APT_PACKAGES))

demo-system-deps:
	$(call apt_install,$(DEMO_APT_PACKAGES))

# pip's output goes to $(VENV)/pip.log (setuptools' editable-install warning included) and is shown only if pip fails.
PIP_QUIET = >>$(VENV)/pip.log 2>&1 || { tail -40 $(VENV)/pip.log; exit 1; }

define make_venv
	@if [ -x $(PY) ] && ! $(PY) -c '$(NEW_ENOUGH)'; then echo "$(VENV) is older than Python 3.12: remaking it"; rm -rf $(VENV); fi
	@test -n "$(PYTHON)" || { echo "error: vt needs Python >= 3.12 (jax >= 0.11); none found on PATH or in ~/.pyenv. Install one, or pass PYTHON=/path/to/python3.12" >&2; exit 2; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
endef

# vt and its test extra into the venv $(1); $(2): packages that replace what setup.py pinned (pip warns that vt's
# pin is not met, and installs them).
define install_into
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q -e '.[test]'
	$(if $(2),$(1)/bin/python -m pip install -q $(2))
	$(1)/bin/python -m pip install -q --no-deps 'lm-eval==0.4.13'  # test-only: its ifeval checker (see setup.py)
	$(1)/bin/python -m pip install -q --no-deps 'nvidia-livecodebench==26.3' 'verl==0.9.1'  # test-only: their graders
endef

$(STAMP): setup.py
	$(make_venv)
	$(call install_into,$(VENV))
	@rm -f $(VENV)/.installed-*; touch $(STAMP)

# The demo's set: vt and its demo extra (no test-only package; tests/test_install_sets.py).
$(DEMO_STAMP): setup.py
	$(make_venv)
	@echo "installing vt and its demo extra into $(VENV) (pip's log: $(VENV)/pip.log)"
	@$(PY) -m pip install -q --upgrade pip $(PIP_QUIET)
	@$(PY) -m pip install -q -e '.[demo]' $(PIP_QUIET)
	@rm -f $(VENV)/.demo-installed-*; touch $(DEMO_STAMP)

install: system-deps $(STAMP)

# Qwen2.5's and Qwen3's real tokenizers, built once into the user's cache from the BPE ranks in the dashscope
# wheel, which the venv's pip downloads from the package registry (no other network); the tests build from that wheel after.
qwen-tokenizer: install
	$(PY) -m vt tokenizer build-qwen2.5 --download
	$(PY) -m vt tokenizer build-qwen3 --download

# Two pytest-xdist workers: the suite (2407 tests) took 37 min on an idle 2-core box (2026-12-06; 38-45 in xdist's default order), with
# the one JAX compilation cache tests/conftest.py sets up for the run (60 min without it), its expensive fixtures built once, and
# whole test files handed out costliest first (tests/durations.json).
test: install qwen-tokenizer
	$(PY) -m pytest -n 2 -q --durations=25 tests

# The previous jax minor keeps working: the model, sampling, train and rl tests in a second venv on jax 0.11.2
# with the same flax (README's "Tested versions").
COMPAT_VENV := .venv-compat
COMPAT_PINS := 'jax==0.11.2' 'jaxlib==0.11.2' 'flax==0.12.12'
test-compat: system-deps qwen-tokenizer
	@test -n "$(PYTHON)" || { echo "error: no Python >= 3.12 found; pass PYTHON=/path/to/python3.12" >&2; exit 2; }
	@test -x $(COMPAT_VENV)/bin/python || $(PYTHON) -m venv $(COMPAT_VENV)
	$(call install_into,$(COMPAT_VENV),$(COMPAT_PINS))
	$(COMPAT_VENV)/bin/python -c "import jax, flax; assert jax.__version__ == '0.11.2', jax.__version__; print('jax', jax.__version__, 'flax', flax.__version__)"
	$(COMPAT_VENV)/bin/python -m pytest -n 2 -q tests/model tests/sampling tests/train tests/rl

install-demo: demo-system-deps $(DEMO_STAMP)
	$(if $(HF_CHECK),@$(PY) -m pip install -q 'torch==2.13.0' $(PIP_QUIET))

demo: install-demo
	@$(VENV)/bin/vt demo $(ARGS)

bench: install
	$(PY) bench/forward.py

clean:
	rm -rf $(VENV) $(COMPAT_VENV) *.egg-info demo_out
