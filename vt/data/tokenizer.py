"""The tokenizer layer every part of vt uses: HF tokenizer directories and SentencePiece models.

One class, :class:`Tokenizer`, wraps either backend behind the same surface:

    encode(text) -> list[int]                      no BOS/EOS added: chat templates carry their own markers
    encode_with_offsets(text) -> (ids, [(start, end)])   character offsets into ``text`` (for loss masks)
    decode(ids, skip_special_tokens=False) -> str
    apply_chat_template(messages, add_generation_prompt=False, tools=None) -> str
    encode_chat(messages, add_generation_prompt=False, tools=None) -> list[int]
    stream_decoder() -> StreamDecoder              incremental text of a token stream, whole characters only
    vocab_size, eos_token_ids, pad_token_id, token_to_id(str)

Chat format (Qwen2.5, ChatML): every message renders as ``<|im_start|>{role}\\n{content}<|im_end|>\\n``;
``add_generation_prompt`` appends ``<|im_start|>assistant\\n``. vt's own template does not insert a default
system prompt (the official Qwen2.5 template does: "You are Qwen, created by Alibaba Cloud..."); an HF
directory's ``chat_template`` is used as written unless ``chat_template="qwen"`` is passed. Qwen2.5's real
tokenizer directory (with its template) is built by :mod:`vt.data.qwen_tokenizer`.

Stop tokens: Qwen chat models end a turn with ``<|im_end|>`` (151645) and a document with ``<|endoftext|>``
(151643); generation must stop on both, so ``eos_token_ids`` holds the ids of both tokens *in this
tokenizer* (a tiny test tokenizer numbers them differently).

The core depends on ``tokenizers``, ``sentencepiece`` and ``jinja2`` only; ``transformers`` is not needed
(tests use it as the reference for template rendering).
"""
from __future__ import annotations

import bisect
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import jinja2
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2 as pb  # ships with sentencepiece (protobuf: tensorboardX needs it too)
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from vt import VtError

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
THINK_START = "<think>"
THINK_END = "</think>"
# Qwen's specials in id order (151643, 151644, 151645); <think>/</think> are plain added tokens in Qwen2.5
# (they are single tokens in Qwen3) and we add them so reasoning traces tokenise compactly.
QWEN_SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, THINK_START, THINK_END)

# ChatML as Qwen2.5 renders it, minus the forced default system prompt and the tool-calling branches.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Qwen2's pre-tokenisation regex (from its tokenizer.json): digits split one by one, newlines grouped.
QWEN_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def render_qwen_chat(messages: Sequence[dict], add_generation_prompt: bool = False) -> str:
    """Pure-Python ChatML rendering, identical to :data:`QWEN_CHAT_TEMPLATE` (no jinja needed)."""
    parts = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def _check_messages(messages: Sequence[dict]) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise VtError(f"chat message {i}: expected {{'role': str, 'content': str}}, got {m!r:.200}")


class _JinjaTemplate:
    """Renders an HF ``chat_template`` the way transformers does (sandboxed, trim_blocks, lstrip_blocks)."""

    def __init__(self, source: str, special: dict[str, Any], where: str):
        def raise_exception(message):
            raise VtError(f"{where}: chat template raised: {message}")

        # The same environment transformers renders chat templates in, so both give identical text.
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise VtError(f"{where}: chat_template does not parse: {e}") from e
        self._special = special

    def render(self, messages: Sequence[dict], add_generation_prompt: bool, tools: Sequence[dict] | None = None,
               **switches) -> str:
        """`switches`: template variables such as Qwen3's enable_thinking, passed as transformers passes its
        apply_chat_template keyword arguments (left undefined when not given)."""
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                     tools=list(tools) if tools else None, **self._special, **switches)


class Tokenizer:
    """A tokenizer with a chat template. Build it with :func:`load_tokenizer` or :func:`build_tiny_tokenizer`."""

    def __init__(self, backend, *, kind: str, path: str, chat_template: str | None = None,
                 special_tokens: dict[str, str | None] | None = None, enable_thinking: bool | None = None):
        # kind: "hf" (a `tokenizers.Tokenizer`) or "spm" (a `sentencepiece.SentencePieceProcessor`).
        # enable_thinking: the default of apply_chat_template's switch (None: left to the template).
        self._backend = backend
        self.enable_thinking = enable_thinking
        self.kind = kind
        self.path = path
        special_tokens = dict(special_tokens or {})
        self._template = None
        if chat_template is not None:
            self._template = _JinjaTemplate(chat_template, {k: v for k, v in special_tokens.items() if v is not None},
                                            where=path)
        self.chat_template_source = chat_template or QWEN_CHAT_TEMPLATE
        if kind == "hf":
            self._special_ids = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)
        else:
            sp = backend
            self._special_ids = frozenset(i for i in range(sp.get_piece_size())
                                          if sp.is_control(i) or sp.id_to_piece(i) in (ENDOFTEXT, IM_START, IM_END))
        # Qwen chat stops on either token; both must exist for a chat model, one suffices for a base model.
        eos = [self.token_to_id(t) for t in (ENDOFTEXT, IM_END)]
        eos_name = special_tokens.get("eos_token")
        if eos_name and self.token_to_id(eos_name) is not None:
            eos.append(self.token_to_id(eos_name))
        if kind == "spm" and backend.eos_id() >= 0:
            eos.append(backend.eos_id())
        self.eos_token_ids: tuple[int, ...] = tuple(sorted({i for i in eos if i is not None}))
        if not self.eos_token_ids:
            raise VtError(f"{path}: tokenizer has neither {ENDOFTEXT} nor {IM_END} nor an eos token")
        pad_name = special_tokens.get("pad_token") or ENDOFTEXT
        pad = self.token_to_id(pad_name)
        if pad is None and kind == "spm" and backend.pad_id() >= 0:
            pad = backend.pad_id()
        # Qwen pads with <|endoftext|>; padding is always masked out, so any valid id would do.
        self.pad_token_id: int = pad if pad is not None else self.eos_token_ids[0]

    # ---- vocabulary -------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can emit (added tokens included); the model's embedding may be larger."""
        if self.kind == "hf":
            return self._backend.get_vocab_size(with_added_tokens=True)
        return self._backend.get_piece_size()

    def token_to_id(self, token: str) -> int | None:
        if self.kind == "hf":
            return self._backend.token_to_id(token)
        i = self._backend.piece_to_id(token)
        # sentencepiece maps unknown pieces to unk_id: only an exact round trip means the token exists.
        return i if self._backend.id_to_piece(i) == token else None

    def id_to_token(self, i: int) -> str | None:
        if self.kind == "hf":
            return self._backend.id_to_token(i)
        return self._backend.id_to_piece(i) if 0 <= i < self._backend.get_piece_size() else None

    @property
    def special_token_ids(self) -> frozenset[int]:
        return self._special_ids

    # ---- text <-> ids -----------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in the text map to their ids; no BOS/EOS added."""
        if self.kind == "hf":
            return self._encode_hf(text).ids
        return self._backend.encode(text)

    def _encode_hf(self, text: str):
        # `tokenizers.Tokenizer.encode` holds the GIL for the whole encode, so grain's reader threads (and any
        # other thread) would tokenise one at a time; `encode_batch` releases it (same result for one text).
        return self._backend.encode_batch([text], add_special_tokens=False)[0]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids plus each token's ``(start, end)`` character span in ``text`` (used to build loss masks).

        A byte-level token that covers part of a multi-byte character reports the whole character's span;
        a sentencepiece byte-fallback piece may report an empty span at the character's start.
        """
        if self.kind == "hf":
            enc = self._encode_hf(text)
            return enc.ids, enc.offsets  # already a list and a list of (start, end) tuples: no copies (hot path)
        proto = self._backend.encode(text, return_type="proto")
        # sentencepiece offsets count UTF-8 bytes; convert to character indices.
        byte_starts = []
        pos = 0
        for ch in text:
            byte_starts.append(pos)
            pos += len(ch.encode("utf-8"))

        def to_char(b):
            return bisect.bisect_right(byte_starts, b) - 1 if b < pos else len(text)

        return [p.id for p in proto.pieces], [(to_char(p.begin), to_char(p.end)) for p in proto.pieces]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "hf":
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        # A model's embedding is often padded past the tokenizer (vocab padding), so a sampler may emit an id
        # with no piece; sentencepiece raises on it, HF tokenizers skip it: skip it here too.
        n = self._backend.get_piece_size()
        ids = [i for i in ids if 0 <= i < n]
        # User-defined pieces (<|im_end|>, <think>) decode to their text; byte-fallback pieces to UTF-8.
        return self._backend.decode(ids)

    # ---- chat -------------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                            tools: Sequence[dict] | None = None, enable_thinking: bool | None = None) -> str:
        """The chat rendered as text (Qwen ChatML unless the HF directory ships another template).

        ``tools``: JSON function schemas, for templates with a tool-calling branch (Qwen2.5's lists them in
        the system turn); vt's own ChatML template has none and rejects them. ``enable_thinking``: Qwen3's
        template switch (False: the generation prompt closes an empty <think> block); None takes the
        tokenizer's default (`load_tokenizer`), and None there leaves it undefined, as transformers does.
        """
        _check_messages(messages)
        thinking = self.enable_thinking if enable_thinking is None else enable_thinking
        if self._template is None:
            if tools or thinking is not None:
                raise VtError(f"{self.path}: vt's ChatML template has no tool-calling branch and no thinking switch; "
                              "load a tokenizer directory whose chat template has them (Qwen2.5's: tools; Qwen3's: "
                              "both)")
            return render_qwen_chat(messages, add_generation_prompt)
        switches = {} if thinking is None else {"enable_thinking": thinking}
        return self._template.render(messages, add_generation_prompt, tools, **switches)

    def encode_chat(self, messages: Sequence[dict], add_generation_prompt: bool = False,
                    tools: Sequence[dict] | None = None, enable_thinking: bool | None = None) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools, enable_thinking))

    def stream_decoder(self, skip_special_tokens: bool = True) -> "StreamDecoder":
        """An incremental decoder for tokens arriving one chunk at a time (see :class:`StreamDecoder`)."""
        return StreamDecoder(self, skip_special_tokens)

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, path={self.path!r}, vocab_size={self.vocab_size})"


class StreamDecoder:
    """Text of a token stream, emitted as it arrives, never half a character.

    A byte-level BPE token may hold part of a multi-byte UTF-8 character (an emoji or a rare CJK character is
    often 2-4 tokens); decoding such a prefix on its own gives U+FFFD. ``push(ids)`` returns only the text
    that is final: it decodes a short window (the tokens since the last emitted boundary plus the new ones,
    so the cost per token stays constant) and holds back the tail while it ends in an incomplete character.
    ``flush()`` returns what is still held (a truly invalid byte sequence then shows as U+FFFD, as the full
    decode would). Concatenated, the pieces equal ``tokenizer.decode(all_ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the decode window: the token after which the emitted text ends cleanly
        self._read = 0  # tokens whose text is already emitted

    def _decode(self, ids) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, ids: Iterable[int] | int) -> str:
        self._ids.extend(int(i) for i in (ids if hasattr(ids, "__iter__") else [ids]))  # one id or many
        done = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""  # nothing new, or the last character is not complete yet
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(done):]

    def flush(self) -> str:
        done = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(done):]


# ---- loading ----------------------------------------------------------------------------------------------
def _read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise VtError(f"{path}: not valid JSON: {e}") from e


def _token_str(value) -> str | None:
    # tokenizer_config.json stores specials either as strings or as AddedToken dicts ({"content": ...}).
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def load_tokenizer(path: str | os.PathLike, chat_template: str | None = None,
                   enable_thinking: bool | None = None) -> Tokenizer:
    """Load an HF tokenizer directory (``tokenizer.json`` [+ ``tokenizer_config.json``]) or a ``.model``
    SentencePiece file.

    ``chat_template``: None uses the directory's own template (``tokenizer_config.json["chat_template"]`` or
    ``chat_template.jinja``), falling back to vt's Qwen ChatML; ``"qwen"`` forces vt's; any other string is
    a jinja template. SentencePiece models always use vt's Qwen ChatML unless a template string is given.
    ``enable_thinking``: the default of every rendering's thinking switch (Qwen3's template; None: undefined).
    Raises :class:`vt.VtError` naming the path when the files are missing or corrupt.
    """
    p = Path(path)
    if not p.exists():
        raise VtError(f"{p}: tokenizer not found (expected an HF tokenizer directory or a SentencePiece .model)")
    override = None if chat_template in (None, "qwen") else chat_template
    if p.is_dir():
        tj = p / "tokenizer.json"
        if not tj.is_file():
            if any(p.glob("*.model")):
                raise VtError(f"{p}: no tokenizer.json; pass the SentencePiece file itself: "
                              f"{next(p.glob('*.model'))}")
            raise VtError(f"{p}: no tokenizer.json in this directory")
        try:
            backend = HFTokenizer.from_file(str(tj))
        except Exception as e:  # the Rust loader raises a bare Exception on corrupt files
            raise VtError(f"{tj}: cannot load tokenizer: {e}") from e
        cfg = _read_json(p / "tokenizer_config.json") if (p / "tokenizer_config.json").is_file() else {}
        template = cfg.get("chat_template")
        if isinstance(template, list):  # multi-template format: [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if template is None and (p / "chat_template.jinja").is_file():
            template = (p / "chat_template.jinja").read_text(encoding="utf-8")
        if chat_template == "qwen":
            template = None
        elif override is not None:
            template = override
        special = {k: _token_str(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return Tokenizer(backend, kind="hf", path=str(p), chat_template=template, special_tokens=special,
                         enable_thinking=enable_thinking)
    sp = spm.SentencePieceProcessor()
    try:
        sp.load(str(p))
    except (OSError, RuntimeError) as e:
        raise VtError(f"{p}: not a SentencePiece model: {e}") from e
    return Tokenizer(sp, kind="spm", path=str(p), chat_template=override, enable_thinking=enable_thinking)


# ---- tiny tokenizers built on the spot (tests, `make demo`: no downloads, ever) ---------------------------
TINY_CORPUS = (
    "Let's think step by step and output the final answer within \\boxed{}.",
    "Find the sum of all integer bases $b>9$ for which $17_b$ is a divisor of $97_b$.",
    "<think>\nFirst, 17_b = b + 7 and 97_b = 9b + 7. So b + 7 divides 9b + 7 - 9(b + 7) = -56.\n"
    "Divisors of 56 greater than 16 are 28 and 56, so b = 21 or b = 49.\n</think>\n"
    "The sum is $21 + 49 = \\boxed{70}$.",
    "Compute $\\frac{3}{4} + \\frac{1}{8} = \\frac{7}{8}$. The probability is $\\sqrt{2}/2 \\approx 0.7071$.",
    "If x^2 - 5x + 6 = 0 then (x - 2)(x - 3) = 0, so x = 2 or x = 3. Therefore the answer is 5.",
    "def fibonacci(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "```python\nimport sys\n\ndef main():\n    data = sys.stdin.read().split()\n    print(sum(map(int, data)))\n\n"
    "if __name__ == \"__main__\":\n    main()\n```",
    "class Solution:\n    def twoSum(self, nums: list[int], target: int) -> list[int]:\n        seen = {}\n"
    "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
    "                return [seen[target - x], i]\n"
    "            seen[x] = i\n",
    "You are a helpful assistant. Please answer the question concisely.",
    "Hello! How can I help you today? I'd like a summary of the article in three bullet points.",
    "Write a haiku about autumn leaves. Respond in JSON with the keys \"title\" and \"poem\".",
    "The mitochondria is the powerhouse of the cell; photosynthesis converts light into chemical energy.",
    "Which of the following is correct? (A) 12 (B) 15 (C) 18 (D) 21. The answer is (C).",
    "Unicode check: café, naïve, 数学, ∑_{i=1}^{n} i = n(n+1)/2, π ≈ 3.14159, emoji 🙂.",
)


def _default_texts() -> list[str]:
    # Repeat with small variations so BPE sees frequent pairs and learns merges across the whole range.
    texts = list(TINY_CORPUS)
    texts += [f"{a} + {b} = {a + b}. {a} * {b} = {a * b}." for a in range(0, 60, 7) for b in range(3, 40, 9)]
    texts += [render_qwen_chat([{"role": "user", "content": TINY_CORPUS[1]},
                                {"role": "assistant", "content": TINY_CORPUS[2]}])]
    return texts


def _special_added_tokens_decoder(backend) -> dict[str, dict]:
    out = {}
    for tok in QWEN_SPECIAL_TOKENS:
        out[str(backend.token_to_id(tok))] = {
            "content": tok, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            # Qwen2.5 marks <think>/</think> non-special so decode(skip_special_tokens=True) keeps them.
            "special": tok not in (THINK_START, THINK_END),
        }
    return out


def build_tiny_tokenizer(out_dir: str | os.PathLike, texts: Iterable[str] | None = None,
                         vocab_size: int = 512, chat_template: str = QWEN_CHAT_TEMPLATE) -> Tokenizer:
    """Train a byte-level BPE (Qwen2 pre-tokenisation) on ``texts`` (a built-in math/code/chat corpus when
    None), add the Qwen special tokens, and write an HF tokenizer directory (tokenizer.json,
    tokenizer_config.json with the Qwen chat template, special_tokens_map.json) that both
    :func:`load_tokenizer` and ``transformers.AutoTokenizer.from_pretrained`` load.

    The vocabulary has at most ``vocab_size`` entries (fewer when the corpus runs out of merges); the
    specials come after the BPE vocabulary, as in Qwen (<|endoftext|>, <|im_start|>, <|im_end|>, <think>,
    </think> in that order). Takes well under a second. ``chat_template``: vt's ChatML, or another (Qwen2.5's
    renders tool calls and tool turns as the sampler's tools write them: vt.data.qwen_tokenizer).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = list(texts) if texts is not None else _default_texts()
    backend = HFTokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()  # Qwen2 normalises NFC too
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    n_special = len(QWEN_SPECIAL_TOKENS)
    if vocab_size < 256 + n_special + 1:
        raise VtError(f"build_tiny_tokenizer: vocab_size {vocab_size} < 262 (256 bytes + 5 specials + 1 merge)")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_special, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    backend.train_from_iterator(texts, trainer=trainer)
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in (ENDOFTEXT, IM_START, IM_END)])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)])
    backend.save(str(out / "tokenizer.json"))

    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": _special_added_tokens_decoder(backend),
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 32768,
        "split_special_tokens": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special_map = {"eos_token": IM_END, "pad_token": ENDOFTEXT, "additional_special_tokens": [IM_START, IM_END]}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n")
    return load_tokenizer(out)


def build_tiny_sentencepiece(out_path: str | os.PathLike, texts: Iterable[str] | None = None,
                             vocab_size: int = 400) -> Tokenizer:
    """Train a tiny SentencePiece BPE model (byte fallback, Qwen specials as user-defined symbols) into
    ``out_path`` (a ``.model`` file) and load it. Identity normalisation so offsets map 1:1 to the text."""
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    texts = list(texts) if texts is not None else _default_texts()
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=buf, vocab_size=vocab_size, model_type="bpe",
        byte_fallback=True, user_defined_symbols=list(QWEN_SPECIAL_TOKENS), normalization_rule_name="identity",
        add_dummy_prefix=False, remove_extra_whitespaces=False, split_digits=True, hard_vocab_limit=False,
        unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, minloglevel=2, character_coverage=1.0,
        allow_whitespace_only_pieces=True, split_by_whitespace=False,
    )
    out.write_bytes(buf.getvalue())
    return load_tokenizer(out)



# ---- writing a tokenizer as Hugging Face files (every vt export carries one) ------------------------------
# Files of an HF tokenizer directory that travel with it (a `.model` only where the directory holds one).
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                      "merges.txt", "added_tokens.json", "chat_template.jinja", "tokenizer.model")
SPM_SPACE = "\u2581"


def _spm_to_hf_backend(sp: spm.SentencePieceProcessor) -> HFTokenizer:
    """A SentencePiece BPE model as a `tokenizers` BPE with the same ids (LLaMA-style conversion): the vocabulary
    by id, merges ranked by the merged piece's score (SentencePiece merges the pair whose piece scores highest),
    spaces as U+2581, byte fallback, user-defined pieces as added tokens matched before the model."""
    proto = pb.ModelProto()
    proto.ParseFromString(sp.serialized_model_proto())
    ts, ns = proto.trainer_spec, proto.normalizer_spec
    if ts.model_type != pb.TrainerSpec.BPE:
        raise VtError("only SentencePiece BPE models convert to tokenizer.json here (this one is "
                      f"{pb.TrainerSpec.ModelType.Name(ts.model_type)})")
    if ns.name not in ("identity", "") or ns.add_dummy_prefix or ns.remove_extra_whitespaces:
        raise VtError(f"SentencePiece normalizer {ns.name!r} (add_dummy_prefix={ns.add_dummy_prefix}, "
                      f"remove_extra_whitespaces={ns.remove_extra_whitespaces}) has no exact tokenizer.json form "
                      "here: train with normalization_rule_name='identity', add_dummy_prefix=False, "
                      "remove_extra_whitespaces=False (as vt's build_tiny_sentencepiece does)")
    T = pb.ModelProto.SentencePiece
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    mergeable = {p.piece: (i, p.score) for i, p in enumerate(proto.pieces) if p.type == T.NORMAL}
    merges = []
    for piece, (i, score) in mergeable.items():
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((-score, i, vocab[left], (left, right)))
    merges = [m[-1] for m in sorted(merges)]
    unk = next((p.piece for p in proto.pieces if p.type == T.UNKNOWN), None)
    backend = HFTokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=ts.byte_fallback))
    backend.normalizer = normalizers.Replace(" ", SPM_SPACE)
    backend.pre_tokenizer = None
    backend.decoder = decoders.Sequence([decoders.Replace(SPM_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    added = [AddedToken(p.piece, special=p.type == T.CONTROL or p.piece in (ENDOFTEXT, IM_START, IM_END),
                        normalized=False) for p in proto.pieces if p.type in (T.USER_DEFINED, T.CONTROL)]
    backend.add_special_tokens([t for t in added if t.special])
    backend.add_tokens([t for t in added if not t.special])
    return backend


def _tokenizer_config(backend: HFTokenizer, tok: "Tokenizer", tokenizer_class: str) -> dict:
    name = lambda i: tok.id_to_token(i) if i is not None else None  # noqa: E731
    eos_name = IM_END if tok.token_to_id(IM_END) is not None else name(tok.eos_token_ids[0])
    decoder = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                        "single_word": t.single_word, "special": t.special}
               for i, t in sorted(backend.get_added_tokens_decoder().items())}
    unk = next((t.content for t in backend.get_added_tokens_decoder().values() if t.content == "<unk>"), None)
    return {"tokenizer_class": tokenizer_class, "added_tokens_decoder": decoder, "bos_token": None,
            "eos_token": eos_name, "pad_token": name(tok.pad_token_id), "unk_token": unk,
            "additional_special_tokens": [t for t in (IM_START, IM_END) if tok.token_to_id(t) is not None],
            "chat_template": tok.chat_template_source, "clean_up_tokenization_spaces": False,
            "add_bos_token": False, "add_eos_token": False, "model_max_length": 32768, "split_special_tokens": False}


def save_hf_tokenizer(tok: "Tokenizer", out_dir: str | os.PathLike) -> list[str]:
    """Write `tok` into `out_dir` as the files `transformers.AutoTokenizer.from_pretrained(out_dir)` loads with
    the same ids, chat template and special tokens (and vt's `load_tokenizer(out_dir)` too). An HF directory's
    files are copied as they are; a SentencePiece model becomes `tokenizer.json` (`tokenizers`' own form) plus
    `tokenizer_config.json` and `special_tokens_map.json`. Returns the names written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tok.kind == "hf":
        src = Path(tok.path)
        names = [f for f in HF_TOKENIZER_FILES if (src / f).is_file()]
        for f in names:
            (out / f).write_bytes((src / f).read_bytes())
        return names
    backend = _spm_to_hf_backend(tok._backend)
    backend.save(str(out / "tokenizer.json"))
    config = _tokenizer_config(backend, tok, "PreTrainedTokenizerFast")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    special_map = {k: config[k] for k in ("eos_token", "pad_token", "unk_token", "additional_special_tokens")
                   if config[k] is not None}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2, ensure_ascii=False) + "\n")
    return ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
