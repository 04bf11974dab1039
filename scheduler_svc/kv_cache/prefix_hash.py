"""Chained hashes that name full KV blocks, so requests with an equal prefix share the same physical blocks.

hash(block i) = sha256(hash(block i-1) || token ids of block i as int64 || extra keys). The parent hash and the
token bytes have fixed lengths, and each image hash enters with its length, so the encoding is unambiguous; the cache
salt enters the first block only and reaches every later block through the chain. A block that holds any of an
image's placeholder tokens takes the image's hash among its extra keys: placeholders are the same token whatever the
image, so two prompts that differ only in an image share no block from the first that holds its placeholders on.
"""
import hashlib
from array import array
from collections.abc import Sequence

from sluice.core.images import ImageInput

BlockHash = bytes

ROOT_PARENT_HASH: BlockHash = bytes(32)


def hash_block(parent_hash: BlockHash, token_ids: Sequence[int], extra_key: bytes = b"") -> BlockHash:
    hasher = hashlib.sha256(parent_hash)
    hasher.update(array("q", token_ids).tobytes())
    hasher.update(extra_key)
    return hasher.digest()


def salt_key(cache_salt: str | None) -> bytes:
    return b"" if cache_salt is None else b"salt:" + cache_salt.encode()


def image_key(images: Sequence[ImageInput], start: int, end: int) -> bytes:
    """The hashes of the images whose placeholders lie in part in tokens start..end - 1."""
    return b"".join(b"image:%d:" % len(image.hash) + image.hash for image in images
                    if image.offset < end and image.end > start)


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int,
                        cache_salt: str | None, images: Sequence[ImageInput] = ()) -> None:
    """Appends the hashes of the full blocks of `token_ids` that `hashes` does not cover yet."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else ROOT_PARENT_HASH
        start, end = i * block_size, (i + 1) * block_size
        extra = b"" if i else salt_key(cache_salt)
        if images:
            extra += image_key(images, start, end)
        hashes.append(hash_block(parent, token_ids[start:end], extra))
