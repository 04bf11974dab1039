"""Relays a scheduler's prefix-cache event stream to a gateway's subscription, until the router stops."""
import asyncio
from collections.abc import AsyncIterator

import grpc


async def relay_kv_events(call, stopping: asyncio.Event) -> AsyncIterator:
    """The batches of `call` (a SubscribeKvEvents stream), ending when it does or when `stopping` is set; a
    scheduler's error is raised as its grpc.aio.AioRpcError."""
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        while True:
            read = asyncio.ensure_future(call.read())
            await asyncio.wait([read, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not read.done():
                read.cancel()
                return
            batch = read.result()
            if batch is grpc.aio.EOF:
                return
            yield batch
    finally:
        stopped.cancel()
        call.cancel()
