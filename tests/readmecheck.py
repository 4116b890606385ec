"""The README's marked examples, run for real and compared with what the README shows.

A fenced block is checked when the line before its opening fence is ``<!-- checked: MODE -->``; unmarked
blocks are ignored. Inside, each ``$ COMMAND`` line is run and the lines up to the next ``$`` line are its
expected output. MODE:

- ``exact``: the output is exactly those lines (stdout and stderr may interleave in any order).
- ``shape``: every line is in the real output (in any order; the output may have more lines), with every
  number (``12``, ``3.5``, ``0x1f``) matching any number and runs of spaces any run of spaces: a renamed
  column, key or message fails, changed figures do not. Blank lines are ignored.

How a command runs: ``sudo`` is dropped (the tests run as root); a command ending in ``# not root`` runs
as user nobody; other trailing ``# comments`` are dropped; the rest runs under ``sh -c`` in a fresh
directory holding ``workloads`` (the repository's), ``optrace.data`` (the synthetic record of
tests/report/conftest.py: 1000 samples of known counts) and, for blocks that name it, ``real.data`` (a
real recording: ``record -F 999 -- workloads/build/demo 3``, the suite's shared ``demo_record``), with the
venv's ``optrace`` first on PATH. The repository's path in the output reads as ``/work/main``.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click

MARKER = re.compile(r"^<!--\s*checked:\s*(exact|shape)\s*-->\s*$")
NUMBER = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?")
NUMBER_PATTERN = r"(?:0x[0-9a-fA-F]+|\d+(?:\.\d+)?)"
NOT_ROOT = re.compile(r"\s+#\s*not root\s*$")
COMMENT = re.compile(r"\s+#\s.*$")


@dataclass(frozen=True)
class Example:
    command: str  # as written after "$ "
    expected: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    line: int  # of the marker, 1-based
    mode: str
    examples: tuple[Example, ...]

    @property
    def needs_recording(self) -> bool:
        return any("real.data" in e.command or e.command.startswith("sudo ") for e in self.examples)


def checked_blocks(text: str) -> list[Block]:
    lines = text.splitlines()
    blocks = []
    for index, line in enumerate(lines):
        match = MARKER.match(line)
        if not match or index + 1 >= len(lines) or not lines[index + 1].startswith("```"):
            continue
        end = next(i for i in range(index + 2, len(lines)) if lines[i].startswith("```"))
        blocks.append(Block(index + 1, match.group(1), _examples(lines[index + 2:end])))
    return blocks


def _examples(body: list[str]) -> tuple[Example, ...]:
    examples: list[Example] = []
    for line in body:
        if line.startswith("$ "):
            examples.append(Example(line[2:], ()))
        elif examples:
            examples[-1] = Example(examples[-1].command, (*examples[-1].expected, line))
    return tuple(examples)


def shell_command(command: str) -> tuple[str, bool]:
    """The command to run under sh -c, and whether it runs as nobody."""
    as_nobody = bool(NOT_ROOT.search(command))
    command = COMMENT.sub("", NOT_ROOT.sub("", command))
    return command.removeprefix("sudo "), as_nobody


def normalize(output: str, repo: Path, workdir: Path) -> list[str]:
    text = output.replace(str(workdir) + "/", "").replace(str(repo), "/work/main")
    return [line.rstrip() for line in text.splitlines()]


def shape_pattern(expected: str) -> re.Pattern[str]:
    parts = []
    for piece in re.split(r"(\s+)", expected.rstrip()):
        if piece.isspace():
            parts.append(r"\s+")
        else:
            at = 0
            for number in NUMBER.finditer(piece):
                parts.append(re.escape(piece[at:number.start()]) + NUMBER_PATTERN)
                at = number.end()
            parts.append(re.escape(piece[at:]))
    return re.compile("".join(parts))


def mismatch(mode: str, expected: tuple[str, ...], stdout: list[str], stderr: list[str]) -> str | None:
    """None when the output fits the block, else what does not."""
    if mode == "exact":
        return _interleaving_mismatch([line.rstrip() for line in expected], stdout, stderr)
    unused = stdout + stderr
    for line in filter(str.strip, expected):  # blank lines only separate examples
        pattern = shape_pattern(line)
        found = next((i for i, actual in enumerate(unused) if pattern.fullmatch(actual)), None)
        if found is None:
            return f"no line of the real output has the shape of {line!r}"
        del unused[found]
    return None


def _interleaving_mismatch(expected: list[str], stdout: list[str], stderr: list[str]) -> str | None:
    out = err = 0
    for line in expected:
        if out < len(stdout) and stdout[out] == line:
            out += 1
        elif err < len(stderr) and stderr[err] == line:
            err += 1
        else:
            return f"expected {line!r}, the real output has {(stdout[out:out + 1] + stderr[err:err + 1])!r}"
    if out < len(stdout) or err < len(stderr):
        return f"the real output has more lines: {(stdout[out:] + stderr[err:])[:3]!r}"
    return None


# What the README and the docs show of the CLI: every `optrace ...` command line (in a fenced block, after
# `$ ` or not, or in an inline code span), checked against click's own command objects.
INLINE_CODE = re.compile(r"`([^`\n]+)`")
INVOCATION = re.compile(r"^(?:\$\s+)?(?:sudo\s+)?(?:\S*/)?optrace\s+(?P<rest>[a-z].*)$")
SUBSTITUTION = re.compile(r"\$\([^)]*\)")
SHELL_STOPS = {"|", "||", "&", "&&", ";", ">", ">>", "<", "2>&1"}


def invocations(text: str) -> list[tuple[str, list[str]]]:
    """(the line as shown, optrace's arguments) of every optrace command line in a markdown text."""
    found = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        candidates = [line] if fenced else INLINE_CODE.findall(line)
        for candidate in candidates:
            match = INVOCATION.match(candidate.strip())
            if match:
                found.append((candidate.strip(), _arguments(match.group("rest"))))
    return found


def _arguments(rest: str) -> list[str]:
    lexer = shlex.shlex(SUBSTITUTION.sub("1", rest), posix=True, punctuation_chars="|&;<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    arguments = []
    for token in lexer:
        if token in SHELL_STOPS or token.startswith(("|", "&", ";", ">", "<")):
            break
        arguments.append(token)
    return arguments


def cli_problem(group: click.Group, arguments: list[str]) -> str | None:
    """None when ``optrace ARGUMENTS`` names commands and options the CLI has, else what it lacks."""
    command: click.Command = group
    ctx = click.Context(group, info_name="optrace")
    rest = list(arguments)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(ctx, rest[0])
        if sub is None:
            return f"no command {rest[0]!r} in {ctx.command_path}"
        ctx, command, rest = click.Context(sub, info_name=rest[0], parent=ctx), sub, rest[1:]
    options = {name: param for param in command.get_params(ctx) if isinstance(param, click.Option)
               for name in (*param.opts, *param.secondary_opts)}
    takes_value = False
    for token in rest:
        if token == "--":
            break
        if takes_value:
            takes_value = False
            continue
        if not token.startswith("-") or token == "-":
            continue
        name = token.split("=", 1)[0]
        if name not in options:
            return f"{ctx.command_path} has no option {name}"
        option = options[name]
        takes_value = "=" not in token and not option.is_flag and not option.count
    return None
