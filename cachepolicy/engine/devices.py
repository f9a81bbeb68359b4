"""The compute devices this llama-cpp-python build offers, and where a model's layers go.

``EngineConfig.n_gpu_layers`` is llama.cpp's ``n_gpu_layers`` (``llama-server -ngl``): the
last N of the model's ``n_layer + 1`` layers (the repeating blocks and the output layer;
the input embedding always stays in host memory) are placed on the GPU devices, each
offloaded attention layer's KV cells with them.  -1 means every layer (llama.cpp's own
convention; ``-ngl 99`` does the same on any model of fewer layers).

What llama.cpp 0.3.36's bindings do not say — which devices the build has, how many layers
actually went to one — is read here: the devices from ggml's backend registry (the
``ggml_backend_dev_*`` functions of the ``libggml`` shipped beside ``libllama``, through
ctypes), and the layer count by llama.cpp's own arithmetic (``llama_model::load_tensors``:
``min(n_gpu_layers, n_layer + 1)`` when the model has a GPU device, else 0; the figure its
"offloaded X/Y layers to GPU" log line prints).  The model's devices are the GPUs, or the
integrated GPUs when there is no discrete one (llama.cpp's choice); on a CPU-only build
there are none, so nothing is offloaded whatever was asked, and ``plan`` says so plainly.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import attrs
import llama_cpp
import structlog
from llama_cpp import llama_cpp as _bindings

from cachepolicy.engine.sizing import context_cost, device_weight_bytes

log = structlog.get_logger("kvagent.engine")

#: ``enum ggml_backend_dev_type`` (ggml-backend.h)
DEVICE_KINDS = ("CPU", "GPU", "IGPU", "ACCEL")
#: What a load says when layers were asked for and the build has no GPU backend.
NO_GPU_BACKEND = "no layer was offloaded: this llama-cpp-python build has no GPU backend"
#: ... and when it has one but this machine shows it no device.
NO_GPU_DEVICE = "no layer was offloaded: llama.cpp found no GPU device on this machine"


@attrs.frozen
class Device:
    """One ggml backend device (``ggml_backend_dev_*``)."""

    name: str  # "CPU", "CUDA0", "Metal", "Vulkan0"...
    description: str  # the hardware: "NVIDIA GeForce RTX 4090", the CPU's model
    kind: str  # one of DEVICE_KINDS
    free_bytes: int
    total_bytes: int


@functools.cache
def _ggml() -> Any:
    """libggml, the library libllama was linked against (already loaded: dlopen returns the
    same handle), with the device functions' signatures declared."""
    lib = ctypes.CDLL(str(Path(_bindings._lib._name).parent / "libggml.so"))
    lib.ggml_backend_dev_count.restype = ctypes.c_size_t
    lib.ggml_backend_dev_count.argtypes = []
    lib.ggml_backend_dev_get.restype = ctypes.c_void_p
    lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(lib, name).restype = ctypes.c_char_p
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_type.restype = ctypes.c_int
    lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_dev_memory.restype = None
    lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.POINTER(ctypes.c_size_t)]
    return lib


def devices() -> tuple[Device, ...]:
    """Every device the build's backends registered (the CPU is always one), with its free
    and total memory now."""
    lib = _ggml()
    out = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = lib.ggml_backend_dev_type(dev)
        out.append(Device(name=(lib.ggml_backend_dev_name(dev) or b"?").decode(),
                          description=(lib.ggml_backend_dev_description(dev) or b"").decode(),
                          kind=DEVICE_KINDS[kind] if 0 <= kind < len(DEVICE_KINDS) else "?",
                          free_bytes=free.value, total_bytes=total.value))
    return tuple(out)


def model_devices(found: tuple[Device, ...]) -> tuple[Device, ...]:
    """The devices llama.cpp would place offloaded layers on: the GPUs, else the integrated
    GPUs (``llama_model_load_from_file``'s default device list)."""
    gpus = tuple(d for d in found if d.kind == "GPU")
    return gpus or tuple(d for d in found if d.kind == "IGPU")


def layers_offloaded(requested: int, n_layer: int, *, has_device: bool) -> int:
    """How many of the model's ``n_layer + 1`` layers llama.cpp puts on a device for
    ``n_gpu_layers = requested`` (-1: all), by its own arithmetic."""
    if not has_device or requested == 0:
        return 0
    return n_layer + 1 if requested < 0 else min(requested, n_layer + 1)


@attrs.frozen
class Offload:
    """Where a model's layers went: ``layers`` of ``total_layers`` on ``devices`` (none: the
    CPU backend holds everything), for ``requested`` (``n_gpu_layers``)."""

    requested: int
    layers: int
    total_layers: int
    devices: tuple[Device, ...] = ()
    #: why fewer layers than asked went to a device ("" when all that was asked did)
    note: str = ""
    #: bytes placed in device memory at load (an estimate: ``sizing.device_bytes``)
    device_bytes: int = 0

    @property
    def backend(self) -> str:
        """What computed the model: "CPU", or the devices holding its layers ("CUDA0",
        "CUDA0+CUDA1"), with the share offloaded when it is not every layer."""
        if self.layers == 0:
            return "CPU"
        names = "+".join(d.name for d in self.devices)
        return names if self.layers == self.total_layers else (
            f"{names} ({self.layers}/{self.total_layers} layers, the rest on CPU)")

    @property
    def cache_key(self) -> str:
        """The backend as far as kernels care (the row-class cache's key): "CPU", or the
        devices' names and hardware and how many layers they hold."""
        if self.layers == 0:
            return "CPU"
        return "+".join(f"{d.name}:{d.description}" for d in self.devices) + (
            f"|{self.layers}/{self.total_layers}")

    def describe(self) -> str:
        """"CPU", or the devices and the layers they hold (``note`` is said apart)."""
        if self.layers == 0:
            return "CPU"
        return (f"{'+'.join(d.name for d in self.devices)} ({self.layers}/"
                f"{self.total_layers} layers on "
                f"{', '.join(d.description or d.name for d in self.devices)})")

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "requested_layers": self.requested,
                "offloaded_layers": self.layers, "total_layers": self.total_layers,
                "devices": [attrs.asdict(d) for d in self.devices], "note": self.note,
                "device_bytes": self.device_bytes}


def plan(requested: int, n_layer: int) -> Offload:
    """Where ``n_gpu_layers = requested`` puts a model of ``n_layer`` blocks on this build
    and machine (asked before or after the load: llama.cpp decides the same way)."""
    on = model_devices(devices()) if requested != 0 else ()
    layers = layers_offloaded(requested, n_layer, has_device=bool(on))
    note = ""
    if requested != 0 and layers == 0:
        note = NO_GPU_DEVICE if llama_cpp.llama_supports_gpu_offload() else NO_GPU_BACKEND
    return Offload(requested=requested, layers=layers, total_layers=n_layer + 1,
                   devices=on if layers else (), note=note)


def offload_for(model_path: str | Path, config: Any, n_layer: int) -> Offload:
    """``plan`` for a model just loaded with ``config`` (an ``EngineConfig``), its device
    bytes estimated (``sizing``), and said: an ``engine_gpu_offload`` info event when layers
    went to a device, an ``engine_gpu_unavailable`` warning with the plain reason when some
    were asked for and none went."""
    offload = plan(config.n_gpu_layers, n_layer)
    if offload.layers:
        cost = context_cost(model_path, config, offloaded=offload.layers)
        offload = attrs.evolve(offload, device_bytes=(
            device_weight_bytes(model_path, offload.layers)
            + (cost.device_bytes if cost is not None else 0)))
        log.info("engine_gpu_offload", backend=offload.backend, layers=offload.layers,
                 total_layers=offload.total_layers, device_bytes=offload.device_bytes)
    elif config.n_gpu_layers != 0:
        log.warning("engine_gpu_unavailable", requested=config.n_gpu_layers,
                    message=offload.note)
    return offload
