"""`rollout.total_num_envs: auto` and `rollout.merged_dispatch: auto` on plain numbers: the
rule (`rollout.auto`) on the cells measured so far, and the discrete-event model of a shard
(`rollout.dispatch_model`, the real Dispatcher against modelled envs and server) that backs
the env count it picks."""

import pytest

from libero_eval.rollout import auto
from libero_eval.rollout.dispatch import LatencyModel
from libero_eval.rollout.dispatch_model import simulate

# the servers measured (docs/performance.md): π0.5 on one H200 beside 32 envs, Cosmos3 on one
# H200 at batch 8, the CPU reference cell of benchmarks/dispatch_cpu.py
PI05 = LatencyModel(0.131, 0.0096)  # 16 in 0.285 s
COSMOS3 = LatencyModel(0.65, 0.19)  # 8 in 2.17 s
CPU = LatencyModel(1.0, 0.25)  # 3 in 1.75 s


def spread(envs: int, low: float, high: float, samples: int = 5) -> list[list[float]]:
    """Each env's step times, spread evenly over [low, high] and over its queries."""
    return [
        [low + (high - low) * ((7 * i + 3 * k) % envs) / (envs - 1) for k in range(samples)]
        for i in range(envs)
    ]


def capacity(model: LatencyModel, batch: int) -> float:
    return batch / model.seconds(batch)


# -- the rule on the measured cells ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "envs", "batch", "model", "low", "high"),
    [
        # π0.5 openpi, one H200: 32 envs, 0.20-0.26 s a query (5 actions), batches of 16;
        # as_ready measured +12% (48.2 -> 54.1 obs/s over 250 episodes)
        ("openpi", 32, 16, PI05, 0.20, 0.26),
        # the CPU cell (benchmarks/dispatch_cpu.py --cells pi05): 6 envs, 0.48 s a query as
        # its shard measured it, batches of 3 in 1.75 s; as_ready gave 98% of the probe
        ("cpu", 6, 3, CPU, 0.43, 0.53),
    ],
)
def test_the_dispatch_the_model_of_each_measured_cell_picks_is_as_ready(
    cell, envs, batch, model, low, high
):
    steps = [low + (high - low) * (i % 7) / 6 for i in range(4 * envs)]
    choice = auto.choose_dispatch("auto", envs, batch, model, steps, 1.0)
    assert choice.value == "as_ready", (cell, choice.reason)
    assert choice.setting == "auto" and choice.reason.startswith("as_ready: in a model")
    assert f"batches of {batch} in {model.seconds(batch):.2f} s" in choice.reason


def test_the_dispatch_follows_the_model_of_the_shard():
    """Whatever the numbers, the choice is the mode the model rates higher, as_ready at a
    near tie (within 2%)."""
    for model, batch in ((PI05, 16), (CPU, 3)):
        batch_s = model.seconds(batch)
        for envs in (batch, 2 * batch, 3 * batch):
            for ratio in (0.3, 0.8, 0.95, 1.2, 2.0):
                steps = [ratio * batch_s * (0.8 + 0.4 * (i % 5) / 4) for i in range(3 * envs)]
                rates = {
                    name: simulate(
                        auto.model_steps(steps, envs),
                        model,
                        batch,
                        merging=True,
                        as_ready=name == "as_ready",
                        rounds=auto.MODEL_ROUNDS,
                        batch_timeout_s=1.0,
                    ).obs_per_s
                    for name in ("batches", "as_ready")
                }
                choice = auto.choose_dispatch("auto", envs, batch, model, steps, 1.0)
                expected = "as_ready" if rates["as_ready"] >= 0.98 * rates["batches"] else "batches"
                assert choice.value == expected, (envs, ratio, rates)
                assert f"{rates[choice.value]:.2f} obs/s" in choice.reason


@pytest.mark.parametrize(
    ("started", "batch", "batch_s", "step_s", "kept"),
    [
        (48, 16, 0.28, 0.20, 32),  # openpi: two batches' worth keep the server busy
        (48, 16, 0.262, 0.55, 48),  # envs slower than a batch: all of them, and more would help
        (24, 8, 2.17, 0.50, 16),  # Cosmos3: 16 envs per GPU, as its config measured
        (6, 3, 1.75, 1.57, 6),  # the CPU cell: 9 would do, its 2 cores allow 6
    ],
)
def test_auto_envs_keep_the_fewest_whole_batches_that_make_the_server_the_bound(
    started, batch, batch_s, step_s, kept
):
    choice = auto.choose_envs("auto", started, batch, batch_s, [step_s] * 10)
    assert choice.value == kept
    assert auto.server_is_the_bound(choice.value, batch, batch_s, step_s) == (
        auto.envs_needed(batch, batch_s, step_s) <= started
    )
    if kept < started:
        assert f"{started - kept} spare envs closed" in choice.reason
    else:
        assert f"{kept} envs" in choice.reason


def test_the_envs_started_are_bounded_by_the_job_its_episodes_and_the_gpu_memory():
    assert auto.start_count(48, 500, True, None) == (48, auto.start_count(48, 500, True, None)[1])
    count, bound = auto.start_count(48, 500, True, 16 * 1024)  # 16 GiB for the renderers
    assert count == 16 * 1024 // auto.EGL_MIB_PER_ENV == 29 and "GPU memory" in bound
    assert auto.start_count(48, 500, False, 16 * 1024)[0] == 48  # an explicit count wins
    assert auto.start_count(48, 5, True, 16 * 1024) == (5, "its 5 episodes to run")


def test_explicit_settings_win_and_what_was_never_measured_says_so():
    choices = auto.ShardChoices(32, "as_ready", 32, "the job's 32 threads")
    assert choices.on_server(merging=True) is True  # as_ready from the first request
    assert not choices.pending and not choices.due(32)
    plain = auto.ShardChoices("auto", "auto", 8, "the job's 8 threads")
    assert plain.on_server(merging=False) is False
    assert plain.dispatch is not None and plain.dispatch.value is None  # Cosmos3: no merging
    plain.step_s += [0.3] * 15
    assert not plain.due(8)  # two queries an env first
    plain.step_s.append(0.3)
    assert plain.due(8)
    short = auto.ShardChoices("auto", "auto", 4, "the job's 4 threads")
    short.on_server(merging=True)
    short.close(4, False)
    log = short.as_log()
    assert log["envs_choice"]["envs"] == 4 and "not measured" in log["envs_choice"]["reason"]
    assert log["dispatch_choice"]["merged_dispatch"] == "batches"


# -- the model behind the env count ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "model", "batch", "merging", "low", "high"),
    [
        ("openpi", PI05, 16, True, 0.20, 0.26),
        ("cosmos3", COSMOS3, 8, False, 0.45, 0.55),
        ("cpu", CPU, 3, True, 1.4, 1.8),
    ],
)
def test_in_the_model_the_envs_chosen_keep_the_server_full_and_one_batch_fewer_do_not(
    cell, model, batch, merging, low, high
):
    median = (low + high) / 2  # what the shard measures
    needed = auto.envs_needed(batch, model.seconds(batch), median)

    def share(envs: int) -> float:
        dispatch = auto.choose_dispatch("auto", envs, batch, model, [median] * envs, 1.0)
        result = simulate(
            spread(envs, low, high),
            model,
            batch,
            merging=merging,
            as_ready=dispatch.value == "as_ready",
            rounds=40,
            batch_timeout_s=1.0,
        )
        return result.obs_per_s / capacity(model, batch)

    assert share(needed) > 0.97, cell
    assert share(needed - batch) < 0.9, cell


def test_in_the_model_as_ready_costs_nothing_where_the_server_is_the_bound():
    """Where the server is the bound (the envs back within 0.85 of a batch's time) the model
    gives as_ready at least what batches give: every batch full. Its gain in the model lies at
    the edge (the envs back just in time, 0.85-1.0 of a batch's time: +10-28%)."""
    for model, batch in ((PI05, 16), (CPU, 3)):
        batch_s = model.seconds(batch)
        for ratio in (0.5, 0.7, 0.8):
            steps = spread(2 * batch, ratio * batch_s * 0.9, ratio * batch_s * 1.1)
            assert auto.server_is_the_bound(2 * batch, batch, batch_s, ratio * batch_s)
            results = [
                simulate(
                    steps,
                    model,
                    batch,
                    merging=True,
                    as_ready=as_ready,
                    rounds=40,
                    batch_timeout_s=1.0,
                )
                for as_ready in (False, True)
            ]
            assert results[1].obs_per_s >= 0.99 * results[0].obs_per_s
            assert results[1].obs_per_s > 0.97 * capacity(model, batch)


def shipped_config(name: str) -> dict:
    """config/<name> with the schema's defaults filled in, as the workflow sees it."""
    from pathlib import Path

    import yaml

    from libero_eval.config import validate_config

    config = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / name).read_text())
    validate_config(config)
    return config


def test_the_renderers_gpu_budget_is_what_the_server_leaves_of_the_gpu():
    from libero_eval.config import RunSettings
    from libero_eval.rollout.render_device import RenderPlan

    config = shipped_config("config.yaml")
    h200 = RenderPlan("GPU 0", {}, 143_771)  # MiB, as nvidia-smi reports one H200
    settings = RunSettings(config)
    assert settings.render_gpu_budget_mib(h200) == int(143_771 * auto.RENDER_GPU_SHARE)
    assert settings.render_gpu_budget_mib(h200) // auto.EGL_MIB_PER_ENV == 36
    assert settings.render_gpu_budget_mib(RenderPlan("CPU", {})) is None
    config["server"]["backend"] = "sglang"
    config["server"]["sglang"]["gpu_memory_cap_gib"] = 120
    assert RunSettings(config).render_gpu_budget_mib(h200) == 143_771 - 120 * 1024


def test_a_family_whose_server_keeps_its_weights_resident_leaves_the_renderers_the_rest():
    """π0.5's SGLang pipeline keeps its weights resident whatever is free, so its renderers
    may take all but what its server takes: on one H100 the shipped openpi config starts its
    32 envs (the 14% kept for Cosmos3's 120 GiB threshold allowed 20, and the run used 66% of
    its server). Cosmos3 keeps the 14%; a cap the config sets still wins."""
    from libero_eval.config import RunSettings
    from libero_eval.policy.families.pi05 import SGLANG_SERVER_GIB
    from libero_eval.rollout.render_device import RenderPlan

    h100 = RenderPlan("GPU 0", {}, 81_559)  # MiB, as nvidia-smi reports one H100 80GB HBM3
    pi05 = shipped_config("libero_pi05_openpi_sglang.yaml")
    budget = RunSettings(pi05).render_gpu_budget_mib(h100)
    assert budget == 81_559 - int(SGLANG_SERVER_GIB * 1024)
    envs = pi05["rollout"]["envs_per_shard"]
    # the GPU memory bounds nothing: the shard starts what it would without the budget
    assert auto.start_count(envs, 60, True, budget) == auto.start_count(envs, 60, False, None)
    cosmos3 = shipped_config("libero_spatial_cosmos3_sglang.yaml")
    assert RunSettings(cosmos3).render_gpu_budget_mib(h100) == int(81_559 * auto.RENDER_GPU_SHARE)
    pi05["server"]["sglang"]["gpu_memory_cap_gib"] = 70
    assert RunSettings(pi05).render_gpu_budget_mib(h100) == 81_559 - 70 * 1024
