import torch

from sluice.worker.runner.cpu_threads import SMALL_STEP_TOKENS, CpuStepThreads

STEP_SIZES = (1, SMALL_STEP_TOKENS, SMALL_STEP_TOKENS + 1, 512, 3)


def _threads_by_step_size(reserved_cores: int, all_threads: int) -> list[int]:
    torch.set_num_threads(all_threads)  # as a worker starts
    threads = CpuStepThreads(reserved_cores)
    seen = []
    for num_tokens in STEP_SIZES:
        threads.set_for(num_tokens)
        seen.append(torch.get_num_threads())
    return seen


def test_a_small_step_leaves_the_reserved_cores_and_a_larger_one_takes_every_core():
    all_threads = torch.get_num_threads()
    try:
        assert _threads_by_step_size(1, 4) == [3, 3, 4, 4, 3]
        assert _threads_by_step_size(0, 4) == [4] * len(STEP_SIZES)
        assert _threads_by_step_size(8, 4) == [1, 1, 4, 4, 1]
    finally:
        torch.set_num_threads(all_threads)
