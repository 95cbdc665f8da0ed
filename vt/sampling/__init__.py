"""The JAX rollout engine: prefill + decode over a paged KV cache (engine, steps, pages), sampling rules (rules),
stop conditions (stop), slot refill. Import names from their modules (see vt/checkpoint/__init__.py for why)."""
