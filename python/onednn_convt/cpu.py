"""Which CPU this is: vendor and microarchitecture, the key of the measured rules.

oneDNN picks its kernels by the ISA it dispatches to, but how fast each kernel runs, and so
which lowering wins, depends on the machine: a Sapphire Rapids capped at AVX-512 BF16 runs
f32 as fast as bf16, an AMD Zen4 runs native bf16 about twice as fast as f32. The measured
rules (:mod:`onednn_convt.lowering.rules`) are therefore keyed by the CPU they were
measured on, as this module names it, and by the dispatch ISA.

The name comes from the x86 vendor, family and model (``/proc/cpuinfo`` on Linux; elsewhere
the vendor alone, ``"unknown"`` microarchitecture), mapped through :data:`MICROARCHITECTURES`.
``ONEDNN_CONVT_CPU`` overrides it (e.g. ``ONEDNN_CONVT_CPU=unknown`` to try the
conservative default rules, or another CPU's name to use its table).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

#: (vendor, family) -> ((first model, last model, microarchitecture), ...), from the vendors'
#: model numbers (AMD: family 0x19 = 25, 0x1A = 26; Intel: family 6)
MICROARCHITECTURES: dict[tuple[str, int], tuple[tuple[int, int, str], ...]] = {
    ("AuthenticAMD", 23): ((0x00, 0x2F, "zen"), (0x30, 0xFF, "zen2")),
    ("AuthenticAMD", 25): (
        (0x00, 0x0F, "zen3"), (0x10, 0x1F, "zen4"), (0x20, 0x5F, "zen3"), (0x60, 0x7F, "zen4"),
        (0xA0, 0xAF, "zen4"),
    ),
    ("AuthenticAMD", 26): ((0x00, 0xFF, "zen5"),),
    ("GenuineIntel", 6): (
        (0x55, 0x55, "skylake-x"), (0x6A, 0x6A, "icelake-x"), (0x6C, 0x6C, "icelake-x"),
        (0x7D, 0x7E, "icelake"), (0x8C, 0x8D, "tigerlake"), (0x8F, 0x8F, "sapphirerapids"),
        (0x97, 0x9A, "alderlake"), (0xAA, 0xAC, "meteorlake"), (0xAD, 0xAE, "graniterapids"),
        (0xB7, 0xB7, "raptorlake"), (0xBA, 0xBA, "raptorlake"), (0xBF, 0xBF, "raptorlake"),
        (0xCF, 0xCF, "emeraldrapids"),
    ),
}
#: display names of the microarchitectures
NAMES = {
    "zen": "AMD Zen", "zen2": "AMD Zen2", "zen3": "AMD Zen3", "zen4": "AMD Zen4", "zen5": "AMD Zen5",
    "skylake-x": "Intel Skylake-X", "icelake-x": "Intel Ice Lake-SP", "icelake": "Intel Ice Lake",
    "tigerlake": "Intel Tiger Lake", "sapphirerapids": "Intel Sapphire Rapids", "alderlake": "Intel Alder Lake",
    "meteorlake": "Intel Meteor Lake", "graniterapids": "Intel Granite Rapids", "raptorlake": "Intel Raptor Lake",
    "emeraldrapids": "Intel Emerald Rapids",
}
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Cpu:
    """One CPU as the measured rules key it.

    Attributes:
        vendor: ``"AuthenticAMD"``, ``"GenuineIntel"``, ... or ``"unknown"``.
        family, model: the x86 family and model numbers (-1 where unknown).
        microarchitecture: a key of :data:`NAMES`, or ``"unknown"``.
        model_name: the OS's description of the CPU (``/proc/cpuinfo`` "model name").
        overridden: whether ``ONEDNN_CONVT_CPU`` set the microarchitecture.
    """

    vendor: str
    family: int
    model: int
    microarchitecture: str
    model_name: str
    overridden: bool = False

    @property
    def name(self) -> str:
        """A readable name: ``"AMD Zen5 (AMD EPYC, family 26 model 2)"``."""
        arch = NAMES.get(self.microarchitecture, self.microarchitecture)
        return f"{arch} ({self.model_name}, family {self.family} model {self.model})"


def microarchitecture(vendor: str, family: int, model: int) -> str:
    """The microarchitecture of an x86 vendor, family and model; ``"unknown"`` if not listed."""
    for first, last, arch in MICROARCHITECTURES.get((vendor, family), ()):
        if first <= model <= last:
            return arch
    return UNKNOWN


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if fields:
                        break
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return -1


@functools.lru_cache(maxsize=None)
def detect() -> Cpu:
    """This machine's CPU (read once per process; ``ONEDNN_CONVT_CPU`` overrides the
    microarchitecture)."""
    fields = _cpuinfo()
    vendor = fields.get("vendor_id", UNKNOWN)
    family, model = _int(fields.get("cpu family", "-1")), _int(fields.get("model", "-1"))
    name = fields.get("model name", UNKNOWN)
    arch = microarchitecture(vendor, family, model)
    given = os.environ.get("ONEDNN_CONVT_CPU", "").strip().lower()
    if given:
        return Cpu(vendor, family, model, given, name, overridden=True)
    return Cpu(vendor, family, model, arch, name)
