"""The Qwen2 family in Flax NNX: the architecture and its building (qwen2: `Qwen2`, `KVCache`, `create_model`,
`abstract_model`), settings and presets (config), the paged KV cache (paged), the splash kernel (splash).
Import names from their modules; like every vt package this one re-exports nothing (see vt/checkpoint/__init__.py).
"""
