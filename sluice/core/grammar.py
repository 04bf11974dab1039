"""Structured-output constraints as llguidance grammars: the router validates them, the worker compiles them."""
import json

from llguidance import LLMatcher, LLTokenizer

from sluice.core.sampling_params import SamplingParams

_JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: no run of spaces or newlines eats the token budget
_NO_EXTENSION = ("NoExtension", "NoExtensionBias")
_CANNOT_SPELL = "no text the model's tokens can spell satisfies it"


def grammar_for(params: SamplingParams) -> str | None:
    """The llguidance grammar of the request's constraint, or None when it has none. Raises ValueError for a JSON
    schema llguidance cannot read."""
    if params.json_schema is not None:
        return LLMatcher.grammar_from_json_schema(_object_schema(params.json_schema), defaults=_JSON_OPTIONS)
    if params.regex is not None:
        return LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(value) for value in params.choice))
    if params.grammar is not None:
        return LLMatcher.grammar_from_lark(params.grammar)
    return None


def _object_schema(schema: str) -> str:
    """llguidance takes options only with an object schema: the schema `true` (any value) is `{}`."""
    return "{}" if schema.strip() == "true" else schema


def grammar_error(grammar: str) -> str | None:
    """Why the grammar does not compile, or None when it does."""
    return LLMatcher.validate_grammar(grammar) or None


def start_error(tokenizer: LLTokenizer, grammar: str) -> str | None:
    """Why no generation with the tokenizer's tokens can start to satisfy the grammar, or None when one can: the
    first token mask is computed, which finds a constraint that only bytes no token spells satisfy."""
    matcher = LLMatcher(tokenizer, grammar)
    matcher.compute_bitmask()
    return matcher_error(matcher)


def matcher_error(matcher: LLMatcher) -> str | None:
    """Why the matcher cannot go on (no token continues its text, a parser limit), or None while it can."""
    if not matcher.is_error():
        return None
    reason = matcher.get_error().strip().split("\n", 1)[0] or matcher.stop_reason()
    return _CANNOT_SPELL if reason in _NO_EXTENSION else reason
