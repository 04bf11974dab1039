from transformers import AutoTokenizer

from sluice.router.tokenizer import RouterTokenizer

TEXT = "naïve café — 世界 🎉🎉 done"


def test_streamed_deltas_are_whole_characters_and_add_up(default_model_dir):
    tokenizer = RouterTokenizer(default_model_dir)
    token_ids = tokenizer.encode_text(TEXT)
    detokenizer = tokenizer.detokenizer()
    deltas = [detokenizer.push([token_id]) for token_id in token_ids]
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in delta for delta in deltas)
    assert "" in deltas  # some tokens carry only part of a character and wait for the rest


def test_special_tokens_are_not_emitted(default_model_dir):
    tokenizer = RouterTokenizer(default_model_dir)
    eos = 2
    assert tokenizer.detokenizer().push([*tokenizer.encode_text("Paris."), eos]) == "Paris."


def test_token_texts_are_each_tokens_own_text_on_every_call(default_model_dir):
    tokenizer = RouterTokenizer(default_model_dir)
    token_ids = [*tokenizer.encode_text(TEXT), 2, tokenizer.encode_text(TEXT)[0]]
    hf_tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    expected = [hf_tokenizer.decode([token_id]) for token_id in token_ids]
    assert tokenizer.token_texts(token_ids) == expected
    assert tokenizer.token_texts(token_ids[::-1]) == expected[::-1]
