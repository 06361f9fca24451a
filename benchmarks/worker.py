"""Child-process entry of the benchmarks: ``python -m benchmarks.worker ROLE PARAMS_JSON``.

An exception is reported as an ``error`` event with its traceback; a watchdog ends a worker
that outlives its ``deadline_s`` (the parent also terminates it by pid).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ._wio import Commands, emit

# Each role's module, by the role's first word. A worker imports only the module of the
# role it runs, so a peer's client (asyncio for NATS) is not in a zmesh worker's RSS.
MODULES = {
    "raw": "raw_roles",
    "zmesh": "zmesh_roles",
    "spark": "spark_roles",
    "rr": "subject_roles",
    "subj": "subject_roles",
    "nats": "nats_roles",
    "redis": "redis_roles",
    "zenoh": "zenoh_roles",
}


def _role(name: str) -> Callable[[dict[str, Any], Commands], None]:
    module = MODULES.get(name.split("_")[0])
    if module is None:
        raise LookupError(f"unknown role {name!r}: roles begin with one of {sorted(MODULES)}")
    roles: dict[str, Callable[[dict[str, Any], Commands], None]] = importlib.import_module(
        f"{__package__}.{module}"
    ).ROLES
    if name not in roles:
        raise LookupError(f"unknown role {name!r}; {module} has {sorted(roles)}")
    return roles[name]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.worker ROLE PARAMS_JSON", file=sys.stderr)
        return 2
    role, params = argv[0], json.loads(argv[1])
    try:
        run = _role(role)
    except LookupError as exc:
        emit("error", error=str(exc))
        return 2
    cmds = Commands()
    deadline = params.get("deadline_s", 600.0)
    # A last resort against a hung worker: the parent also terminates it by pid.
    watchdog = threading.Timer(deadline + 30.0, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    try:
        run(params, cmds)
    except SystemExit:
        pass
    except BaseException as exc:
        emit("error", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        return 1
    finally:
        watchdog.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
