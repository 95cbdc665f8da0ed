"""The programs that run inside the sandbox, next to the untrusted solution: Python stdlib only, never importing vt.
The host copies them into each sandbox's read-only /code: harness.py as /code/_harness.py (cold.prepare_code_dir),
the warm pool's server (pool_server.py and its parts, each a file here) into /code/pool (warm.SERVER_PARTS)."""
