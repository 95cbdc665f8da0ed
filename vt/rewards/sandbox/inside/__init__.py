"""The programs that run inside the sandbox, next to the untrusted solution: Python stdlib only, never importing vt
(or each other by package name). The host copies them into each sandbox's read-only /code: harness.py as
/code/_harness.py, pool_server.py as /code/_pool_server.py (cold.prepare_code_dir, warm.PoolWorker)."""
