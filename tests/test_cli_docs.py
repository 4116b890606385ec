"""Man pages and shell completion are generated from the CLI itself (scripts/cli_docs.py, run and installed
by `make setup`): every command has a page naming all its options, with EXAMPLES the CLI accepts, and bash
completes commands and options."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from support import REPO

sys.path.insert(0, str(REPO / "scripts"))
import cli_docs  # noqa: E402
import readmecheck  # noqa: E402

from optrace.frontend.cli import cli  # noqa: E402

COMMAND_PATHS = [path for path, _, _ in cli_docs.walk(cli, ("optrace",))]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli")
    cli_docs.main(str(out))
    return out


def test_every_command_has_a_page_naming_all_its_options(generated):
    assert {"optrace-record", "optrace-report", "optrace-count", "optrace-jit-show"} <= {"-".join(p) for p in COMMAND_PATHS}
    for path, command, ctx in cli_docs.walk(cli, ("optrace",)):
        page = generated / "man" / f"{'-'.join(path)}.1"
        rendered = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True,
                                  env={**os.environ, "MANWIDTH": "200"}, check=True)
        assert rendered.stderr == "", rendered.stderr
        text = rendered.stdout.replace("\u2010", "-")  # man may hyphenate with U+2010
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden:
                for name in param.opts:
                    assert name in text, f"{page.name} lacks {name}"


def test_every_page_has_examples_the_cli_accepts(generated):
    for path, command, ctx in cli_docs.walk(cli, ("optrace",)):
        page = generated / "man" / f"{'-'.join(path)}.1"
        rendered = subprocess.run(["man", "-l", str(page)], capture_output=True, text=True,
                                  env={**os.environ, "MANWIDTH": "200"}, check=True).stdout
        assert "\nEXAMPLES\n" in rendered, f"{page.name} has no EXAMPLES"
        for example, _ in cli_docs.EXAMPLES[path]:
            [(_, arguments)] = readmecheck.invocations(f"`{example}`")
            assert readmecheck.cli_problem(cli, arguments) is None, (page.name, example)
            assert arguments[:len(path) - 1] == list(path[1:]), f"{page.name}: {example} is another command's"


def _bash_complete(script: Path, *words: str) -> list[str]:
    """What bash offers after `words` (the last one being completed), with the generated script."""
    code = (f"source {script}; COMP_WORDS=({' '.join(words)}); COMP_CWORD={len(words) - 1}; "
            "_optrace_completion optrace; printf '%s\\n' \"${COMPREPLY[@]}\"")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()


@pytest.mark.parametrize("words, expected", [
    (("optrace", "rep"), ["report"]),
    (("optrace", "report", "--so"), ["--sort"]),
    (("optrace", "count", "--cum"), ["--cumulative"]),
    (("optrace", "jit", "s"), ["show"]),
])
def test_bash_completes_commands_and_options(generated, words, expected):
    assert _bash_complete(generated / "completion" / "optrace", *words) == expected


@pytest.mark.root
def test_make_setup_installed_them():
    """`make setup` (root) put the pages where man finds them and the completions where shells load them."""
    for path in COMMAND_PATHS:
        found = subprocess.run(["man", "-w", "-".join(path)], capture_output=True, text=True)
        assert found.returncode == 0, f"{'-'.join(path)}: {found.stderr}"
    for installed in ("/usr/share/bash-completion/completions/optrace", "/usr/local/share/zsh/site-functions/_optrace",
                      "/usr/share/fish/vendor_completions.d/optrace.fish"):
        assert "_OPTRACE_COMPLETE" in Path(installed).read_text()
