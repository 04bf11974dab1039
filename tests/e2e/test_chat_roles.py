"""Chat roles: an empty one is refused; any other is the model's chat template's call."""
import shutil

import grpc
import pytest

from sluice.client import SluiceClient, chat_request, sampling_params
from sluice.v1 import generation_pb2 as pb
from tests.e2e.services import extra_router

pytestmark = pytest.mark.slow

_STRICT_TEMPLATE = """{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('unknown role ' + message['role']) }}{% endif %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"""


def _chat(*roles: str) -> pb.GenerateRequest:
    messages = [pb.ChatMessage(role=role, content=f"a message from {role or 'nobody'}") for role in roles]
    return pb.GenerateRequest(chat=pb.ChatMessages(messages=messages),
                              sampling=sampling_params(max_tokens=4, temperature=0.0))


@pytest.mark.parametrize("roles, field", [(("",), "chat.messages[0].role"),
                                          (("system", "user", "  "), "chat.messages[2].role")])
def test_an_empty_role_is_invalid_argument_naming_the_message(services, roles, field):
    with pytest.raises(grpc.RpcError) as error:
        services.client.generate(_chat(*roles))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details().startswith(f"{field}:")
    assert len(services.client.generate(chat_request("Hello!", max_tokens=4, temperature=0.0)).token_ids) == 4


def test_a_role_the_template_renders_is_accepted_as_rendered(services, hf_tokenizer):
    messages = [{"role": "narrator", "content": "a message from narrator"}]
    expected_prompt = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    result = services.client.generate(_chat("narrator"))
    assert result.usage["prompt_tokens"] == len(hf_tokenizer(expected_prompt, add_special_tokens=False).input_ids)
    assert len(result.token_ids) == 4


def test_a_role_the_template_refuses_is_invalid_argument(services, default_model_dir, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_model_dir / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text(_STRICT_TEMPLATE)
    with extra_router(services, tmp_path) as (_, address), SluiceClient(address) as client:
        with pytest.raises(grpc.RpcError) as error:
            client.generate(_chat("user", "narrator"))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.value.details() == "chat: the model's chat template refuses these messages: unknown role narrator"
        assert len(client.generate(_chat("system", "user")).token_ids) == 4
