"""Summarize py-spy samples taken with ``python -m benchmarks --profile DIR``.

    python -m benchmarks.profile DIR/zmesh_process-0/producer.txt [--top N]

Reads py-spy's raw (collapsed) format recorded with ``--threads`` and prints, per thread,
its share of the samples, the functions with the most samples on top of the stack (self)
and those with the most samples anywhere on the stack (inclusive). py-spy leaves idle
threads out, so shares are of the process's busy time.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")
_THREAD = re.compile(r"^thread \((?P<tid>\d+)\)(?::\s*(?P<name>.*))?$")


def _func(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("zmesh/", "benchmarks/", "site-packages/"):
        if marker in path:
            path = path[path.index(marker) :].replace("site-packages/", "")
            break
    else:
        path = Path(path).name
    return f"{m.group('fn')} ({path})"


def load(path: Path) -> dict[str, tuple[Counter[str], Counter[str], int]]:
    """thread -> (self counts, inclusive counts, total samples)."""
    threads: dict[str, list] = defaultdict(lambda: [Counter(), Counter(), 0])
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = "main"
        m = _THREAD.match(frames[0])
        if m:
            thread = m.group("name") or m.group("tid")
            frames = frames[1:]
            if frames and not _FRAME.match(frames[0].strip()):
                thread = frames[0]  # py-spy puts the thread name first
                frames = frames[1:]
        entry = threads[thread]
        entry[2] += n
        funcs = [_func(f) for f in frames]
        if funcs:
            entry[0][funcs[-1]] += n
        for fn in set(funcs):
            entry[1][fn] += n
    return {k: (v[0], v[1], v[2]) for k, v in threads.items()}


def report(path: Path, top: int) -> str:
    threads = load(path)
    total = sum(t[2] for t in threads.values()) or 1
    lines = [f"== {path} ({total} busy samples)"]
    for name, (own, incl, n) in sorted(threads.items(), key=lambda kv: -kv[1][2]):
        if n < total * 0.02:
            continue
        lines.append(f"-- thread {name}: {n} samples ({100 * n / total:.0f}% of busy time)")
        lines.append("   self:")
        lines += [f"   {100 * c / n:5.1f}%  {fn}" for fn, c in own.most_common(top)]
        lines.append("   inclusive:")
        lines += [f"   {100 * c / n:5.1f}%  {fn}" for fn, c in incl.most_common(top + 6)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.profile")
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    missing = [str(f) for f in args.files if not f.is_file()]
    if missing:
        ap.error(
            f"no such profile file: {', '.join(missing)} (python -m benchmarks "
            "--profile DIR writes DIR/SCENARIO-REP/ROLE.txt)"
        )
    for f in args.files:
        print(report(f, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
