"""toyvla: a third policy family that lives entirely here, to show that a family is one package.

It brings its adapter (below), its settings section (``schema.yaml`` beside this file,
``policy.toyvla``), its own HTTP server (``server.py``: ``POST /toy/act`` with JSON, ready at
``GET /toy/ready``, no metadata), its part of the CPU reference server
(``reference_server.py``: the same routes, answered by the reference server's policy) and a
config (``config.yaml``). A run registers it the way a user registers theirs:
``policy.family_modules: [toyvla]`` with this folder's parent on ``PYTHONPATH``;
``server.backend: family`` starts its own server, ``server.backend: reference`` the reference
server with its part.

The server answers every observation with ``chunk`` LIBERO actions that hold the arm still,
the gripper open or closed, and marks its answers ``"server": "toyvla"``; the adapter refuses
an answer without that mark, so an episode without an error came back through this server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import yaml

from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.endpoint import ConnectionSpec
from libero_eval.policy.errors import PolicyResponseError
from libero_eval.policy.families import Family, FamilyServer, ReferencePart

SCHEMA = yaml.safe_load((Path(__file__).with_name("schema.yaml")).read_text(encoding="utf-8"))
ACT_PATH, READY_PATH = "/toy/act", "/toy/ready"
MARK = "toyvla"


class ToyVlaAdapter(PolicyAdapter):
    """Observations -> ``{"request_id", "prompt", "brightness", "chunk", "gripper"}``;
    ``{"server": "toyvla", "actions": [B][chunk][7]}`` -> LIBERO actions."""

    family: ClassVar[str] = "toyvla"

    def __init__(self, settings: dict[str, Any]):
        self.chunk = int(settings["chunk"])
        self.gripper = str(settings["gripper"])

    @classmethod
    def check_run_config(cls, config: dict[str, Any]) -> None:
        if config["rollout"]["send_privileged_state"]:
            raise ValueError(
                "rollout.send_privileged_state: toyvla's server reads no privileged state; "
                "set it to false"
            )

    def prompt_key(self, obs: Observation) -> str:
        return obs.task_language

    def build_request(self, observations: list[Observation], request_id: str) -> dict[str, Any]:
        return {
            "request_id": request_id,
            "prompt": observations[0].task_language,
            "brightness": [float(obs.agentview.mean()) for obs in observations],
            "chunk": self.chunk,
            "gripper": self.gripper,
        }

    def parse_response(self, response: dict[str, Any], batch_size: int) -> np.ndarray:
        if response.get("server") != MARK:
            raise PolicyResponseError(f"not an answer of toyvla's server: {response!r:.200}")
        actions = np.asarray(response.get("actions"), dtype=np.float64)
        if actions.shape != (batch_size, self.chunk, 7):
            raise PolicyResponseError(
                f"toyvla answered actions of shape {actions.shape}, expected "
                f"{(batch_size, self.chunk, 7)}"
            )
        return actions

    def outcome_settings(self) -> dict[str, Any]:
        return {"family": self.family, "toyvla": {"chunk": self.chunk, "gripper": self.gripper}}


def endpoint(url: str, settings: dict[str, Any]) -> ConnectionSpec:
    """JSON to its own routes; it has no metadata (one observation per request)."""
    return ConnectionSpec(
        url, "http", "json", path=ACT_PATH, health_path=READY_PATH, metadata_path=None
    )


def reference_outcome(config: dict[str, Any]) -> dict[str, Any]:
    """The reference server's part of the fingerprint: its policy decides the actions."""
    return {
        "backend": "reference",
        "family": "toyvla",
        "policy": config["server"]["reference"]["policy"],
    }


FAMILY = Family(
    name="toyvla",
    title="toyvla",
    adapter=ToyVlaAdapter,
    endpoint=endpoint,
    backends=("family", "reference"),
    example_config="tests/families/toyvla/config.yaml",
    schema=SCHEMA,
    server=FamilyServer(
        command=("{python}", "-m", "toyvla.server", "--host", "{host}", "--port", "{port}"),
        health_path=READY_PATH,
    ),
    reference=ReferencePart(
        module="toyvla.reference_server",
        outcome=reference_outcome,
        selftest_checks=("policy.toyvla.chunk: the actions the server answers per observation",),
    ),
)
