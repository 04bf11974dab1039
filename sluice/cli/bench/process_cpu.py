"""CPU use of each process of a gRPC run while it is timed: shows which process, and which of its threads, limits the
stack. A thread near 1.0 core is saturated (on a GPU the worker's event loop polls while a step runs, so there it
always is)."""
import psutil


class ProcessCpu:
    def __init__(self, pids: dict[str, int]):
        """pids: a name for each process to watch (the services, the load client)."""
        self._processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._start = {name: (_process_seconds(process), _thread_seconds(process))
                       for name, process in self._processes.items()}

    def busy_cores(self, wall_seconds: float) -> dict[str, dict[str, float]]:
        """Per process since construction: the cores it kept busy in all (threads that ended included), and its
        busiest live thread's."""
        report = {}
        for name, process in self._processes.items():
            start_seconds, start_threads = self._start[name]
            spent = {thread: seconds - start_threads.get(thread, 0.0)
                     for thread, seconds in _thread_seconds(process).items()}
            report[name] = {"cores": (_process_seconds(process) - start_seconds) / wall_seconds,
                            "busiest_thread_cores": max(spent.values(), default=0.0) / wall_seconds}
        return report


def format_busy_cores(report: dict[str, dict[str, float]]) -> str:
    return "CPU while timed (cores; busiest thread): " + ", ".join(
        f"{name} {cpu['cores']:.2f} ({cpu['busiest_thread_cores']:.2f})" for name, cpu in report.items())


def _process_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _thread_seconds(process: psutil.Process) -> dict[int, float]:
    return {thread.id: thread.user_time + thread.system_time for thread in process.threads()}
