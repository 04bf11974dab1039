"""Chained hashes that name full KV blocks, so requests with an equal prefix share the same physical blocks.

hash(block i) = sha256(hash(block i-1) || token ids of block i as int64 || extra keys). The parent hash and the
token bytes have fixed lengths, so the encoding is unambiguous; the cache salt enters the first block only and
reaches every later block through the chain.
"""
import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes

ROOT_PARENT_HASH: BlockHash = bytes(32)


def hash_block(parent_hash: BlockHash, token_ids: Sequence[int], extra_key: bytes = b"") -> BlockHash:
    hasher = hashlib.sha256(parent_hash)
    hasher.update(array("q", token_ids).tobytes())
    hasher.update(extra_key)
    return hasher.digest()


def salt_key(cache_salt: str | None) -> bytes:
    return b"" if cache_salt is None else b"salt:" + cache_salt.encode()


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int,
                        cache_salt: str | None) -> None:
    """Appends the hashes of the full blocks of `token_ids` that `hashes` does not cover yet."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else ROOT_PARENT_HASH
        extra = b"" if i else salt_key(cache_salt)
        hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra))
