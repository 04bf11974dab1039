"""The worker's NIXL agent between two real processes: a pull lands the peer's blocks bit for bit in the local ones,
every layer's keys and values, in float32, bfloat16 and FP8; a cache of another shape is refused naming the field (a
peer that is gone: tests/e2e/test_pd_disaggregation.py)."""
import asyncio

import pytest
import torch
import torch.multiprocessing as mp

from sluice.core.errors import InvalidArgument
from sluice.worker.kv_transfer.agent import KvTransferAgent

NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, NUM_LAYERS = 8, 4, 2, 8, 3


def _caches(dtype: torch.dtype, seed: int, num_kv_heads: int = NUM_KV_HEADS):
    """kv_cache's layout: each block stored whole ([blocks, heads, block_size, head_dim]), seen token-major."""
    generator = torch.Generator().manual_seed(seed)

    def one():
        stored = torch.randn((NUM_BLOCKS, num_kv_heads, BLOCK_SIZE, HEAD_DIM), generator=generator)
        return stored.to(dtype).transpose(1, 2)
    return [(one(), one()) for _ in range(NUM_LAYERS)]


def _hold(dtype: torch.dtype, sources, done) -> None:
    agent = KvTransferAgent("test-prefill", _caches(dtype, seed=1), serves_reads=True)
    sources.put(agent.source)
    done.get()


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16, torch.float8_e4m3fn], ids=str)
def peer(request):
    """A prefill side's cache in another process (its values: _caches(dtype, seed=1)); yields (dtype, its source)."""
    context = mp.get_context("spawn")
    sources, done = context.Queue(), context.Queue()
    holder = context.Process(target=_hold, args=(request.param, sources, done))
    holder.start()
    try:
        yield request.param, sources.get(timeout=60)
    finally:
        done.put(None)
        holder.join(timeout=30)
        if holder.is_alive():
            holder.kill()


def test_a_pull_lands_the_peers_blocks_bit_for_bit(peer):
    dtype, source = peer
    local = _caches(dtype, seed=2)
    agent = KvTransferAgent("test-decode", local, serves_reads=False)
    num_bytes = asyncio.run(agent.pull(source, [5, 2], [0, 7], timeout=10))
    remote = _caches(dtype, seed=1)
    assert num_bytes == 2 * 2 * NUM_LAYERS * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM * dtype.itemsize
    untouched = _caches(dtype, seed=2)
    for (key, value), (remote_key, remote_value), (kept_key, _) in zip(local, remote, untouched):
        for cache, remote_cache in ((key, remote_key), (value, remote_value)):
            assert torch.equal(cache[0].view(torch.uint8), remote_cache[5].view(torch.uint8))
            assert torch.equal(cache[7].view(torch.uint8), remote_cache[2].view(torch.uint8))
        assert torch.equal(key[1:7].view(torch.uint8), kept_key[1:7].view(torch.uint8))


def test_a_cache_of_another_shape_is_refused_naming_the_field(peer):
    dtype, source = peer
    agent = KvTransferAgent("test-decode", _caches(dtype, seed=2, num_kv_heads=1), serves_reads=False)
    with pytest.raises(InvalidArgument) as refused:
        asyncio.run(agent.pull(source, [0], [0], timeout=10))
    assert refused.value.field == "kv_transfer.remote_engine_id"

