"""examples/producer.py and examples/consumer.py, run against each other as processes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import spawn, wait_until

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ADDRESS_RE = re.compile(r"consumer up: control (127\.0\.0\.1:\d+)")


class Script:
    """An example script as a child process; stdout and stderr go to files."""

    def __init__(self, tmp_path: Path, name: str, args: list[str]) -> None:
        self.out = tmp_path / f"{name}.out"
        self.err = tmp_path / f"{name}.err"
        with self.out.open("wb") as out, self.err.open("wb") as err:
            self.popen = spawn(
                [str(EXAMPLES / f"{name}.py"), *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def report(self) -> str:
        return f"stdout:\n{self.stdout()}\nstderr:\n{self.err.read_text(errors='replace')}"

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
