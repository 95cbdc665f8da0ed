"""Checkpoints: Orbax save/restore of model parameters, and conversion to and from Hugging Face format."""
from vt.checkpoint.params import (export_to_hf, import_from_hf, load_model, load_model_config,  # noqa: F401
                                  save_model)
