"""``zmesh request`` and ``zmesh reply``: a short-lived node that asks a topic's
responders and prints the reply, and one that answers requests (for testing)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from .. import Message, Reply
from .._requests import Delivery
from .._subjects import check_subject
from ..config import check_name
from ..errors import ArgumentError, ConfigError, NoRespondersError, ReplyError, ZMeshError
from .audience import wait_serving, wait_settled
from .client import StopSignals
from .clientnode import NodeArgs, cli_node, node_options
from .output import READER_GONE, CliError, drop_stdout, note
from .pub import parse_headers
from .settings import Number
from .shell import run_shell
from .stopflag import StopFlag
from .sub import payload_json

RETRY_S = 0.05  # a request with no responder known yet is tried again this often
SIGNAL_CHECK_S = 0.1  # a wait for replies looks for a stop signal this often
FAILED = 3  # the exit code of a request whose responder's function failed


def reply_json(reply: Reply) -> dict[str, Any]:
    """What ``--json`` prints of a reply."""
    return {
        "topic": reply.topic,
        "responder": reply.responder,
        "request": str(reply.request),
        "ok": reply.ok,
        "headers": reply.headers,
        **payload_json(reply.payload),
    }


def _until_stopped(call: Callable[[], list[Reply]], signals: StopSignals) -> list[Reply] | None:
    """``call()`` (a request) on a thread of its own, waited for until it returns or a
    stop signal comes (None then: the node's close ends the call). A wait on a lock, as
    the call's, does not end for a signal."""
    result: list[list[Reply]] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=run, name="zmesh-cli-request", daemon=True)
    worker.start()
    while worker.is_alive():
        if signals.stop.is_set():
            return None
        worker.join(SIGNAL_CHECK_S)
    if failure:
        raise failure[0]
    return result[0]


def _print(reply: Reply, as_json: bool) -> None:
    out = sys.stdout.buffer
    if as_json:
        out.write(json.dumps(reply_json(reply), ensure_ascii=False, default=repr).encode())
    else:
        out.write(reply.payload)
    out.write(b"\n")
    out.flush()


@click.command(short_help="Ask TOPIC's responders; print the reply (--many: every reply).")
@click.argument("topic")
@click.argument("data", default="")
@click.option("--key", help="Route the request by this key (one responder per key).")
@click.option(
    "--header", "headers", multiple=True, metavar="KEY=VALUE", help="A header (repeatable)."
)
@click.option(
    "--timeout",
    type=Number(min=0.001),
    default=5.0,
    show_default=True,
    help="Seconds to wait for the reply (with --many: for the replies).",
)
@click.option(
    "--discovery-wait",
    type=Number(min=0),
    default=5.0,
    show_default=True,
    help="Seconds at most to wait for a responder to be found before giving up.",
)
@click.option(
    "--many",
    is_flag=True,
    help="Scatter/gather: ask every responder found (once they stop changing) and print "
    "each reply that comes within --timeout (or the first --count).",
)
@click.option(
    "--count", type=click.IntRange(min=1), help="With --many: stop after this many replies."
)
@click.option(
    "--at-least-once",
    is_flag=True,
    help="A request whose responder died is handled again by another (the "
    "responder must be idempotent); by default it is dropped.",
)
@click.option("--json", "as_json", is_flag=True, help="Each reply as a JSON object.")
@node_options
def request(
    topic: str,
    data: str,
    key: str | None,
    headers: tuple[str, ...],
    timeout: float,
    discovery_wait: float,
    many: bool,
    count: int | None,
    at_least_once: bool,
    as_json: bool,
    node: NodeArgs,
) -> None:
    """Send DATA to TOPIC as a request and print the reply's payload (--json: the whole
    reply).

    \b
    Exit codes: 0 replied; 1 no responder found within --discovery-wait, or no reply
    within --timeout (or an error); 3 the responder's function failed (with --many: a
    responder's; its reason on stderr, the other replies printed); 2 bad usage; 130 /
    143 stopped by SIGINT / SIGTERM.
    """
    check_name("topic", topic)  # (before a node starts for nothing)
    if count is not None and not many:
        raise click.UsageError("--count goes with --many")
    header_map = parse_headers(headers) or None
    delivery: Delivery = "at_least_once" if at_least_once else "at_most_once"
    with StopSignals() as signals, cli_node("request", node) as n:

        def ask() -> list[Reply]:
            if many:
                return n.request_many(
                    topic,
                    data,
                    count=count,
                    timeout=timeout,
                    key=key,
                    headers=header_map,
                    delivery=delivery,
                )
            return [
                n.request(
                    topic, data, timeout=timeout, key=key, headers=header_map, delivery=delivery
                )
            ]

        deadline = time.monotonic() + discovery_wait
        if many and count is None:
            # (asked once the members found stop changing: each one known is asked)
            wait_serving(n, topic, discovery_wait, signals)
            wait_settled(n, max(0.0, deadline - time.monotonic()), signals)
        replies: list[Reply] | None = None
        while replies is None and not signals.stop.is_set():
            try:
                replies = _until_stopped(ask, signals)
            except NoRespondersError as exc:
                if time.monotonic() >= deadline:
                    raise CliError(f"{exc} (waited {discovery_wait:g}s)") from exc
                signals.stop.wait(RETRY_S)
            except ReplyError as exc:
                raise CliError(str(exc), exit_code=FAILED) from exc
            except (ArgumentError, ConfigError):
                raise  # (bad usage: exit 2, main.run)
            except ZMeshError as exc:
                raise CliError(str(exc)) from exc
        if replies is None:
            raise CliError("interrupted", exit_code=signals.exit_code)
    failed = [r for r in replies if not r.ok]
    for reply in replies:
        if reply.ok:
            _print(reply, as_json)
        else:  # (only --many gets these: a single request raised ReplyError)
            reason = reply.payload.decode(errors="replace")
            note(f"responder {reply.responder[:12]} failed: {reason}")
    if many:
        note(f"{len(replies)} replies" + (f", {len(failed)} of them failures" if failed else ""))
        if not replies:
            raise CliError(f"no reply within {timeout:g}s")
        if failed:
            raise CliError(
                f"{len(failed)} of {len(replies)} responders' functions failed (above)",
                exit_code=FAILED,
            )


def _exec_reply(cmd: str, msg: Message, timeout: float, stop: StopFlag) -> bytes:
    """The standard output of CMD run with the request on stdin; what raises is
    replied as an error."""
    ran = run_shell(cmd, msg.payload, timeout, stop, capture=True)
    if ran.timed_out:
        raise RuntimeError(f"--exec ran longer than {timeout:g}s; killed")
    if ran.returncode is None:
        raise RuntimeError("--exec stopped: the responder is stopping")
    if ran.returncode != 0:
        raise RuntimeError(
            f"--exec exited {ran.returncode}: {ran.stderr.decode(errors='replace').strip()}"
        )
    return ran.stdout


@click.command(short_help="Answer requests on TOPIC (for testing): echo, --data or --exec.")
@click.argument("topic")
@click.option(
    "--group",
    default="responders",
    show_default=True,
    help="The group of responders to join (shared: one answers each request).",
)
@click.option(
    "--mode",
    type=click.Choice(["shared", "broadcast"]),
    default="shared",
    show_default=True,
    help="broadcast: every member answers (for `zmesh request --many`).",
)
@click.option("--data", help="Reply this text instead of the request's payload.")
@click.option(
    "--exec",
    "exec_cmd",
    metavar="CMD",
    help="Reply what CMD (with sh) prints, the request on its stdin; a non-zero exit "
    "is replied as an error.",
)
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many requests.")
@click.option("--timeout", type=Number(min=0), help="Stop after this many seconds.")
@node_options
def reply(
    topic: str,
    group: str,
    mode: str,
    data: str | None,
    exec_cmd: str | None,
    count: int | None,
    timeout: float | None,
    node: NodeArgs,
) -> None:
    """Answer the requests of TOPIC (a pattern too) as a member of --group: with the
    request's payload (an echo), --data, or what --exec prints; print each request's
    payload on a line.

    \b
    Exit codes: 0 after --count requests, or at --timeout without --count; 1 fewer than
    --count within --timeout (or an error); 2 bad usage; 130 / 143 stopped by SIGINT /
    SIGTERM.
    """
    check_subject("topic", topic, wildcards=True)
    check_name("group", group)
    if data is not None and exec_cmd is not None:
        raise click.UsageError("give --data or --exec, not both")
    handled = 0
    lock = threading.Lock()
    enough = threading.Event()
    reader_gone = threading.Event()  # (stdout's reader went away: `| head -1`)
    signals = StopSignals()

    def answer(msg: Message) -> bytes:
        nonlocal handled
        try:
            if exec_cmd is not None:
                return _exec_reply(exec_cmd, msg, timeout or 60.0, signals.stop)
            return msg.payload if data is None else data.encode()
        finally:
            with lock:
                handled += 1
                if count is not None and handled >= count:
                    enough.set()
                if not reader_gone.is_set():
                    try:
                        sys.stdout.buffer.write(msg.payload + b"\n")
                        sys.stdout.buffer.flush()
                    except BrokenPipeError:  # (this request is still answered)
                        reader_gone.set()
                        enough.set()

    with signals, cli_node("reply", node) as n:
        serving = n.serve(topic, group, answer, mode=mode)
        note(
            f"node {n.name} of mesh {node.mesh}: control {n.control_address}; "
            f"answering {topic} as {group}"
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        while not enough.is_set() and not signals.stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            signals.stop.wait(0.05)
        serving.close()
    if reader_gone.is_set():
        drop_stdout()
        raise click.exceptions.Exit(READER_GONE)
    if signals.signum is not None:
        raise CliError(f"interrupted after {handled} requests", exit_code=128 + signals.signum)
    if count is not None and handled < count:
        raise CliError(f"answered {handled} of {count} requests within {timeout:g}s")
    note(f"{handled} requests answered")
