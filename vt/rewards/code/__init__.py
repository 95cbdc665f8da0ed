"""The code verifier, in named parts (the sandbox that runs the programs is vt/rewards/sandbox/):

  tests.py    what a test is: the test kinds (MODES; StdioTest, CallTest, ProgramTest) and vt's ``tests`` list
  formats.py  dataset shapes (HumanEval, MBPP, LiveCodeBench, verl, ...) read into tests: FORMATS, code_tests
  grading.py  the host half of the harness protocol: a test's request, how a run ended, the source's grading rules
  reward.py   the reward: the answer's code block, the tests run in the pool, the verdict

A new record format: one function in formats.py. A new grading rule: grading.py. A new test kind: tests.py
says which files it touches.
"""
