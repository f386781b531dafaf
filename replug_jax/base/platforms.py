"""The JAX platforms of this machine, settled before JAX is imported: no TPU runtime started where no TPU is.

With libtpu installed (the TPU compiler the plan uses, `replug_jax/plan/`; a test dependency), every JAX process
starts the TPU runtime at its first use of a device, and on a machine without TPU chips libtpu prints its warnings
("could not determine TPU accelerator type", "unexpected worker hostname ...") and costs a second. `settle()`, run
by `import replug_jax` before any module of the package imports JAX, sets JAX_PLATFORMS=cpu where that is the only
platform the machine has: libtpu is installed, no TPU and no GPU is attached, and JAX_PLATFORMS is not set. It
changes nothing anywhere else: a TPU VM (its chips are on the PCI bus), a GPU machine, a machine without libtpu, a
user's own JAX_PLATFORMS. A TPU is taken as present wherever a Google PCI device other than its virtual NIC is, or
/dev/accel* or /dev/vfio/N exists, so that a TPU generation newer than this list is never run on the CPU.
A process that imported JAX before replug_jax decided its platforms already.
"""
from __future__ import annotations

import glob
import importlib.util
import os

GOOGLE_PCI_VENDOR = "0x1ae0"
GOOGLE_NON_TPU_DEVICES = {"0x0042"}  # gVNIC, the virtual NIC of every Compute Engine VM
GPU_DEVICE_FILES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd")  # NVIDIA (JAX's own check) and ROCm


def tpu_attached() -> bool:
    """Whether this machine may have TPU chips (module docstring)."""
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        return True
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor, encoding="ascii") as f:
                if f.read().strip() != GOOGLE_PCI_VENDOR:
                    continue
            with open(os.path.join(os.path.dirname(vendor), "device"), encoding="ascii") as f:
                if f.read().strip() not in GOOGLE_NON_TPU_DEVICES:
                    return True
        except OSError:
            continue
    return False


def gpu_attached() -> bool:
    return any(os.path.exists(path) for path in GPU_DEVICE_FILES)


def settle() -> None:
    """JAX_PLATFORMS=cpu where libtpu is installed and the CPU is the machine's only platform (module docstring)."""
    if "JAX_PLATFORMS" in os.environ or importlib.util.find_spec("libtpu") is None:
        return
    if not tpu_attached() and not gpu_attached():
        os.environ["JAX_PLATFORMS"] = "cpu"
