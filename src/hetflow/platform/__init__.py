"""Platform: devices, capability matching, contexts, executables, the code repository."""
from .context import Context
from .devices import Device, devices, get_device
from .matching import LogicalDevice, select

__all__ = ["Context", "Device", "LogicalDevice", "devices", "get_device", "select"]
