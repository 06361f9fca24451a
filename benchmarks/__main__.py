"""The benchmark runner.

    python -m benchmarks [--quick] [--reps N] [--json PATH] [--results-dir DIR]
                         [--only NAME ...] [--profile DIR] [--peers]

Runs every scenario (or those named) ``--reps`` times, repetition by repetition, prints a
table of medians with the ratio of each to the raw baseline of the same run and the
targets met or missed, and writes everything as JSON. ``--results-dir`` writes
results.json, results.txt (the table) and machine.md there. ``--profile`` runs every
child under ``py-spy record`` (collapsed stacks per process, one folder per repetition).
``--peers`` adds NATS JetStream, Redis Streams and Zenoh (peer mode) in the same run, each
where its server and client are installed (a line says why one is skipped), and prints
them beside zmesh and raw pyzmq.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from . import SCENARIOS, _child, machine, peer_report, peer_servers, report, scen_raw, scen_zmesh
from .scen_peers import PEER_SCENARIOS
from .sizes import FULL, QUICK

RUNNERS = {
    **scen_raw.SCENARIOS,
    **scen_zmesh.SCENARIOS,
    **{name: fn for name, (_peer, fn) in PEER_SCENARIOS.items()},
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small counts and 1 repetition (a smoke run of about 20 seconds)",
    )
    ap.add_argument(
        "--reps",
        type=int,
        default=None,
        help="repetitions of each scenario; medians are reported (default 3, quick 1)",
    )
    ap.add_argument("--json", type=Path, help="write the results as JSON to this file")
    ap.add_argument(
        "--results-dir",
        type=Path,
        help="write results.json, results.txt and machine.md to this directory",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=SCENARIOS + tuple(PEER_SCENARIOS),
        help=f"run only these scenarios: {', '.join(SCENARIOS + tuple(PEER_SCENARIOS))}",
    )
    ap.add_argument(
        "--peers",
        action="store_true",
        help="add NATS JetStream, Redis Streams and Zenoh (peer mode) where installed",
    )
    ap.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run every child process under py-spy and keep its samples in DIR",
    )
    args = ap.parse_args(argv)
    if args.reps is None:
        args.reps = 1 if args.quick else 3
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    # Where the results go is checked before the run, not found wrong after it.
    for option, path, is_dir in (
        ("--json", args.json, False),
        ("--results-dir", args.results_dir, True),
    ):
        if path is not None:
            problem = _unwritable(path, is_dir)
            if problem:
                ap.error(f"{option} {path}: {problem}")
    if args.profile is not None and not _child.py_spy():
        ap.error("--profile needs py-spy in this environment: pip install py-spy")
    return args


def _unwritable(path: Path, is_dir: bool) -> str:
    """Why results cannot be written to ``path`` (a file, or a directory if ``is_dir``);
    empty if they can. Creates the directory (or the file's)."""
    folder = path if is_dir else path.parent
    if is_dir and path.exists() and not path.is_dir():
        return "exists and is not a directory"
    if not is_dir and path.is_dir():
        return "is a directory"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {folder}: {exc.strerror}"
    probe = path / ".zmesh-bench-probe" if is_dir else path
    existed = probe.exists()
    try:
        with open(probe, "a"):
            pass
    except OSError as exc:
        return f"not writable: {exc.strerror}"
    if not existed:
        probe.unlink()
    return ""


def _peers(args: argparse.Namespace, names: list[str], err: Console) -> tuple[list[str], dict]:
    """Append the peers' scenarios to ``names`` (``--peers``, or named in ``--only``) for
    the peers that can run here; the peers that run, and why the others cannot."""
    wanted = [n for n in PEER_SCENARIOS if (n in args.only if args.only else args.peers)]
    ran: list[str] = []
    skipped: dict[str, str] = {}
    for peer in peer_servers.PEERS:
        mine = [n for n in wanted if PEER_SCENARIOS[n][0] == peer]
        if not mine:
            continue
        reason = peer_servers.missing(peer)
        if reason:
            skipped[peer] = reason
            # (one line, never wrapped; the reason's brackets are text, not markup)
            name = peer_servers.PEER_NAMES[peer]
            err.print(f"[yellow]skipped[/] {name}: {escape(reason)}", soft_wrap=True)
            continue
        ran.append(peer)
        names.extend(mine)
    return ran, skipped


def run(argv: list[str] | None = None) -> int:
    args = _args(argv)
    sizes = QUICK if args.quick else FULL
    names = [n for n in SCENARIOS if not args.only or n in args.only]
    out = Console() if sys.stdout.isatty() else Console(width=180)
    err = Console(stderr=True)
    ran, skipped = _peers(args, names, err)
    started = _dt.datetime.now(_dt.UTC)
    t_start = time.monotonic()
    load_start = os.getloadavg()
    speed_start = machine.python_speed()
    raw: dict[str, dict[str, Any]] = {n: {"reps": [], "errors": []} for n in names}
    root = Path(tempfile.mkdtemp(prefix="zmesh-bench-"))
    interrupted = False
    try:
        for rep in range(args.reps):
            for name in names:
                workdir = root / f"{name}-{rep}"
                profile = args.profile / f"{name}-{rep}" if args.profile else None
                speed = machine.python_speed()  # (the host's speed varies by the minute)
                t0 = time.monotonic()
                err.print(f"[dim]rep {rep + 1}/{args.reps}[/] {name} ...", end=" ")
                try:
                    metrics = RUNNERS[name](workdir, sizes, profile)
                except Exception as exc:  # (one scenario's failure is recorded, not fatal)
                    text = (
                        str(exc)
                        if isinstance(exc, _child.BenchError)
                        else f"{type(exc).__name__}: {exc}"
                    )
                    raw[name]["errors"].append(f"rep {rep + 1}: {text}")
                    err.print(f"[red]failed[/] ({time.monotonic() - t0:.1f}s)\n{text}")
                    continue
                finally:
                    shutil.rmtree(workdir, ignore_errors=True)
                metrics["python_speed_s"] = speed
                metrics["rep"] = rep + 1  # (its round: ratios pair a round's figures)
                raw[name]["reps"].append(metrics)
                err.print(f"{metrics['rate']:,.0f} msgs/s ({time.monotonic() - t0:.1f}s)")
    except KeyboardInterrupt:  # (the children are stopped by then: report what was measured)
        interrupted = True
        err.print("[yellow]interrupted[/]: reporting the repetitions measured so far")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    scenarios, targets = report.summarize(raw)
    desc = machine.describe()
    # Other work on the machine skews every figure: record how busy it was.
    desc["load_average_start"] = [round(x, 2) for x in load_start]
    desc["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    desc["python_speed_s_start"] = speed_start
    desc["python_speed_s_end"] = machine.python_speed()
    title = (
        f"zmesh benchmarks ({'quick' if args.quick else 'full'}, median of "
        f"{args.reps}) - {desc['cpus']} CPUs {desc['cpu_model']}, Python "
        f"{desc['python']}, libzmq {desc['libzmq']}, zmesh {desc['git_commit']}"
    )
    tab = report.table(scenarios, targets, title)
    out.print(tab)
    tables = [tab]
    peer_rows = peer_report.rows(scenarios, ran)
    if ran:
        for peer in ran:
            desc.update(peer_servers.versions(peer))
        tables.append(peer_report.table(peer_rows, ran, "The peers beside zmesh (same run)"))
        out.print(tables[-1])
    doc = {
        "schema": "zmesh-bench/1",
        "started_at": started.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t_start, 1),
        "mode": "quick" if args.quick else "full",
        "reps": args.reps,
        "sizes": dataclasses.asdict(sizes),
        "machine": desc,
        "scenarios": scenarios,
        "targets": targets,
        "peers": {"ran": ran, "skipped": skipped, "rows": peer_rows},
    }
    text = json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"
    try:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(text)
        if args.results_dir:
            args.results_dir.mkdir(parents=True, exist_ok=True)
            (args.results_dir / "results.json").write_text(text)
            rec = Console(record=True, width=200, file=open(os.devnull, "w"))  # noqa: SIM115
            for t in tables:
                rec.print(t)
            (args.results_dir / "results.txt").write_text(rec.export_text())
            rec.file.close()
            (args.results_dir / "machine.md").write_text(machine.markdown(desc))
    except OSError as exc:  # (checked before the run; a disk may still fill up)
        fd, kept = tempfile.mkstemp(prefix="zmesh-bench-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        err.print(f"[red]cannot write the results[/] ({exc}); the JSON is in {kept}")
        return 1
    if interrupted:
        return 130
    failed = [n for n, e in scenarios.items() if not e["reps"]]
    if failed:
        err.print(f"[red]no result for {', '.join(failed)}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
