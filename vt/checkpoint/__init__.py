"""Checkpoints: Orbax save/restore of model parameters (params), conversion to and from Hugging Face format (hf),
seals (seal), atomic output directories (io), the learners' step manager (manager).

Like every vt package, this one re-exports nothing: import names from the module that defines them
(`from vt.checkpoint.params import load_model`). Importing a package then costs only what its modules need, so
`vt --help`, which imports every package's commands.py, loads neither JAX nor Orbax.
"""
