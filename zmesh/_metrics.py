"""A Prometheus endpoint per node: every counter and gauge that ``status`` shows.

Needs the ``metrics`` extra (prometheus-client). Values are read from the node's status
at each scrape, so the endpoint never disagrees with ``zmesh status``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .config import parse_seed
from .errors import ConfigError

if TYPE_CHECKING:
    from .node import Node


class MetricsServer:
    """The HTTP endpoint of one node's metrics."""

    def __init__(self, node: Node, address: str) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
            from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        except ImportError as exc:
            raise ConfigError("metrics_address needs prometheus-client: "
                              "pip install 'zmesh[metrics]'") from exc
        host, port = parse_seed(address, what="metrics_address", allow_port_zero=True)
        self._node = node
        self._counter = CounterMetricFamily
        self._gauge = GaugeMetricFamily
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        self._server, self._thread = start_http_server(port, host, registry=registry)
        self.address = f"{host}:{self._server.server_port}"

    def collect(self) -> Iterator[object]:
        st = self._node.status()
        labels = {"node": st["node"]["name"], "mesh": st["node"]["mesh"]}
        keys, values = list(labels), list(labels.values())
        events = self._counter("zmesh_events", "Node events by kind", labels=[*keys, "event"])
        for event, n in sorted(st["counters"].items()):
            events.add_metric([*values, event], n)
        yield events
        outbox = self._gauge("zmesh_outbox_messages", "Unacknowledged messages in the outbox",
                             labels=keys)
        outbox.add_metric(values, st["outbox"])
        yield outbox
        lane_keys = [*keys, "topic", "lane", "group"]
        gauges = {name: self._gauge(f"zmesh_lane_{name}", f"Lane {name.replace('_', ' ')}",
                                    labels=lane_keys)
                  for name in ("pending", "ready", "in_flight", "members")}
        lane_events = self._counter("zmesh_lane_events", "Lane events by kind",
                                    labels=[*lane_keys, "event"])
        for lane in st["lanes"]:
            lv = [*values, lane["topic"], lane["lane"], lane["group"]]
            for name, g in gauges.items():
                v = lane[name]
                g.add_metric(lv, len(v) if isinstance(v, list) else v)
            for event in ("acked", "nacked", "expired", "ack_timeouts", "dead_lettered",
                          "superseded"):
                lane_events.add_metric([*lv, event], lane.get(event, 0))
        yield from gauges.values()
        yield lane_events
        peers = self._gauge("zmesh_peers", "Peers by liveness", labels=[*keys, "alive"])
        alive = sum(1 for p in st["peers"] if p["alive"])
        peers.add_metric([*values, "true"], alive)
        peers.add_metric([*values, "false"], len(st["peers"]) - alive)
        yield peers

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_metrics(node: Node, address: str) -> MetricsServer:
    """Start the endpoint of ``node`` at ``address`` (``host:port``, port 0 for any)."""
    return MetricsServer(node, address)
