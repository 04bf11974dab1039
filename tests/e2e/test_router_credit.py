"""Step updates to a router that grants credit: the real scheduler holds them back while the router has none left,
then sends what waited as one merged message. Checked against Hugging Face greedy output."""
import queue
import time

import grpc
import pytest

from sluice.v1 import generation_pb2, scheduler_pb2, scheduler_pb2_grpc

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def prompt_and_expected(hf_greedy_of, hf_tokenizer):
    prompt = hf_tokenizer("The three laws of motion are").input_ids
    return prompt, hf_greedy_of(prompt, MAX_TOKENS)


def _submit(request_id: str, prompt: list[int]) -> scheduler_pb2.RouterMessage:
    sampling = generation_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
    return scheduler_pb2.RouterMessage(submit=scheduler_pb2.Submit(request_id=request_id, prompt_token_ids=prompt,
                                                                   sampling=sampling))


def _credit(messages: int) -> scheduler_pb2.RouterMessage:
    return scheduler_pb2.RouterMessage(credit=scheduler_pb2.Credit(messages=messages))


def _wait_until_idle(services, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while (load := services.load()).num_running or load.num_waiting:
        assert time.monotonic() < deadline, "the request did not finish"
        time.sleep(0.05)


def test_updates_wait_for_credit_and_arrive_merged(services, prompt_and_expected):
    prompt, expected = prompt_and_expected
    outgoing = queue.Queue()
    outgoing.put(_credit(1))
    outgoing.put(_submit("credited", prompt))
    with grpc.insecure_channel(services.layout.scheduler_address) as channel:
        updates = scheduler_pb2_grpc.SchedulerStub(channel).Connect(iter(outgoing.get, None))
        first = next(updates).step
        _wait_until_idle(services)  # every step ran while this router had no credit
        outgoing.put(_credit(1))
        rest = next(updates).step
        outgoing.put(None)
    assert list(first.token_ids) == expected[:1]
    assert list(rest.request_ids) == ["credited"] * (len(expected) - 1)  # one entry per step, in one message
    assert list(rest.token_ids) == expected[1:]
    assert [finished.request_id for finished in rest.finished] == ["credited"]


def test_without_credit_every_step_is_its_own_message(services, prompt_and_expected):
    prompt, expected = prompt_and_expected
    outgoing = queue.Queue()
    outgoing.put(_submit("uncredited", prompt))
    steps = []
    with grpc.insecure_channel(services.layout.scheduler_address) as channel:
        for message in scheduler_pb2_grpc.SchedulerStub(channel).Connect(iter(outgoing.get, None)):
            steps.append(message.step)
            if message.step.finished:
                break
        outgoing.put(None)
    assert [list(step.token_ids) for step in steps] == [[token] for token in expected]
