"""The Qwen2 family in Flax NNX: the architecture and its building (qwen2: `Qwen2`, `create_model`, `abstract_model`),
settings and presets (config), attention without a cache (attention, blocked_attention, splash) and the KV cache
of pages on device (kv_pages). Import names from their modules; like every vt package this one re-exports nothing
(see vt/checkpoint/__init__.py).
"""
