"""Child-process entry of the benchmarks: ``python -m benchmarks.worker ROLE PARAMS_JSON``.

An exception is reported as an ``error`` event with its traceback; a watchdog ends a worker
that outlives its ``deadline_s`` (the parent also terminates it by pid).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ._wio import Commands, emit


def _roles() -> dict[str, Callable[[dict[str, Any], Commands], None]]:
    from . import (
        nats_roles,
        raw_roles,
        redis_roles,
        spark_roles,
        subject_roles,
        zenoh_roles,
        zmesh_roles,
    )

    return {
        **raw_roles.ROLES,
        **zmesh_roles.ROLES,
        **spark_roles.ROLES,
        **subject_roles.ROLES,
        **nats_roles.ROLES,
        **redis_roles.ROLES,
        **zenoh_roles.ROLES,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.worker ROLE PARAMS_JSON", file=sys.stderr)
        return 2
    role, params = argv[0], json.loads(argv[1])
    roles = _roles()
    if role not in roles:
        emit("error", error=f"unknown role {role!r}; known: {sorted(roles)}")
        return 2
    cmds = Commands()
    deadline = params.get("deadline_s", 600.0)
    # A last resort against a hung worker: the parent also terminates it by pid.
    watchdog = threading.Timer(deadline + 30.0, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    try:
        roles[role](params, cmds)
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
