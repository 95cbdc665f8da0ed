"""vt.data: tokenizers, sources, chat masks, packing, grain pipelines, curriculum, quality filters.

Flow: ``open_source(spec)`` -> Record | Malformed -> ``tokenize_record`` (chat template, assistant-only
mask) -> ``build_sft_dataset`` (shard, shuffle, epochs, skip counting, first-fit packing, batching).

Names are imported lazily so ``import vt.data`` stays cheap (grain alone takes over a second to import).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "vt.data.tokenizer": ("Tokenizer", "load_tokenizer", "build_tiny_tokenizer", "build_tiny_sentencepiece",
                          "QWEN_CHAT_TEMPLATE", "render_qwen_chat", "StreamDecoder"),
    "vt.data.qwen_tokenizer": ("build_qwen25_tokenizer", "ensure_qwen25_tokenizer"),
    "vt.data.sources": ("Record", "Malformed", "open_source", "record_from_dict", "JsonlSource", "ParquetSource",
                        "ArrayRecordSource", "TfdsSource", "ListSource", "ConcatSource", "SubsetSource",
                        "write_array_record"),
    "vt.data.chat": ("Tokenized", "Skip", "tokenize_record", "to_training_example", "chat_token_mask"),
    "vt.data.packing": ("PACKED_KEYS", "pack_first_fit", "padding_fraction"),
    "vt.data.dataset": ("PipelineConfig", "SftDataset", "SkipReport", "build_sft_dataset", "skip_report",
                         "count_tokens"),
    "vt.data.curriculum": ("PassRate", "load_pass_rates", "select_hard_subset", "stratify", "token_trace_length"),
    "vt.data.filters": ("repetition_score", "NgramDecontaminator"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'vt.data' has no attribute {name!r}")
