"""Where the env workers render: the slot's GPU, the CPU, or a fixed GPU (`rollout.render_device`).

robosuite picks its EGL device from `MUJOCO_EGL_DEVICE_ID`, else from the first entry of
`CUDA_VISIBLE_DEVICES`, and reads that number as an index into EGL's device list
(`robosuite/renderers/context/egl_context.py`). EGL's order need not be CUDA's, and under
Slurm `CUDA_VISIBLE_DEVICES` is the job's allocation, not an EGL index. So a GPU is mapped to
its EGL device by identity: the device UUID (EGL_EXT_device_persistent_id), else the PCI bus id
of the EGL device's DRM node (EGL_EXT_device_drm), else EGL_NV_device_cuda's CUDA ordinal. The
GPU's UUID and PCI bus id come from `nvidia-smi`.

robosuite also asserts that `MUJOCO_EGL_DEVICE_ID` appears in `CUDA_VISIBLE_DEVICES` when the
latter is set (`robosuite/utils/binding_utils.py`). Env workers run no CUDA code, so they get
`CUDA_VISIBLE_DEVICES` set to the EGL index itself, which satisfies the assert and keeps
robosuite's fallback pointing at the same device (an empty `CUDA_VISIBLE_DEVICES` would make
robosuite fail: it parses "" as a device list).

`plan_render_env` runs once per shard (it queries the devices) and returns the variables for
the env workers; `check_render_env` runs in each worker before the env is built and fails with
an error naming the variables when they do not pick the planned device.
"""

from __future__ import annotations

import ctypes
import glob
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

RENDER_VARIABLES = (
    "MUJOCO_GL",
    "PYOPENGL_PLATFORM",
    "MUJOCO_EGL_DEVICE_ID",
    "CUDA_VISIBLE_DEVICES",
    "__EGL_VENDOR_LIBRARY_FILENAMES",
)
# Set in the env workers' environment: the EGL device the plan expects, as an identity.
EXPECTED_DEVICE_VARIABLE = "LIBERO_EVAL_RENDER_DEVICE"

# EGL enums (Khronos registry).
EGL_EXTENSIONS = 0x3055
EGL_DRM_DEVICE_FILE_EXT = 0x3233
EGL_CUDA_DEVICE_NV = 0x323A
EGL_DEVICE_UUID_EXT = 0x335C


class RenderDeviceError(RuntimeError):
    """The render device cannot be resolved, or the environment does not select it."""


@dataclass(frozen=True)
class GpuDevice:
    """A GPU as the NVIDIA driver names it (`nvidia-smi` index, UUID, PCI bus id)."""

    index: int
    uuid: str
    pci_bus_id: str
    memory_mib: int | None = None  # memory.total


@dataclass(frozen=True)
class EglDevice:
    """One entry of eglQueryDevicesEXT, with whatever identity its extensions report."""

    index: int
    uuid: str | None = None  # "GPU-xxxxxxxx-..." like nvidia-smi, from the persistent id
    pci_bus_id: str | None = None  # from the DRM device file's sysfs node
    cuda_ordinal: int | None = None  # EGL_CUDA_DEVICE_NV
    software: bool = False  # EGL_MESA_device_software (llvmpipe)


@dataclass(frozen=True)
class RenderPlan:
    """The render device chosen for a shard's env workers, and the variables that select it."""

    description: str
    env: dict[str, str]
    gpu_memory_mib: int | None = None  # the render GPU's memory (None: no GPU, or unknown)

    @property
    def expected(self) -> str | None:
        return self.env.get(EXPECTED_DEVICE_VARIABLE)


# -- identities ---------------------------------------------------------------------------------


def normalize_pci_bus_id(bus_id: str) -> str:
    """`00000000:3B:00.0` (nvidia-smi) and `0000:3b:00.0` (sysfs) -> `0000:3b:00.0`."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device_function = parts
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{device_function}"


def _uuid_text(raw: bytes) -> str:
    hexed = raw.hex()
    return f"GPU-{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:32]}"


def gpu_for_entry(entry: str, gpus: Sequence[GpuDevice]) -> GpuDevice:
    """The GPU a `CUDA_VISIBLE_DEVICES` entry (an index or a `GPU-` UUID) names."""
    entry = entry.strip()
    for gpu in gpus:
        if entry.isdigit() and gpu.index == int(entry):
            return gpu
        if not entry.isdigit() and gpu.uuid.lower().startswith(entry.lower()):
            return gpu
    known = ", ".join(f"{g.index} ({g.uuid}, {g.pci_bus_id})" for g in gpus) or "none"
    raise RenderDeviceError(
        f"rollout.render_device: GPU {entry!r} is not one of the GPUs nvidia-smi lists: {known}"
    )


def egl_device_for(gpu: GpuDevice, egl_devices: Sequence[EglDevice]) -> EglDevice:
    """The EGL device that is `gpu`, matched by UUID, else PCI bus id, else CUDA ordinal."""
    for key, mine in (
        ("uuid", gpu.uuid.lower()),
        ("pci_bus_id", normalize_pci_bus_id(gpu.pci_bus_id)),
    ):
        for device in egl_devices:
            theirs = getattr(device, key)
            if theirs is None:
                continue
            theirs = theirs.lower() if key == "uuid" else normalize_pci_bus_id(theirs)
            if theirs == mine:
                return device
    # EGL_NV_device_cuda: the ordinal in CUDA's own enumeration of the whole machine
    # (CUDA_VISIBLE_DEVICES cleared), which follows nvidia-smi's PCI order when
    # CUDA_DEVICE_ORDER=PCI_BUS_ID or the GPUs are all alike.
    for device in egl_devices:
        if device.cuda_ordinal is not None and device.cuda_ordinal == gpu.index:
            return device
    listed = ", ".join(describe_egl(d) for d in egl_devices) or "none"
    raise RenderDeviceError(
        f"rollout.render_device: no EGL device is GPU {gpu.index} ({gpu.uuid}, PCI "
        f"{gpu.pci_bus_id}); EGL lists: {listed}. Set rollout.render_device to cpu, or to "
        "a GPU that EGL can render on."
    )


def describe_egl(device: EglDevice) -> str:
    parts = [f"#{device.index}"]
    if device.uuid:
        parts.append(device.uuid)
    if device.pci_bus_id:
        parts.append(f"PCI {device.pci_bus_id}")
    if device.cuda_ordinal is not None:
        parts.append(f"CUDA {device.cuda_ordinal}")
    if device.software:
        parts.append("software")
    return " ".join(parts)


def identity_of(device: EglDevice) -> str:
    """A string that names the device across processes (what the check compares)."""
    if device.uuid:
        return device.uuid.lower()
    if device.pci_bus_id:
        return normalize_pci_bus_id(device.pci_bus_id)
    if device.cuda_ordinal is not None:
        return f"cuda:{device.cuda_ordinal}"
    return f"egl:{device.index}"


# -- planning -----------------------------------------------------------------------------------


def slot_gpu_entry(
    slot_gpu_ids: Sequence[int] | int | None, environ: Mapping[str, str]
) -> str | None:
    """The slot's first GPU: the launcher's pin (local runs), else the job's allocation."""
    if isinstance(slot_gpu_ids, int):
        return str(slot_gpu_ids)
    if slot_gpu_ids:
        return str(slot_gpu_ids[0])
    visible = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible not in ("-1", "NoDevFiles"):
        return visible.split(",")[0]
    return None


def plan_render_env(
    choice: str | int,
    *,
    mujoco_gl: str,
    slot_gpu_ids: Sequence[int] | int | None,
    backend: str,
    environ: Mapping[str, str] | None = None,
    list_gpus: Callable[[], list[GpuDevice]] | None = None,
    list_egl: Callable[[], list[EglDevice]] | None = None,
    mesa_vendor_files: Callable[[], list[str]] | None = None,
) -> RenderPlan:
    """The env workers' render variables for `rollout.render_device` = `choice`.

    choice: "auto" (the slot's GPU with backend sglang; unchanged EGL defaults otherwise),
    "slot_gpu", "cpu", or a GPU index as nvidia-smi and CUDA_VISIBLE_DEVICES number it.
    """
    environ = os.environ if environ is None else environ
    list_gpus = list_gpus or query_gpus
    list_egl = list_egl or query_egl_devices
    mesa_vendor_files = mesa_vendor_files or find_mesa_vendor_files
    if choice == "auto":
        choice = "slot_gpu" if backend == "sglang" else "default"
    if choice == "default":
        env = {"MUJOCO_GL": mujoco_gl}
        if mujoco_gl == "egl":
            env["PYOPENGL_PLATFORM"] = "egl"
        return RenderPlan(f"{mujoco_gl} defaults (no device pinned)", env)
    if choice == "cpu":
        return _cpu_plan(mujoco_gl, mesa_vendor_files())
    if mujoco_gl != "egl":
        raise RenderDeviceError(
            f"rollout.render_device: {choice!r} renders on a GPU through EGL, but "
            f"rollout.mujoco_gl is {mujoco_gl!r}; set rollout.mujoco_gl: egl, or "
            "rollout.render_device: cpu"
        )
    if choice == "slot_gpu":
        entry = slot_gpu_entry(slot_gpu_ids, environ)
        if entry is None:
            raise RenderDeviceError(
                "rollout.render_device: slot_gpu, but this job has no GPU (server.gpu_ids "
                "is unset and CUDA_VISIBLE_DEVICES is empty); set rollout.render_device to "
                "cpu or to a GPU index"
            )
    elif isinstance(choice, int) and not isinstance(choice, bool) and choice >= 0:
        entry = str(choice)
    else:
        raise RenderDeviceError(
            f"rollout.render_device: {choice!r} is not one of auto, slot_gpu, cpu, or a GPU "
            "index >= 0"
        )
    gpu = gpu_for_entry(entry, list_gpus())
    device = egl_device_for(gpu, list_egl())
    env = {
        "MUJOCO_GL": "egl",
        "PYOPENGL_PLATFORM": "egl",
        "MUJOCO_EGL_DEVICE_ID": str(device.index),
        # robosuite asserts MUJOCO_EGL_DEVICE_ID is in CUDA_VISIBLE_DEVICES; env workers
        # run no CUDA code.
        "CUDA_VISIBLE_DEVICES": str(device.index),
        EXPECTED_DEVICE_VARIABLE: identity_of(device),
    }
    return RenderPlan(
        f"GPU {gpu.index} ({gpu.uuid}) = EGL device {describe_egl(device)}", env, gpu.memory_mib
    )


def _cpu_plan(mujoco_gl: str, vendor_files: list[str]) -> RenderPlan:
    if mujoco_gl == "osmesa":
        env = {"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa", "CUDA_VISIBLE_DEVICES": ""}
        return RenderPlan("CPU (OSMesa)", env)
    if not vendor_files:
        raise RenderDeviceError(
            "rollout.render_device: cpu with rollout.mujoco_gl egl needs Mesa's EGL vendor "
            "file (/usr/share/glvnd/egl_vendor.d/*mesa*.json, Debian package libegl-mesa0); "
            "install it, or set rollout.mujoco_gl: osmesa"
        )
    env = {
        "MUJOCO_GL": "egl",
        "PYOPENGL_PLATFORM": "egl",
        # Only Mesa's EGL, whose first device is always its software one (llvmpipe).
        "__EGL_VENDOR_LIBRARY_FILENAMES": ":".join(vendor_files),
        "MUJOCO_EGL_DEVICE_ID": "0",
        "CUDA_VISIBLE_DEVICES": "0",  # robosuite's assert; env workers run no CUDA code
        EXPECTED_DEVICE_VARIABLE: "software",
    }
    return RenderPlan("CPU (Mesa llvmpipe through EGL)", env)


# -- the check at env start ---------------------------------------------------------------------


def robosuite_egl_index(environ: Mapping[str, str]) -> int:
    """The EGL device index robosuite 1.4 will open (its egl_context/binding_utils rules)."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    chosen = environ.get("MUJOCO_EGL_DEVICE_ID")
    if visible and chosen is not None and not (chosen.isdigit() and chosen in visible):
        raise RenderDeviceError(
            f"MUJOCO_EGL_DEVICE_ID={chosen!r} does not appear in CUDA_VISIBLE_DEVICES="
            f"{visible!r}: robosuite asserts it does (robosuite/utils/binding_utils.py). "
            "Let rollout.render_device set both."
        )
    selected = chosen if chosen is not None else visible
    if selected is None:
        return 0
    first = selected.split(",")[0].strip()
    if not first.isdigit():
        variable = "MUJOCO_EGL_DEVICE_ID" if chosen is not None else "CUDA_VISIBLE_DEVICES"
        raise RenderDeviceError(
            f"robosuite reads {variable}={selected!r} as an EGL device index, and "
            f"{first!r} is not one; set rollout.render_device so MUJOCO_EGL_DEVICE_ID is "
            "set explicitly"
        )
    return int(first)


def check_render_env(
    environ: Mapping[str, str] | None = None,
    list_egl: Callable[[], list[EglDevice]] | None = None,
) -> str:
    """Check that the variables select the planned device; describe it, or raise naming them."""
    environ = os.environ if environ is None else environ
    gl = environ.get("MUJOCO_GL", "")
    shown = ", ".join(f"{k}={environ.get(k)!r}" for k in RENDER_VARIABLES if k in environ)
    if gl != "egl":
        platform = environ.get("PYOPENGL_PLATFORM", gl)
        if gl == "osmesa" and platform != "osmesa":
            raise RenderDeviceError(
                f"MUJOCO_GL=osmesa needs PYOPENGL_PLATFORM=osmesa, got {platform!r} ({shown})"
            )
        return f"MUJOCO_GL={gl}"
    if environ.get("PYOPENGL_PLATFORM", "egl").lower() != "egl":
        raise RenderDeviceError(
            f"MUJOCO_GL=egl needs PYOPENGL_PLATFORM=egl (or unset), got "
            f"{environ.get('PYOPENGL_PLATFORM')!r} ({shown})"
        )
    index = robosuite_egl_index(environ)
    expected = environ.get(EXPECTED_DEVICE_VARIABLE)
    devices = (list_egl or query_egl_devices)()
    if not 0 <= index < len(devices):
        raise RenderDeviceError(
            f"EGL device {index} does not exist: EGL lists {len(devices)} device(s) "
            f"({', '.join(describe_egl(d) for d in devices) or 'none'}); check {shown}"
        )
    device = devices[index]
    if expected == "software":
        if not device.software and (device.uuid or device.pci_bus_id or device.cuda_ordinal):
            raise RenderDeviceError(
                f"rollout.render_device is cpu, but EGL device {index} is "
                f"{describe_egl(device)}, a GPU; check {shown}"
            )
    elif expected is not None and identity_of(device) != expected:
        raise RenderDeviceError(
            f"EGL device {index} is {describe_egl(device)}, not the planned {expected} "
            f"(EGL's device order changed between processes?); check {shown}"
        )
    return f"EGL device {describe_egl(device)}"


# -- real device queries ------------------------------------------------------------------------


def query_gpus() -> list[GpuDevice]:
    """The machine's NVIDIA GPUs (all of them, whatever CUDA_VISIBLE_DEVICES says)."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,pci.bus_id,memory.total",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise RenderDeviceError(
            f"rollout.render_device names a GPU, but nvidia-smi failed ({exc}); set "
            "rollout.render_device: cpu on machines without NVIDIA GPUs"
        ) from exc
    gpus = []
    for line in out.strip().splitlines():
        index, uuid, bus, memory = (part.strip() for part in line.split(","))
        memory_mib = int(memory) if memory.isdigit() else None  # "[N/A]" on some devices
        gpus.append(GpuDevice(int(index), uuid, normalize_pci_bus_id(bus), memory_mib))
    return gpus


def find_mesa_vendor_files() -> list[str]:
    pattern = "/usr/share/glvnd/egl_vendor.d/*mesa*.json"
    return sorted(glob.glob(pattern))


def _pci_of_drm_file(path: str) -> str | None:
    node = os.path.basename(path)
    link = f"/sys/class/drm/{node}/device"
    try:
        return normalize_pci_bus_id(os.path.basename(os.path.realpath(link)))
    except (OSError, ValueError):
        return None


def query_egl_devices() -> list[EglDevice]:
    """eglQueryDevicesEXT with each device's identity (needs PyOpenGL and libEGL)."""
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    from mujoco.egl import egl_ext as EGL  # noqa: N812 - EGL's own naming

    def proc(name: str, restype, *argtypes):
        address = EGL.eglGetProcAddress(name)
        if not address:
            return None
        return ctypes.CFUNCTYPE(restype, *argtypes)(address)

    query_string = proc(
        "eglQueryDeviceStringEXT", ctypes.c_char_p, EGL.EGLDeviceEXT, ctypes.c_int32
    )
    query_attrib = proc(
        "eglQueryDeviceAttribEXT",
        ctypes.c_uint32,
        EGL.EGLDeviceEXT,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_ssize_t),
    )
    query_binary = proc(
        "eglQueryDeviceBinaryEXT",
        ctypes.c_uint32,
        EGL.EGLDeviceEXT,
        ctypes.c_int32,
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_int32),
    )
    devices = []
    for index, handle in enumerate(EGL.eglQueryDevicesEXT()):
        extensions = ""
        if query_string is not None:
            raw = query_string(handle, EGL_EXTENSIONS)
            extensions = raw.decode() if raw else ""
        uuid = pci = None
        cuda = None
        if query_binary is not None and "EGL_EXT_device_persistent_id" in extensions:
            buffer, size = (ctypes.c_uint8 * 16)(), ctypes.c_int32(0)
            if query_binary(handle, EGL_DEVICE_UUID_EXT, 16, buffer, ctypes.byref(size)):
                uuid = _uuid_text(bytes(buffer)[: size.value or 16])
        if query_string is not None and "EGL_EXT_device_drm" in extensions:
            raw = query_string(handle, EGL_DRM_DEVICE_FILE_EXT)
            if raw:
                pci = _pci_of_drm_file(raw.decode())
        if query_attrib is not None and "EGL_NV_device_cuda" in extensions:
            value = ctypes.c_ssize_t(-1)
            if query_attrib(handle, EGL_CUDA_DEVICE_NV, ctypes.byref(value)):
                cuda = int(value.value)
        software = "EGL_MESA_device_software" in extensions
        devices.append(EglDevice(index, uuid, pci, cuda, software))
    return devices
