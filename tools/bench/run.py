"""Run every package's benchmark and the peers side by side; write docs/benchmarks.md.

    uv run --group bench python tools/bench/run.py            # the run of record (target: under 15 minutes here)
    uv run --group bench python tools/bench/run.py --full     # also the rows no issue target needs (peers, 2 GB)
    uv run --group bench python tools/bench/run.py --quick    # smoke run (target: under 3 minutes)
    uv run --group bench python tools/bench/run.py --only sampler,formats

Each ``tools/bench/bench_<name>.py`` exposes ``run(quick: bool) -> str`` that
returns its markdown section (tables with medians of >= 3 runs and ratios to the
raw baseline and the best peer) and writes ``docs/benchmarks/<name>.md``. This
script runs them in a fixed order and joins the sections under one header that
records the machine and the command. Measurements that take minutes run on their own and their last reports are appended
here: the tokenize peak-RSS scaling to 2 GB (``bench_tokenize.py --rss-scaling 100,500,2000``,
which records its commit), the first open of 10^9-entry indices (``bench_open.py``; this
run opens 10^8) and the remote reads at issue 38's size (``bench_remote_peers.py --issue-size``, 7 minutes;
this run reads 32 MiB); ``run.py --refresh-separate`` re-appends them after such a run without
rerunning the rest. Each section's wall and CPU seconds (this process and the children it waited for) are
printed as it ends, listed with the total at the end and written into the header.

``--full`` is passed to each section whose ``run`` takes ``full``: there it adds the rows that prove no issue
target (the peers of the tokenize sections, the 2 GB memory point, the 55 MB sft prep) and never changes the
sizes the default rows are measured at.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import inspect
import os
import platform
import resource
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
ORDER = [
    "formats",
    "open",
    "tokenize",
    "tokenize-prep",
    "tokenize-process",
    "sft",
    "datasets",
    "remote_cache",
    "verify",
    "block_order",
    "sampler",
    "curriculum",
    "hf-streaming",
    "stream_remote",
    "eval_broadcast",
    "remote-peers",
    "startup",
]


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} cores ({cpu}){mem}, {system}, Python {platform.python_version()}"


def trace_children() -> None:
    """Log each child process of the benchmarks (its command and seconds) to stderr, for finding where a section's
    time goes (``--trace``)."""
    import subprocess

    init, wait = subprocess.Popen.__init__, subprocess.Popen._wait  # type: ignore[attr-defined]

    def traced_init(self, args, *rest, **kwargs):
        self._bench_started = time.perf_counter()
        init(self, args, *rest, **kwargs)

    def traced_wait(self, timeout):
        code = wait(self, timeout)
        if code is not None and not getattr(self, "_bench_logged", False):
            self._bench_logged = True
            words = [str(w) for w in (self.args if isinstance(self.args, (list, tuple)) else [self.args])]
            shown = " ".join(Path(w).name if w.startswith("/") else w[:60] for w in words)[:160]
            seconds = time.perf_counter() - self._bench_started
            sys.stderr.write(f"[trace {time.strftime('%H:%M:%S')} {seconds:6.1f} s] {shown}\n")
        return code

    subprocess.Popen.__init__ = traced_init  # type: ignore[method-assign]
    subprocess.Popen._wait = traced_wait  # type: ignore[attr-defined]


def cpu_seconds() -> float:
    """User + system seconds of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def load(name: str):
    path = HERE / f"bench_{name.replace('-', '_')}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


START, END = "<!-- bench:start -->", "<!-- bench:end -->"
SEPARATE = [
    REPO / "docs" / "benchmarks" / name
    for name in ("tokenize-rss.md", "open-huge.md", "open-native-full.md", "remote-peers-issue-size.md")
]
SEPARATE_HEADING = "# Measured separately"


def separate_section() -> str:
    """The minutes-long reports (each with its own command), appended after this run's sections."""
    reports = [path.read_text().strip() for path in SEPARATE if path.exists()]
    return f"{SEPARATE_HEADING} (minutes long, so outside this run)\n\n" + "\n\n".join(reports)


def sync_readmes(names: list[str]) -> list[Path]:
    """Quote each package's last full report (docs/benchmarks/<name>.md) in its README, between markers.

    So the READMEs never carry hand-typed figures: they hold what the last full run wrote.
    """
    changed = []
    for name in names:
        report = REPO / "docs" / "benchmarks" / f"{name}.md"
        readme = REPO / "packages" / name.replace("_", "-") / "README.md"  # eval_broadcast -> eval-broadcast
        if not report.exists() or not readme.exists():
            continue
        text = readme.read_text()
        if START not in text or END not in text:
            continue
        body = report.read_text().strip()
        body = "\n".join("#" + line if line.startswith("#") else line for line in body.splitlines())
        quote = (
            f"{START}\n_Quoted by `tools/bench/run.py` from "
            f"[docs/benchmarks/{name}.md](../../docs/benchmarks/{name}.md) (the last full run; "
            f"all packages: [docs/benchmarks.md](../../docs/benchmarks.md))._\n\n{body}\n{END}"
        )
        head, rest = text.split(START, 1)
        tail = rest.split(END, 1)[1]
        updated = head + quote + tail
        if updated != text:
            readme.write_text(updated)
            changed.append(readme)
    return changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument(
        "--full", action="store_true", help="also the rows no issue target needs (see each section's --full)"
    )
    parser.add_argument("--only", default="", help="comma-separated subset of " + ",".join(ORDER))
    parser.add_argument("--output", default=str(REPO / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--trace", action="store_true", help="log every child process (command, seconds) to stderr, to find slow parts"
    )
    parser.add_argument(
        "--sync-readmes", action="store_true", help="only re-quote docs/benchmarks/<pkg>.md in the package READMEs"
    )
    parser.add_argument(
        "--refresh-separate",
        action="store_true",
        help="only replace the 'measured separately' section of --output with the current "
        "docs/benchmarks/tokenize-rss.md and open-huge.md (after a `bench_tokenize.py --rss-scaling` "
        "or `bench_open.py` run)",
    )
    args = parser.parse_args()
    if args.sync_readmes:
        for path in sync_readmes(ORDER):
            print(f"updated {path}")
        return 0
    if args.refresh_separate:
        out = Path(args.output)
        head = out.read_text().split(SEPARATE_HEADING, 1)[0].rstrip("\n")
        out.write_text(head + "\n\n" + separate_section() + "\n")
        print(f"wrote {out}")
        return 0
    # Python's default: cache compiled bytecode. Under PYTHONDONTWRITEBYTECODE=1 (some container images set
    # it) every process, ours and the peers' alike, compiles each imported module again (about 2 s more
    # per torch import here), which measures the environment, not the code.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.trace:
        trace_children()
    names = [n for n in ORDER if (HERE / f"bench_{n.replace('-', '_')}.py").exists()]
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; available: {names}")
        names = [n for n in names if n in wanted]
    sections = []
    took: list[tuple[str, float, float]] = []  # name, wall s, CPU s
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    for name in names:
        print(f"== {name}", flush=True)
        t0, cpu0 = time.perf_counter(), cpu_seconds()
        module = load(name)
        full = {"full": True} if args.full and "full" in inspect.signature(module.run).parameters else {}
        sections.append(module.run(args.quick, **full).strip())
        took.append((name, time.perf_counter() - t0, cpu_seconds() - cpu0))
        print(f"   {name} took {took[-1][1]:.0f} s wall, {took[-1][2]:.0f} CPU-s", flush=True)
    total = time.perf_counter() - started
    per_section = ", ".join(f"{name} {wall:.0f} ({cpu:.0f})" for name, wall, cpu in took)
    totals = f"total {total:.0f} s wall, {sum(cpu for _, _, cpu in took):.0f} CPU-s"
    print(f"seconds per section, wall (CPU): {per_section}; {totals}", flush=True)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    header = [
        "# tokenloom benchmarks",
        "",
        f"Produced by `{' '.join(['python', 'tools/bench/run.py', *sys.argv[1:]])}` on "
        f"{_dt.date.today().isoformat()}, in {total:.0f} s.",
        f"Machine: {machine()}; load average (1 min) {load_at_start:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end.",
        f"Seconds per section, wall (CPU: this process and the children it waited for): {per_section}; {totals}.",
        "Figures are medians of at least 3 runs; machines here are shared and noisy, so read ratios "
        "(measured in the same run) rather than absolute numbers. Child processes cache bytecode "
        "(Python's default), whatever PYTHONDONTWRITEBYTECODE says.",
        "",
    ]
    if not args.quick and any(path.exists() for path in SEPARATE):
        sections.append(separate_section())
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header) + "\n" + "\n\n".join(sections) + "\n")
    print(f"wrote {out}")
    if not args.quick:
        for path in sync_readmes(names):
            print(f"updated {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
