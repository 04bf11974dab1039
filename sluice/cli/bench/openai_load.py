"""The same load through an OpenAI-compatible gateway (smg in front of the router): streamed /v1/completions with
the workload's prompts as text (smg takes no token ids), sent with the `openai` client."""
import time

from sluice.cli.bench.arrivals import drive
from sluice.cli.bench.report import RequestTrace
from sluice.cli.bench.workload import BenchRequest


async def run_openai_load(base_url: str, model: str, requests: list[BenchRequest], rate: float | None = None,
                          concurrency: int | None = None, seed: int = 0,
                          progress=None) -> tuple[list[RequestTrace], float]:
    """Each streamed chunk but the closing one counts as one token: the gateway sends one per token (the total is
    checked against the usage the gateway reports)."""
    import openai

    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0,
                                  timeout=None) as client:
        async def send(request: BenchRequest, trace: RequestTrace) -> None:
            params = request.sampling_params()
            stream = await client.completions.create(
                model=model, prompt=request.prompt_text, max_tokens=params.max_tokens, stream=True,
                temperature=params.temperature, extra_body={"ignore_eos": params.ignore_eos},
                stream_options={"include_usage": True})
            async for chunk in stream:
                if chunk.choices and (chunk.choices[0].text or chunk.choices[0].finish_reason is None):
                    trace.token_times.append(time.perf_counter())  # not the closing chunk that only ends it
                elif chunk.usage is not None and chunk.usage.completion_tokens != len(trace.token_times):
                    raise RuntimeError(f"{len(trace.token_times)} chunks for {chunk.usage.completion_tokens} tokens")

        return await drive(send, requests, rate, concurrency, seed, progress)
