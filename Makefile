# Two entry points for a fresh machine: `make demo` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
# Re-install only when setup.py changes.
STAMP := $(VENV)/.installed-$(shell cat setup.py | md5sum | cut -c1-12)
# Debian packages the suite needs: bubblewrap isolates untrusted code for the code reward (util-linux's setpriv
# drops each sandbox to its own uid); shellcheck lints the launchers.
APT_PACKAGES := bubblewrap util-linux shellcheck

.PHONY: test demo install system-deps qwen-tokenizer bench clean

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing Debian packages:$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; \
	  else echo "warning: missing Debian packages$$missing (run as root or install them)"; fi; \
	fi

$(STAMP): setup.py
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m pip install -q --no-deps 'lm-eval==0.4.13'  # test-only: its ifeval checker (see setup.py)
	$(PY) -m pip install -q --no-deps 'nvidia-livecodebench==26.3' 'verl==0.9.1'  # test-only: their stdout graders
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

demo: install
	$(VENV)/bin/vt demo

bench: install
	$(PY) bench/forward.py

clean:
	rm -rf $(VENV) *.egg-info demo_out
