"""The compiled variants of Triton kernels that code launches, as Triton's cache tells them apart: the kernel, its
compile-time constants and launch options, and each other argument's type and specialization (an integer of 1 or a
multiple of 16, an aligned pointer). Recorded through the interpreter, so on any machine."""
import contextlib
import inspect

import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.runtime.interpreter import InterpretedFunction

LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas")


def compiled_variant(kernel: InterpretedFunction, args: tuple, kwargs: dict) -> tuple:
    parameters = inspect.signature(kernel.fn).parameters
    unspecialized = kernel.kwargs["do_not_specialize"] or ()
    unaligned = kernel.kwargs["do_not_specialize_on_alignment"] or ()
    bound = dict(zip(kernel.arg_names, args)) | kwargs
    variant = []
    for name, value in bound.items():
        if name in LAUNCH_OPTIONS or parameters[name].annotation in (tl.constexpr, "tl.constexpr"):
            variant.append((name, value))
        else:
            variant.append((name, native_specialize_impl(BaseBackend, value, False, name not in unspecialized,
                                                         name not in unaligned)))
    return kernel.__name__, tuple(sorted(variant))


@contextlib.contextmanager
def recorded_launches(monkeypatch):
    """Yields the set that every interpreted kernel launch inside the block adds its compiled variant to."""
    launched = set()
    run = InterpretedFunction.run

    def recording_run(kernel, *args, grid, warmup, **kwargs):
        launched.add(compiled_variant(kernel, args, kwargs))
        return run(kernel, *args, grid=grid, warmup=warmup, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(InterpretedFunction, "run", recording_run)
        yield launched
