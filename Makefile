# Two entry points for a fresh machine: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# jax >= 0.11 needs Python >= 3.12: the venv is made with the first interpreter found that is new enough
# (pyenv's, where the system's python3 is older); `make PYTHON=/path/to/python3.12 ...` chooses one.
NEW_ENOUGH := import sys; sys.exit(sys.version_info < (3, 12))
PYTHON ?= $(shell for p in python3.12 $(HOME)/.pyenv/versions/3.12*/bin/python3 python3 python3.13 $(HOME)/.pyenv/versions/3.13*/bin/python3; do \
  command -v $$p >/dev/null 2>&1 && $$p -c '$(NEW_ENOUGH)' 2>/dev/null && { command -v $$p; break; }; done)
# Re-install only when setup.py changes.
STAMP := $(VENV)/.installed-$(shell cat setup.py | md5sum | cut -c1-12)
# Debian packages the suite needs: bubblewrap isolates untrusted code for the code reward (util-linux's setpriv
# drops each sandbox to its own uid); shellcheck lints the launchers.
APT_PACKAGES := bubblewrap util-linux shellcheck

.PHONY: test test-compat demo install system-deps qwen-tokenizer bench clean

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; \
	  else echo "warning: missing Debian packages$$missing (run as root or install them)"; fi; \
	fi

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
	@if [ -x $(PY) ] && ! $(PY) -c '$(NEW_ENOUGH)'; then echo "$(VENV) is older than Python 3.12: remaking it"; rm -rf $(VENV); fi
	@test -n "$(PYTHON)" || { echo "error: vt needs Python >= 3.12 (jax >= 0.11); none found on PATH or in ~/.pyenv. Install one, or pass PYTHON=/path/to/python3.12" >&2; exit 2; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call install_into,$(VENV))
	@rm -f $(VENV)/.installed-*; touch $(STAMP)

install: system-deps $(STAMP)

# Qwen2.5's real tokenizer, built once into the user's cache from the BPE ranks in the dashscope wheel, which the
# venv's pip downloads from the package registry (no other network); the tests build from that wheel after.
qwen-tokenizer: install
	$(PY) -m vt tokenizer build-qwen2.5 --download

# Two pytest-xdist workers: the suite (1701 tests) took 35.5 min this way on an idle 2-core box, with the one
# JAX compilation cache tests/conftest.py sets up for the run (60 min without it).
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

demo: install
	$(VENV)/bin/vt demo

bench: install
	$(PY) bench/forward.py

clean:
	rm -rf $(VENV) $(COMPAT_VENV) *.egg-info demo_out
