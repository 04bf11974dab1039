"""A vision-language workload: each request's prompt as text of its number of tokens, after images of random pixels
(PNG) of its own, so no two requests share an image, or a prefix beyond the chat template's."""
import io
import random
import string
from dataclasses import replace
from pathlib import Path

import numpy as np
from PIL import Image

from sluice.cli.bench.workload import BenchRequest


def with_images(requests: list[BenchRequest], tokenizer_json: Path, images_per_request: int, size: tuple[int, int],
                seed: int) -> list[BenchRequest]:
    """size: width and height in pixels."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    rng = random.Random(seed)
    return [replace(request, **_text(tokenizer, len(request.prompt_token_ids), rng),
                    images=tuple(random_png(*size, seed=(seed, index, image)) for image in range(images_per_request)))
            for index, request in enumerate(requests)]


def _text(tokenizer, num_tokens: int, rng: random.Random, attempts: int = 10) -> dict:
    """Lowercase words cut to num_tokens tokens, drawn again where the cut text does not encode to exactly them."""
    for _ in range(attempts):
        words = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(num_tokens))
        token_ids = tokenizer.encode(words, add_special_tokens=False).ids[:num_tokens]
        text = tokenizer.decode(token_ids)
        if tokenizer.encode(text, add_special_tokens=False).ids == token_ids:
            return {"prompt_token_ids": token_ids, "prompt_text": text}
    raise ValueError(f"no text of {num_tokens} tokens in {attempts} draws")


def random_png(width: int, height: int, seed) -> bytes:
    """seed: anything numpy's default_rng takes."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()
