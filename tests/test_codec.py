"""libero_eval.policy.codec speaks SGLang's msgpack numpy encoding byte for byte."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from libero_eval.policy import codec

# --- Reference implementation --------------------------------------------------------------
# Copied verbatim from SGLang 0.5.23,
# sglang/multimodal_gen/runtime/entrypoints/action/protocol.py
# (pack_numpy_payload, unpack_numpy_payload, pack_msgpack, unpack_msgpack).


def pack_numpy_payload(obj):
    if isinstance(obj, (np.ndarray, np.generic)) and obj.dtype.kind in ("V", "O", "c"):  # noqa: UP038
        raise ValueError(f"Unsupported dtype: {obj.dtype}")
    if isinstance(obj, np.ndarray):
        return {
            b"__ndarray__": True,
            b"data": obj.tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    if isinstance(obj, np.generic):
        return {
            b"__npgeneric__": True,
            b"data": obj.item(),
            b"dtype": obj.dtype.str,
        }
    return obj


def unpack_numpy_payload(obj):
    ndarray_marker = obj.get("__ndarray__") or obj.get(b"__ndarray__")
    npgeneric_marker = obj.get("__npgeneric__") or obj.get(b"__npgeneric__")
    data = obj.get("data", obj.get(b"data"))
    dtype = obj.get("dtype", obj.get(b"dtype"))
    shape = obj.get("shape", obj.get(b"shape"))
    if ndarray_marker:
        return np.ndarray(
            buffer=data,
            dtype=np.dtype(dtype),
            shape=shape,
        )
    if npgeneric_marker:
        return np.dtype(dtype).type(data)
    return obj


def pack_msgpack(payload: Any) -> bytes:
    return msgpack.packb(payload, default=pack_numpy_payload, use_bin_type=True)


def unpack_msgpack(payload: bytes) -> Any:
    return msgpack.unpackb(payload, object_hook=unpack_numpy_payload, raw=False)


# --- Fixtures -------------------------------------------------------------------------------

RNG = np.random.default_rng(0)
IMAGE = RNG.integers(0, 256, size=(192, 320, 3), dtype=np.uint8)
IMAGES = RNG.integers(0, 256, size=(4, 8, 16, 3), dtype=np.uint8)
ACTIONS = RNG.standard_normal((8, 16, 10)).astype(np.float32)


def request_like_payload() -> dict:
    """A payload shaped like our client's msgpack request and SGLang's response."""
    return {
        "request_id": "req-1",
        "input": {"prompt": ["pick up the bowl."] * 4, "input_reference": IMAGES},
        "parameters": {"num_frames": 17, "seed": np.int64(1140), "guidance_scale": 1.0},
        "runtime": {"response_format": "envelope"},
        "data": [{"index": 0, "action": {"values": ACTIONS[0], "shape": [16, 10]}}],
        "scalars": [np.float32(0.5), np.uint8(7), np.bool_(True)],
    }


def assert_same_tree(left: Any, right: Any) -> None:
    assert type(left) is type(right), (left, right)
    if isinstance(left, dict):
        assert list(left) == list(right)
        for key in left:
            assert_same_tree(left[key], right[key])
    elif isinstance(left, list):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            assert_same_tree(a, b)
    elif isinstance(left, np.ndarray):
        assert left.dtype == right.dtype and left.shape == right.shape
        np.testing.assert_array_equal(left, right)
    else:
        assert left == right


# --- Round trips ----------------------------------------------------------------------------


def test_uint8_image_round_trips_with_dtype_and_shape():
    decoded = codec.unpack(codec.pack(IMAGE))
    assert decoded.dtype == np.uint8
    assert decoded.shape == (192, 320, 3)
    np.testing.assert_array_equal(decoded, IMAGE)


def test_float32_batch_of_action_chunks_round_trips_exactly():
    decoded = codec.unpack(codec.pack({"actions": ACTIONS}))["actions"]
    assert decoded.dtype == np.float32
    assert decoded.shape == (8, 16, 10)
    assert decoded.tobytes() == ACTIONS.tobytes()


def test_non_contiguous_arrays_are_sent_in_c_order():
    transposed = ACTIONS[0].T  # a Fortran-ordered view
    np.testing.assert_array_equal(codec.unpack(codec.pack(transposed)), transposed)


def test_numpy_scalars_round_trip_with_their_dtype():
    for scalar in (np.float32(0.25), np.int64(-3), np.uint8(255), np.bool_(False)):
        decoded = codec.unpack(codec.pack(scalar))
        assert type(decoded) is type(scalar)
        assert decoded == scalar


def test_plain_python_values_pass_through():
    payload = {"a": [1, 2.5, "x", None, True], "b": b"\x00\x01", "c": {"d": []}}
    assert codec.unpack(codec.pack(payload)) == payload


# --- Byte compatibility with SGLang ---------------------------------------------------------


def test_pack_produces_exactly_sglangs_bytes():
    payload = request_like_payload()
    assert codec.pack(payload) == pack_msgpack(payload)


@pytest.mark.parametrize(
    "array",
    [
        IMAGE,
        ACTIONS,
        np.zeros((0, 10), dtype=np.float32),
        np.arange(6, dtype=">i4").reshape(2, 3),
        np.array(["ab", "c"]),
        np.array(3.5),
    ],
    ids=["uint8-image", "float32-BHD", "empty", "big-endian", "unicode", "0-d"],
)
def test_array_byte_layout_matches_sglang(array):
    assert codec.pack(array) == pack_msgpack(array)


def test_array_map_layout_is_sglangs_marker_map():
    array = np.arange(4, dtype=np.uint8).reshape(2, 2)
    raw = msgpack.unpackb(codec.pack(array), raw=False)
    assert raw == {
        b"__ndarray__": True,
        b"data": b"\x00\x01\x02\x03",
        b"dtype": "|u1",
        b"shape": [2, 2],
    }


def test_unpack_reads_what_sglang_packs():
    payload = request_like_payload()
    assert_same_tree(codec.unpack(pack_msgpack(payload)), unpack_msgpack(pack_msgpack(payload)))


def test_sglang_reads_what_we_pack():
    payload = request_like_payload()
    assert_same_tree(unpack_msgpack(codec.pack(payload)), codec.unpack(codec.pack(payload)))


def test_unpack_accepts_str_keys_as_written_by_msgpack_numpy_style_encoders():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    str_keyed = msgpack.packb(
        {"__ndarray__": True, "data": array.tobytes(), "dtype": "<f4", "shape": [2, 3]},
        use_bin_type=True,
    )
    np.testing.assert_array_equal(codec.unpack(str_keyed), array)
    scalar = msgpack.packb({"__npgeneric__": True, "data": 2, "dtype": "<i8"})
    assert codec.unpack(scalar) == np.int64(2)


def test_unpacked_arrays_are_read_only_views_like_sglangs():
    decoded = codec.unpack(codec.pack(ACTIONS))
    assert not decoded.flags.writeable
    assert not unpack_msgpack(pack_msgpack(ACTIONS)).flags.writeable


# --- Rejections -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, kind",
    [
        (np.array([1, "a", None], dtype=object), "object"),
        (np.zeros(2, dtype=[("x", "<f4")]), "void"),
        (np.zeros(2, dtype=np.complex64), "complex"),
        (np.complex128(1 + 2j), "complex"),
    ],
)
def test_pack_rejects_object_void_and_complex_dtypes(value, kind):
    with pytest.raises(ValueError, match=rf"dtype .*\({kind}") as excinfo:
        codec.pack({"x": value})
    assert "astype" in str(excinfo.value)
    with pytest.raises(ValueError, match="Unsupported dtype"):  # SGLang rejects them too
        pack_msgpack({"x": value})


def test_pack_rejects_unknown_objects_naming_the_type():
    with pytest.raises(TypeError, match="type set"):
        codec.pack({"x": {1, 2}})


@pytest.mark.parametrize(
    "data",
    [b"", b"\xc1", b"\x92\x01", b"not msgpack at all"],
    ids=["empty", "reserved-byte", "truncated", "text"],
)
def test_unpack_rejects_garbage_with_value_error(data):
    with pytest.raises(ValueError, match="cannot decode msgpack data"):
        codec.unpack(data)


def test_unpack_rejects_array_maps_whose_bytes_do_not_fit_the_shape():
    bad = msgpack.packb(
        {b"__ndarray__": True, b"data": b"\x00" * 5, b"dtype": "<f4", b"shape": [2]},
        use_bin_type=True,
    )
    with pytest.raises(
        ValueError, match="holds 5 bytes but dtype float32 and shape \\[2\\] need 8"
    ):
        codec.unpack(bad)


def test_unpack_rejects_object_dtype_maps():
    bad = msgpack.packb(
        {b"__ndarray__": True, b"data": b"\x00" * 8, b"dtype": "|O", b"shape": [1]},
        use_bin_type=True,
    )
    with pytest.raises(ValueError, match="unsupported dtype object"):
        codec.unpack(bad)
