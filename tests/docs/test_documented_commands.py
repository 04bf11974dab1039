"""Every command in the ```bash blocks of README.md, BENCHMARKS.md and docs/*.md runs as written, checked without a GPU
or a server, one rule per program (any other program fails: give it a rule here):

- `sluice ...`: the real parser (sluice.cli.main.build_parser) accepts every flag and value; a flag must be spelt in
  full (argparse would take a prefix).
- `python SCRIPT.py ...`: the script's own argparse parser accepts the arguments. The script runs in a subprocess, as
  `python SCRIPT.py` runs it (its folder first on sys.path, no PYTHONPATH), and stops at its parse_args. What a
  script's parse_known_args leaves it passes on to `sluice`, so those flags must be flags of a `sluice` command. A
  script that does not parse its arguments with argparse is not run, and must be given no flags.
- `python -m pytest ...`, `pytest ...`: pytest is installed, and the paths named exist.
- `pip install ...`: the extras named (`.[a,b]`, `sluice[a]`) are extras of pyproject.toml.
- a path in the repository (`scripts/bootstrap`, `benchmarks/gpu_suite.sh`): it exists, is executable and passes
  `bash -n`; it is not run (it sets up a machine or needs a GPU).
- `kubectl kustomize DIR`, `kubectl apply -k DIR`: DIR renders with `kubectl kustomize` (skipped without kubectl).
- `docker build ... CONTEXT`: CONTEXT has a Dockerfile that declares every `--build-arg`.
- `grpcurl`, `curl`: they need a running server and are not run; grpcurl's method must exist in the protos and its
  `-d` JSON must parse as the method's request, and curl's `-d` must be JSON.
- `NAME=VALUE` before a command and `export NAME=VALUE` set the environment; PYTHONPATH is refused (`PYTHONPATH=.`
  would put the bare `kernels` folder on sys.path, shadowing Hugging Face's `kernels` package).
`.venv/bin/X` is X installed next to the interpreter that runs these tests.

The flag tables of those files are checked too: under a heading that names a `sluice` command, every flag of the
table is the command's, a default written as code is the parser's default, and every flag of the command is in a
table of the file; any other table whose first column is `flag` names flags that some `sluice` command takes. The
```python blocks compile, and every relative link resolves."""
import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from sluice.cli.main import build_parser

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
_OPERATORS = {"&&", "||", ";", "|", "&"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = field(default=())

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.argv)}"


def fenced_blocks(text: str, language: str) -> list[tuple[int, str]]:
    """(line of the block's first line, the block's text) of every ```language block."""
    blocks, start, lines = [], None, []
    for number, line in enumerate(text.splitlines(), 1):
        if start is None and line.strip() == f"```{language}":
            start, lines = number + 1, []
        elif start is not None and line.strip() == "```":
            blocks.append((start, "\n".join(lines)))
            start = None
        elif start is not None:
            lines.append(line)
    return blocks


def _tokens(text: str) -> list[str] | None:
    """Shell words and operators of `text`, comments dropped; None while a quote is still open."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:
        return None


def block_commands(doc: str, first_line: int, block: str) -> list[Command]:
    """The simple commands of one bash block: lines joined across backslashes and open quotes, split at operators."""
    commands, pending, pending_line, environment = [], "", 0, {}
    for offset, line in enumerate(block.splitlines()):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending_line = pending_line if pending else first_line + offset
        pending += line + "\n"
        tokens = None if line.rstrip().endswith("\\") else _tokens(pending)
        if tokens is None:
            continue
        pending = ""
        simple: list[str] = []
        for token in [*tokens, ";"]:
            if token not in _OPERATORS:
                simple.append(token)
                continue
            if simple and simple[0] == "export":
                environment.update(word.split("=", 1) for word in simple[1:])
            elif simple:
                env = dict(environment)
                while simple and _ASSIGNMENT.match(simple[0]):
                    name, value = simple.pop(0).split("=", 1)
                    env[name] = value
                if simple:
                    commands.append(Command(doc, pending_line, tuple(simple), tuple(sorted(env.items()))))
                else:  # assignments alone set the shell's variables
                    environment = env
            simple = []
    assert not pending, f"{doc}:{pending_line}: a quote or a line continuation is never closed"
    return commands


def documented_commands() -> list[Command]:
    commands = []
    for path in DOCS:
        if path.exists():
            for first_line, block in fenced_blocks(path.read_text(), "bash"):
                commands.extend(block_commands(path.relative_to(ROOT).as_posix(), first_line, block))
    return commands


COMMANDS = documented_commands()


# -- the sluice command

def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((action.choices for action in parser._actions if isinstance(action, argparse._SubParsersAction)), {})


def _without_abbreviations(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.allow_abbrev = False
    for child in _subparsers(parser).values():
        _without_abbreviations(child)
    return parser


@cache
def sluice_parser() -> argparse.ArgumentParser:
    return _without_abbreviations(build_parser())


def sluice_errors(args: list[str]) -> str | None:
    """None when the `sluice` parser accepts args (down to a subcommand's handler), else argparse's message."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parsed = sluice_parser().parse_args(args)
    except SystemExit as exit:
        help_asked = exit.code == 0 and ("-h" in args or "--help" in args)
        return None if help_asked else stderr.getvalue().strip() or f"exit {exit.code}"
    return None if callable(getattr(parsed, "run", None)) else "no subcommand to run"


def subcommand(words: list[str]) -> argparse.ArgumentParser:
    parser = sluice_parser()
    for word in words:
        parser = _subparsers(parser)[word]
    return parser


def options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {option: action for action in parser._actions for option in action.option_strings
            if not isinstance(action, argparse._HelpAction)}


# -- python scripts: parsed by their own parser in one subprocess for all of them

_PARSE_ONLY = r"""
import argparse, contextlib, io, json, os, runpy, sys

class Parsed(BaseException):
    def __init__(self, passed_on=()):
        self.passed_on = list(passed_on)

inside_parse_args = False

def parse_only(self, args=None, namespace=None):
    global inside_parse_args
    self.allow_abbrev, inside_parse_args = False, True
    try:
        parse_args(self, args, namespace)
    finally:
        inside_parse_args = False
    raise Parsed

def parse_known_only(self, args=None, namespace=None):
    self.allow_abbrev = False
    parsed = parse_known_args(self, args, namespace)
    if inside_parse_args:
        return parsed
    raise Parsed(parsed[1])

parse_args, parse_known_args = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
argparse.ArgumentParser.parse_args = parse_only
argparse.ArgumentParser.parse_known_args = parse_known_only
results = []
for script, args in json.loads(sys.argv[1]):
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        results.append({"error": "ran to its end without parsing its arguments"})
    except Parsed as parsed:
        results.append({"error": None, "passed_on": parsed.passed_on})
    except SystemExit as exit:
        help_asked = exit.code == 0 and ("-h" in args or "--help" in args)
        results.append({"error": None if help_asked else stderr.getvalue().strip() or f"exit {exit.code}"})
    except BaseException as error:
        results.append({"error": f"{type(error).__name__}: {error}"})
print(json.dumps(results))
"""


def _parses_its_arguments(script: Path) -> bool:
    return re.search(r"\.parse_(known_)?args\(", script.read_text()) is not None


def script_invocations() -> list[tuple[str, list[str]]]:
    """(script, args) of every documented python command whose script exists and parses its arguments."""
    invocations = []
    for command in COMMANDS:
        args = _python_args(command)
        if args and (ROOT / args[0]).is_file() and _parses_its_arguments(ROOT / args[0]):
            invocations.append((args[0], list(args[1:])))
    return invocations


def parse_in_scripts(invocations: list[tuple[str, list[str]]]) -> dict[tuple[str, tuple[str, ...]], dict]:
    """{"error": argparse's message or None, "passed_on": what parse_known_args left} per (script, args)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", _PARSE_ONLY, json.dumps(invocations)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {(script, tuple(args)): result for (script, args), result in zip(invocations, results)}


_STALE_SCRIPT_CALLS = [("benchmarks/schedule.py", ["--no-such-flag"])]


@pytest.fixture(scope="module")
def script_parses() -> dict[tuple[str, tuple[str, ...]], dict]:
    return parse_in_scripts(script_invocations() + _STALE_SCRIPT_CALLS)


def _python_args(command: Command) -> list[str] | None:
    """The script and its arguments of `python SCRIPT ...`, else None."""
    program, *args = command.argv
    if Path(program).name not in ("python", "python3") or not args or args[0].startswith("-"):
        return None
    return args


# -- the rules

def _program(argv: tuple[str, ...]) -> str:
    """`.venv/bin/X` and a bare X (an installed console script) both name X, which must be installed."""
    program = argv[0]
    if program.startswith(".venv/bin/"):
        program = program.removeprefix(".venv/bin/")
        assert (BIN / program).exists(), f"{argv[0]}: {program} is not installed next to {sys.executable}"
    return program


def check_sluice(command: Command, script_parses) -> None:
    error = sluice_errors(list(command.argv[1:]))
    assert error is None, f"{command}\n{error}"


def check_python(command: Command, script_parses) -> None:
    args = command.argv[1:]
    if args[:2] == ("-m", "pytest"):
        return check_pytest(command, script_parses)
    assert args and not args[0].startswith("-"), f"{command}: no rule for python {args[0] if args else ''}"
    script = ROOT / args[0]
    assert script.is_file(), f"{command}: {args[0]} does not exist"
    if not _parses_its_arguments(script):
        flags = [arg for arg in args[1:] if arg.startswith("-")]
        assert not flags, f"{command}: {args[0]} takes no flags (it does not use argparse), got {flags}"
        return
    parsed = script_parses[(args[0], tuple(args[1:]))]
    assert parsed["error"] is None, f"{command}\n{parsed['error']}"
    sluice_flags = {option for parser in _all_commands(sluice_parser()).values() for option in options(parser)}
    unknown = [arg for arg in parsed.get("passed_on", [])
               if arg.startswith("-") and arg.split("=")[0] not in sluice_flags]
    assert not unknown, f"{command}: {args[0]} passes on {unknown}, which no sluice command takes"


def check_pytest(command: Command, script_parses) -> None:
    assert (BIN / "pytest").exists(), f"{command}: pytest is not installed next to {sys.executable}"
    for arg in command.argv[1:]:
        path = arg.split("::")[0]
        if not arg.startswith("-") and ("/" in path or path.endswith(".py")):
            assert (ROOT / path).exists(), f"{command}: {path} does not exist"


def check_pip(command: Command, script_parses) -> None:
    args = command.argv[1:]
    assert args[:1] in (("install",), ("download",)), f"{command}: no rule for pip {args[:1]}"
    tomllib = pytest.importorskip("tomllib")
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for arg in args[1:]:
        match = re.fullmatch(r"(?:\.|sluice)\[([\w,-]+)\]", arg)
        if match:
            unknown = set(match.group(1).split(",")) - extras
            assert not unknown, f"{command}: no such extras {sorted(unknown)} (pyproject.toml has {sorted(extras)})"


def check_repository_script(command: Command, script_parses) -> None:
    script = ROOT / command.argv[0]
    assert script.is_file(), f"{command}: {command.argv[0]} does not exist"
    assert os.access(script, os.X_OK), f"{command}: {command.argv[0]} is not executable"
    if script.read_text().startswith(("#!/usr/bin/env bash", "#!/bin/bash", "#!/bin/sh")):
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{command}: {done.stderr}"


def check_kubectl(command: Command, script_parses) -> None:
    args = list(command.argv[1:])
    if args[:1] == ["kustomize"]:
        directory = args[1]
    elif args[:1] == ["apply"] and "-k" in args:
        directory = args[args.index("-k") + 1]
    else:
        pytest.fail(f"{command}: no rule for kubectl {args[:1]} (it would need a cluster)")
    assert (ROOT / directory / "kustomization.yaml").is_file(), f"{command}: {directory} is not a kustomization"
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not on the PATH")
    done = subprocess.run(["kubectl", "kustomize", directory], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout, f"{command}: {done.stderr}"


def check_docker(command: Command, script_parses) -> None:
    args = list(command.argv[1:])
    assert args[:1] == ["build"], f"{command}: no rule for docker {args[:1]}"
    build_args, dockerfile, context = [], None, None
    words = iter(args[1:])
    for word in words:
        if word in ("-t", "--tag"):
            next(words)
        elif word == "--build-arg":
            build_args.append(next(words).split("=", 1)[0])
        elif word in ("-f", "--file"):
            dockerfile = next(words)
        elif word.startswith("-"):
            pytest.fail(f"{command}: no rule for docker build {word}")
        else:
            context = word
    assert context is not None, f"{command}: no build context"
    dockerfile = ROOT / (dockerfile or Path(context) / "Dockerfile")
    assert dockerfile.is_file(), f"{command}: {dockerfile} does not exist"
    declared = set(re.findall(r"^ARG\s+(\w+)", dockerfile.read_text(), re.M))
    undeclared = set(build_args) - declared
    assert not undeclared, f"{command}: {dockerfile.name} declares no ARG {sorted(undeclared)}"


_GRPCURL_VALUED = {"-d", "-H", "-rpc-header", "-reflect-header", "-cacert", "-cert", "-key", "-authority",
                   "-servername", "-max-time", "-connect-timeout", "-format", "-import-path", "-proto", "-protoset",
                   "-user-agent", "-max-msg-sz", "-keepalive-time"}


def check_grpcurl(command: Command, script_parses) -> None:
    from google.protobuf import descriptor_pool, json_format, message_factory
    from grpc_health.v1 import health_pb2  # noqa: F401  (registers grpc.health.v1)

    from sluice.v1 import generation_pb2, scheduler_pb2, worker_pb2  # noqa: F401  (register sluice.v1)

    data, positional, words = None, [], iter(command.argv[1:])
    for word in words:
        if word in _GRPCURL_VALUED:
            value = next(words)
            data = value if word == "-d" else data
        elif not word.startswith("-"):
            positional.append(word)
    assert positional, f"{command}: no address"
    if len(positional) < 2 or positional[1] in ("list", "describe"):
        return
    service_name, _, method_name = positional[1].rpartition("/")
    service = descriptor_pool.Default().FindServiceByName(service_name)
    method = service.methods_by_name.get(method_name)
    assert method is not None, f"{command}: {service_name} has no method {method_name}"
    if data is not None and data != "@":
        request = message_factory.GetMessageClass(method.input_type)()
        try:
            json_format.Parse(data, request)
        except json_format.ParseError as error:
            pytest.fail(f"{command}: {error}")


def check_curl(command: Command, script_parses) -> None:
    args = list(command.argv[1:])
    for flag in ("-d", "--data", "--data-raw"):
        if flag in args:
            try:
                json.loads(args[args.index(flag) + 1])
            except json.JSONDecodeError as error:
                pytest.fail(f"{command}: the body is not JSON: {error}")


def check_smg(command: Command, script_parses) -> None:
    """smg's own parser takes the arguments (it exits on one it does not know)."""
    from smg.launch_router import parse_router_args

    args = list(command.argv[1:])
    assert args[:1] == ["launch"], f"{command}: no rule for smg {args[:1]}"
    parse_router_args(args[1:])


RULES = {"sluice": check_sluice, "smg": check_smg, "python": check_python, "python3": check_python, "pytest": check_pytest,
         "pip": check_pip, "kubectl": check_kubectl, "docker": check_docker, "grpcurl": check_grpcurl,
         "curl": check_curl}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: f"{command.doc}:{command.line}:{command.argv[0]}")
def test_documented_command_runs_as_written(command: Command, script_parses):
    assert "PYTHONPATH" not in dict(command.env), \
        f"{command}: PYTHONPATH puts the bare `kernels` folder on sys.path; the editable install needs none"
    program = _program(command.argv)
    if "/" in program:
        return check_repository_script(command, script_parses)
    rule = RULES.get(program)
    assert rule is not None, f"{command}: no rule for {program!r} in {Path(__file__).name}"
    rule(command, script_parses)


def test_the_readme_has_commands():
    readme = [command for command in COMMANDS if command.doc == "README.md"]
    assert len(readme) >= 10, [str(command) for command in readme]


def test_a_stale_command_fails(script_parses):
    assert sluice_errors(["serve", "--no-such-flag"])
    assert sluice_errors(["generate", "hi", "--max-tok", "5"])  # a prefix of --max-tokens
    assert sluice_errors(["serve", "--dtype", "float64"])
    assert sluice_errors(["serve", "--port", "8000"]) is None
    assert "--no-such-flag" in script_parses[("benchmarks/schedule.py", ("--no-such-flag",))]["error"]


def test_blocks_split_into_commands():
    block = ("# a comment\nFOO=1 .venv/bin/sluice serve \\\n  --port 1  # a note\n"
             "grpcurl -d '{\"a\":\n 1}' x s/M && export BAR=2; BAZ=3\nsluice worker\n")
    commands = block_commands("doc.md", 10, block)
    assert [(c.line, c.argv, dict(c.env)) for c in commands] == [
        (11, (".venv/bin/sluice", "serve", "--port", "1"), {"FOO": "1"}),
        (13, ("grpcurl", "-d", '{"a":\n 1}', "x", "s/M"), {}),
        (15, ("sluice", "worker"), {"BAR": "2", "BAZ": "3"}),
    ]


# -- python blocks

PYTHON_BLOCKS = [(path.relative_to(ROOT).as_posix(), line, block) for path in DOCS if path.exists()
                 for line, block in fenced_blocks(path.read_text(), "python")]


@pytest.mark.parametrize("doc, line, block", PYTHON_BLOCKS, ids=[f"{doc}:{line}" for doc, line, _ in PYTHON_BLOCKS])
def test_documented_python_compiles(doc: str, line: int, block: str):
    compile(block, f"{doc}:{line}", "exec")


# -- flag tables

@dataclass
class FlagTable:
    doc: str
    line: int
    command: list[str] | None  # the `sluice` command its heading names
    rows: list[tuple[list[str], str | None]]  # (flags of the first cell, the default cell)


_HEADING = re.compile(r"^#{1,6} ")
_SLUICE_IN_HEADING = re.compile(r"`sluice ([a-z][a-z -]*)`")
_CODE = re.compile(r"`([^`]*)`")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def flag_tables(doc: str, text: str) -> list[FlagTable]:
    tables, command, lines = [], None, text.splitlines()
    in_block, number = False, 0
    while number < len(lines):
        line = lines[number]
        in_block = in_block != line.startswith("```")
        if not in_block and _HEADING.match(line):
            match = _SLUICE_IN_HEADING.search(line)
            command = match.group(1).split() if match else None
        if not in_block and line.startswith("|") and number + 1 < len(lines) and lines[number + 1].startswith("|"):
            header = [cell.lower() for cell in _cells(line)]
            start, number = number, number + 2
            rows = []
            while number < len(lines) and lines[number].startswith("|"):
                cells = _cells(lines[number])
                flags = [code.split()[0] for code in _CODE.findall(cells[0]) if code.startswith("-")]
                default = cells[header.index("default")] if "default" in header else None
                rows.append((flags, default))
                number += 1
            if header[0].startswith("flag"):
                tables.append(FlagTable(doc, start + 1, command, rows))
            continue
        number += 1
    return tables


def _all_commands(parser: argparse.ArgumentParser, words=()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    found = {words: parser}
    for name, child in _subparsers(parser).items():
        found |= _all_commands(child, (*words, name))
    return found


def _default_matches(written: str, default) -> bool:
    if written == str(default):
        return True
    try:
        return float(written) == float(default)
    except (TypeError, ValueError):
        return False


TABLES = [table for path in DOCS if path.exists()
          for table in flag_tables(path.relative_to(ROOT).as_posix(), path.read_text())]


@pytest.mark.parametrize("table", TABLES, ids=[f"{table.doc}:{table.line}" for table in TABLES])
def test_flag_table_matches_the_parser(table: FlagTable):
    candidates = [subcommand(table.command)] if table.command else list(_all_commands(sluice_parser()).values())
    for flags, default_cell in table.rows:
        assert flags, f"{table.doc}:{table.line}: a row names no flag"
        for flag in flags:
            owners = [parser for parser in candidates if flag in options(parser)]
            assert owners, f"{table.doc}:{table.line}: no sluice command {' '.join(table.command or [])} takes {flag}"
        written = _CODE.match(default_cell or "")
        if written:
            defaults = [options(parser)[flags[0]].default for parser in candidates if flags[0] in options(parser)]
            assert any(_default_matches(written.group(1), default) for default in defaults), \
                f"{table.doc}:{table.line}: {flags[0]} defaults to {defaults}, not {written.group(1)}"


@pytest.mark.parametrize("table", [table for table in TABLES if table.command],
                         ids=[f"{table.doc}:{table.line}" for table in TABLES if table.command])
def test_command_flag_table_is_complete(table: FlagTable):
    parser = subcommand(table.command)
    documented = {flag for flags, _ in table.rows for flag in flags}
    for other in TABLES:  # a flag of another command's table in the same file, which this command takes too
        if other.doc == table.doc and other.command and other.command != table.command:
            documented |= {flag for flags, _ in other.rows for flag in flags}
    missing = {action.option_strings[-1] for option, action in options(parser).items()
               if not documented & set(action.option_strings)}
    assert not missing, f"{table.doc}:{table.line}: sluice {' '.join(table.command)} takes {sorted(missing)} too"


# -- links

_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", [path for path in DOCS if path.exists()], ids=lambda path: path.name)
def test_relative_links_resolve(path: Path):
    targets = [target for target in _LINK.findall(path.read_text()) if "://" not in target]
    missing = [target for target in targets if not (path.parent / target).exists()]
    assert not missing, f"{path.relative_to(ROOT)} links to {missing}"
