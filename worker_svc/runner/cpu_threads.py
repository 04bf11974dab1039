"""The threads a step runs on the CPU. A step of a few tokens takes a few milliseconds a layer stack, about what the
services spend on it (the worker's RPCs, and the router's and scheduler's work where they share the machine), and
threads spinning at its barriers take the cores those need: such a step leaves `reserved_cores` of them free. A larger
step is the work that matters, and runs on every core."""
import torch

SMALL_STEP_TOKENS = 8


class CpuStepThreads:
    def __init__(self, reserved_cores: int):
        self.all_threads = torch.get_num_threads()  # the cores torch found, or OMP_NUM_THREADS
        self.small_step_threads = max(1, self.all_threads - reserved_cores)
        self._threads = 0  # set by the first step, on the thread that runs the steps

    def set_for(self, num_tokens: int) -> None:
        threads = self.small_step_threads if num_tokens <= SMALL_STEP_TOKENS else self.all_threads
        if threads != self._threads:
            torch.set_num_threads(threads)
            self._threads = threads
