"""The command lines of Sluice's child Python processes. -P keeps the working folder off their sys.path: in a source
checkout it holds router/ and kernels/, which would shadow the installed packages (and Hugging Face's `kernels`)."""
import sys


def python_command(*args: str) -> list[str]:
    return [sys.executable, "-P", *args]


def sluice_command(*args: str) -> list[str]:
    return python_command("-m", "sluice.cli", *args)


def sluice_subcommand(command: list[str]) -> str:
    """The `sluice` subcommand that a sluice_command line runs ("worker", "router", ...)."""
    return command[command.index("sluice.cli") + 1]
