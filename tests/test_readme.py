"""Every README code block runs, so the README cannot drift from the code.

The blocks run in order in one temporary directory, as a reader following the README
would run them (a later block may use what an earlier one made). Comment lines right
before a block (blank lines between are fine) steer the test:

    <!-- readme-test: skip (needs network) -->            not run; the reason is required
    <!-- readme-test: replace "--steps 80" "--steps 2" --> tiny settings; the text must occur
    <!-- readme-test: setup "python make_fixture.py" -->   a shell command run first
    <!-- readme-test: append 'print("checked")' -->        code run after the block

`bash`/`sh`/`console` blocks run under `bash -euo pipefail`, `python` blocks with this
interpreter, `toml` blocks are parsed; other languages are shown, not run. Blocks run in
a reader's checkout: the repository's `scripts/` and `tests/` (its reference data in
`tests/data`) beside them.
"""
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import toml_files

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\s*$")
DIRECTIVE = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
RUN_LANGUAGES = {"bash", "sh", "console", "python", "toml"}


@dataclass
class Block:
    line: int
    language: str
    code: str
    skip: str | None = None
    replacements: list = field(default_factory=list)
    appended: list = field(default_factory=list)
    setup: list = field(default_factory=list)
    source: str = "README.md"   # the file the block is in (tests/test_docs.py reads docs/)

    @property
    def name(self):
        return f"{self.source}:{self.line} ({self.language or 'text'})"


def parse_directives(block, directives):
    for text in directives:
        if text.startswith("skip"):
            reason = text[len("skip"):].strip()
            if not reason:
                raise ValueError(f"{block.name}: 'skip' needs a reason in parentheses")
            block.skip = reason.strip("() ")
            continue
        words = shlex.split(text)
        if words[0] == "replace" and len(words) == 3:
            block.replacements.append((words[1], words[2]))
        elif words[0] == "setup" and len(words) == 2:
            block.setup.append(words[1])
        elif words[0] == "append" and len(words) == 2:
            block.appended.append(words[1])
        else:
            raise ValueError(f"{block.name}: unknown readme-test directive {text!r}")


def readme_blocks(text, source="README.md"):
    """Fenced blocks with the directives written in the comment lines just before them."""
    blocks, directives, lines = [], [], text.splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match is None:
            directive = DIRECTIVE.match(lines[i])
            if directive:
                directives.append(directive.group(1))
            elif lines[i].strip():
                directives = []
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        block = Block(i + 1, match.group(1).lower(), "\n".join(lines[i + 1:end]) + "\n",
                      source=source)
        parse_directives(block, directives)
        blocks.append(block)
        directives = []
        i = end + 1
    return blocks


def apply_replacements(block):
    code = block.code
    for old, new in block.replacements:
        assert old in code, f"{block.name}: readme-test replace: {old!r} is not in the block"
        code = code.replace(old, new)
    return code + "".join(line + "\n" for line in block.appended)


def test_parser_reads_directives_and_blocks():
    text = ("intro\n<!-- readme-test: skip (needs network) -->\n\n```bash\ncurl x\n```\n"
            "<!-- readme-test: replace \"--steps 80\" \"--steps 2\" -->\n"
            "<!-- readme-test: setup \"touch a\" -->\n```python\nprint(1)  # --steps 80\n```\n"
            "<!-- readme-test: skip (x) -->\nprose in between cancels it\n```toml\na = 1\n```\n")
    first, second, third = readme_blocks(text)
    assert (first.language, first.skip, first.code) == ("bash", "needs network", "curl x\n")
    assert second.replacements == [("--steps 80", "--steps 2")] and second.setup == ["touch a"]
    assert apply_replacements(second) == "print(1)  # --steps 2\n"
    assert third.skip is None and third.language == "toml"
    with pytest.raises(ValueError, match="needs a reason"):
        readme_blocks("<!-- readme-test: skip -->\n```bash\nx\n```\n")
    with pytest.raises(ValueError, match="unknown"):
        readme_blocks("<!-- readme-test: frobnicate -->\n```bash\nx\n```\n")


def reader_environment(tmp_path):
    """PATH with `python`/`python3` running this interpreter (whatever else is on PATH, and
    whether or not its virtual environment is activated), PYTHONPATH at this checkout."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("python", "python3"):
        # a wrapper, not a symlink: a symlink to a virtual environment's python starts the
        # base interpreter, without the environment's packages
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        wrapper.chmod(0o755)
    env = dict(os.environ)
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg",
               PYTHONWARNINGS="ignore")
    return env


def run_block(block, cwd, env):
    code = apply_replacements(block)
    for command in block.setup:
        subprocess.run(["bash", "-euo", "pipefail", "-c", command], cwd=cwd, env=env,
                       check=True, timeout=300)
    if block.language == "toml":
        toml_files.loads(code)
        return
    if block.language == "python":
        argv = [sys.executable, "-c", code]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{block.name} failed (exit {done.returncode})\n--- code ---\n{code}"
        f"--- stdout ---\n{done.stdout[-3000:]}\n--- stderr ---\n{done.stderr[-3000:]}")


README_BLOCKS = readme_blocks((REPO / "README.md").read_text())


@pytest.mark.parametrize("block", [b for b in README_BLOCKS
                                   if b.language in RUN_LANGUAGES and b.skip is not None],
                         ids=lambda b: b.name)
def test_readme_block_not_run(block):
    """Every block the README test does not run shows up as a skip with its reason."""
    pytest.skip(f"{block.name} not run: {block.skip}")


def test_no_readme_block_needs_data_beside_the_clone():
    """A reader's clone has no ../shared: reference data ships in tests/data."""
    assert [b.name for b in README_BLOCKS if "../shared" in b.code] == []


@pytest.mark.slow
def test_readme_code_blocks_run(tmp_path):
    blocks = readme_blocks((REPO / "README.md").read_text())
    runnable = [b for b in blocks if b.language in RUN_LANGUAGES and b.skip is None]
    assert runnable, "no README block runs: did the fence or directive syntax change?"
    # The reader's checkout: the repository's scripts and tests (with tests/data).
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    for folder in ("scripts", "tests"):
        (cwd / folder).symlink_to(REPO / folder)
    env = reader_environment(tmp_path)
    for block in runnable:
        run_block(block, cwd, env)
