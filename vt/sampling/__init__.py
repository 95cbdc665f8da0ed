"""The JAX rollout engine: prefill + decode over a paged KV cache (engine, steps), the host's page tables and
memory plan (page_table), sampling rules (rules), stop conditions (stop), slot refill. Import names from their
modules (see vt/checkpoint/__init__.py for why)."""
