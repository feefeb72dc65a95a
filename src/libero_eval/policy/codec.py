"""msgpack with SGLang's numpy encoding, byte-compatible with SGLang 0.5.23.

SGLang's action API (``sglang/multimodal_gen/runtime/entrypoints/action/protocol.py``,
``pack_msgpack`` / ``unpack_msgpack``) sends numpy values as msgpack maps:

- arrays: ``{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": dtype.str, b"shape": shape}``
- numpy scalars: ``{b"__npgeneric__": True, b"data": value.item(), b"dtype": dtype.str}``

packed with ``use_bin_type=True`` and unpacked with ``raw=False``. :func:`pack` produces the
same bytes as SGLang; :func:`unpack` reads SGLang's maps with ``bytes`` or ``str`` keys.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

MSGPACK_CONTENT_TYPE = "application/msgpack"
_UNSUPPORTED_KINDS = {"O": "object", "V": "void (structured)", "c": "complex"}


def _check_dtype(dtype: np.dtype, what: str) -> None:
    if dtype.kind in _UNSUPPORTED_KINDS:
        raise ValueError(
            f"cannot msgpack-encode a numpy {what} of dtype {dtype} "
            f"({_UNSUPPORTED_KINDS[dtype.kind]}): SGLang's ndarray encoding carries raw bytes of "
            "bool, integer, float, bytes or str dtypes only; convert it first, e.g. "
            ".astype(np.float32)"
        )


def _encode_numpy(obj: Any) -> Any:
    """msgpack ``default`` hook: numpy array/scalar -> SGLang's marker map."""
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype, "array")
        return {
            b"__ndarray__": True,
            b"data": obj.tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": obj.shape,
        }
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype, "scalar")
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(
        f"cannot msgpack-encode an object of type {type(obj).__name__}: send dicts, lists, "
        "str, bytes, numbers, bool, None, numpy arrays or numpy scalars"
    )


def _field(obj: dict, name: str) -> Any:
    value = obj.get(name)
    return obj.get(name.encode()) if value is None else value


def _decode_numpy(obj: dict) -> Any:
    """msgpack ``object_hook``: SGLang's marker map -> numpy array/scalar; other maps unchanged."""
    is_array = bool(_field(obj, "__ndarray__"))
    is_scalar = bool(_field(obj, "__npgeneric__"))
    if not (is_array or is_scalar):
        return obj
    marker = "__ndarray__" if is_array else "__npgeneric__"
    try:
        dtype = np.dtype(_field(obj, "dtype"))
    except TypeError as exc:
        raise ValueError(
            f"msgpack {marker} map has an invalid dtype {_field(obj, 'dtype')!r}: {exc}"
        ) from exc
    if dtype.kind in _UNSUPPORTED_KINDS:
        raise ValueError(
            f"msgpack {marker} map has unsupported dtype {dtype} "
            f"({_UNSUPPORTED_KINDS[dtype.kind]}); SGLang's encoding carries plain numeric data"
        )
    data = _field(obj, "data")
    if is_scalar:
        return dtype.type(data)
    shape = _field(obj, "shape")
    if not isinstance(data, bytes | bytearray):
        raise ValueError(
            f"msgpack __ndarray__ map needs raw bytes in 'data', got {type(data).__name__}"
        )
    if not isinstance(shape, list | tuple) or not all(
        isinstance(size, int) and size >= 0 for size in shape
    ):
        raise ValueError(
            f"msgpack __ndarray__ map needs 'shape' as a list of non-negative ints, got {shape!r}"
        )
    expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
    if len(data) != expected:
        raise ValueError(
            f"msgpack __ndarray__ map holds {len(data)} bytes but dtype {dtype} and shape "
            f"{list(shape)} need {expected}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def pack(obj: Any) -> bytes:
    """Encode ``obj`` exactly as SGLang's ``pack_msgpack`` does."""
    return msgpack.packb(obj, default=_encode_numpy, use_bin_type=True)


def unpack(data: bytes) -> Any:
    """Decode SGLang msgpack (``unpack_msgpack``); arrays come back as read-only numpy views.

    Raises ``ValueError`` (msgpack's own errors are ``ValueError`` subclasses) for bytes that
    are not one complete msgpack document or hold malformed numpy maps.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"unpack needs bytes, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, object_hook=_decode_numpy, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        reason = str(exc) or f"{type(exc).__name__} (malformed msgpack)"
        raise ValueError(f"cannot decode msgpack data ({len(data)} bytes): {reason}") from exc
