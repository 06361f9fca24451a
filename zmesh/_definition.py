"""Reading a node definition: a node's TOML file, which may also hold a ``[bridge]`` table
(the Spark bridge's, which zmesh.spark reads: the core knows nothing of it)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from .config import NodeConfig
from .errors import ConfigError


def read_definition(path: str | Path) -> tuple[NodeConfig, dict[str, Any] | None]:
    """The node's config and, when the file has one, its ``[bridge]`` table as it is."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return NodeConfig.from_toml(path), None  # raises with the file's name and the cause
    bridge = data.pop("bridge", None)
    node_cfg = NodeConfig.from_mapping(data, source=str(path))
    if bridge is not None and not isinstance(bridge, dict):
        raise ConfigError(f"{path}: [bridge] must be a table of BridgeConfig settings")
    return node_cfg, bridge
