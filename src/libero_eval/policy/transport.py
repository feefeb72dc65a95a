"""The client an adapter's transport needs: HTTP (SGLang's action API) or websocket (openpi)."""

from __future__ import annotations

from libero_eval.policy.adapters.base import PolicyAdapter
from libero_eval.policy.client import PolicyClient
from libero_eval.policy.ws_client import WebsocketPolicyClient


def make_client(
    url: str,
    adapter: PolicyAdapter,
    timeout_s: float = 600,
    max_retries: int = 5,
    retry_backoff_s: float = 1.0,
) -> PolicyClient | WebsocketPolicyClient:
    """A client for ``url`` speaking ``adapter``'s connection and wire format."""
    if adapter.connection == "websocket":
        return WebsocketPolicyClient(
            url,
            adapter.websocket_path,
            timeout_s=timeout_s,
            max_retries=max_retries,
            retry_backoff_s=retry_backoff_s,
            health_path=adapter.health_path,
        )
    if adapter.connection != "http":
        raise ValueError(f"adapter connection {adapter.connection!r} is not 'http' or 'websocket'")
    return PolicyClient(
        url,
        timeout_s=timeout_s,
        max_retries=max_retries,
        retry_backoff_s=retry_backoff_s,
        transport=adapter.wire_format,
    )
