"""Policy families: one package per model family, and the registry the rest of the package asks.

A family is a package that defines ``FAMILY``, a :class:`Family`: its adapter and math, its
endpoint (a :class:`~libero_eval.policy.endpoint.ConnectionSpec` from its settings), the
server backends that serve it and, where it has them, its own server command, its part of the
reference server (:class:`ReferencePart`: its routes, settings and part of the rollout
fingerprint), and its older-layout upgrade. Its settings are the config section
``policy.<name>`` (``Family.schema``, merged into the config schema when the family is
registered; a built-in family's is the ``schema.yaml`` of its package, :func:`load_schema`),
and ``policy.family``'s choices are the registered families.

Families are found three ways, none of which adds a line here:

- the packages under ``libero_eval/policy/families/`` (the built-in ``cosmos3`` and ``pi05``);
- installed distributions that declare an entry point in the group ``libero_eval.families``
  (``[project.entry-points."libero_eval.families"] mine = "my_package"``);
- the modules a config lists in ``policy.family_modules`` (importable names: an installed
  package, or one on ``PYTHONPATH``), imported before the config is validated.

``config``, ``policy.connection``, ``reference/``, ``serve/``, ``rollout/``, ``report/`` and the
self-test name no family; they ask this registry (docs/design.md, "Adding a policy family";
docs/rfcs/0009-family-plug-ins.md).
"""

from __future__ import annotations

import hashlib
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from libero_eval import package_data, settings_schema
from libero_eval.policy.adapter import Observation, PolicyAdapter
from libero_eval.policy.endpoint import ConnectionSpec

ENTRY_POINT_GROUP = "libero_eval.families"
MODULES_FIELD = "policy.family_modules"


@dataclass(frozen=True)
class FamilyServer:
    """A family's own policy server, run for ``server.backend: family``: its command line, in
    which ``{python}`` (the serve job's interpreter), ``{host}`` and ``{port}`` are replaced
    at launch, the path it answers with HTTP 200 once ready, and whether it runs on a GPU (its
    serve job then asks for one and is pinned to the slot's, as SGLang's)."""

    command: tuple[str, ...]
    health_path: str = "/health"
    gpu: bool = False


@dataclass(frozen=True)
class ReferencePart:
    """A family's part of the CPU reference server (``server.backend: reference``, the
    self-test's server), which then serves it.

    - ``module``: the importable name of its server part, imported by the reference server
      alone (it defines ``Settings`` and ``add_routes(app, host, settings)``;
      :mod:`libero_eval.policy.reference_host` says what the server hands it).
    - ``outcome``: ``config -> the reference server's part of the rollout fingerprint``.
    - ``settings``: ``config -> the values of its Settings`` as the server takes them, where
      the whole config decides one (a checkpoint's own statistics); None: its fields of
      ``server.reference`` as the config gives them.
    - ``schema``: the fields it adds to ``server.reference`` (field -> its schema), merged
      into the config schema at registration; None: none, or merged already
      (:func:`load_schema`).
    - ``selftest_checks``: what to check when the self-test fails for this family (its
      conventions that the scripted expert's answers go through), named by the verdict.
    """

    module: str
    outcome: Callable[[dict[str, Any]], dict[str, Any]]
    settings: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    schema: Mapping[str, Any] | None = None
    selftest_checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class Family:
    """One model family, as its package declares it (``FAMILY = Family(...)``).

    - ``name``: the value of ``policy.family``; its settings are ``policy.<name>``.
    - ``title``: how messages name it (``π0.5``).
    - ``adapter``: its :class:`PolicyAdapter` subclass (observations -> request, answer ->
      actions, its statistics and outcome settings, its whole-config check).
    - ``endpoint``: ``(url, settings) -> ConnectionSpec``: where and how its server talks.
    - ``backends``: the ``server.backend`` values that can serve it.
    - ``example_config``: a ready config, named in messages.
    - ``schema``: its ``policy.<name>`` section (a JSON-schema mapping), merged into the
      config schema at registration; None where it is there already (a built-in family's
      package merges its ``schema.yaml`` when imported, :func:`load_schema`).
    - ``server``: its own server (``server.backend: family``), or None.
    - ``settings``: ``config -> policy.<name>`` as the adapter takes it, where the whole
      config decides a field (π0.5's checkpoint); None takes the section as it is.
    - ``upgrade``: ``policy -> messages``: an older layout moved into ``policy.<name>`` before
      validation (raises ``ValueError`` where it cannot be); None when there is none.
    - ``reference``: its part of the reference server (:class:`ReferencePart`), given
      exactly when ``backends`` lists ``reference``; None: the reference server does not
      serve it.
    - ``statistics_field``: the field a bad statistics file is reported under.
    - ``graph_batches``: ``config -> merged batch sizes`` whose CUDA graphs the run's server
      keys by batch size alone and keeps, which the capacity probe sends once each before
      the server is ready (`libero_eval.policy.capacity.warm_graphs`); None or () for none.
    - ``sglang_warmup``: ``config -> sglang serve arguments`` that make SGLang's own start-up
      warm-up run the run's request shape (added unless ``server.sglang.extra_args`` sets a
      ``--warmup-*`` flag itself); None: SGLang's default.
    - ``sglang_server_gib``: the GPU memory (GiB) its SGLang server takes while it serves,
      for a family whose pipeline keeps its weights resident whatever is free (it declares
      no ``keep_resident_min_available_gb``): the env renderers of ``rollout.total_num_envs:
      auto`` may take the rest of the GPU. None: they take ``rollout.auto.RENDER_GPU_SHARE``
      of it, which leaves a threshold of 120 GiB free on an H200.
    """

    name: str
    title: str
    adapter: type[PolicyAdapter]
    endpoint: Callable[[str, dict[str, Any]], ConnectionSpec]
    backends: tuple[str, ...]
    example_config: str | None = None
    schema: Mapping[str, Any] | None = None
    server: FamilyServer | None = None
    settings: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    upgrade: Callable[[dict[str, Any]], list[str]] | None = None
    reference: ReferencePart | None = None
    statistics_field: str | None = None
    graph_batches: Callable[[dict[str, Any]], tuple[int, ...]] | None = None
    sglang_warmup: Callable[[dict[str, Any]], tuple[str, ...]] | None = None
    sglang_server_gib: float | None = None

    def __post_init__(self) -> None:
        if self.adapter.family != self.name:
            raise ValueError(
                f"family {self.name!r}: its adapter {self.adapter.__name__} says family "
                f"{self.adapter.family!r}; give them one name"
            )
        if ("family" in self.backends) != (self.server is not None):
            raise ValueError(
                f"family {self.name!r}: server.backend 'family' runs the family's own server: "
                "list it in backends exactly when Family.server is given"
            )
        if ("reference" in self.backends) != (self.reference is not None):
            raise ValueError(
                f"family {self.name!r}: server.backend 'reference' runs the reference server "
                "with the family's part of it: list it in backends exactly when "
                "Family.reference is given"
            )


_REGISTRY: dict[str, Family] = {}
_MODULES: dict[str, str] = {}  # family -> the module whose FAMILY registered it
_discovered = False


def register(family: Family, source: str = "") -> Family:
    """Add ``family`` (its schema section merged, ``policy.family``'s choices extended);
    registering the same family again is a no-op, another under a taken name an error."""
    if not isinstance(family, Family):
        raise ValueError(f"{source or 'a family'}: FAMILY must be a Family, got {family!r}")
    known = _REGISTRY.get(family.name)
    if known is not None:
        if known.adapter is family.adapter:
            return known
        raise ValueError(
            f"two packages claim policy.family {family.name!r}: {known.adapter.__module__} and "
            f"{family.adapter.__module__}"
        )
    if family.schema is None and family.name not in settings_schema.fields("policy"):
        raise ValueError(
            f"family {family.name!r} ({source or family.adapter.__module__}) has no settings "
            f"section: give Family.schema, the schema of policy.{family.name}"
        )
    reference = family.reference.schema if family.reference is not None else None
    settings_schema.add_policy_family(family.name, family.schema, reference)
    _REGISTRY[family.name] = family
    return family


def load_schema(package: str, name: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The ``schema.yaml`` of family package ``package`` (package data beside its
    ``__init__``: ``policy``, the section ``policy.<name>``, and optionally ``reference``, the
    fields it adds to ``server.reference``), merged into the config schema now, so that the
    family's own modules read their fields, defaults and choices through
    :mod:`libero_eval.settings_schema` while the package is imported, before it registers."""
    text = resources.files(package).joinpath("schema.yaml").read_text(encoding="utf-8")
    parts = yaml.safe_load(text)
    settings_schema.add_policy_family(name, parts["policy"], parts.get("reference"))
    return parts["policy"], parts.get("reference")


def _register_module(module_name: str, source: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"{source}: cannot import {module_name!r} ({exc}); install the family's package, "
            "or put the directory that holds it on PYTHONPATH"
        ) from None
    entry = getattr(module, "FAMILY", None)
    if entry is None:
        raise ValueError(
            f"{source}: module {module_name!r} defines no FAMILY; a family package sets "
            "FAMILY = libero_eval.policy.families.Family(...) in its __init__.py"
        )
    register(entry, f"{source} {module_name!r}")
    _MODULES.setdefault(entry.name, module_name)


def _discover() -> None:
    """The built-in families (the packages here) and the installed ones (entry points)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if module.ispkg:
            _register_module(f"{__name__}.{module.name}", "libero_eval.policy.families")
    for point in entry_points(group=ENTRY_POINT_GROUP):
        _register_module(point.value.split(":")[0], f"entry point {point.name!r}")


def load_modules(modules: Any) -> None:
    """Register the families of ``policy.family_modules`` (importable module names)."""
    if modules is None:
        return
    if not isinstance(modules, list) or not all(isinstance(m, str) and m for m in modules):
        raise ValueError(
            f"{MODULES_FIELD}: expected a list of importable module names, got {modules!r}"
        )
    _discover()
    for name in modules:
        _register_module(name, MODULES_FIELD)


def load_config_modules(config: Mapping[str, Any]) -> None:
    """:func:`load_modules` for a config as written (before or after validation)."""
    policy = config.get("policy") if isinstance(config, Mapping) else None
    if isinstance(policy, Mapping):
        load_modules(policy.get("family_modules"))
    else:
        _discover()


def names() -> tuple[str, ...]:
    """Every registered family's name, in registration order."""
    _discover()
    return tuple(_REGISTRY)


def get(name: Any) -> Family:
    """The family registered as ``name`` (``policy.family``)."""
    _discover()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown policy.family {name!r}; known families: {sorted(_REGISTRY)}. A family is "
            "a package whose FAMILY is a libero_eval.policy.families.Family: list it in "
            f"{MODULES_FIELD}, or install it with an entry point in {ENTRY_POINT_GROUP!r}"
        ) from None


def module_of(name: str) -> str | None:
    """The module whose ``FAMILY`` registered family ``name``: importing it registers the
    family again in another process (the reference server's); None for one registered
    otherwise (:func:`register` called directly)."""
    get(name)
    return _MODULES.get(name)


def reference_server(name: str, module: str | None = None) -> ModuleType:
    """The reference-server part of family ``name`` (``ReferencePart.module``, imported now),
    after importing ``module``, the module that registers the family, where one is given."""
    if module:
        load_modules([module])
    family = get(name)
    if family.reference is None:
        raise ValueError(
            f"the reference server does not serve policy.family {name!r} ({family.title}): the "
            "family gives no Family.reference; it is served by " + ", ".join(family.backends)
        )
    part = importlib.import_module(family.reference.module)
    missing = [what for what in ("Settings", "add_routes") if not hasattr(part, what)]
    if missing:
        raise ValueError(
            f"family {name!r}: its reference-server part {family.reference.module!r} lacks "
            f"{', '.join(missing)} (libero_eval.policy.reference_host says what it defines)"
        )
    return part


def make_adapter(family: str, settings: dict[str, Any]) -> PolicyAdapter:
    """Instantiate the adapter registered for ``family`` (``policy.family``) with ``settings``."""
    return get(family).adapter(settings)


def connection_spec(url: str, family: str, settings: dict[str, Any]) -> ConnectionSpec:
    """The endpoint ``family``'s settings (``policy.<family>``) talk to at ``url``."""
    return get(family).endpoint(url, settings)


def statistics_sha256(path: str | Path) -> str | None:
    """Content hash of a server's statistics file (or of the norm_stats.json in a directory,
    or a checkpoint's config.json); None where there is none."""
    path = package_data.resolve(path)
    if path.is_dir() and (path / "norm_stats.json").is_file():
        path = path / "norm_stats.json"
    elif path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def __getattr__(name: str) -> Any:
    if name == "ADAPTERS":  # {family: adapter class}, every registered family
        _discover()
        return {key: family.adapter for key, family in _REGISTRY.items()}
    raise AttributeError(name)


__all__ = [
    "ENTRY_POINT_GROUP",
    "Family",
    "FamilyServer",
    "ReferencePart",
    "Observation",
    "PolicyAdapter",
    "connection_spec",
    "get",
    "load_config_modules",
    "load_modules",
    "load_schema",
    "make_adapter",
    "module_of",
    "names",
    "reference_server",
    "register",
    "statistics_sha256",
]
