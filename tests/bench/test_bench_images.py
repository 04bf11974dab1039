"""`sluice bench throughput --images-per-request` on the tiny Qwen2.5-VL folder through the gRPC stack: the report
counts the text tokens asked for, the prompt tokens the router made of them with the chat template and each image's
placeholders, every output token, and the vision encoder's share of the worker's step time."""
import json
import subprocess

from sluice.cli.bench.image_workload import with_images
from sluice.cli.bench.workload import random_workload
from sluice.cli.python_command import sluice_command
from sluice.client import user_message
from sluice.router.chat_pb import chat_from_pb
from sluice.router.multimodal.vision_prompts import VisionPrompts
from sluice.router.tokenizer import RouterTokenizer
from sluice.v1 import generation_pb2 as pb
from tests.bench.test_bench_commands import WORKLOAD
from tests.router.tiny_vl_folder import MAX_PIXELS


def test_throughput_with_images_counts_text_and_prompt_tokens_and_the_encoders_share(tmp_path, tiny_vl_dir):
    out = tmp_path / "bench.json"
    subprocess.run([*sluice_command(), "--log-level", "WARNING", "bench", "throughput", "--model", str(tiny_vl_dir),
                    "--images-per-request", "2", "--image-size", "40", "24", *WORKLOAD, "--out", str(out)],
                   check=True, timeout=600)
    (result,) = json.loads(out.read_text())["results"]
    vocab_size = json.loads((tiny_vl_dir / "config.json").read_text())["text_config"]["vocab_size"]
    drawn = random_workload(4, (8, 16), (3, 6), vocab_size)
    requests = with_images(drawn, tiny_vl_dir / "tokenizer.json", 2, (40, 24), seed=0)
    prompts = VisionPrompts.of_model(tiny_vl_dir, RouterTokenizer(tiny_vl_dir), MAX_PIXELS)
    assert result["requests"] == 4
    assert result["text_prompt_tokens"] == sum(len(r.prompt_token_ids) for r in drawn)
    assert result["prompt_tokens"] == sum(
        len(prompts.encode_chat(chat_from_pb(pb.ChatMessages(messages=[user_message(r.prompt_text, r.images)])))[0])
        for r in requests)
    assert result["output_tokens"] == sum(r.max_tokens for r in drawn)
    assert 0 < result["vision_encoder_share"] < 1
