"""vt.data: tokenizers, sources, chat masks, packing, grain pipelines, curriculum, quality filters.

Flow: ``open_source(spec)`` -> Record | Malformed -> ``tokenize_record`` (chat template, assistant-only
mask) -> ``build_sft_dataset`` (shard, shuffle, epochs, skip counting, first-fit packing, batching).

Import names from the module that defines them (tokenizer, qwen_tokenizer, sources, chat, packing, dataset,
curriculum, filters, tasks); like every vt package this one re-exports nothing (see vt/checkpoint/__init__.py).
"""
