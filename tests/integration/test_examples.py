"""The example scripts as processes: examples/producer.py and examples/consumer.py run
against each other, and examples/metrics_pipeline/run.py up to where Spark would start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import zmesh
from tests.conftest import spawn, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ADDRESS_RE = re.compile(r"consumer up: control (127\.0\.0\.1:\d+)")


class Script:
    """An example script as a child process; stdout and stderr go to files."""

    def __init__(
        self,
        tmp_path: Path,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        label: str | None = None,
    ) -> None:
        label = label or Path(name).name  # (names its output files)
        self.out = tmp_path / f"{label}.out"
        self.err = tmp_path / f"{label}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = spawn(
                [str(EXAMPLES / f"{name}.py"), *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def report(self) -> str:
        return f"stdout:\n{self.stdout()}\nstderr:\n{self.stderr()}"

    def wait_for(self, regex: re.Pattern[str], timeout: float = 30.0) -> re.Match[str]:
        def seen() -> re.Match[str] | None:
            found = regex.search(self.stdout())
            if found is None and self.popen.poll() is not None:
                pytest.fail(f"exited {self.popen.returncode} early; {self.report()}")
            return found

        return wait_until(seen, timeout, what=regex.pattern)  # type: ignore[return-value]


def run_pair(
    tmp_path: Path,
    procs: list[Script],
    common: list[str],
    consumer_extra: list[str],
    seed: bool,
    count: int = 12,
) -> Script:
    consumer = Script(
        tmp_path, "consumer", [*common, "--count", str(count), "--timeout", "90", *consumer_extra]
    )
    procs.append(consumer)
    address = consumer.wait_for(ADDRESS_RE).group(1)
    producer_args = [*common, "--count", str(count), "--timeout", "90"]
    if seed:
        producer_args += ["--seed", address]
    producer = Script(tmp_path, "producer", producer_args)
    procs.append(producer)
    assert producer.popen.wait(timeout=120) == 0, producer.report()
    assert f"producer done: {count} messages acknowledged" in producer.stdout()
    assert consumer.popen.wait(timeout=60) == 0, consumer.report()
    return consumer


def received(consumer: Script) -> list[str]:
    return re.findall(r"^received (reading \d+) \(key sensor-\d\)$", consumer.stdout(), re.M)


def test_consumer_prints_every_message_seeded(
    tmp_path: Path, mesh_name: str, procs: list[Script]
) -> None:
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns"]
    consumer = run_pair(tmp_path, procs, common, [], seed=True)
    assert sorted(received(consumer)) == sorted(f"reading {i}" for i in range(12))
    assert "consumer done: 12 messages" in consumer.stdout()


def test_handler_form(tmp_path: Path, mesh_name: str, procs: list[Script]) -> None:
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns"]
    consumer = run_pair(tmp_path, procs, common, ["--handler"], seed=True)
    assert sorted(received(consumer)) == sorted(f"reading {i}" for i in range(12))


def test_examples_find_each_other_over_mdns_on_loopback(
    tmp_path: Path, mesh_name: str, procs: list[Script]
) -> None:
    # No seed: discovery by mDNS, which speaks on 127.0.0.1 only.
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1"]
    consumer = run_pair(tmp_path, procs, common, [], seed=False, count=5)
    assert sorted(received(consumer)) == sorted(f"reading {i}" for i in range(5))


def test_consumers_of_two_groups_each_get_every_message(
    tmp_path: Path, mesh_name: str, procs: list[Script]
) -> None:
    # As examples/README.md gives it: both consumers first, then a producer told of both
    # groups; mDNS on loopback.
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1"]
    consumers = [
        Script(tmp_path, "consumer", [*common, "--group", group, "--timeout", "90"], label=group)
        for group in ("printers", "other")
    ]
    procs.extend(consumers)
    for consumer in consumers:
        consumer.wait_for(ADDRESS_RE)
    groups = ["--group", "printers", "--group", "other"]
    producer = Script(tmp_path, "producer", [*common, *groups, "--timeout", "90"])
    procs.append(producer)
    assert producer.popen.wait(timeout=120) == 0, producer.report()
    for consumer in consumers:
        assert consumer.popen.wait(timeout=60) == 0, consumer.report()
        assert sorted(received(consumer)) == sorted(f"reading {i}" for i in range(10))


def test_members_of_one_group_share_the_messages(
    tmp_path: Path, mesh_name: str, procs: list[Script]
) -> None:
    # --count 0: each prints what comes until --timeout (or, here, until stopped), as it
    # cannot know how many make its share.
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns"]
    consumers = [
        Script(tmp_path, "consumer", [*common, "--count", "0", "--timeout", "90"], label=label)
        for label in ("one", "two")
    ]
    procs.extend(consumers)
    seeds = [arg for c in consumers for arg in ("--seed", c.wait_for(ADDRESS_RE).group(1))]
    producer = Script(tmp_path, "producer", [*common, *seeds, "--count", "12"])
    procs.append(producer)
    assert producer.popen.wait(timeout=120) == 0, producer.report()
    shares = []
    for consumer in consumers:
        assert consumer.popen.poll() is None, consumer.report()  # (still taking its share)
        consumer.popen.send_signal(signal.SIGINT)
        assert consumer.popen.wait(timeout=30) == 130, consumer.report()
        shares.append(received(consumer))
    assert sorted(set(shares[0] + shares[1])) == sorted(f"reading {i}" for i in range(12))


@pytest.mark.parametrize(
    ("name", "args", "signum"),
    [
        ("producer", [], signal.SIGTERM),
        ("consumer", [], signal.SIGINT),
        ("consumer", ["--handler"], signal.SIGTERM),
    ],
)
def test_a_signal_closes_the_node_and_removes_the_temp_dir(
    tmp_path: Path,
    mesh_name: str,
    procs: list[Script],
    name: str,
    args: list[str],
    signum: signal.Signals,
) -> None:
    temp = tmp_path / "temp"  # (the script's TemporaryDirectory is made in here)
    temp.mkdir()
    script = Script(
        tmp_path,
        name,
        ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns", *args],
        env={**os.environ, "TMPDIR": str(temp)},
    )
    procs.append(script)
    script.wait_for(re.compile(rf"{name} up: control"))
    assert list(temp.iterdir())
    script.popen.send_signal(signum)
    assert script.popen.wait(timeout=30) == 128 + signum, script.report()
    assert script.stderr().splitlines()[-1] == f"{name}: stopped by {signum.name}"
    assert "Traceback" not in script.stderr()
    assert list(temp.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("consumer", ["--interface", "localhost"]),
        ("producer", ["--interface", "127.0.0.1", "--seed", "127.0.0.1"]),
        ("producer", ["--interface", "127.0.0.1", "--no-mdns", "--topic", "bad topic"]),
    ],
)
def test_a_bad_option_is_one_line(
    tmp_path: Path, mesh_name: str, procs: list[Script], name: str, args: list[str]
) -> None:
    script = Script(tmp_path, name, ["--mesh", mesh_name, *args])
    procs.append(script)
    assert script.popen.wait(timeout=60) == 2, script.report()
    assert "Traceback" not in script.stderr()
    assert script.stderr().splitlines()[-1].startswith(f"{name}: error: "), script.report()


@pytest.mark.parametrize(
    ("name", "args", "why"),
    [
        ("producer", ["--count", "-1"], "argument --count: must be 0 or more, got -1"),
        ("consumer", ["--count", "-1"], "argument --count: must be 0 or more, got -1"),
        ("consumer", ["--count", "x"], "argument --count: invalid count value: 'x'"),
        (
            "metrics_pipeline/sensors",
            ["--sensors", "-1"],
            "argument --sensors: must be 1 or more, got -1",
        ),
        *[
            (name, ["--timeout", value], f"argument --timeout: {why}")
            for name in ("producer", "consumer")
            for value, why in [
                ("0", "must be a finite number of seconds > 0, got 0"),
                ("-5", "must be a finite number of seconds > 0, got -5"),
                ("nan", "must be a finite number of seconds > 0, got nan"),
                ("inf", "must be a finite number of seconds > 0, got inf"),
            ]
        ],
    ],
)
def test_a_count_or_timeout_out_of_range_is_refused(
    tmp_path: Path, mesh_name: str, procs: list[Script], name: str, args: list[str], why: str
) -> None:
    # (they were taken: a producer "done: -1 messages acknowledged", a consumer waiting
    # for ever, or one whose --timeout inf broke its closing thread and outlived SIGTERM)
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns"]
    script = Script(tmp_path, name, [*common, *args])
    procs.append(script)
    assert script.popen.wait(timeout=60) == 2, script.report()
    prog = f"{Path(name).name}.py"
    assert script.stderr().splitlines()[-1] == f"{prog}: error: {why}", script.report()
    assert script.stdout() == ""


@pytest.mark.parametrize("args", [[], ["--handler"]])
def test_a_consumer_with_a_timeout_past_what_one_wait_takes_stops_at_a_signal(
    tmp_path: Path, mesh_name: str, procs: list[Script], args: list[str]
) -> None:
    # (a wait past threading.TIMEOUT_MAX is an OverflowError: it broke the thread that
    # ends the iteration, and SIGTERM no longer stopped the consumer)
    temp = tmp_path / "temp"  # (the script's TemporaryDirectory is made in here)
    temp.mkdir()
    common = ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns"]
    env = {**os.environ, "TMPDIR": str(temp)}
    script = Script(tmp_path, "consumer", [*common, "--timeout", "1e300", *args], env=env)
    procs.append(script)
    script.wait_for(ADDRESS_RE)
    script.popen.send_signal(signal.SIGTERM)
    assert script.popen.wait(timeout=30) == 143, script.report()
    assert "Traceback" not in script.stderr(), script.report()
    assert list(temp.iterdir()) == []


@pytest.mark.parametrize("args", [[], ["--handler"]])
def test_a_payload_that_is_not_utf8_is_printed(
    tmp_path: Path,
    mesh_name: str,
    procs: list[Script],
    make_node: Callable[..., zmesh.Node],
    args: list[str],
) -> None:
    consumer = Script(
        tmp_path,
        "consumer",
        ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns", "--count", "1", *args],
    )
    procs.append(consumer)
    producer = make_node("producer", seeds=[consumer.wait_for(ADDRESS_RE).group(1)])
    producer.topic("readings", groups=["printers"])
    producer.publish("readings", b"\xff\xfe 21.5", key="raw").wait_acked(timeout=60)
    assert consumer.popen.wait(timeout=30) == 0, consumer.report()
    assert "received \ufffd\ufffd 21.5 (key raw)" in consumer.stdout()


# -- examples/metrics_pipeline/run.py, up to where Spark would start ------------------

PIPELINE = "metrics_pipeline/run"
MARKER = ".metrics_pipeline"  # (run.py's, in a workdir it made)


def children_of(pid: int) -> list[int]:
    """The pids of the processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # (it ended meanwhile)
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def grandchildren() -> Iterator[list[int]]:
    """Pids of processes a test's children started: any still running at the end is
    killed by its pid."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if running(pid):
            os.kill(pid, signal.SIGKILL)


def test_pipeline_refuses_a_workdir_not_its_own(tmp_path: Path, procs: list[Script]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine\n")
    run = Script(tmp_path, PIPELINE, ["--workdir", str(work)])
    procs.append(run)
    assert run.popen.wait(timeout=60) == 2, run.report()
    assert run.stderr().splitlines() == [
        f"run.py: --workdir {work} is not empty and not run.py's; give a new or empty directory"
    ]
    assert [p.name for p in work.iterdir()] == ["notes.txt"]


def test_pipeline_refuses_a_workdir_in_use(
    tmp_path: Path, procs: list[Script], make_node: Callable[..., zmesh.Node]
) -> None:
    work = tmp_path / "work"
    (work / "windows").mkdir(parents=True)
    (work / MARKER).touch()
    (work / "windows" / "batch=0").write_text("a running pipeline's\n")
    make_node("bridge", data_dir=str(work / "bridge"))  # (its data dir, locked)
    run = Script(tmp_path, PIPELINE, ["--workdir", str(work)])
    procs.append(run)
    assert run.popen.wait(timeout=60) == 1, run.report()
    assert run.stderr().splitlines()[-1] == f"run.py: another run (pid {os.getpid()}) uses {work}"
    assert (work / "windows" / "batch=0").exists()


def test_pipeline_reports_a_pager_that_fails_to_start(
    tmp_path: Path, procs: list[Script], make_node: Callable[..., zmesh.Node]
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / MARKER).touch()
    make_node("pager", data_dir=str(work / "pager"))  # (so the pager's data dir is in use)
    run = Script(tmp_path, PIPELINE, ["--workdir", str(work)])
    procs.append(run)
    assert run.popen.wait(timeout=60) == 1, run.report()
    err = run.stderr()
    assert "run.py: alerts_consumer.py exited with code 1\n" in err, err
    assert f"alerts_consumer: data dir '{work / 'pager'}' is in use" in err, err
    assert "Traceback" not in err
    assert not (work / "logs" / "sensors.err").exists()  # (nothing was started after it)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_pipeline_stops_its_children_on_a_signal(
    tmp_path: Path, procs: list[Script], grandchildren: list[int], signum: signal.Signals
) -> None:
    run = Script(tmp_path, PIPELINE, ["--workdir", str(tmp_path / "work")])
    procs.append(run)
    run.wait_for(re.compile(r"^pager up: control", re.M), timeout=60)
    grandchildren.extend(children_of(run.popen.pid))
    assert grandchildren, run.report()
    run.popen.send_signal(signum)
    assert run.popen.wait(timeout=60) == 128 + signum, run.report()
    assert run.stderr().splitlines()[-1] == f"run.py: stopped by {signum.name}"
    assert [pid for pid in grandchildren if running(pid)] == []


def test_sensors_stop_on_ctrl_c(tmp_path: Path, mesh_name: str, procs: list[Script]) -> None:
    data = tmp_path / "sensors"
    sensors = Script(
        tmp_path,
        "metrics_pipeline/sensors",
        ["--mesh", mesh_name, "--interface", "127.0.0.1", "--no-mdns", "--sensors", "1"]
        + ["--data-dir", str(data)],
    )
    procs.append(sensors)
    # (its readings wait for a bridge that never comes)
    wait_until(lambda: (data / "sensor-1").exists(), 30, what="sensor-1's data dir")
    sensors.popen.send_signal(signal.SIGINT)
    assert sensors.popen.wait(timeout=30) == 130, sensors.report()
    assert sensors.stderr().splitlines()[-1] == "sensors: stopped by SIGINT"
    assert "Traceback" not in sensors.stderr()


# -- a signal while a script is busy ---------------------------------------------------
# Each script waits for SIGINT and SIGTERM on a thread of its own, which tells the main
# thread to stop; the main thread closes the node(s) on its normal path. Here the signal
# comes while the script is at work: messages published and delivered but not acked
# (producer, sensors), an alert handled (alerts_consumer).


def busy_script(
    tmp_path: Path, procs: list[Script], make_node: Callable[..., zmesh.Node], name: str
) -> Script:
    """``name`` started against a node of the test's, and seen at work; its temp dirs (the
    producer's data dir) in tmp_path/temp."""
    peer = make_node("peer")
    args = ["--mesh", peer.config.mesh, "--seed", peer.control_address]
    args += ["--interface", "127.0.0.1", "--no-mdns"]
    if name == "producer":
        sub = peer.subscribe("readings", group="printers")
        args += ["--count", "50"]
    elif name == "metrics_pipeline/sensors":
        sub = peer.subscribe("metrics", group="spark")
        args += ["--sensors", "2", "--readings", "50", "--data-dir", str(tmp_path / "sensors")]
    else:
        peer.topic("alerts", groups=["pager"])
        alert = {"sensor": "s", "window_start": "w", "avg_value": 90, "max_value": 91}
        peer.publish("alerts", json.dumps({**alert, "readings": 10}))
        args += ["--data-dir", str(tmp_path / "pager")]
    temp = tmp_path / "temp"
    temp.mkdir()
    script = Script(tmp_path, name, args, env={**os.environ, "TMPDIR": str(temp)})
    procs.append(script)
    if name == "metrics_pipeline/alerts_consumer":
        script.wait_for(re.compile(r"^ALERT s window w avg=90.0", re.M))  # (its handler ran)
    else:
        # A message came and is left unacked: the script is waiting for its acks.
        def delivered() -> bool:
            return bool(sub.fetch(1, timeout=0.1)) or script.popen.poll() is not None

        wait_until(delivered, 30, what=f"a message from {name}")
        assert script.popen.poll() is None, script.report()
    return script


def assert_stopped(
    tmp_path: Path, script: Script, signums: list[signal.Signals], children: list[int]
) -> None:
    """It exited 128 + one of ``signums``, saying which in one line, and left no process
    and no temp dir behind."""
    code = script.popen.wait(timeout=30)
    assert code - 128 in signums, script.report()
    prog = Path(script.out.name).stem  # (Script's label: the script's name)
    last = script.stderr().splitlines()[-1]
    assert last == f"{prog}: stopped by {signal.Signals(code - 128).name}", script.report()
    assert "Traceback" not in script.stderr(), script.report()
    assert [pid for pid in children if running(pid)] == []
    assert list((tmp_path / "temp").iterdir()) == []


@pytest.mark.parametrize(
    ("name", "signum"),
    [
        ("producer", signal.SIGTERM),
        ("producer", signal.SIGINT),
        ("metrics_pipeline/sensors", signal.SIGTERM),
        ("metrics_pipeline/alerts_consumer", signal.SIGTERM),
    ],
)
def test_a_signal_stops_a_busy_script(
    tmp_path: Path,
    procs: list[Script],
    make_node: Callable[..., zmesh.Node],
    name: str,
    signum: signal.Signals,
) -> None:
    script = busy_script(tmp_path, procs, make_node, name)
    children = children_of(script.popen.pid)  # (none so far: each script is one process)
    script.popen.send_signal(signum)
    assert_stopped(tmp_path, script, [signum], children)


@pytest.mark.parametrize(
    "name", ["producer", "metrics_pipeline/sensors", "metrics_pipeline/alerts_consumer"]
)
def test_more_signals_while_it_stops_change_nothing(
    tmp_path: Path, procs: list[Script], make_node: Callable[..., zmesh.Node], name: str
) -> None:
    # (Ctrl-C pressed again and again.) Raised from a handler, as these scripts once did,
    # each would land wherever the first one's unwinding had got to: inside the node's
    # close, the temp dir's removal, the exit. Blocked, they are never delivered: the
    # script ends as at the one its thread took (SIGTERM, or SIGINT when one was pending
    # with it: sigwait takes the lowest).
    script = busy_script(tmp_path, procs, make_node, name)
    children = children_of(script.popen.pid)
    script.popen.send_signal(signal.SIGTERM)

    def interrupted_until_gone() -> bool:
        if script.popen.poll() is None:
            script.popen.send_signal(signal.SIGINT)
        return script.popen.poll() is not None

    wait_until(interrupted_until_gone, 30, interval=0.001, what=f"{name} to exit")
    assert_stopped(tmp_path, script, [signal.SIGTERM, signal.SIGINT], children)
