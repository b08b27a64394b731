"""The gateway's tokenizer written as a Hugging Face folder, so that clients (aiperf, guidellm,
``vllm bench serve``) load it with ``AutoTokenizer.from_pretrained(DIR)`` and count tokens as the
gateway does. ``prfaas tokenizer export`` is the command.

- A real model (engine ``torch``): its folder's tokenizer files, copied as they are.
- The emulated ``ByteTokenizer`` (engine ``timed``): rebuilt with the ``tokenizers`` library as a
  byte-level BPE without merges over the 256 byte symbols, so token id = UTF-8 byte, as the
  gateway's; EOS ``<eos>`` is id 256; special tokens in text are split like any text (the
  gateway never reads ``"<eos>"`` in a prompt as EOS either); and a chat template that renders the
  gateway's plain join (``"<role>: <content>\\n"`` per message, then ``"assistant:"``).

``tokenizers`` and ``transformers`` are imported only when a function here runs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",  # lets AutoTokenizer find the class when tokenizer_config.json does not say
)
"""What is copied from a model folder when present; the first two must be."""
REQUIRED_FILES = TOKENIZER_FILES[:2]

BYTE_EOS_TOKEN = "<eos>"
# The plain join of serve.api.tokenizer.render_chat, as a Jinja chat template.
PLAIN_JOIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}"
    "{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}"
)


def copy_tokenizer(model_dir: Path, out_dir: Path) -> list[Path]:
    """Copy ``model_dir``'s tokenizer files into ``out_dir``; ``FileNotFoundError`` names the
    missing required files."""
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"model folder {model_dir} lacks {', '.join(missing)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            written.append(Path(shutil.copyfile(model_dir / name, out_dir / name)))
    return written


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ``ByteLevel`` pre-tokenizer applies:
    printable Latin-1 bytes map to themselves, the other 68 to U+0100 onwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer_hf(max_context_tokens: int) -> Any:
    """A ``PreTrainedTokenizerFast`` whose ``encode`` gives ``ByteTokenizer``'s ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in byte_level_alphabet().items()}
    vocab[BYTE_EOS_TOKEN] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: no split into words (the regex would not change ids, but it costs time).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        eos_token=BYTE_EOS_TOKEN,
        model_max_length=max_context_tokens,
        split_special_tokens=True,
        chat_template=PLAIN_JOIN_TEMPLATE,
    )


def export_byte_tokenizer(out_dir: Path, max_context_tokens: int) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [Path(p) for p in byte_tokenizer_hf(max_context_tokens).save_pretrained(out_dir)]
    # transformers 5 names its own class; "PreTrainedTokenizerFast" loads in 4.x and 5.x alike.
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return sorted({p for p in paths if p.is_file()})
