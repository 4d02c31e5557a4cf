"""Every console command shown in a ```bash block of README.md and docs/*.md exists and takes the options shown:
each is parsed by the parser of the program it names, without running it (fairseq's commands through fairseq's
own parsers with the plugin as --user-dir; the project's console scripts and ``python`` scripts through their own
``main``, stopped right after their argument parser has accepted the command line; shell scripts must exist, be
executable and parse). A command whose program or option stops existing fails here, naming the page and line.

Written as the docs write them: ``DATA``-style placeholders are paths, ``$VAR`` a value, ``$(bet-fairseq-user-dir)``
the plugin's folder, ``$(which fairseq-train)`` the command itself, and a ``...`` token (``...same options...``)
"the options above", which is left out. The Python examples of the README run in tests/core/test_readme_example.py.
"""

import argparse
import contextlib
import glob
import io
import os
import re
import runpy
import shlex
import signal
import subprocess
import sys
import tomllib
import warnings
from dataclasses import dataclass
from typing import List

import pytest

from conftest import ROOT

USER_DIR = os.path.join(ROOT, "bet_fairseq")
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
FAIRSEQ_COMMANDS = ("fairseq-train", "fairseq-generate", "fairseq-eval-lm", "fairseq-preprocess")


@dataclass
class Command:
    page: str
    line: int
    argv: List[str]

    def __str__(self):
        return f"{self.page}:{self.line}: {shlex.join(self.argv)}"


def bash_blocks(text: str):
    """(first line number, lines) of each ```bash block."""
    lines, blocks, start = text.splitlines(), [], None
    for i, line in enumerate(lines, 1):
        if start is None and line.strip() == "```bash":
            start = i + 1
        elif start is not None and line.strip() == "```":
            blocks.append((start, lines[start - 1:i - 1]))
            start = None
    return blocks


VALUES = {"NODE_RANK": "0"}  # shell variables the docs use where a number must stand; any other is a path


def substitute(line: str) -> str:
    line = line.replace("$(bet-fairseq-user-dir)", USER_DIR)
    line = re.sub(r"\$\(which ([\w.-]+)\)", r"\1", line)
    return re.sub(r"\$\{?(\w+)\}?", lambda m: VALUES.get(m.group(1), m.group(1)), line)  # $TEXT -> TEXT


def without_ellipses(tokens: List[str]) -> List[str]:
    """The tokens less ``...`` and ``...same options...`` (from a token starting with ... to one ending with it)."""
    kept, skipping = [], False
    for token in tokens:
        if not skipping and token.startswith("..."):
            skipping = not (len(token) > 3 and token.endswith("...")) and token != "..."
        elif skipping:
            skipping = not token.endswith("...")
        else:
            kept.append(token)
    return kept


def page_commands(page: str) -> List[Command]:
    """The commands of a page's bash blocks: continuation lines joined, comments dropped, ``&&`` split."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    commands = []
    for start, lines in bash_blocks(text):
        pending, first = "", None
        for number, line in enumerate(lines, start):
            first = number if not pending else first
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            tokens = without_ellipses(shlex.split(substitute(pending + line), comments=True))
            pending = ""
            argv = []
            for token in tokens + ["&&"]:
                if token == "&&":
                    if argv:
                        commands.append(Command(page, first, argv))
                    argv = []
                else:
                    argv.append(token)
    return commands


ALL_COMMANDS = [c for page in PAGES for c in page_commands(page)]


# ------------------------------------------------------------------------------------- parsing a command
class Parsed(BaseException):
    """Raised by the intercepted argument parser once the command line is accepted (a BaseException, so that the
    tools' own error handlers, which catch Exception, let it through)."""

    def __init__(self, namespace):
        super().__init__()
        self.namespace = namespace


@contextlib.contextmanager
def stop_after_parsing():
    """The outermost ``ArgumentParser.parse_*args`` call of the code inside raises ``Parsed`` with its result
    (nested calls, such as a subcommand's parser, run as usual). Leftover arguments of ``parse_known_args`` are an
    error here: a command shown in the docs must be taken whole. Global state a tool may set before parsing
    (warning filters, signal handlers, sys.argv, sys.path, the environment) is restored afterwards."""
    depth = [0]
    originals = {name: getattr(argparse.ArgumentParser, name)
                 for name in ("parse_args", "parse_known_args", "parse_intermixed_args",
                              "parse_known_intermixed_args")}

    def wrap(name, original):
        def intercepted(self, *args, **kwargs):
            depth[0] += 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                if name.startswith("parse_known"):
                    namespace, extra = result
                    if extra:
                        self.error(f"unrecognized arguments: {' '.join(extra)}")
                    raise Parsed(namespace)
                raise Parsed(result)
            return result
        return intercepted

    saved = (list(sys.argv), list(sys.path), dict(os.environ),
             {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)})
    for name, original in originals.items():
        setattr(argparse.ArgumentParser, name, wrap(name, original))
    try:
        with warnings.catch_warnings():
            yield
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)
        sys.argv[:], sys.path[:] = saved[0], saved[1]
        os.environ.clear()
        os.environ.update(saved[2])
        for s, handler in saved[3].items():
            signal.signal(s, handler)


def parse_with(run, argv0: str, argv: List[str]):
    """The namespace ``run()`` parses from ``sys.argv = [argv0, *argv]``; AssertionError with the parser's message
    when it refuses the command line or the program ends without parsing one."""
    err = io.StringIO()
    with stop_after_parsing(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        sys.argv = [argv0, *argv]
        try:
            run()
        except Parsed as done:
            return done.namespace
        except SystemExit as e:
            raise AssertionError(f"refused (exit {e.code}): {parser_error(err.getvalue())}") from None
    raise AssertionError("ended without parsing a command line")


def parser_error(stderr: str) -> str:
    """argparse's ``error:`` lines (its usage text before them runs to hundreds of lines under fairseq)."""
    errors = [line[:400] for line in stderr.splitlines() if "error:" in line]  # a choice list can be long
    return "\n".join(errors) if errors else stderr.strip()[-2000:]


def console_scripts():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["scripts"]


def registered_variants(page: str):
    """The attention variants registered, with those a page's own code registers (docs/adding_a_variant.md)."""
    from bet_fairseq.attention import VARIANTS

    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        return set(VARIANTS) | set(re.findall(r'register_variant\("(\w+)"', f.read()))


def check_fairseq(program: str, argv: List[str], page: str = None):
    from fairseq import options

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            if program == "fairseq-preprocess":
                args = options.get_preprocessing_parser().parse_args(argv)
            else:
                parser = {"fairseq-train": options.get_training_parser,
                          "fairseq-generate": options.get_generation_parser,
                          "fairseq-eval-lm": options.get_eval_lm_parser}[program]()
                args = options.parse_args_and_arch(parser, argv)
    except SystemExit as e:
        raise AssertionError(f"refused (exit {e.code}): {parser_error(err.getvalue())}") from None
    mode = getattr(args, "self_attn_mode", None)
    if mode is not None and page is not None:
        assert mode in registered_variants(page), f"--self-attn-mode {mode} is not a registered variant"
    return args


def check_pip(argv: List[str]):
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = set(tomllib.load(f)["project"]["optional-dependencies"])
    for token in argv:
        match = re.fullmatch(r"\.\[([\w,-]+)\]", token)
        if match:
            missing = set(match.group(1).split(",")) - extras
            assert not missing, f"extras {sorted(missing)} are not in pyproject.toml's optional-dependencies"


def check_python(command: Command, argv: List[str]):
    if argv[:2] == ["-m", "venv"]:
        return
    if argv[:2] == ["-m", "pytest"]:
        paths = [a for a in argv[2:] if not a.startswith("-")]
        assert paths and all(os.path.exists(os.path.join(ROOT, p)) for p in paths), f"no such test path: {paths}"
        return
    if argv[0] == "-m":
        parse_with(lambda: runpy.run_module(argv[1], run_name="__main__", alter_sys=True), argv[1], argv[2:])
        return
    script = os.path.join(ROOT, argv[0])
    assert os.path.isfile(script), f"{argv[0]} does not exist"
    # `python run/x.py` puts the script's folder first on sys.path (its sibling modules import as top-level)
    sys.path.insert(0, os.path.dirname(script))
    try:
        parse_with(lambda: runpy.run_path(script, run_name="__main__"), script, argv[1:])
    finally:
        sys.path.remove(os.path.dirname(script))


def check_shell_script(argv: List[str]):
    script = os.path.join(ROOT, argv[0])
    assert os.path.isfile(script), f"{argv[0]} does not exist"
    assert os.access(script, os.X_OK), f"{argv[0]} is not executable"
    proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert proc.returncode == 0, f"{argv[0]} does not parse: {proc.stderr}"


def check_torchrun(command: Command, argv: List[str]):
    from torch.distributed.run import get_args_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = get_args_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"torchrun refused (exit {e.code}): {parser_error(err.getvalue())}") from None
    check(command, [args.training_script, *args.training_script_args])


def check(command: Command, argv: List[str]):
    while argv and re.fullmatch(r"\w+=\S*", argv[0]):  # VAR=value before the command
        argv = argv[1:]
    program, rest = os.path.basename(argv[0]), argv[1:]
    if program in FAIRSEQ_COMMANDS:
        check_fairseq(program, rest, command.page)
    elif program in ("python", "python3"):
        check_python(command, rest)
    elif program == "pip":
        check_pip(rest)
    elif program == "torchrun":
        check_torchrun(command, rest)
    elif program in console_scripts():
        module, function = console_scripts()[program].split(":")
        entry = getattr(__import__(module, fromlist=[function]), function)
        parse_with(entry, program, rest)
    elif argv[0].endswith(".sh"):
        check_shell_script(argv)
    else:
        raise AssertionError(f"{program}: a program this test does not know how to check; teach it here")


def command_id(command: Command) -> str:
    program = next(a for a in command.argv if not re.fullmatch(r"\w+=\S*", a))
    return f"{command.page}:{command.line}:{os.path.basename(program)}"


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=command_id)
def test_documented_command_parses(command, monkeypatch):
    monkeypatch.chdir(ROOT)  # the docs' commands run from the repository's root (--user-dir bet_fairseq)
    try:
        check(command, command.argv)
    except AssertionError as e:
        raise AssertionError(f"{command}\n  {e}") from None


def test_the_pages_show_commands():
    """The extraction itself: the README's set-up and main job are found, and every page with a bash block gives
    commands (a change of the block syntax must not make this test check nothing)."""
    readme = [c.argv[0] for c in ALL_COMMANDS if c.page == "README.md"]
    for program in (".venv/bin/pip", ".venv/bin/python", "bet-prepare-iwslt14", "fairseq-train", "fairseq-generate",
                    "bet-reproduce"):
        assert program in readme, f"README.md shows no {program} command"
    for page in PAGES:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            if "```bash" in f.read():
                assert any(c.page == page for c in ALL_COMMANDS), f"{page}: bash blocks but no command found"


def test_a_removed_option_fails():
    """The checks can fail: an option that does not exist, an unknown architecture and a missing script."""
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        check(Command("x", 1, []), ["fairseq-train", "DATA", "--user-dir", USER_DIR, "--arch", "bet_sf_iwslt",
                                    "--no-such-option", "1"])
    with pytest.raises(AssertionError, match="invalid choice"):
        check(Command("x", 1, []), ["fairseq-train", "DATA", "--user-dir", USER_DIR, "--arch", "no_such_arch"])
    with pytest.raises(AssertionError, match="unrecognized arguments"):
        check(Command("x", 1, []), ["bet-results", "runs/", "--no-such-option"])
    with pytest.raises(AssertionError, match="does not exist"):
        check(Command("x", 1, []), ["python", "run/no_such_script.py", "--reps", "1"])


def main_job(program: str) -> argparse.Namespace:
    """The README's first quick start's ``program`` command, parsed."""
    (command,) = [c for c in ALL_COMMANDS if c.page == "README.md" and c.argv[0] == program]
    return check_fairseq(program, command.argv[1:])


@pytest.mark.parametrize("program,recipe", [("fairseq-train", "train"), ("fairseq-generate", "eval")])
def test_the_readme_main_job_is_the_recipe(program, recipe, monkeypatch):
    """The README's main job trains and evaluates with the settings the run scripts use (bet_fairseq/recipes.py),
    logging flags apart, so that the commands shown are the real ones."""
    from bet_fairseq import recipes

    monkeypatch.chdir(ROOT)
    flags = (recipes.train_recipe if recipe == "train" else recipes.eval_recipe)("iwslt14_de_en")
    flags = {k: v for k, v in flags.items() if k not in ("--log-format", "--log-interval")}
    base = ["DATA", "--user-dir", USER_DIR, *(["--path", "CKPT"] if recipe == "eval" else ["--arch", "bet_sf_iwslt"])]
    defaults = vars(check_fairseq(program, base))
    expected = vars(check_fairseq(program, base + recipes.to_argv(flags)))
    shown = vars(main_job(program))
    set_by_recipe = [dest for dest, value in expected.items() if defaults.get(dest) != value]
    assert len(set_by_recipe) >= len(flags) - 2, set_by_recipe  # (a flag may restate a default)
    for dest in set_by_recipe:
        assert shown.get(dest) == expected[dest], \
            f"README's {program}: {dest} = {shown.get(dest)!r}, the recipe's {expected[dest]!r}"


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_links_point_into_the_repository(page):
    """Every relative link of a page names a file of the repository and, for a Markdown page, one of its headings:
    a reader who clones the repository can follow every reference."""
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        text = f.read()
    for target in re.findall(r"\]\(([^)\s]+)\)|src=\"([^\"]+)\"", text):
        target = next(t for t in target if t)
        if re.match(r"\w+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
        assert os.path.exists(file), f"{page}: link to {target}, which does not exist"
        if anchor and file.endswith(".md"):
            with open(file, encoding="utf-8") as f:
                headings = {github_anchor(h) for h in re.findall(r"^#+ (.*)$", f.read(), flags=re.M)}
            assert anchor in headings, f"{page}: link to {target}: no such heading in {os.path.relpath(file, ROOT)}"
