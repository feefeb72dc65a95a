"""The rules of a run config that no one field's schema can say, each a named function whose
docstring states it: `libero_eval.config.check_config` runs :data:`RUN_RULES` in order on a
config the schema has checked and filled (`settings_schema`, the one validator of each field's
type, bounds and default). Each raises a `ConfigError` naming the fields and the fix.

A rule is ``rule(config, settings)``: the checked config and the run's
`libero_eval.config.RunSettings`, whose parts (protocol, adapter, shards, a slot's server
settings) are derived once and check themselves as they are built.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from libero_eval import suites as suite_catalog
from libero_eval.config_layout import ConfigError
from libero_eval.config_server import (
    CHECKPOINT_SERVERS,
    PATHLESS_BACKENDS,
    gpus_per_slot,
    slot_urls,
)
from libero_eval.policy import families


def scripted_expert(config: dict[str, Any]) -> bool:
    """Whether the server is the reference server's scripted expert."""
    server = config["server"]
    return server["backend"] == "reference" and server["reference"]["policy"] == "scripted"


def sends_privileged_state(config: dict[str, Any]) -> bool:
    """`rollout.send_privileged_state`; null (the default) sends it exactly to the reference
    server's scripted expert, which plans from it, so the schema's defaults run as they are."""
    value = config["rollout"]["send_privileged_state"]
    return scripted_expert(config) if value is None else bool(value)


def backend_serves_the_family(config: dict[str, Any], settings: Any) -> None:
    """`server.backend` is one of the backends `policy.family` lists (`Family.backends`), or
    `url`, a server the user runs, which may serve any family (its metadata is checked)."""
    backend, family = config["server"]["backend"], families.get(config["policy"]["family"])
    if backend != "url" and backend not in family.backends:
        served = [name for name in families.names() if backend in families.get(name).backends]
        raise ConfigError(
            f"server.backend {backend} does not serve policy.family {family.name} "
            f"({family.title}), which is served by {', '.join(family.backends)}: set "
            f"server.backend to one of them"
            + (f", or policy.family to {' or '.join(served)}" if served else "")
        )


# The key of `report.published` that stands for the run's suites pooled (the schema's
# description; `libero_eval.analysis.published` compares it with the overall row).
PUBLISHED_OVERALL = "overall"


def check_published_config(report: Mapping[str, Any], suite_names: list[str]) -> None:
    """Raise ValueError naming the field for what the schema cannot check (it checks each
    entry's rate, n and source): a published key that is neither `overall` nor a registered
    suite (a typo would otherwise never be compared), and a source that is only blanks."""
    for key, entry in (report.get("published") or {}).items():
        field = f"report.published.{key}"
        if key != PUBLISHED_OVERALL and key not in suite_names:
            close = difflib.get_close_matches(key, suite_names, n=3, cutoff=0.6)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise ValueError(
                f"{field}: {key!r} is not a suite name or {PUBLISHED_OVERALL!r}.{hint}"
            )
        if not str(entry["source"]).strip():
            raise ValueError(f"{field}.source: say where the figure comes from")


def episodes_and_published_suites_exist(config: dict[str, Any], settings: Any) -> None:
    """`plan.suites` (patterns too) select runnable suites, `plan.seed` and `plan.seeds` are
    not both set, and each `report.published` key is a suite or `overall`."""
    settings.shards  # noqa: B018 (planned: libero_eval.config.planned_episodes)
    check_published_config(config["report"], suite_catalog.registered_suites())


def reset_seeding_fits_the_protocol(config: dict[str, Any], settings: Any) -> None:
    """`rollout.reset_seeding: reference` only with a protocol whose reference stream the
    episode alone decides (openpi, cosmos: replayed; lerobot: seed + trial)."""
    protocol = settings.protocol
    reproducible = protocol.replays_reference_stream or protocol.seed_per_trial
    if config["rollout"]["reset_seeding"] == "reference" and not reproducible:
        raise ConfigError(
            f"rollout.reset_seeding: reference cannot reproduce protocol {protocol.name}: its "
            "reference seeds each reset from the env's rank and slot, not from the episode "
            "(docs/protocols.md); use reset_seeding: episode"
        )


def family_accepts_the_run(config: dict[str, Any], settings: Any) -> None:
    """The family's own whole-config rules (`PolicyAdapter.check_run_config`) hold, and its
    adapter builds (its statistics file loaded and checked)."""
    families.get(config["policy"]["family"]).adapter.check_run_config(config)
    settings.adapter  # noqa: B018


def each_slots_server_is_valid(config: dict[str, Any], settings: Any) -> None:
    """Every slot's serve-job settings pass `ServerSettings.from_dict` (schema and rules)."""
    for slot in range(config["server"]["num_slots"]):
        settings.server(slot)


def urls_name_one_server_per_slot(config: dict[str, Any], settings: Any) -> None:
    """With `server.backend: url`, `server.url.urls` lists one URL per slot
    (`server.num_slots`), each a different server (two slots on one server would share its
    batches and skew both capacity probes: give its shards `rollout.shards_per_slot`)."""
    server = config["server"]
    if server["backend"] != "url":
        return
    urls = server["url"]["urls"]
    lists = urls.items() if isinstance(urls, dict) else [(None, urls)]
    if not urls:
        raise ConfigError(
            "server.url.urls: required with server.backend url: the base URLs of the servers "
            "you run, one per slot, e.g. [http://127.0.0.1:30000]"
        )
    for checkpoint, listed in lists:
        named = slot_urls(config, checkpoint)
        field = named[0][0].rsplit("[", 1)[0] if named else "server.url.urls"
        if len(listed) != server["num_slots"]:
            raise ConfigError(
                f"{field} lists {len(listed)} URL(s) but server.num_slots is "
                f"{server['num_slots']}: one server per slot. Set server.num_slots: "
                f"{len(listed)}, or list {server['num_slots']} URLs"
            )
        seen: dict[str, str] = {}
        for name, url in named:
            if url in seen:
                raise ConfigError(
                    f"{name} {url} is {seen[url]} again: one server per slot. For more shards "
                    "on one server, list it once and raise rollout.shards_per_slot"
                )
            seen[url] = name


def envs_split_over_the_shards(config: dict[str, Any], settings: Any) -> None:
    """`rollout.total_num_envs`, a number, splits evenly over the server.num_slots x
    rollout.shards_per_slot shards."""
    server, rollout = config["server"], config["rollout"]
    num_shards = server["num_slots"] * rollout["shards_per_slot"]
    total_envs = rollout["total_num_envs"]
    if isinstance(total_envs, int) and total_envs % num_shards:
        raise ConfigError(
            f"rollout.total_num_envs ({total_envs}) must split evenly over the "
            f"{num_shards} shards (server.num_slots x rollout.shards_per_slot)"
        )


def gpu_ids_cover_the_slots(config: dict[str, Any], settings: Any) -> None:
    """`server.gpu_ids`, when given, lists a device for every GPU of every slot."""
    server = config["server"]
    gpu_ids, per_slot = server["gpu_ids"], gpus_per_slot(config)
    needed = server["num_slots"] * per_slot
    if gpu_ids is not None and len(gpu_ids) < needed:
        raise ConfigError(
            f"server.gpu_ids lists {len(gpu_ids)} devices but {server['num_slots']} slots x "
            f"{per_slot} GPUs each need {needed}: list them all, or use null"
        )


def privileged_state_only_for_the_expert(config: dict[str, Any], settings: Any) -> None:
    """`rollout.send_privileged_state` goes to the reference server only, and its scripted
    expert (`server.reference.policy: scripted`), which plans from it, gets it."""
    backend = config["server"]["backend"]
    if backend != "reference" and sends_privileged_state(config):
        raise ConfigError(
            "rollout.send_privileged_state is only for the reference server's scripted "
            f"expert; set it to false (or null) with server.backend {backend}"
        )
    if scripted_expert(config) and not sends_privileged_state(config):
        raise ConfigError(
            "server.reference.policy scripted plans from privileged state: set "
            "rollout.send_privileged_state: true (or use policy hold)"
        )


# What `libero_eval.config.check_config` checks, in order.
RUN_RULES = (
    backend_serves_the_family,
    episodes_and_published_suites_exist,
    reset_seeding_fits_the_protocol,
    family_accepts_the_run,
    urls_name_one_server_per_slot,
    gpu_ids_cover_the_slots,  # before the slots' settings, which would miss their GPUs
    each_slots_server_is_valid,
    envs_split_over_the_shards,
    privileged_state_only_for_the_expert,
)


def checkpoints_name_the_models(config: dict[str, Any], settings: Any) -> None:
    """With `checkpoints:` the backend takes a checkpoint (`config_server.CHECKPOINT_SERVERS`),
    `server.sglang.model_path` is left to them, servers take free ports (several checkpoints'
    servers run at once) and no self-test is asked (it judges one model)."""
    server = config["server"]
    backend = server["backend"]
    if backend not in CHECKPOINT_SERVERS and backend not in PATHLESS_BACKENDS:
        raise ConfigError(
            f"checkpoints: server.backend {backend} cannot evaluate checkpoints; use one of "
            f"{', '.join(CHECKPOINT_SERVERS)} (or evaluate one model without checkpoints:)"
        )
    if backend == "url" and not isinstance(server["url"]["urls"], dict):
        named = len(config["checkpoints"] or ())
        if named > 1:
            raise ConfigError(
                f"server.url.urls is a list with {named} checkpoints: each checkpoint needs "
                "servers of its own; map each checkpoint's name to its URLs "
                "(server.url.urls: {name: [url, ...]})"
            )
    if backend == "sglang" and server["sglang"]["model_path"] is not None:
        raise ConfigError(
            "server.sglang.model_path and checkpoints are both set: each checkpoint is served "
            "as the model, so leave server.sglang.model_path null (or drop checkpoints: to "
            "evaluate that one model)"
        )
    if server["port"]:
        raise ConfigError(
            f"server.port {server['port']} with checkpoints: servers of several checkpoints run "
            "at once and would take the same ports; set server.port: 0 (a free port each)"
        )
    if config["selftest"]["min_success_once"] is not None:
        raise ConfigError(
            "selftest.min_success_once with checkpoints: the self-test judges one model; run "
            "it without checkpoints:, or set it to null"
        )


# What `libero_eval.config.check_config` checks of a config with `checkpoints:` before each
# checkpoint's own config is checked by RUN_RULES (the first) or CHECKPOINT_SERVER_RULES.
CHECKPOINT_RULES = (checkpoints_name_the_models,)
# The rules a checkpoint's own config may break where the first checkpoint's did not: its
# server and the family's check of its model.
CHECKPOINT_SERVER_RULES = (
    backend_serves_the_family,
    family_accepts_the_run,
    each_slots_server_is_valid,
    privileged_state_only_for_the_expert,
)
