"""The table of physical devices (SPEC §2 "Devices").

One :class:`Device` record per physical device: the CPU package and each NVIDIA GPU
(real, or the Numba CUDA simulator's, marked ``simulated``). The table is built once
and rebuilt on ``devices(refresh=True)``.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import platform as _platform
import threading
from pathlib import Path

import psutil

from ..cuda_compat import cuda_available, cuda_module, simulated
from ..errors import ArgumentError, ArgumentTypeError, DeviceError


@dataclasses.dataclass(frozen=True)
class Device:
    """Capabilities of one physical device.

    ``simd_width`` counts 32-bit lanes of the widest vector unit on a CPU and the warp
    size on a GPU; ``version`` is the CPU ISA (LLVM's CPU name and vector features) or
    the CUDA compute capability ``"major.minor"``.
    """

    id: str
    kind: str
    vendor: str
    name: str
    version: str
    compute_units: int
    simd_width: int
    global_memory: int
    local_memory: int
    fp64: bool
    atomics: bool
    host_shared: bool
    simulated: bool = False
    ordinal: int = 0
    arch: str = ""

    def to_dict(self):
        return dataclasses.asdict(self)

    def synchronize(self) -> None:
        """Wait until everything enqueued on this device, from any thread and stream, has
        run: a GPU launch over device data (CuPy or hetflow arrays) returns once it is
        enqueued, so a loop of them is timed, or its GPU's results read by other means
        than hetflow's, after this. A CPU's launches return done: nothing to wait for."""
        if self.kind != "gpu":
            return
        cuda = cuda_module()
        with cuda.gpus[self.ordinal]:
            cuda.synchronize()


_lock = threading.Lock()
_table: tuple[Device, ...] | None = None


def devices(refresh: bool = False) -> tuple[Device, ...]:
    """Return the device table, rebuilding it when ``refresh`` is True."""
    global _table
    table = _table  # built once: read without the lock (a tuple, replaced whole)
    if table is not None and refresh is False:
        return table
    if not isinstance(refresh, bool):  # "no" or "false" would rebuild it
        raise ArgumentTypeError(f"devices: refresh must be True or False; got {type(refresh).__name__} "
                                f"{refresh!r}")
    with _lock:
        if _table is None or refresh:
            if refresh:
                cuda_available.cache_clear()
                cpu_device.cache_clear()
            _table = (cpu_device(),) + _gpu_devices()
            _by_id.clear()
        return _table


@functools.lru_cache(maxsize=1)
def cpu_device() -> Device:
    """The CPU package's record, without enumerating GPUs (which starts CUDA)."""
    return _cpu_device()


_gpus: tuple = (None, ())  # (a device table, its GPUs)


def gpus() -> tuple[Device, ...]:
    """The GPUs of the device table (none on a machine without one), taken once per table."""
    global _gpus
    table = devices()
    if _gpus[0] is not table:
        _gpus = (table, tuple(d for d in table if d.kind == "gpu"))
    return _gpus[1]


def find_devices(name: str) -> tuple[Device, ...]:
    """The devices ``name`` stands for: one id ('cpu0', 'gpu1'), ``'all'`` (every device
    in the table) or ``'gpu'`` (every GPU, or the CPU on a machine without one, so that
    code written for a GPU also runs where there is none)."""
    if name == "all":
        return devices()
    if name == "gpu":
        return gpus() or (cpu_device(),)
    try:
        return (get_device(name),)
    except DeviceError as exc:  # a name, not only an id, was wanted: say which names there are
        raise DeviceError(f"{exc}; or name 'all' (every device) or 'gpu' (every GPU), or list several "
                          f"devices: {[d.id for d in devices()]!r}") from None


def get_device(device_id) -> Device:
    """Look a device up by id ('cpu0', 'gpu0', ...); a Device gives the table's record of
    its id. An id of no device raises DeviceError listing the devices; anything but an id
    or a Device, ArgumentTypeError."""
    try:
        return _by_id[device_id]
    except (KeyError, TypeError):  # (TypeError: unhashable, a list)
        return _look_up(device_id)


def _look_up(device_id) -> Device:
    """:func:`get_device` for an id it has not seen yet (or no id at all)."""
    if isinstance(device_id, Device):
        return get_device(device_id.id)
    if not isinstance(device_id, str):
        raise ArgumentTypeError(f"a device is named by an id such as 'cpu0' or 'gpu0', or a Device; got "
                                f"{type(device_id).__name__} {device_id!r}")
    if device_id == "cpu0":  # without enumerating GPUs (which starts CUDA)
        found = cpu_device()
    else:
        found = next((dev for dev in devices() if dev.id == device_id), None)
        if found is None:
            raise DeviceError(_unknown(device_id))
    _by_id[device_id] = found
    return found


def _unknown(device_id: str) -> str:
    """Why ``device_id`` names no device, listing those that exist."""
    known = [d.id for d in devices()]
    near = device_id.strip().lower()  # ids are lower case, without spaces: 'GPU0', ' cpu0 '
    hint = f" (did you mean {near!r}?)" if near != device_id and near in known else ""
    return f"no device with id {device_id!r}{hint}; devices are: {', '.join(known)}"


_by_id: dict[str, Device] = {}  # ids looked up in the table in force (devices() clears it)


def device_list(given, what: str, kinds: str, empty: bool = False) -> tuple[Device, ...]:
    """The devices that ``given``, a list of device ids and Devices, names: none twice, and
    at least one unless ``empty``. Messages name the argument ``what``, and say it must be
    one of ``kinds`` when ``given`` is no list."""
    if isinstance(given, (str, bytes)):  # not a list of ids, one per character
        raise ArgumentTypeError(f"{what} must be {kinds}; got {type(given).__name__} {given!r}")
    if isinstance(given, (set, frozenset)):  # devices take rows and shares in the list's order
        raise ArgumentTypeError(f"{what} {given!r} is a set, whose order is arbitrary: give a list "
                                f"(shares and rows go to devices in its order)")
    try:
        items = tuple(given)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be {kinds}; got {type(given).__name__}") from None
    if not items and not empty:
        raise ArgumentError(f"{what} {given!r} names no device; give at least one")
    # (get_device keeps the ids it found: a list of ids is a few dict look-ups)
    found = tuple(_recorded(d, what) if isinstance(d, Device) else _listed(d, given, what) for d in items)
    if len(found) > 1:  # each device runs its share once (ids: hashed once, unlike a Device)
        ids = [d.id for d in found]
        if len(set(ids)) < len(ids):
            twice = sorted({i for i in ids if ids.count(i) > 1})
            raise ArgumentError(f"{what} {given!r} names {', '.join(twice)} more than once")
    return found


def _listed(item, given, what: str) -> Device:
    """The device of id ``item`` of the list ``given``."""
    if not isinstance(item, str):
        raise ArgumentTypeError(f"{what} {given!r} holds {item!r}, which is neither a device id nor a Device")
    return get_device(item)


def _recorded(device: Device, what: str) -> Device:
    """``device``, a record of the device table: one the table lacks, or holds with other
    fields (made up, or changed with ``dataclasses.replace``), would run with what no
    device has and fail only inside the launch."""
    table = devices()
    if device in table:  # (identity first: the table's own records compare no fields)
        return device
    record = next((d for d in table if d.id == device.id), None)
    if record is None:
        raise DeviceError(f"{what}: Device {device.id!r} is not in the device table; devices are: "
                          f"{', '.join(d.id for d in table)}")
    differ = [f"{f.name} {getattr(device, f.name)!r} (the table's: {getattr(record, f.name)!r})"
              for f in dataclasses.fields(Device) if getattr(device, f.name) != getattr(record, f.name)]
    raise DeviceError(f"{what}: Device {device.id!r} differs from the device table's record in "
                      f"{', '.join(differ)}; take devices from hetflow.devices() or hetflow.get_device()")


@functools.lru_cache(maxsize=1)
def host_arch() -> str:
    """LLVM's name for the host CPU plus a digest of its features (what Numba targets)."""
    import hashlib

    import llvmlite.binding as ll

    features = ll.get_host_cpu_features().flatten()
    return f"{ll.get_host_cpu_name()}-{hashlib.sha1(features.encode()).hexdigest()[:8]}"


def _simd_lanes(features) -> int:
    if features.get("avx512f"):
        return 16
    if features.get("avx2") or features.get("avx"):
        return 8
    return 4


@functools.lru_cache(maxsize=1)
def _cpu_brand() -> tuple[str, str, int]:
    """(vendor, brand name, L1 data cache bytes).

    Read from /proc and /sys where they exist (instant); py-cpuinfo elsewhere, which
    runs CPUID in a subprocess and takes about a second.
    """
    try:
        fields = {}
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
        l1d = Path("/sys/devices/system/cpu/cpu0/cache/index0/size").read_text().strip()
        l1d_bytes = int(l1d[:-1]) * 1024 if l1d.endswith("K") else int(l1d)
        return fields["vendor_id"], fields["model name"], l1d_bytes
    except (OSError, KeyError, ValueError):
        import cpuinfo

        info = cpuinfo.get_cpu_info()
        l1d = info.get("l1_data_cache_size") or 0
        return info.get("vendor_id_raw", "unknown"), info.get("brand_raw", _platform.processor()), int(l1d)


def _cpu_device() -> Device:
    import llvmlite.binding as ll

    features = ll.get_host_cpu_features()
    vendor, brand, l1d = _cpu_brand()
    vec = sorted(k for k, v in features.items() if v and k.startswith(("avx", "sse", "neon", "sve")))
    return Device(
        id="cpu0",
        kind="cpu",
        vendor=vendor,
        name=brand,
        version=f"{_platform.machine()} {ll.get_host_cpu_name()} " + " ".join(vec),
        compute_units=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        simd_width=_simd_lanes(features),
        global_memory=psutil.virtual_memory().total,
        local_memory=l1d,
        fp64=True,
        atomics=True,
        host_shared=True,
        arch=host_arch(),
    )


def _gpu_devices() -> tuple[Device, ...]:
    if not cuda_available():
        return ()
    cuda = cuda_module()
    if simulated():
        return tuple(_simulated_gpu(i, g) for i, g in enumerate(cuda.gpus))
    return tuple(_real_gpu(cuda, i) for i in range(len(cuda.gpus)))


def _simulated_gpu(ordinal, gpu) -> Device:
    major, minor = gpu.compute_capability
    return Device(
        id=f"gpu{ordinal}", kind="gpu", vendor="NVIDIA", name="Numba CUDA simulator",
        version=f"{major}.{minor}", compute_units=1, simd_width=32,
        global_memory=psutil.virtual_memory().total, local_memory=48 * 1024,
        fp64=True, atomics=True, host_shared=True, simulated=True, ordinal=ordinal,
        arch=f"sim-sm_{major}{minor}",
    )


def _real_gpu(cuda, ordinal) -> Device:
    """The GPU's description from the driver's device attributes, without a context: a
    context on every GPU of the host would cost each process (an MPI rank a GPU) memory
    and start-up time on all of them, not only on the GPU it uses."""
    driver = cuda.cudadrv.driver.driver
    dev = driver.get_device(ordinal)
    major, minor = dev.compute_capability
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    return Device(
        id=f"gpu{ordinal}", kind="gpu", vendor="NVIDIA", name=name,
        version=f"{major}.{minor}", compute_units=dev.MULTIPROCESSOR_COUNT,
        simd_width=dev.WARP_SIZE, global_memory=int(driver.cuDeviceTotalMem(dev.id)),
        local_memory=dev.MAX_SHARED_MEMORY_PER_BLOCK, fp64=True, atomics=True,
        host_shared=bool(getattr(dev, "UNIFIED_ADDRESSING", 0)), ordinal=ordinal,
        arch=f"sm_{major}{minor}",
    )
