"""Runs inside the sandbox, with the untrusted solution. Python stdlib only; it never imports vt.

Usage (by cold.py; the warm pool's server loads it as a module instead):
  python3 -I /code/_harness.py LIMITS_JSON MODE [IN_FD,OUT_FD]   (solution.py next to it)
  IN_FD,OUT_FD: inherited fds that carry the run's stdin and stdout; they are moved onto fds 0 and 1 before
                anything else (bwrap's own stdio is /dev/null: see cold.channel_arg).
  LIMITS_JSON: {"cpu_s": int, "as_bytes": int, "fsize_bytes": int, "nproc": int|null, "nofile": int}
  MODE "stdin": run /code/solution.py as __main__ on the given stdin; the host compares stdout.
  MODE "call":  stdin is {"nonce": str, "fn_name": str, "args": [...]}; import the solution, call the
                function (top level or a method of ``class Solution``), and print
                "\\n<nonce>" + JSON {"ok": value} or {"error": kind, "message": str} on the saved stdout.
  MODE "program": stdin is {"nonce": str, "setup": str, "test": str, "expose": [str], "entry": [str]}; run a
                test program (HumanEval's ``check(candidate)``, MBPP's asserts) against the solution's
                ``expose``d names (never a builtin, unless it is one of the record's own ``entry`` points, such
                as MBPP's ``def sum(a, b)``) and print "\\n<nonce>" + JSON
                {"ok": true} or {"error": kind, "message": str}. See run_program for the isolation.

Nothing here is trusted by the host. The expected output never enters the sandbox, so whatever the
solution patches (builtins, json, __eq__, sys.exit) it can at best print a value, and the host compares
that value itself. Limits are set first, before any solution code runs, soft = hard so they cannot be
raised again.
"""
import builtins
import collections
import importlib
import io
import json
import os
import resource
import signal
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


def load_solution():
    """solution.py compiled as ``python3 solution.py`` compiles it: from its bytes (so a coding cookie or a
    BOM means what it means to the interpreter), read without building a file object (in a freshly forked
    process every new object is a page copied)."""
    fd = os.open(SOLUTION, os.O_RDONLY)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(fd)
    return compile(b"".join(chunks), SOLUTION, "exec")


def run_stdin():
    sys.argv = [SOLUTION]
    code = load_solution()
    # Exceptions propagate: Python prints the traceback and exits 1, as for a plain `python3 solution.py`.
    exec(code, {"__name__": "__main__", "__file__": SOLUTION, "__builtins__": __builtins__})


def run_call():
    request = json.loads(sys.stdin.read())
    out_fd = os.dup(1)  # the solution may close or redirect stdout; the result goes to our own copy
    marker = "\n" + request["nonce"]
    try:
        code = load_solution()
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

# ---- program mode --------------------------------------------------------------------------------
# The solution and the test program never share a process. The harness forks: the child runs the solution
# (and only it) and serves calls to its top-level names over a pipe; the parent runs the test code (judge;
# in the warm pool the server's tester does, inside/tester.py) with stand-ins that forward each call
# and decode the reply into plain values. So nothing the solution does (exiting early, patching builtins
# or modules, returning an object whose __eq__ is always true, printing "PASSED", writing to stdout)
# reaches the test code: the tests see only values of plain types (decoded by the parent, which never runs
# solution code), and the verdict is written by the parent on a stdout the child no longer holds, after a
# per-run nonce the child never sees (the parent reads its stdin only after the fork, and is not dumpable,
# so the child cannot read its memory or fds). Limits: arguments and results cross the pipe by value
# (plain types only; an argument the solution mutates is not seen mutated by the test, and a function
# cannot be passed as an argument).

MAX_MESSAGE = 64 << 20  # one encoded call or reply
MAX_DEPTH = 200
_DICTS = (dict, collections.OrderedDict, collections.defaultdict, collections.Counter)


def encode(x, depth=0):
    """A plain value -> tagged JSON-able lists. Exact types only: subclasses (with their own __eq__,
    __hash__ or __repr__) are refused, so what the test compares is what the value really is."""
    if depth > MAX_DEPTH:
        raise ValueError("value nested too deeply to pass between processes")
    t = type(x)
    if x is None:
        return ["N"]
    if t is bool:
        return ["b", x]
    if t is int:
        return ["i", hex(x)]
    if t is float:
        return ["f", x.hex()]
    if t is complex:
        return ["c", x.real.hex(), x.imag.hex()]
    if t is str:
        return ["s", x]
    if t is bytes:
        return ["y", x.hex()]
    if t is list or t is collections.deque:
        return ["l", [encode(v, depth + 1) for v in x]]
    if t is tuple:
        return ["t", [encode(v, depth + 1) for v in x]]
    if t is set or t is frozenset:
        return ["S" if t is set else "F", [encode(v, depth + 1) for v in x]]
    if t in _DICTS:
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(x)]]
    raise TypeError("cannot pass a %s between the test and the solution (plain values only)" % t.__name__)


def decode(v, depth=0):
    """Inverse of encode, on data from the untrusted side: builds only plain values."""
    if depth > MAX_DEPTH or type(v) is not list or not v or type(v[0]) is not str:
        raise ValueError("malformed value")
    tag = v[0]
    if tag == "N":
        return None
    if tag == "b" and type(v[1]) is bool:
        return v[1]
    if tag == "i":
        return int(v[1], 16)
    if tag == "f":
        return float.fromhex(v[1])
    if tag == "c":
        return complex(float.fromhex(v[1]), float.fromhex(v[2]))
    if tag == "s" and type(v[1]) is str:
        return v[1]
    if tag == "y":
        return bytes.fromhex(v[1])
    if tag in ("l", "t", "S", "F") and type(v[1]) is list:
        items = [decode(x, depth + 1) for x in v[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d" and type(v[1]) is list:
        return {decode(k, depth + 1): decode(x, depth + 1) for k, x in v[1]}
    raise ValueError("malformed value")


def send(fd, obj):
    data = json.dumps(obj, allow_nan=False).encode()
    data = len(data).to_bytes(8, "big") + data
    while data:
        data = data[os.write(fd, data):]


def recv(fd):
    """One message, or None at end of file (the other side exited)."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    size = int.from_bytes(head, "big")
    if size > MAX_MESSAGE:
        raise ValueError("message over %d bytes" % MAX_MESSAGE)
    body = _read_exactly(fd, size)
    if body is None:
        return None
    return json.loads(body)


def _read_exactly(fd, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, min(n - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class SolutionExited(Exception):
    """The solution's process ended (exit, crash, kill) or broke the protocol."""


class SolutionBaseException(Exception):
    """The solution raised SystemExit / KeyboardInterrupt / GeneratorExit from a call."""


_prctl = None  # libc's prctl: looked up on first use, or once by warm_up in the warm pool's server


def warm_up():
    """Called once by the warm pool's server, which loads this module and forks every run from it: the
    ctypes import and libc lookup a program test would otherwise make in its own process are made there."""
    global _prctl
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl


def _not_dumpable():
    # Without this the child (same uid) could read the parent's memory or fds through /proc/<ppid>/.
    try:
        if _prctl is None:
            warm_up()
        _prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:  # noqa: BLE001 - best effort: the fd and namespace barriers still hold
        pass


def run_program():
    _not_dumpable()
    sys.stdout.flush()
    call_r, call_w = os.pipe()  # parent -> child: calls
    reply_r, reply_w = os.pipe()  # child -> parent: ready, replies
    pid = os.fork()
    if pid == 0:
        os.close(call_w)
        os.close(reply_r)
        serve_solution(call_r, reply_w)  # never returns
    os.close(call_r)
    os.close(reply_w)
    request = json.loads(sys.stdin.read())  # only now: the child never held the nonce
    out_fd = os.dup(1)
    verdict = judge(request, call_w, reply_r)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
    write_verdict(out_fd, request["nonce"], verdict)
    os._exit(0)


def judge(request, call_w, reply_r):
    """run_tests' verdict on the solution served at the other end of call_w / reply_r."""
    try:
        return run_tests(request, call_w, reply_r)
    except BaseException as e:  # noqa: BLE001 - a harness bug must read as an error, not a pass
        return {"error": "runtime_error", "message": "harness: %s: %s" % (type(e).__name__, str(e)[:200])}


def write_verdict(fd, nonce, verdict):
    """The verdict line the host looks for: a newline, the run's nonce, the verdict as JSON."""
    data = ("\n" + nonce + json.dumps(verdict) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]


def serve_solution(call_r, reply_w):
    """Child: run setup + solution, report its top-level names, then answer calls until killed."""
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)  # the request (with the nonce) stays the parent's
        os.dup2(2, 1)  # whatever the solution prints goes to stderr: it can never reach the verdict stream
        lo, hi = sorted((call_r, reply_w))  # close every other fd (one syscall each range, not 1021 tries)
        os.closerange(3, lo)
        os.closerange(lo + 1, hi)
        os.closerange(hi + 1, 1024)
        # sys.stdin now reads /dev/null: it is the fresh stdin the process started with, never read before
        # the fork (the parent reads the request only after it), so no byte of the request is buffered in it.
        code = load_solution()
        scope = {"__name__": "__solution__", "__file__": SOLUTION, "__builtins__": builtins}
        setup = recv(call_r)  # the parent sends the setup code first (a plain string, no nonce)
        if setup:
            exec(compile(setup, "<test_setup>", "exec"), scope)
        exec(code, scope)
        names = {}
        for name, value in list(scope.items()):
            if name.startswith("__"):
                continue
            if type(value) is type(sys):
                if type(getattr(value, "__name__", None)) is str:
                    names[name] = ["mod", value.__name__]  # the tests may use the solution's `import math`
                continue
            if callable(value):
                names[name] = ["fn"]
            else:
                try:
                    names[name] = ["val", encode(value)]
                except (TypeError, ValueError, RecursionError):
                    pass
        functions = {n: scope[n] for n, kind in names.items() if kind[0] == "fn"}
        send(reply_w, ["ready", names])
    except BaseException as e:  # noqa: BLE001 - SystemExit included: the tests never ran
        _report_and_exit(reply_w, e)
    while True:
        request = recv(call_r)
        if request is None:
            os._exit(0)
        name, args, kwargs = request
        try:
            value = functions[name](*decode(args), **decode(kwargs))
            reply = ["ok", encode(value)]
        except BaseException as e:  # noqa: BLE001
            reply = ["raise", type(e).__name__, str(e)[:200]]
        send(reply_w, reply)


def _report_and_exit(fd, e):
    try:
        send(fd, ["raise", type(e).__name__, str(e)[:200]])
    finally:
        os._exit(1)


def run_tests(request, call_w, reply_r):
    """Parent: the test program in a fresh scope whose solution names are stand-ins."""
    send(call_w, request.get("setup") or "")
    ready = recv(reply_r)
    if ready is None:
        return {"error": "runtime_error", "message": "the solution exited before the tests ran"}
    if ready[0] != "ready":
        return _raised(ready[1], ready[2], "while loading the solution")
    scope = {"__name__": "__test__", "__builtins__": builtins}

    def stand_in(name):
        def call(*args, **kwargs):
            send(call_w, [name, encode(list(args)), encode(kwargs)])
            reply = recv(reply_r)
            if reply is None:
                raise SolutionExited("the solution's process ended during a call to %s()" % name)
            if reply[0] == "ok":
                return decode(reply[1])
            exc = getattr(builtins, reply[1], None)
            if isinstance(exc, type) and issubclass(exc, (StopIteration, StopAsyncIteration)):
                # Raised through map() or iter(f, sentinel) it would end the test's iteration early:
                # `all(map(lambda x: candidate(x) == y, xs))` would pass on an empty map.
                raise RuntimeError("%s: %s" % (reply[1], reply[2]))
            if isinstance(exc, type) and issubclass(exc, Exception):
                raise exc(reply[2])  # a test may expect e.g. ValueError
            if isinstance(exc, type) and issubclass(exc, BaseException):
                raise SolutionBaseException("%s: %s" % (reply[1], reply[2]))
            raise RuntimeError("%s: %s" % (reply[1], reply[2]))  # the solution's own exception class

        call.__name__ = call.__qualname__ = name
        return call

    # Only the names the test reads and never binds itself (the host's free_names), and never a builtin:
    # a solution's `abs` or `set` must not replace the one the test calls. The record's own entry points
    # are the exception: the task asks for them by name, even where that name is a builtin's (MBPP's `sum`).
    exposed = (set(request.get("expose") or ()) - set(dir(builtins))) | set(request.get("entry") or ())
    for name, kind in ready[1].items():
        if name not in exposed:
            continue
        if kind[0] == "mod":
            module = standard_module(kind[1])
            # Under its own name only: `import operator as math` must not stand in for the test's `math`.
            if module is not None and name in (module.__name__, module.__name__.rsplit(".", 1)[-1]):
                scope[name] = module
        else:
            scope[name] = stand_in(name) if kind[0] == "fn" else decode(kind[1])
    try:
        if request.get("setup"):
            exec(compile(request["setup"], "<test_setup>", "exec"), scope)
        exec(compile(request["test"], "<test>", "exec"), scope)
    except AssertionError as e:
        return {"error": "wrong", "message": _where(e, "AssertionError")}
    except MemoryError:
        return {"error": "memory", "message": "MemoryError"}
    except BaseException as e:  # noqa: BLE001 - any other failure of a test is a failed test
        return {"error": "runtime_error", "message": _where(e, type(e).__name__)}
    return {"ok": True}


def standard_module(name):
    """A fresh import, in the test process, of a standard-library module the solution imported (MBPP's
    asserts use e.g. ``math.isclose`` from the solution's ``import math``). Only the standard library:
    a name from the untrusted side must never make this process import the solution's own file."""
    stdlib = getattr(sys, "stdlib_module_names", ())
    if type(name) is not str or name.split(".")[0] not in stdlib or name.rsplit(".", 1)[-1] == "__main__":
        return None  # a package's __main__ runs its command line when imported (venv.__main__ makes a venv)
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _raised(name, message, when):
    kind = "memory" if name == "MemoryError" else "runtime_error"
    return {"error": kind, "message": "%s %s: %s" % (name, when, message)}


def _where(e, name):
    line = None
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<test>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = name + (": " + str(e) if str(e) else "")
    return (text + (" (test line %d)" % line if line else ""))[:300]


def take_stdio(arg):
    """Move the run's channels (inherited as the fds "IN,OUT") onto stdin and stdout, and give Python the
    stdio objects it makes for a fresh process on them."""
    fd_in, fd_out = (int(x) for x in arg.split(","))
    for fd, std in ((fd_in, 0), (fd_out, 1)):
        if fd != std:
            os.dup2(fd, std)
            os.close(fd)
    sys.stdin, sys.stdout = fresh_stdio(0), fresh_stdio(1)
    sys.__stdin__, sys.__stdout__ = sys.stdin, sys.stdout


def fresh_stdio(fd):
    """sys.stdin / stdout / stderr as the interpreter makes them at start-up (create_stdio), on fd 0, 1 or 2."""
    like = (sys.__stdin__, sys.__stdout__, sys.__stderr__)[fd]
    encoding = getattr(like, "encoding", "utf-8")
    errors = getattr(like, "errors", "backslashreplace" if fd == 2 else "strict")
    buffered = io.open(fd, "rb" if fd == 0 else "wb", -1, closefd=False)
    buffered.raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    line_buffering = fd == 2 or os.isatty(fd)
    text = io.TextIOWrapper(buffered, encoding, errors, "\n", line_buffering, False)
    text.mode = "r" if fd == 0 else "w"
    return text


# The test kinds (argv's MODE), a copy of vt.rewards.code.tests.MODES (this program never imports vt;
# tests/rewards/test_code_programs.py checks that the copies agree).
MODES = ("stdin", "call", "program")
RUN_MODE = dict(zip(MODES, (run_stdin, run_call, run_program)))


def main():
    if len(sys.argv) > 3:
        take_stdio(sys.argv[3])
    set_limits(json.loads(sys.argv[1]))
    RUN_MODE[sys.argv[2]]()


if __name__ == "__main__":
    main()
