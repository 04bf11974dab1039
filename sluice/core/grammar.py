"""Structured-output constraints as llguidance grammars: the router validates them, the worker compiles them."""
import json

from llguidance import LLMatcher

from sluice.core.sampling_params import SamplingParams

_JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: no run of spaces or newlines eats the token budget


def grammar_for(params: SamplingParams) -> str | None:
    """The llguidance grammar of the request's constraint, or None when it has none."""
    if params.json_schema is not None:
        return LLMatcher.grammar_from_json_schema(params.json_schema, defaults=_JSON_OPTIONS)
    if params.regex is not None:
        return LLMatcher.grammar_from_regex(params.regex)
    if params.choice is not None:
        return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(value) for value in params.choice))
    if params.grammar is not None:
        return LLMatcher.grammar_from_lark(params.grammar)
    return None


def grammar_error(grammar: str) -> str | None:
    """Why the grammar does not compile, or None when it does."""
    return LLMatcher.validate_grammar(grammar) or None
