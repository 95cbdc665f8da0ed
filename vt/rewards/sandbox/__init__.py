"""Running untrusted code for the code reward: the host side and the programs that run inside the sandbox.

  cold.py    one fresh bwrap sandbox and interpreter per test run (Sandbox), and what both paths share:
             Limits, RunResult, the bwrap arguments, cgroups, the seccomp filter, the code directory
  warm.py    the warm pool (SandboxPool): one long-lived sandbox per worker slot (PoolWorker) around a server
             that forks one child per run
  channel.py the host's half of the warm server's protocol (framing, deadlines, WorkerLost)
  placement.py  a warm worker's CPU (claim_cpu) and where it keeps its files (scratch_base)
  inside/    the programs that run in the sandbox and never import vt: the harness (every test run's process)
             and the warm pool's server (pool_server.py and its parts); copied into each sandbox's read-only /code

A test kind (mode "stdin", "call", "program") is matched on both sides of the sandbox: the harness's mode
dispatch (inside/harness.py, main), the server's routing of program tests to its tester
(inside/pool_server.py) and the cold argv (cold.py, Sandbox.run); the reward picks the mode and judges the
verdict (vt/rewards/code).
"""
