"""The one validator: `settings_schema.load` builds a settings dataclass from a mapping of its
fields, checked by the schema alone (each field against its section's subschema, defaults
filled), then the class's named cross-field rules; every error names `section.field`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from libero_eval import settings_schema
from libero_eval.failures import FailurePolicy
from libero_eval.settings_schema import Rule, field_schema, load


class LoadError(ValueError):
    pass


def batch_fits_the_envs(settings: Envs, where: str) -> str | None:
    """A test rule: the batch is at most the envs."""
    if settings.batch > settings.envs_per_shard:
        return f"{where}.batch: {settings.batch} exceeds {where}.envs_per_shard"
    return None


@dataclass(frozen=True)
class Videos:
    SECTION: ClassVar[tuple[str, ...]] = ("rollout", "videos")

    enabled: bool
    frame_stride: int


@dataclass(frozen=True)
class Envs:
    """Projects a few `rollout` fields, with a job's own field and a nested section."""

    SECTION: ClassVar[tuple[str, ...]] = ("rollout",)
    RULES: ClassVar[tuple[Rule, ...]] = (batch_fits_the_envs,)

    envs_per_shard: int
    batch_timeout_s: float
    batch: int = field(metadata=field_schema({"type": "integer", "minimum": 1}))
    gpus: tuple[int, ...] = field(
        default=(), metadata=field_schema({"type": "array", "items": {"type": "integer"}})
    )
    videos: Videos | None = None


def test_a_field_left_out_takes_the_schemas_default_and_values_take_their_types():
    envs = load(Envs, {"batch": 1, "gpus": [0, 1], "videos": {}})
    assert envs.envs_per_shard == settings_schema.default("rollout", "envs_per_shard")
    assert envs.batch_timeout_s == settings_schema.default("rollout", "batch_timeout_s")
    assert envs.gpus == (0, 1)  # a list, as JSON has it, read as the tuple the field is
    assert envs.videos == Videos(
        enabled=settings_schema.default("rollout", "videos", "enabled"),
        frame_stride=settings_schema.default("rollout", "videos", "frame_stride"),
    )
    assert type(load(Envs, {"batch": 1, "batch_timeout_s": 2}).batch_timeout_s) is float


def test_the_mapping_given_is_not_changed():
    data = {"batch": 1, "videos": {}}
    load(Envs, data)
    assert data == {"batch": 1, "videos": {}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # a config field: the section's subschema, in jsonschema's words, with its description
        (
            {"batch": 1, "envs_per_shard": 0},
            r"rollout\.envs_per_shard: 0 is less than the minimum of 1 \(rollout\.envs_per_shard: "
            r"LIBERO env worker processes",
        ),
        ({"batch": 1, "envs_per_shard": True}, r"rollout\.envs_per_shard: True is not of type"),
        # a job's own field: the schema of its metadata
        ({"batch": 0}, r"rollout\.batch: 0 is less than the minimum of 1"),
        ({}, r"rollout\.batch: required but missing"),
        # a nested section, named with its path
        ({"batch": 1, "videos": {"frame_stride": 0}}, r"rollout\.videos\.frame_stride: 0 is less"),
        # an unknown field: a close name, or where a field of that name lives
        ({"batch": 1, "envs_per_shardd": 2}, r"did you mean rollout\.envs_per_shard\?"),
        (
            {"batch": 1, "request_retries": 2},
            r"rollout\.request_retries: 'request_retries' was unexpected: rollout has no such "
            r"field; rollout\.failures\.request_retries is a field of that name: move it there",
        ),
        # a cross-field rule, named by the class
        ({"batch": 9, "envs_per_shard": 2}, r"rollout\.batch: 9 exceeds rollout\.envs_per_shard"),
        ("not a mapping", r"rollout: 'not a mapping' is not of type 'object'"),
    ],
)
def test_a_bad_value_is_named_with_its_field(data, message):
    with pytest.raises(LoadError, match=message):
        load(Envs, data, error=LoadError)


def test_every_bad_field_is_named_at_once_and_where_renames_the_section():
    with pytest.raises(ValueError) as error:
        load(Envs, {"batch": 0, "envs_per_shard": 0}, where="shard")
    assert "shard.batch: 0 is less" in str(error.value)
    assert "shard.envs_per_shard: 0 is less" in str(error.value)


def test_a_section_given_by_hand_and_build():
    assert load(FailurePolicy, {}, section=("rollout", "failures")) == FailurePolicy.defaults()
    assert settings_schema.build(Videos, "rollout", "videos", enabled=True).enabled is True
    with pytest.raises(ValueError, match=r"rollout\.videos\.frame_stride: 'x' is not of type"):
        settings_schema.build(Videos, "rollout", "videos", frame_stride="x")


def test_a_section_as_a_mapping_is_checked_and_filled():
    pi05 = settings_schema.checked({"api": "sglang_websocket"}, "policy", "pi05")
    assert pi05["image_size"] == settings_schema.default("policy", "pi05", "image_size")
    with pytest.raises(ValueError, match=r"policy\.pi05\.api: 'x' is not one of"):
        settings_schema.checked({"api": "x"}, "policy", "pi05")


def test_the_class_schema_is_the_sections_subschema_and_its_own_fields():
    node = settings_schema.class_schema(Envs)
    rollout = settings_schema.section("rollout")["properties"]
    assert node["properties"]["envs_per_shard"] is rollout["envs_per_shard"]
    assert node["properties"]["batch"] == {"type": "integer", "minimum": 1}
    assert node["properties"]["videos"]["type"] == ["object", "null"]
    assert node["additionalProperties"] is False
    assert node["required"] == ["batch"]  # the others have a schema or a Python default
