"""Cosmos3 LIBERO action and observation math (libero_eval.policy.families.cosmos3.actions)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.spatial.transform import Rotation

from libero_eval.policy.families.cosmos3 import actions as am

STATS_PATH = (
    Path(__file__).resolve().parents[1]
    / "src"
    / "libero_eval"
    / "data"
    / "stats"
    / "libero_native_frame_wise_relative_rot6d.json"
)


def columns_rot6d(matrices: np.ndarray) -> np.ndarray:
    """rot6d written independently of the module: first column, then second column."""
    return np.concatenate([matrices[:, :, 0], matrices[:, :, 1]], axis=1)


def rotation_error_rad(rotvec: np.ndarray, truth: Rotation) -> np.ndarray:
    return (Rotation.from_rotvec(rotvec).inv() * truth).magnitude()


@pytest.fixture(scope="module")
def raw_stats() -> am.ActionStats:
    return am.load_action_stats(STATS_PATH, "global_raw")


@pytest.fixture(scope="module")
def identity_stats() -> am.ActionStats:
    return am.load_action_stats(STATS_PATH, "global")


# ------------------------------------------------------------------------------ rotations


@pytest.mark.parametrize("method", ["gram_schmidt", "svd"])
def test_rot6d_to_axis_angle_matches_scipy_on_random_rotations(method):
    truth = Rotation.random(1000, random_state=7)
    rotvec = am.rot6d_to_axis_angle(columns_rot6d(truth.as_matrix()), method)
    assert rotvec.shape == (1000, 3)
    np.testing.assert_allclose(rotvec, truth.as_rotvec(), atol=1e-9)


@pytest.mark.parametrize("method", ["gram_schmidt", "svd"])
def test_rot6d_to_axis_angle_handles_rotations_near_180_degrees(method):
    rng = np.random.default_rng(3)
    axes = rng.normal(size=(300, 3))
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    angles = np.repeat([np.pi - 1e-4, np.pi - 1e-7, np.pi], 100)
    truth = Rotation.from_rotvec(axes * angles[:, None])
    rotvec = am.rot6d_to_axis_angle(columns_rot6d(truth.as_matrix()), method)
    assert np.all(rotation_error_rad(rotvec, truth) < 1e-6)
    np.testing.assert_allclose(np.linalg.norm(rotvec, axis=1), angles, atol=1e-6)


def test_rot6d_batches_over_leading_dimensions():
    truth = Rotation.random(24, random_state=11)
    r6 = columns_rot6d(truth.as_matrix()).reshape(2, 3, 4, 6)
    rotvec = am.rot6d_to_axis_angle(r6)
    assert rotvec.shape == (2, 3, 4, 3)
    np.testing.assert_allclose(rotvec.reshape(24, 3), truth.as_rotvec(), atol=1e-9)
    assert am.rot6d_to_matrix(r6).shape == (2, 3, 4, 3, 3)


@pytest.mark.parametrize("method", ["gram_schmidt", "svd"])
def test_positive_column_scaling_does_not_change_the_rotation(method):
    rng = np.random.default_rng(5)
    truth = Rotation.random(200, random_state=5)
    matrices = truth.as_matrix()
    scaled = np.concatenate(
        [
            matrices[:, :, 0] * rng.uniform(0.2, 5.0, size=(200, 1)),
            matrices[:, :, 1] * rng.uniform(0.2, 5.0, size=(200, 1)),
        ],
        axis=1,
    )
    np.testing.assert_allclose(am.rot6d_to_matrix(scaled, method), matrices, atol=1e-9)


def test_gram_schmidt_on_noisy_input_follows_the_documented_recipe():
    rng = np.random.default_rng(9)
    r6 = columns_rot6d(Rotation.random(100, random_state=9).as_matrix())
    r6 = r6 * rng.uniform(0.5, 2.0, size=(100, 1)) + rng.normal(scale=0.1, size=(100, 6))
    result = am.rot6d_to_matrix(r6, "gram_schmidt")
    for r6_row, matrix in zip(r6, result, strict=True):
        c0 = r6_row[:3] / np.linalg.norm(r6_row[:3])
        c1 = r6_row[3:] - np.dot(r6_row[3:], c0) * c0
        c1 = c1 / np.linalg.norm(c1)
        np.testing.assert_allclose(matrix, np.column_stack([c0, c1, np.cross(c0, c1)]), atol=1e-12)


def test_svd_on_noisy_input_gives_the_nearest_proper_rotation():
    rng = np.random.default_rng(13)
    truth = Rotation.random(200, random_state=13)
    r6 = columns_rot6d(truth.as_matrix()) + rng.normal(scale=0.05, size=(200, 6))
    result = am.rot6d_to_matrix(r6, "svd")
    np.testing.assert_allclose(
        result @ np.swapaxes(result, 1, 2), np.eye(3)[None].repeat(200, 0), atol=1e-12
    )
    np.testing.assert_allclose(np.linalg.det(result), 1.0, atol=1e-12)
    target = np.stack([r6[:, :3], r6[:, 3:], np.cross(r6[:, :3], r6[:, 3:])], axis=-1)
    gram_schmidt = am.rot6d_to_matrix(r6, "gram_schmidt")
    svd_distance = np.linalg.norm(result - target, axis=(1, 2))
    assert np.all(svd_distance <= np.linalg.norm(gram_schmidt - target, axis=(1, 2)) + 1e-12)
    assert not np.allclose(result, gram_schmidt, atol=1e-6)  # the two methods really differ
    recovered = Rotation.from_matrix(result)
    assert np.all((recovered.inv() * truth).magnitude() < 0.2)


def test_rows_instead_of_columns_give_the_inverse_rotation():
    truth = Rotation.from_rotvec([[0.0, 0.0, 0.5], [0.3, -0.2, 0.1]])
    matrices = truth.as_matrix()
    rows = np.concatenate([matrices[:, 0, :], matrices[:, 1, :]], axis=1)
    from_rows = am.rot6d_to_axis_angle(rows)
    assert np.all(rotation_error_rad(from_rows, truth) > 0.3)
    np.testing.assert_allclose(from_rows, truth.inv().as_rotvec(), atol=1e-12)
    np.testing.assert_allclose(am.rot6d_to_axis_angle(columns_rot6d(matrices)), truth.as_rotvec())


def test_matrix_and_axis_angle_to_rot6d_use_columns():
    truth = Rotation.random(50, random_state=17)
    np.testing.assert_allclose(
        am.matrix_to_rot6d(truth.as_matrix()), columns_rot6d(truth.as_matrix())
    )
    np.testing.assert_allclose(
        am.axis_angle_to_rot6d(truth.as_rotvec()), columns_rot6d(truth.as_matrix()), atol=1e-12
    )
    assert am.matrix_to_rot6d(np.eye(3)).tolist() == [1, 0, 0, 0, 1, 0]


@pytest.mark.parametrize("method", ["gram_schmidt", "svd"])
def test_degenerate_rot6d_is_rejected(method):
    with pytest.raises(ValueError, match="degenerate"):
        am.rot6d_to_matrix(np.array([0.0, 0, 0, 0, 1, 0]), method)
    with pytest.raises(ValueError, match="parallel"):
        am.rot6d_to_matrix(np.array([1.0, 0, 0, 2, 0, 0]), method)
    with pytest.raises(ValueError, match="non-finite"):
        am.rot6d_to_matrix(np.array([np.nan, 0, 0, 0, 1, 0]), method)
    with pytest.raises(ValueError, match=r"\[\.\.\., 6\]"):
        am.rot6d_to_matrix(np.zeros(5), method)


def test_unknown_orthonormalization_is_rejected():
    with pytest.raises(ValueError, match="gram_schmidt"):
        am.rot6d_to_matrix(np.array([1.0, 0, 0, 0, 1, 0]), "qr")


# ------------------------------------------------------------------------------ stats


def test_stats_blocks_follow_the_normalization():
    assert am.stats_block_for("quantile_rot") == "global_raw"
    assert am.stats_block_for("quantile") == "global"
    with pytest.raises(ValueError, match="quantile_rot"):
        am.stats_block_for("mean_std")


def test_denormalization_with_the_global_raw_block(raw_stats):
    raw = json.loads(STATS_PATH.read_text())["global_raw"]
    np.testing.assert_allclose(am.denormalize_quantile(-np.ones(10), raw_stats), raw["q01"])
    np.testing.assert_allclose(am.denormalize_quantile(np.ones(10), raw_stats), raw["q99"])
    midpoint = am.denormalize_quantile(np.zeros(10), raw_stats)
    np.testing.assert_allclose(midpoint, (np.array(raw["q01"]) + raw["q99"]) / 2)
    # rot6d channel 3 is R[0, 0] of near-identity rotations in [0.934955, 1.0]
    assert midpoint[3] == pytest.approx((0.934955 + 1.0) / 2)
    assert raw_stats.block == "global_raw" and raw_stats.source == STATS_PATH


def test_denormalization_with_the_global_block_leaves_rot6d_unchanged(identity_stats):
    values = np.random.default_rng(1).uniform(-1, 1, size=(16, 10))
    denormalized = am.denormalize_quantile(values, identity_stats)
    np.testing.assert_allclose(denormalized[:, 3:9], values[:, 3:9])
    assert not np.allclose(denormalized[:, :3], values[:, :3])


def test_normalize_inverts_denormalize_and_clips(raw_stats):
    values = np.random.default_rng(2).uniform(-1, 1, size=(32, 10))
    values[:, 9] = np.round(values[:, 9])  # keep the gripper channel well defined
    np.testing.assert_allclose(
        am.normalize_quantile(am.denormalize_quantile(values, raw_stats), raw_stats),
        values,
        atol=1e-12,
    )
    outside = am.denormalize_quantile(np.full(10, 3.0), raw_stats)
    np.testing.assert_array_equal(am.normalize_quantile(outside, raw_stats), np.ones(10))


def test_normalize_survives_a_zero_width_quantile_range(tmp_path):
    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"global_raw": {"q01": [0.5] * 10, "q99": [0.5] * 10}}))
    stats = am.load_action_stats(path, "global_raw")
    result = am.normalize_quantile(np.full(10, 0.5), stats)
    assert np.all(np.isfinite(result)) and np.all(result == -1.0)


def test_channel_count_mismatch_is_reported(raw_stats):
    with pytest.raises(ValueError, match="10 channels.*global_raw"):
        am.denormalize_quantile(np.zeros((4, 7)), raw_stats)


def write_stats(tmp_path: Path, content) -> Path:
    path = tmp_path / "stats.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(
    ("content", "block", "message"),
    [
        ({"global": {"q01": [0] * 10, "q99": [1] * 10}}, "global_raw", "no 'global_raw' block"),
        ({"global_raw": {"q01": [0] * 7, "q99": [1] * 10}}, "global_raw", "'q01'.*length 7"),
        ({"global_raw": {"q01": [0] * 10}}, "global_raw", "'q99'.*None"),
        ({"global": {"q01": [0] * 10, "q99": ["1"] * 10}}, "global", "'q99'.*finite numbers"),
        (
            '{"global_raw": {"q01": [NaN,0,0,0,0,0,0,0,0,0], "q99": [1,1,1,1,1,1,1,1,1,1]}}',
            "global_raw",
            "'q01'.*finite numbers",
        ),
        (
            {"global_raw": {"q01": [0] * 10, "q99": [1] * 9 + [-1]}},
            "global_raw",
            r"q99 < q01 in channel\(s\) \[9\]",
        ),
        ("{not json", "global_raw", "not readable JSON"),
        ([1, 2, 3], "global_raw", "no 'global_raw' block"),
    ],
)
def test_bad_stats_files_name_the_file_block_and_fix(tmp_path, content, block, message):
    path = write_stats(tmp_path, content)
    with pytest.raises(ValueError, match=message) as info:
        am.load_action_stats(path, block)
    text = str(info.value)
    assert str(path) in text and f"'{block}'" in text and "Cosmos3 LIBERO stats file" in text


def test_missing_stats_file_is_named(tmp_path):
    path = tmp_path / "nowhere.json"
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        am.load_action_stats(path)
    assert str(path) in str(info.value) and "'global_raw'" in str(info.value)


# ------------------------------------------------------------------------------ gripper


def test_binary_gripper_mapping_is_rlinfs_negative_sign_exactly():
    # RLinf (rlinf/envs/action_utils.py): np.sign(2g - 1) * -1, which is 0 at g = 0.5.
    g = np.array([0.0, 0.2, 0.4999, 0.5, 0.5001, 1.0])
    mapped = am.gripper_to_libero(g, "binary")
    np.testing.assert_array_equal(mapped, [1, 1, 1, 0, -1, -1])
    np.testing.assert_array_equal(mapped, np.sign(2 * g - 1) * -1.0)
    assert not np.signbit(mapped[3])  # a plain 0.0, not -0.0


def test_continuous_gripper_mapping_is_linear_and_clipped():
    g = np.array([-0.5, 0.0, 0.25, 0.5, 1.0, 1.2])
    np.testing.assert_allclose(am.gripper_to_libero(g, "continuous"), [1, 1, 0.5, 0, -1, -1])


def test_libero_gripper_to_unit_inverts_the_mappings():
    np.testing.assert_allclose(am.libero_gripper_to_unit([-1.0, 0.0, 1.0]), [1.0, 0.5, 0.0])
    x = np.array([-1.0, 1.0])
    for mapping in ("binary", "continuous"):
        np.testing.assert_allclose(am.gripper_to_libero(am.libero_gripper_to_unit(x), mapping), x)


def test_gripper_mapping_rejects_bad_input():
    with pytest.raises(ValueError, match="binary"):
        am.gripper_to_libero(np.zeros(2), "sigmoid")
    with pytest.raises(ValueError, match="non-finite"):
        am.gripper_to_libero(np.array([np.nan]), "binary")


# ------------------------------------------------------------------------------ chunks


def expected_libero(normalized: np.ndarray, stats_path: Path, block: str) -> np.ndarray:
    """The documented conversion, written out with plain numpy and scipy."""
    stats = json.loads(stats_path.read_text())[block]
    q01, q99 = np.array(stats["q01"]), np.array(stats["q99"])
    raw = (normalized[:, :10] + 1) / 2 * (q99 - q01) + q01
    c0 = raw[:, 3:6] / np.linalg.norm(raw[:, 3:6], axis=1, keepdims=True)
    c1 = raw[:, 6:9] - np.sum(raw[:, 6:9] * c0, axis=1, keepdims=True) * c0
    c1 /= np.linalg.norm(c1, axis=1, keepdims=True)
    rotvec = Rotation.from_matrix(np.stack([c0, c1, np.cross(c0, c1)], axis=-1)).as_rotvec()
    gripper = -np.sign(2 * raw[:, 9:10] - 1)
    return np.concatenate([raw[:, :3], rotvec, gripper], axis=1)


def test_model_chunk_to_libero_uses_the_first_ten_of_padded_channels(raw_stats):
    rng = np.random.default_rng(21)
    chunk = rng.uniform(-1, 1, size=(16, 32)).astype(np.float32)
    chunk[:, 10:] = np.nan  # padding is never read
    result = am.model_chunk_to_libero(chunk, raw_stats)
    assert result.shape == (16, 7) and result.dtype == np.float64
    np.testing.assert_allclose(
        result, expected_libero(chunk.astype(np.float64), STATS_PATH, "global_raw"), atol=1e-9
    )


def test_model_chunk_to_libero_truncates_long_chunks(raw_stats):
    chunk = np.random.default_rng(22).uniform(-1, 1, size=(20, 10))
    result = am.model_chunk_to_libero(chunk, raw_stats, num_action_chunks=16)
    np.testing.assert_allclose(result, expected_libero(chunk, STATS_PATH, "global_raw")[:16])


def test_model_chunk_to_libero_pads_short_chunks_with_the_last_row(raw_stats):
    chunk = np.random.default_rng(23).uniform(-1, 1, size=(5, 12))
    result = am.model_chunk_to_libero(chunk, raw_stats, num_action_chunks=16)
    expected = expected_libero(chunk, STATS_PATH, "global_raw")
    np.testing.assert_allclose(result[:5], expected)
    np.testing.assert_allclose(result[5:], np.repeat(expected[-1:], 11, axis=0))


def test_model_chunk_to_libero_continuous_gripper(raw_stats):
    chunk = np.zeros((16, 10))
    chunk[:, 9] = np.linspace(-1, 1, 16)  # g = (x + 1) / 2 with q01 = 0, q99 = 1
    result = am.model_chunk_to_libero(chunk, raw_stats, gripper_mapping="continuous")
    np.testing.assert_allclose(result[:, 6], -np.linspace(-1, 1, 16), atol=1e-12)


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (np.zeros(10), r"\[H >= 1, D >= 10\].*\(10,\)"),
        (np.zeros((16, 9)), r"\[H >= 1, D >= 10\].*\(16, 9\)"),
        (np.zeros((0, 10)), r"\[H >= 1, D >= 10\]"),
        (np.array([["a"] * 10]), "numeric"),
    ],
)
def test_model_chunk_to_libero_rejects_bad_shapes(raw_stats, chunk, message):
    with pytest.raises(ValueError, match=message):
        am.model_chunk_to_libero(chunk, raw_stats)


def test_model_chunk_to_libero_rejects_non_finite_values(raw_stats):
    chunk = np.zeros((16, 10))
    chunk[4, 2] = np.inf
    with pytest.raises(ValueError, match=r"non-finite values in row\(s\) \[4\]"):
        am.model_chunk_to_libero(chunk, raw_stats)


def test_model_chunk_to_libero_requires_the_ten_channel_layout(raw_stats):
    with pytest.raises(ValueError, match="raw_action_dim must be 10"):
        am.model_chunk_to_libero(np.zeros((16, 10)), raw_stats, raw_action_dim=7)


def test_libero_round_trip_with_the_global_raw_block(raw_stats):
    rng = np.random.default_rng(31)
    actions = np.concatenate(
        [
            rng.uniform(-0.5, 0.5, size=(16, 3)),
            rng.uniform(-0.08, 0.08, size=(16, 3)),
            rng.choice([-1.0, 1.0], size=(16, 1)),
        ],
        axis=1,
    )
    raw = np.concatenate([actions[:, :3], am.axis_angle_to_rot6d(actions[:, 3:6])], axis=1)
    assert np.all(raw >= raw_stats.q01[:9]) and np.all(raw <= raw_stats.q99[:9])  # no clipping
    model = am.libero_to_model_chunk(actions, raw_stats)
    assert model.shape == (16, 10) and model.dtype == np.float32
    assert np.all(np.abs(model) <= 1.0)
    np.testing.assert_allclose(am.model_chunk_to_libero(model, raw_stats), actions, atol=2e-5)


def test_libero_round_trip_with_the_global_block_covers_large_rotations(identity_stats):
    rng = np.random.default_rng(32)
    actions = np.concatenate(
        [
            rng.uniform(-0.5, 0.5, size=(16, 3)),
            Rotation.random(16, random_state=32).as_rotvec(),
            rng.choice([-1.0, 1.0], size=(16, 1)),
        ],
        axis=1,
    )
    model = am.libero_to_model_chunk(actions, identity_stats)
    back = am.model_chunk_to_libero(model, identity_stats, orthonormalization="svd")
    np.testing.assert_allclose(back[:, [0, 1, 2, 6]], actions[:, [0, 1, 2, 6]], atol=2e-6)
    assert np.all(rotation_error_rad(back[:, 3:6], Rotation.from_rotvec(actions[:, 3:6])) < 1e-5)


def test_libero_to_model_chunk_clips_out_of_range_translations(raw_stats):
    actions = np.zeros((2, 7))
    actions[:, 0] = [5.0, -5.0]
    model = am.libero_to_model_chunk(actions, raw_stats)
    assert model[0, 0] == 1.0 and model[1, 0] == -1.0
    with pytest.raises(ValueError, match=r"\[H, 7\]"):
        am.libero_to_model_chunk(np.zeros((2, 10)), raw_stats)


# ------------------------------------------------------------------------------ images


def camera_pair(size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(41)
    agentview = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    wrist = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
    return agentview, wrist


def test_preprocessed_image_is_the_resized_rotated_concat_plus_reflect_padding():
    agentview, wrist = camera_pair()
    image = am.preprocess_observation_image(agentview, wrist)
    assert image.shape == (192, 320, 3) and image.dtype == np.uint8
    concat = np.concatenate([np.rot90(agentview, 2), np.rot90(wrist, 2)], axis=1)
    resized = np.asarray(Image.fromarray(concat).resize((320, 160), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(image[:160], resized)
    for k in range(32):  # reflect: row 160 + k mirrors row 158 - k (the edge row is not repeated)
        np.testing.assert_array_equal(image[160 + k], image[158 - k])


def test_preprocessed_image_puts_rotated_agentview_left_and_wrist_right():
    agentview = np.zeros((256, 256, 3), dtype=np.uint8)
    wrist = np.zeros((256, 256, 3), dtype=np.uint8)
    agentview[:, :, 0] = 200  # red
    wrist[:, :, 2] = 200  # blue
    agentview[0:64, 0:64] = [0, 255, 0]  # green marker at the raw top-left corner
    image = am.preprocess_observation_image(agentview, wrist)
    assert np.all(image[:160, :150, 2] == 0) and np.all(image[:160, 170:, 0] == 0)
    assert np.all(image[:160, 170:, 2] == 200)
    # after the 180 degree turn the marker sits at the bottom-right of the left half
    assert np.all(image[125:155, 125:155] == [0, 255, 0])
    assert np.all(image[5:30, 5:30] == [200, 0, 0])


def test_small_cameras_are_not_upscaled_and_get_padded_on_both_sides():
    agentview, wrist = camera_pair(size=128)
    image = am.preprocess_observation_image(agentview, wrist)
    assert image.shape == (192, 320, 3)
    concat = np.concatenate([agentview[::-1, ::-1], wrist[::-1, ::-1]], axis=1)
    np.testing.assert_array_equal(image[:128, :256], concat)
    np.testing.assert_array_equal(image[128:, :256], concat[126:62:-1])
    np.testing.assert_array_equal(image[:128, 256:], concat[:, 254:190:-1])


@pytest.mark.parametrize(
    ("agentview", "wrist", "message"),
    [
        (np.zeros((256, 256, 3), np.float32), np.zeros((256, 256, 3), np.uint8), "agentview"),
        (np.zeros((256, 256, 3), np.uint8), np.zeros((256, 256), np.uint8), "wrist"),
        (np.zeros((256, 256, 3), np.uint8), np.zeros((128, 128, 3), np.uint8), "same height"),
    ],
)
def test_bad_camera_images_are_rejected(agentview, wrist, message):
    with pytest.raises(ValueError, match=message):
        am.preprocess_observation_image(agentview, wrist)


# ------------------------------------------------------------------------------ prompt

SUFFIX = (
    " This video contains concatenated views from multiple camera perspectives. The left half"
    " shows the third-person view; the right half shows the wrist-mounted camera."
)


def test_prompt_augmentation_adds_a_period_and_the_camera_sentence():
    task = "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert am.augment_prompt(task) == task + "." + SUFFIX
    assert am.augment_prompt("open the drawer.") == "open the drawer." + SUFFIX
    assert am.augment_prompt("open the drawer  ") == "open the drawer." + SUFFIX


def test_prompt_augmentation_rejects_empty_tasks():
    with pytest.raises(ValueError, match="non-empty"):
        am.augment_prompt("  ")
