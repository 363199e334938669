"""Character-level tokenizer for the tiny policy, saved as a ``PreTrainedTokenizerFast`` folder.

One token per character of printable ASCII plus newline, and four special tokens:
``<pad>`` (id 0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3). Any other character encodes as
``<unk>``. Nothing is added around encoded text (no BOS, like Qwen's tokenizers); training and
generation append ``<eos>`` themselves.

Plain template: the chat template concatenates the contents of the messages and adds nothing,
so ``apply_chat_template([{"role": "user", "content": "Q: 2+3=? A:"}])`` is ``"Q: 2+3=? A:"``.

The ``Fuse`` decoder joins decoded characters without separators; without it decoded text
would come back with a space between every character.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = "\n" + "".join(chr(c) for c in range(32, 127))
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# How transformers names a plain tokenizers-backed class in tokenizer_config.json (5.x, 4.x).
_FAST_CLASS_NAMES = ("TokenizersBackend", "PreTrainedTokenizerFast")
# The char tokenizer's tokenizer.json is about 3 KB; anything far larger is another tokenizer.
_CHAR_TOKENIZER_MAX_BYTES = 64 * 1024


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character tokenizer as a ``PreTrainedTokenizerFast``."""
    backend = Tokenizer(models.WordLevel(vocab=_vocab(), unk_token=UNK))
    # Each character is its own pre-token; "isolated" keeps spaces and newlines as tokens.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def save_tokenizer(out_dir: str | os.PathLike[str]) -> Path:
    """Write the tokenizer folder (loadable with ``AutoTokenizer.from_pretrained``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(out)
    return out


def _vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(CHARACTERS))}


def is_char_tokenizer(path: str | os.PathLike[str]) -> bool:
    """Whether folder ``path`` holds this character tokenizer as ``save_tokenizer`` wrote it.

    Cheap for any other folder: a real model's tokenizer.json (megabytes) is never parsed; its
    tokenizer_config.json names another class, or its size gives it away.
    """
    path = Path(path)
    try:
        config = json.loads((path / "tokenizer_config.json").read_text())
        if config.get("tokenizer_class") not in _FAST_CLASS_NAMES or "auto_map" in config:
            return False
        if (path / "tokenizer.json").stat().st_size > _CHAR_TOKENIZER_MAX_BYTES:
            return False
        model = json.loads((path / "tokenizer.json").read_text())["model"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return model.get("type") == "WordLevel" and model.get("vocab") == _vocab()


def load_tokenizer(path: str | os.PathLike[str], trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """Load any tokenizer folder (the char tokenizer or a real model's) as ``AutoTokenizer`` does.

    The char tokenizer's own folder is loaded as the ``PreTrainedTokenizerFast`` it was saved as,
    which is what ``AutoTokenizer`` returns for it (a unit test compares them): importing
    ``AutoTokenizer`` imports every model's tokenizer mapping, ~1.5 CPU s in each job's driver.
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"tokenizer path {path} is not a directory")
    if is_char_tokenizer(path):
        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
