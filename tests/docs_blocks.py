"""The fenced code blocks of the README and the user guide (docs/), for the tests that run them.

A block is named by its page, the heading it sits under and its index among that heading's blocks, so a test can
read exactly the block it runs; ``tests/test_docs.py`` checks that every block is claimed by a test.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # "README.md" or "docs/<name>.md"
    section: str  # the nearest heading above, without its #s
    index: int  # among the blocks of that section
    lang: str
    text: str

    @property
    def key(self) -> tuple[str, str, int]:
        return self.page, self.section, self.index


@dataclasses.dataclass(frozen=True)
class Command:
    env: dict[str, str]  # VAR=value assignments before the command
    argv: list[str]  # popjax's arguments (without "popjax")
    comment: str  # the text after "  #", if any


def guide_pages() -> list[str]:
    """The pages of the guide, in the order of mkdocs.yml's nav."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def walk(nav):
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from (walk(value) if isinstance(value, list) else [f"docs/{value}"])

    return list(walk(config["nav"]))


def blocks(page: str) -> list[Block]:
    found, section, counts, lang, lines = [], "", {}, None, []
    for line in (ROOT / page).read_text().splitlines():
        fence = FENCE.match(line)
        if lang is None and fence:
            lang, lines = fence.group(1), []
        elif lang is not None and line.strip() == "```":
            index = counts.get(section, 0)
            counts[section] = index + 1
            found.append(Block(page, section, index, lang, "\n".join(lines) + "\n"))
            lang = None
        elif lang is not None:
            lines.append(line)
        elif line.startswith("#"):
            section = line.lstrip("#").strip()
    assert lang is None, f"{page}: a code block is not closed"
    return found


def block(page: str, section: str, index: int = 0) -> Block:
    matches = [b for b in blocks(page) if b.section == section and b.index == index]
    assert matches, f"{page} has no block {index} under '{section}'"
    return matches[0]


def commands(block: Block, program: str = "popjax") -> list[Command]:
    """The block's ``popjax`` command lines (continuations joined, leading VAR=value assignments apart)."""
    joined = block.text.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        code, _, comment = line.partition("  #")
        words = shlex.split(code.removeprefix("$ "))  # a shell prompt before a command
        env = {}
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if words and words[0] == program:
            found.append(Command(env, words[1:], comment.strip()))
    return found


# The documented tiny variant: what the tests append to the guide's commands so they run in seconds (a flag given
# twice takes the last value); everything else is the guide's.
TINY_TRAIN = ["--steps", "300", "--warmup", "100", "--rollout-len", "20", "--eval-interval", "300",
              "--eval-episodes", "1", "--batch-size", "16", "--buffer-size", "1000",
              "--learner-config", "hidden=[8, 8]", "--no-progress"]
# --allow-busy: the test may run beside others (the result is stamped busy instead of refused).
TINY_BENCH = ["--hidden", "8,8", "--batch-size", "8", "--k", "2", "--repeats", "10", "--min-time", "0",
              "--impl", "vmap,vmap_scan,jax_seq", "--allow-busy", "--out", "bench"]
TINY_OPTIONS = {"total_env_steps": 300, "warmup_steps": 100, "rollout_len": 25, "eval_interval": 300,
                "eval_episodes": 1, "batch_size": 16, "buffer_size": 1000, "learner_config": {"hidden": [8, 8]},
                "progress": False}


def tiny_argv(argv: list[str], train: list[str] = TINY_TRAIN) -> list[str]:
    """A guide command with the tiny flags of its sub-command appended."""
    if argv[0] == "train":
        return argv + train
    if argv[0] == "resume":
        return argv + ["--no-progress"]
    if argv[0] == "sweep":  # the run flags of train (its own --steps is each trial's budget)
        return argv + train
    if argv[:2] in (["bench", "update"], ["bench", "accelerator"]) and "--help" not in argv:
        return argv + TINY_BENCH
    return argv


def out_dir(argv: list[str]) -> str | None:
    return argv[argv.index("--out") + 1] if "--out" in argv else None


def run_python(block: Block, namespace: dict | None = None) -> dict:
    """Runs a python block as a module of its own (as a user's script runs: its classes belong to a module that
    pydantic and pickle can find), in ``namespace`` when given (blocks that build on the previous ones)."""
    import sys
    import types

    if namespace is None:
        name = "guide_" + re.sub(r"\W", "_", f"{Path(block.page).stem}_{block.section}_{block.index}").lower()
        module = types.ModuleType(name)
        sys.modules[name] = module
        namespace = module.__dict__
    exec(compile(block.text, block.page, "exec"), namespace)
    return namespace
