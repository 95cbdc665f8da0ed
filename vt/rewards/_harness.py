"""Runs inside the sandbox, with the untrusted solution. Python stdlib only; it never imports vt.

Usage (by sandbox.py): python3 -I /code/_harness.py LIMITS_JSON MODE   (solution.py sits next to it)
  LIMITS_JSON: {"cpu_s": int, "as_bytes": int, "fsize_bytes": int, "nproc": int|null, "nofile": int}
  MODE "stdin": run /code/solution.py as __main__ on the given stdin; the host compares stdout.
  MODE "call":  stdin is {"nonce": str, "fn_name": str, "args": [...]}; import the solution, call the
                function (top level or a method of ``class Solution``), and print
                "\\n<nonce>" + JSON {"ok": value} or {"error": kind, "message": str} on the saved stdout.

Nothing here is trusted by the host. The expected output never enters the sandbox, so whatever the
solution patches (builtins, json, __eq__, sys.exit) it can at best print a value, and the host compares
that value itself. Limits are set first, before any solution code runs, soft = hard so they cannot be
raised again.
"""
import json
import os
import resource
import sys

# Next to this file: /code/solution.py in the sandbox (read-only), the run directory when unsandboxed.
SOLUTION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "solution.py")


def set_limits(limits):
    pairs = [
        (resource.RLIMIT_CPU, limits["cpu_s"]),
        (resource.RLIMIT_AS, limits["as_bytes"]),
        (resource.RLIMIT_FSIZE, limits["fsize_bytes"]),
        (resource.RLIMIT_NOFILE, limits["nofile"]),
        (resource.RLIMIT_CORE, 0),
    ]
    if limits.get("nproc") is not None:
        pairs.append((resource.RLIMIT_NPROC, limits["nproc"]))
    for what, value in pairs:
        resource.setrlimit(what, (value, value))


def run_stdin():
    sys.argv = [SOLUTION]
    with open(SOLUTION) as f:
        code = compile(f.read(), SOLUTION, "exec")
    # Exceptions propagate: Python prints the traceback and exits 1, as for a plain `python3 solution.py`.
    exec(code, {"__name__": "__main__", "__file__": SOLUTION, "__builtins__": __builtins__})


def run_call():
    request = json.loads(sys.stdin.read())
    out_fd = os.dup(1)  # the solution may close or redirect stdout; the result goes to our own copy
    marker = "\n" + request["nonce"]
    try:
        with open(SOLUTION) as f:
            code = compile(f.read(), SOLUTION, "exec")
        scope = {"__name__": "__solution__", "__file__": SOLUTION, "__builtins__": __builtins__}
        exec(code, scope)
        fn = find_function(scope, request["fn_name"])
        result = {"ok": fn(*request["args"])}
        payload = json.dumps(result, allow_nan=False)  # only plain JSON values can be compared by the host
    except MemoryError:
        payload = json.dumps({"error": "memory", "message": "MemoryError"})
    except RecursionError as e:
        payload = json.dumps({"error": "runtime_error", "message": "RecursionError: " + str(e)[:200]})
    except BaseException as e:  # noqa: BLE001 - SystemExit included: exiting before the result is a failure
        payload = json.dumps({"error": "runtime_error", "message": (type(e).__name__ + ": " + str(e))[:200]})
    sys.stdout.flush()
    data = (marker + payload + "\n").encode()
    while data:
        data = data[os.write(out_fd, data):]
    os._exit(0)  # skip atexit hooks and finalisers the solution may have registered


def find_function(scope, name):
    cls = scope.get("Solution")
    if isinstance(cls, type) and callable(getattr(cls, name, None)):
        return getattr(cls(), name)
    fn = scope.get(name)
    if callable(fn):
        return fn
    raise NameError("no function %r at top level or in class Solution" % name)


def main():
    set_limits(json.loads(sys.argv[1]))
    if sys.argv[2] == "call":
        run_call()
    else:
        run_stdin()


if __name__ == "__main__":
    main()
