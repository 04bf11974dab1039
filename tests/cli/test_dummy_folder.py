"""The router's folder of the dummy Qwen2.5-VL-7B shape: Qwen's special tokens at the shape's ids, a 448 x 448 image
as Qwen2.5-VL's processor makes it (a 32 x 32 grid of patches, 256 placeholders), and text one token a byte."""
from sluice.cli.bench.image_workload import random_png
from sluice.cli.dummy_folder import router_model
from sluice.client import user_message
from sluice.router.chat_pb import chat_from_pb
from sluice.router.multimodal.vision_prompts import VisionPrompts
from sluice.router.tokenizer import RouterTokenizer
from sluice.v1 import generation_pb2 as pb


def test_a_dummy_vision_shape_gets_a_folder_the_router_reads_as_qwen2_5_vls(tmp_path):
    folder = router_model("dummy", "Qwen2.5-VL-7B", tmp_path)
    assert router_model("dummy", "Qwen3-0.6B", tmp_path) is None
    tokenizer = RouterTokenizer(folder)
    prompts = VisionPrompts.of_model(folder, tokenizer, 28 * 28 * 1280)
    assert tokenizer.token_id("<|im_end|>") == 151645 and prompts.image_token_id == 151655
    chat = chat_from_pb(pb.ChatMessages(messages=[user_message("what is this", [random_png(448, 448, seed=0)])]))
    token_ids, (image,) = prompts.encode_chat(chat)
    assert image.grid_thw == (1, 32, 32) and image.length == 256
    text_ids = tokenizer.encode_rendered("what is this")
    assert len(text_ids) == len("what is this")
    assert token_ids[image.end] == tokenizer.token_id("<|vision_end|>") and token_ids[image.end + 1:][:12] == text_ids
