"""A language model's text side: its tokenizer, the token ids of its texts, perplexity windows and prompts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.errors import ConfigError, ModelError
from harness.models import LlmFiles


@dataclass(frozen=True)
class TokenizedPrompt:
    """One prompt as text and as token ids."""

    text: str
    ids: tuple[int, ...]


def load_tokenizer(path: Path, vocab: int | None = None):
    """Return the `tokenizers.Tokenizer` in path; raise ModelError naming the file when it does not load or
    its vocabulary is larger than the graphs' logits (`vocab`)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises its own Exception type with serde's message
        raise ModelError(f"tokenizer {path}: does not load as a Hugging Face tokenizers file "
                         f"(tokenizer.json): {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if vocab is not None and tokenizer.get_vocab_size() > vocab:
        raise ModelError(f"tokenizer {path}: {tokenizer.get_vocab_size()} tokens, but the graphs' logits have "
                         f"{vocab}: the tokenizer does not belong to this model")
    return tokenizer


def read_text(path: Path | None, what: str) -> str:
    """Return the UTF-8 text of path; raise ConfigError naming the file (and `what` it is for) otherwise."""
    if path is None:
        raise ConfigError(f"no {what} text: set llm.{what}_text in the model spec")
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} text {path}: cannot read it as UTF-8 text ({e})") from None


def token_ids(tokenizer, text: str) -> np.ndarray:
    """Return the token ids of text as int64 [N]."""
    return np.asarray(tokenizer.encode(text).ids, dtype=np.int64)


def nll_windows(ids: np.ndarray, width: int, limit: int) -> np.ndarray:
    """Return up to `limit` non-overlapping windows of `width` tokens, evenly spread over ids, as int32 [N, width]
    (each window is scored on its tokens 1..width-1 given the earlier ones)."""
    count = len(ids) // width
    if count < 1:
        raise ConfigError(f"the evaluation text has {len(ids)} tokens; perplexity needs at least one window "
                          f"of {width}")
    starts = np.linspace(0, (count - 1) * width, num=min(limit, count)).astype(np.int64) // width * width
    return np.stack([ids[s:s + width] for s in np.unique(starts)]).astype(np.int32)


def prompts(files: LlmFiles, tokenizer, context_length: int, max_new: int) -> list[TokenizedPrompt]:
    """Return the model's prompts tokenized; raise ConfigError for none, or for one too long to leave
    `max_new` tokens of room in the context."""
    if not files.prompts:
        raise ConfigError("no prompts: set llm.prompts in the model spec (a list of strings)")
    out = []
    for k, text in enumerate(files.prompts):
        ids = tuple(tokenizer.encode(text).ids)
        if not ids:
            raise ConfigError(f"prompt {k} ({text!r}) encodes to no tokens")
        if len(ids) + max_new > context_length:
            raise ConfigError(f"prompt {k} ({text[:40]!r}...) is {len(ids)} tokens: with {max_new} new tokens it "
                              f"exceeds the context length {context_length} (at most {context_length - max_new} "
                              "prompt tokens)")
        out.append(TokenizedPrompt(text, ids))
    return out


def stop_id(files: LlmFiles, tokenizer) -> int | None:
    """Return the stop token's id (None when the spec names none); ConfigError when the tokenizer lacks it."""
    if files.stop_token is None:
        return None
    token = tokenizer.token_to_id(files.stop_token)
    if token is None:
        raise ConfigError(f"stop token {files.stop_token!r} is not in the tokenizer {files.tokenizer}")
    return int(token)
