"""Reading a node definition: a node's TOML file, which may also define a Spark bridge."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from .config import NodeConfig
from .errors import ConfigError

if TYPE_CHECKING:
    from .spark import BridgeConfig


def read_definition(path: str | Path) -> tuple[NodeConfig, BridgeConfig | None]:
    """The node's config and, when the file has a ``[bridge]`` table, the Spark bridge's."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return NodeConfig.from_toml(path), None  # raises with the file's name and the cause
    bridge = data.pop("bridge", None)
    node_cfg = NodeConfig.from_mapping(data, source=str(path))
    if bridge is None:
        return node_cfg, None
    if not isinstance(bridge, dict):
        raise ConfigError(f"{path}: [bridge] must be a table of BridgeConfig settings")
    from .spark import BridgeConfig

    return node_cfg, BridgeConfig.from_mapping(bridge, source=str(path))
