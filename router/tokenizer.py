"""The router's tokenizer: text and chat to token ids, streaming detokenization; or token ids only."""
from pathlib import Path

import llguidance.hf
from jinja2 import TemplateError, TemplateSyntaxError
from tokenizers.decoders import DecodeStream
from transformers import AutoTokenizer

from sluice.core.errors import InvalidArgument
from sluice.core.grammar import grammar_for, start_error
from sluice.core.sampling_params import SamplingParams


class RouterTokenizer:
    """Text and chat messages to token ids (with the model's chat template), and streaming detokenization."""

    def __init__(self, model_path: Path):
        if model_path.suffix == ".gguf":
            self._hf = AutoTokenizer.from_pretrained(model_path.parent, gguf_file=model_path.name)
        else:
            self._hf = AutoTokenizer.from_pretrained(model_path)
        self.vocab_size = len(self._hf)
        self.bos_token_id: int | None = self._hf.bos_token_id
        self.pad_token_id: int | None = self._hf.pad_token_id
        self._grammar_tokenizer = llguidance.hf.from_tokenizer(self._hf)
        self._token_texts: dict[int, str] = {}  # filled as logprobs name tokens: at most one entry per vocab id

    def check_text_controls(self, params: SamplingParams) -> None:
        """With a tokenizer, stop strings and bad words can be honoured, and a constraint some token can start."""
        grammar = grammar_for(params)
        if grammar is None:
            return
        error = start_error(self._grammar_tokenizer, grammar)
        if error is not None:
            raise InvalidArgument(f"sampling.{params.constraint}", error)

    def encode_text(self, text: str) -> list[int]:
        return self._hf(text).input_ids

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """The chat template decides which roles it takes: one that raises refuses the messages."""
        encoded = self._apply_chat_template(messages, tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    def render_chat(self, messages: list[dict], chat_template: str | None = None) -> str:
        """The chat template's text (chat_template, or the tokenizer's own) of the messages and the assistant's turn."""
        return self._apply_chat_template(messages, tokenize=False, chat_template=chat_template)

    def encode_rendered(self, text: str) -> list[int]:
        """The token ids of a chat template's text, which holds the special tokens itself."""
        return self._hf(text, add_special_tokens=False).input_ids

    def token_id(self, token: str) -> int:
        return self._hf.convert_tokens_to_ids(token)

    def _apply_chat_template(self, messages: list[dict], **options):
        try:
            return self._hf.apply_chat_template(messages, add_generation_prompt=True, **options)
        except TemplateSyntaxError:
            raise
        except TemplateError as error:
            raise InvalidArgument("chat", f"the model's chat template refuses these messages: {error}") from error

    def bad_words_token_ids(self, words: list[str]) -> list[list[int]]:
        """Each word's tokens on its own (as at the start of a text) and after a space (mid-text), without
        duplicates."""
        sequences = []
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                token_ids = self._hf(text, add_special_tokens=False).input_ids
                if token_ids not in sequences:
                    sequences.append(token_ids)
        return sequences

    def detokenizer(self) -> "IncrementalDetokenizer":
        return IncrementalDetokenizer(self._hf.backend_tokenizer)

    def token_texts(self, token_ids: list[int]) -> list[str]:
        """Each token's text on its own (for logprobs), decoded once per token id: a step's logprobs name
        several tokens for each request, mostly the same ones."""
        texts = self._token_texts
        missing = [token_id for token_id in dict.fromkeys(token_ids) if token_id not in texts]
        if missing:
            texts.update(zip(missing, self._hf.batch_decode([[token_id] for token_id in missing])))
        return [texts[token_id] for token_id in token_ids]


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas that never split a UTF-8 character."""

    def __init__(self, backend):
        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=True)

    def push(self, token_ids: list[int]) -> str:
        return "".join(self._stream.step(self._backend, token_id) or "" for token_id in token_ids)


class TokenIdsOnly:
    """Stands in for a tokenizer where there is none (random-weight benchmarks): token ids in, token ids out."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.bos_token_id = self.pad_token_id = None

    @staticmethod
    def check_text_controls(params: SamplingParams) -> None:
        """Stop strings, bad words and structured output work on text: without a tokenizer they cannot be honoured."""
        for name in ("stop", "bad_words", params.constraint):
            if name and getattr(params, name):
                raise InvalidArgument(f"sampling.{name}", "this deployment has no tokenizer: it works on text")

    def encode_text(self, text: str) -> list[int]:
        raise InvalidArgument("text", "this deployment has no tokenizer: send token ids")

    def encode_chat(self, messages: list[dict]) -> list[int]:
        raise InvalidArgument("chat", "this deployment has no tokenizer: send token ids")

    def detokenizer(self) -> "NoText":
        return NoText()

    @staticmethod
    def token_texts(token_ids: list[int]) -> list[str]:
        return [""] * len(token_ids)


class NoText:
    @staticmethod
    def push(token_ids: list[int]) -> str:
        return ""
