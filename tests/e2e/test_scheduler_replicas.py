"""One router balancing over two scheduler replicas (each with its own worker)."""
import signal
import time
from concurrent.futures import ThreadPoolExecutor

from sluice.client import SluiceClient, text_request
from tests.e2e.services import extra_router, running_services

PROMPTS = [f"Write a long story about a {animal}." for animal in ("cat", "dog", "owl", "fox", "eel", "yak", "emu",
                                                                   "ant")]


MAX_TOKENS = 24


def _long(prompt: str):
    return text_request(prompt, max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def test_requests_spread_over_replicas_and_survive_losing_one(default_model_dir, services):
    with running_services(default_model_dir) as a:
        b = services
        schedulers = f"{a.layout.scheduler_address},{b.layout.scheduler_address}"
        with extra_router(a, default_model_dir, schedulers=schedulers) as (_, address), SluiceClient(address) as client:
            with ThreadPoolExecutor(len(PROMPTS)) as pool:
                results = [pool.submit(client.generate, _long(p)) for p in PROMPTS]
                busy = set()
                while not all(r.done() for r in results):
                    busy |= {name for name, s in (("a", a), ("b", b)) if s.load().num_running > 0}
                    time.sleep(0.02)
            assert busy == {"a", "b"}
            assert all(len(r.result().token_ids) == MAX_TOKENS for r in results)

            repeated = "You are a careful assistant. " * 12 + "Name a prime number."
            client.generate(text_request(repeated, max_tokens=2, temperature=0.0))
            again = client.generate(text_request(repeated, max_tokens=2, temperature=0.0))
            assert again.usage["cached_tokens"] > 0  # the same prefix went to the same replica's prefix cache

            a.processes[1].send_signal(signal.SIGKILL)
            a.processes[1].wait()
            time.sleep(1.0)  # the router sees the broken stream at once on loopback
            survivors = [client.generate(_long(p)) for p in PROMPTS[:2]]
            assert all(len(s.token_ids) == MAX_TOKENS for s in survivors)
