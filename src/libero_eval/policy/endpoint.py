"""Where a policy server listens and how it talks (:class:`ConnectionSpec`).

Each family derives its own from its settings (``Family.endpoint``,
``libero_eval.policy.families``); ``libero_eval.policy.connection.connect`` picks the
connection that speaks it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from libero_eval.policy.connection_base import WIRE_FORMATS

CHANNELS = ("http", "websocket")
# SGLang's HTTP action API, the default of an HTTP endpoint
GENERATIONS_PATH = "/v1/actions/generations"
METADATA_PATH = "/v1/actions/metadata"


@dataclass(frozen=True)
class ConnectionSpec:
    """Where a policy server listens and how it talks.

    ``url``: ``http://HOST:PORT``; ``channel``: the wire protocol, ``http`` or ``websocket``
    (not the episode protocol of ``rollout.protocol``); ``wire_format``: the body encoding,
    ``msgpack`` or ``json`` (websocket: msgpack only); ``path``: the websocket path
    (websocket) or the path requests are POSTed to (http, "" = SGLang's
    ``/v1/actions/generations``); ``health_path``: answered with HTTP 200 once the server is
    ready; ``metadata_path``: ``GET`` it for the server's metadata (http; None: the server
    has none, and a request carries one observation).
    """

    url: str
    channel: str = "http"
    wire_format: str = "msgpack"
    path: str = ""
    health_path: str = "/health"
    metadata_path: str | None = METADATA_PATH

    def __post_init__(self) -> None:
        if self.channel not in CHANNELS:
            raise ValueError(f"policy connection channel {self.channel!r} is not one of {CHANNELS}")
        if self.wire_format not in WIRE_FORMATS:
            raise ValueError(
                f"policy connection wire_format {self.wire_format!r} is not one of "
                f"{WIRE_FORMATS} (set by the family's settings under policy.<family>)"
            )
        if self.channel == "websocket" and self.wire_format != "msgpack":
            raise ValueError("a websocket policy server speaks msgpack only (openpi's protocol)")
        for name in ("health_path", "metadata_path"):
            value = getattr(self, name)
            if value is not None and not value.startswith("/"):
                raise ValueError(f"{name.replace('_', ' ')} must start with '/', got {value!r}")
        if self.channel == "http" and self.path and not self.path.startswith("/"):
            raise ValueError(f"request path must start with '/', got {self.path!r}")

    @property
    def request_path(self) -> str:
        """Where an HTTP request is POSTed."""
        return self.path or GENERATIONS_PATH

    def at(self, url: str) -> ConnectionSpec:
        """The same endpoint at ``url`` (a job learns its server's URL from the service file)."""
        return replace(self, url=url)
