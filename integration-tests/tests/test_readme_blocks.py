"""Every code block of README.md and packages/*/README.md, run as written.

The blocks are read from the Markdown (nothing is copied into this file), so an
example that drifts from the code fails here, named by its place: the test id is
``README:line`` of the block's opening fence.

Rules (also the contract for anyone editing a README):

- Languages run: ``python`` (the venv's python), ``bash`` / ``sh`` (``bash -euo
  pipefail``) and ``console`` (only the ``$ `` lines, as bash; output lines are
  what the user sees and are not compared). Other fences (diagrams, ``yaml``,
  ``json``, plain) are not code.
- **One directory per README**: its blocks run in order in one fresh temp dir, a
  block seeing what the blocks above it made, exactly as a user who follows the
  README from the top. (Chosen over one dir per block because chaining is what
  broke for users: blocks reusing one output with other settings. The dependency
  is therefore always "everything above in the same README", and a README that
  needs data makes it in a visible set-up block of its own.) Running one block
  alone (``-k``) first runs the blocks above it.
- Markers, an HTML comment on the line just before the fence (invisible when the
  Markdown is rendered):
  ``<!-- readme-test: skip: REASON -->`` the block is not run; allowed only for
  set-up lines that cannot run here (installs from the network, ``uv run tox``,
  the package test suites). Skips are reported with their reason and capped by
  ``MAX_SKIPS``.
  ``<!-- readme-test: torchrun nproc=N -->`` a python block that needs ranks runs
  as ``torchrun --standalone --nproc-per-node N`` (gloo on CPU).
  ``<!-- readme-test: file=NAME -->`` a non-code block (e.g. ``yaml``) is written
  to NAME in the README's directory, as the text tells the user to.
- ``uv``: the tests run inside an environment that already holds every package
  (tox's integration env, or ``uv run`` in the workspace), and must not resolve
  or download anything. Shims named ``uv`` and ``uvx`` are first on PATH:
  ``uv run [uv options] CMD ARGS...`` and ``uvx [uvx options] CMD ARGS...`` run
  ``CMD ARGS...`` from the active environment (the options, e.g. ``--project
  DIR`` or ``--from PKG``, are dropped; ``python`` is this interpreter); any other
  ``uv`` command (``uv add``, ``uv sync``...) fails and names this rule: such a
  line is set-up, so its block is marked skip.
- No network: HF_HUB_OFFLINE=1, HF_DATASETS_OFFLINE=1, TRANSFORMERS_OFFLINE=1.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READMES = [ROOT / "README.md", *sorted((ROOT / "packages").glob("*/README.md"))]
RUN_LANGUAGES = {"python", "bash", "sh", "console"}
NOT_CODE = {"", "yaml", "json", "toml", "text"}  # diagrams, file contents, output: not run
# set-up lines only (8 today: 3 are install lines that tools/release/test_release.py runs in clean venvs);
# raising it needs a reason in the review
MAX_SKIPS = 8
BLOCK_TIMEOUT = 420  # seconds; a hang fails the block instead of stalling CI (the cluster recipe takes 1-2.5 min)

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,})(?P<lang>[\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<body>.*?)\s*-->\s*$")
MARKER_FORMS = re.compile(r"^(skip:\s*\S.*|torchrun nproc=\d+|file=[\w./-]+)$")


@dataclass(frozen=True)
class Block:
    readme: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None

    @property
    def id(self) -> str:
        return f"{self.readme.relative_to(ROOT)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker and self.marker.startswith("skip:"):
            return self.marker.removeprefix("skip:").strip()
        return None

    @property
    def nproc(self) -> int | None:
        match = re.fullmatch(r"torchrun nproc=(\d+)", self.marker or "")
        return int(match.group(1)) if match else None

    @property
    def file_name(self) -> str | None:
        return self.marker.removeprefix("file=") if self.marker and self.marker.startswith("file=") else None

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGUAGES or self.file_name is not None


def parse_blocks(readme: Path) -> list[Block]:
    """Every fenced block of ``readme`` with the marker comment on the line before it (if any)."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening.group("fence"), len(opening.group("indent"))
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{fence}`*\s*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        previous = MARKER.match(lines[i - 1]) if i > 0 else None
        marker = previous.group("body") if previous else None
        blocks.append(Block(readme, i + 1, opening.group("lang").lower(), "\n".join(body) + "\n", marker))
        i = j + 1
    return blocks


ALL_BLOCKS = [block for readme in READMES for block in parse_blocks(readme)]
RUN_BLOCKS = [block for block in ALL_BLOCKS if block.runs]


def console_commands(code: str) -> str:
    """The ``$ `` lines of a console transcript, as a script."""
    return "\n".join(line[2:] for line in code.splitlines() if line.startswith("$ ")) + "\n"


UV_SHIM = '''#!{python}
"""readme-test shim for `uv run` and `uvx`: the command runs from the active environment (see the module doc)."""
import os, sys
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if name == "uv" and args[:1] == ["run"]:
    args = args[1:]
elif name != "uvx":
    sys.exit(f"readme-test: only `uv run CMD` and `uvx CMD` run here (got {{sys.argv!r}}); mark set-up blocks skip")
with_value = {{"--project", "--directory", "--group", "--package", "--extra", "--with", "--python", "--from"}}
while args and args[0].startswith("-"):
    option = args.pop(0)
    if option in with_value and "=" not in option:
        args.pop(0)
if not args:
    sys.exit(f"readme-test: `{{name}}` without a command")
if args[0] == "python":
    args[0] = sys.executable
os.execvp(args[0], args)
'''


class ReadmeRun:
    """The blocks of one README, run in order in one directory."""

    def __init__(self, readme: Path, workdir: Path, scripts: Path) -> None:
        self.blocks = [block for block in RUN_BLOCKS if block.readme == readme]
        self.workdir, self.scripts = workdir, scripts
        self.results: dict[int, str | None] = {}  # line -> None (passed or skipped) or the failure text
        self.workdir.mkdir(parents=True)
        self.scripts.mkdir(parents=True)
        shim_dir = scripts / "bin"
        shim_dir.mkdir()
        for name in ("uv", "uvx"):
            shim = shim_dir / name
            shim.write_text(UV_SHIM.format(python=sys.executable))
            shim.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join([str(shim_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("PYTHONPATH", None)

    def run_through(self, block: Block) -> None:
        for earlier in self.blocks:
            if earlier.line == block.line:
                break
            if earlier.line not in self.results:
                self.results[earlier.line] = self._run(earlier)
            if self.results[earlier.line] is not None:
                pytest.fail(f"{earlier.id}, a block above this one in the same README, failed; fix it first")
        failure = self._run(block)
        self.results[block.line] = failure
        if failure is not None:
            pytest.fail(failure, pytrace=False)

    def _run(self, block: Block) -> str | None:
        if block.skip_reason is not None:
            return None
        if block.file_name is not None:
            (self.workdir / block.file_name).parent.mkdir(parents=True, exist_ok=True)
            (self.workdir / block.file_name).write_text(block.code, encoding="utf-8")
            return None
        script = self.scripts / f"block_{block.line}.{'py' if block.lang == 'python' else 'sh'}"
        if block.lang == "python":
            script.write_text(block.code, encoding="utf-8")
            if block.nproc:
                command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
                command += [f"--nproc-per-node={block.nproc}", str(script)]
            else:
                command = [sys.executable, str(script)]
        else:
            code = console_commands(block.code) if block.lang == "console" else block.code
            script.write_text(code, encoding="utf-8")
            command = ["bash", "-euo", "pipefail", str(script)]
        process = subprocess.Popen(
            command,
            cwd=self.workdir,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            output, _ = process.communicate(timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate(timeout=30)
            return f"{block.id} did not finish in {BLOCK_TIMEOUT} s\n{output.decode(errors='replace')[-6000:]}"
        if process.returncode != 0:
            text = output.decode(errors="replace")[-6000:]
            shown = textwrap.indent(block.code, "    ")
            return (
                f"{block.id} ({block.lang}) exited {process.returncode}: {shlex.join(command)}\n"
                f"in {self.workdir}\n--- block ---\n{shown}--- output (tail) ---\n{text}"
            )
        return None


_RUNS: dict[Path, ReadmeRun] = {}


@pytest.fixture
def readme_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> ReadmeRun:
    block: Block = request.node.callspec.params["block"]
    if block.readme not in _RUNS:
        base = tmp_path_factory.mktemp(block.readme.parent.name if block.readme.parent != ROOT else "root")
        _RUNS[block.readme] = ReadmeRun(block.readme, base / "work", base / "scripts")
    return _RUNS[block.readme]


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[block.id for block in RUN_BLOCKS])
def test_readme_block(block: Block, readme_run: ReadmeRun) -> None:
    if block.skip_reason is not None:
        pytest.skip(f"{block.id}: {block.skip_reason}")
    readme_run.run_through(block)


def test_markers_are_well_formed_and_skips_are_few() -> None:
    """Every marker is one of the known forms, stands before a block it applies to, and skips stay rare."""
    problems: list[str] = []
    for readme in READMES:
        lines = readme.read_text(encoding="utf-8").splitlines()
        fence_lines = {block.line for block in parse_blocks(readme)}
        for number, line in enumerate(lines, start=1):
            match = MARKER.match(line)
            if not match:
                if "readme-test" in line:
                    problems.append(f"{readme.relative_to(ROOT)}:{number}: malformed marker {line!r}")
                continue
            if not MARKER_FORMS.match(match.group("body")):
                problems.append(f"{readme.relative_to(ROOT)}:{number}: unknown marker {match.group('body')!r}")
            if number + 1 not in fence_lines:
                problems.append(f"{readme.relative_to(ROOT)}:{number}: marker not on the line before a fence")
    for block in ALL_BLOCKS:
        if block.lang not in RUN_LANGUAGES | NOT_CODE:
            problems.append(f"{block.id}: fence language {block.lang!r} is neither run nor known not to be code")
        if block.nproc is not None and block.lang != "python":
            problems.append(f"{block.id}: torchrun marker on a {block.lang} block")
        if block.file_name is not None and block.lang in RUN_LANGUAGES:
            problems.append(f"{block.id}: file= marker on a {block.lang} block (it would not run)")
    skips = [f"{block.id}: {block.skip_reason}" for block in RUN_BLOCKS if block.skip_reason is not None]
    assert not problems, "\n".join(problems)
    assert len(skips) <= MAX_SKIPS, f"{len(skips)} skipped README blocks (at most {MAX_SKIPS}):\n" + "\n".join(skips)
    assert len(RUN_BLOCKS) - len(skips) >= 20, "the README parser found too few blocks: is the fence regex right?"


def test_parser_reads_fences_markers_and_console_lines(tmp_path: Path) -> None:
    """The parser itself: languages, marker on the previous line only, nested indentation, console prompts."""
    readme = tmp_path / "README.md"
    readme.write_text(
        "text\n<!-- readme-test: torchrun nproc=2 -->\n```python\nprint(1)\n```\n\n"
        "<!-- readme-test: skip: network -->\n\n```bash\nls\n```\n"
        "- item\n\n  ```console\n  $ echo hi\n  hi\n  ```\n````\n```\n````\n"
    )
    blocks = parse_blocks(readme)
    assert [(b.line, b.lang, b.marker) for b in blocks] == [
        (3, "python", "torchrun nproc=2"),
        (9, "bash", None),  # a blank line between marker and fence: no marker
        (14, "console", None),
        (18, "", None),
    ]
    assert blocks[0].nproc == 2 and blocks[0].code == "print(1)\n"
    assert console_commands(blocks[2].code) == "echo hi\n"
    assert blocks[3].code == "```\n"


def test_uv_shims_run_from_the_active_environment_and_refuse_the_rest(tmp_path: Path) -> None:
    """``uv run [opts] CMD`` and ``uvx [--from P] CMD`` run CMD here; ``uv add`` fails naming the rule."""
    run = ReadmeRun(tmp_path / "README.md", tmp_path / "work", tmp_path / "scripts")

    def bash(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", line], cwd=run.workdir, env=run.env, capture_output=True, text=True
        )

    ran = bash("uv run --project /nowhere python -c 'import sys; print(sys.executable)'")
    assert ran.returncode == 0 and ran.stdout.strip() == sys.executable, ran.stderr
    ran = bash("uvx --from tokenloom tokenloom --help")
    assert ran.returncode == 0 and "Usage" in ran.stdout, ran.stderr
    refused = bash("uv add tokenloom")
    assert refused.returncode != 0 and "mark set-up blocks skip" in refused.stderr
