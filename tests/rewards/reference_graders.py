"""Run LiveCodeBench's and verl's (PRIME's) own graders: stdin/stdout on printed outputs, call-based on
returned values.

Usage: python reference_graders.py {livecodebench|prime} < JSON [[printed, expected], ...]
       python reference_graders.py {livecodebench_call|prime_call} < JSON [[returned, expected], ...]
Prints a JSON list of verdicts (true = the reference grader passes the program that prints ``printed``;
for the call-based graders, the function that returns the value of the JSON text ``returned``, called on
one argument, against the JSON text ``expected``).
A separate process: verl's run_test disables os functions (reliability_guard) in the process that runs it.
The packages are installed with --no-deps (the Makefile); only their grader modules are loaded, by path,
so that neither package's __init__ (and its heavy imports) runs.
"""
import importlib.util
import json
import os
import sys


def load(package: str, relative: str):
    root = importlib.util.find_spec(package).submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location(f"ref_{package}", os.path.join(root, relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def program(printed: str) -> str:
    return "import sys\nsys.stdout.write(%r)\n" % printed


def _prime_grader():
    grader = load("verl", "utils/reward_score/prime_code/testing_util.py")
    # run_test first disables os functions (os.putenv among them), which breaks its own second call: the
    # programs here are ours and print or return a constant, so the guard is skipped. The comparison is untouched.
    grader.reliability_guard = lambda *args, **kwargs: None
    return grader


def _verdicts(grade, pairs):
    """Whether each (candidate, expected) passes: ``grade(candidate, expected)`` is the checker's results list."""
    return [grade(candidate, expected) == [True] for candidate, expected in pairs]


def livecodebench(pairs):
    grader = load("livecodebench", "evaluation/testing_util.py")
    return _verdicts(lambda printed, expected: grader.grade_stdio(program(printed), [""], [expected], timeout=10)[0],
                     pairs)


def prime(pairs):
    grader = _prime_grader()
    return _verdicts(lambda printed, expected: grader.run_test({"inputs": [""], "outputs": [expected]},
                                                               test=program(printed), timeout=10)[0], pairs)


def function(returned: str) -> str:
    return "import json\ndef f(x):\n    return json.loads(%r)\n" % returned


def livecodebench_call(pairs):
    grader = load("livecodebench", "evaluation/testing_util.py")
    return _verdicts(lambda returned, expected: grader.grade_call_based(function(returned), ["0"], [expected], "f",
                                                                        timeout=10)[0], pairs)


def prime_call(pairs):
    grader = _prime_grader()
    def grade(returned, expected):
        case = {"inputs": ["0"], "outputs": [expected], "fn_name": "f"}
        return grader.run_test(case, test=function(returned), timeout=10)[0]

    return _verdicts(grade, pairs)


if __name__ == "__main__":
    pairs = json.load(sys.stdin)
    graders = {"livecodebench": livecodebench, "prime": prime, "livecodebench_call": livecodebench_call,
               "prime_call": prime_call}  # fmt: skip
    verdicts = graders[sys.argv[1]](pairs)
    sys.stdout = sys.__stdout__
    print(json.dumps(verdicts))
