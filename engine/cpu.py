"""What this CPU is and whether it runs bf16 matmuls natively (read from its flags, not from what oneDNN emulates)."""

from __future__ import annotations

import platform
from pathlib import Path

# x86: AVX-512 BF16 (Zen 4, Cooper Lake and later Xeons) or AMX (Sapphire Rapids and later) compute bf16 dot
# products in hardware; without them oneDNN still "supports" bf16 on AVX-512 by converting in software.
X86_NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})
# Arm: the BFDOT/BFMMLA instructions (Armv8.6 BF16, Neoverse V1/N2 and later), with SVE or without.
ARM_NATIVE_BF16 = frozenset({"bf16", "svebf16"})
_CPUINFO = Path("/proc/cpuinfo")
# What a record names its machine by, besides the model name: the kind of bf16 matmul the CPU has (the brand alone
# does not tell a Zen 4, bf16 in hardware, from an AVX2 EPYC that emulates it at half the speed or less).
# AVX-512 without BF16 counts as AVX2 here: bf16 is emulated on both.
CPU_KINDS = ("AMX", "AVX-512 BF16", "AVX2", "other")
_TORCH_KINDS = {"AMX": "AMX", "AMX_BF16": "AMX", "AVX512_BF16": "AVX-512 BF16", "AVX512": "AVX2", "AVX2": "AVX2"}


def _cpuinfo_lines() -> list[str]:
    try:
        return _CPUINFO.read_text().splitlines()
    except OSError:
        return []


def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC 9R14", "Intel(R) Xeon(R) Platinum 8488C", ...) or the best guess."""
    for line in _cpuinfo_lines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("model name", "cpu model", "hardware") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_flags() -> frozenset[str]:
    """The feature flags of the first CPU (x86 `flags`, Arm `Features`), lower case; empty where unreadable."""
    for line in _cpuinfo_lines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features") and ":" in line:
            return frozenset(line.split(":", 1)[1].lower().split())
    return frozenset()


def native_bf16(flags: frozenset[str] | set[str] | None = None, machine: str | None = None) -> bool:
    """True when the CPU computes bf16 matmuls in hardware: AVX-512 BF16 or AMX on x86, BF16 (or SVE BF16) on Arm.

    Without flags to read (not Linux), x86 falls back to torch's own capability string (it names AMX or AVX-512
    BF16 only where the hardware has them); anything else counts as not native.
    """
    machine = (machine or platform.machine()).lower()
    flags = cpu_flags() if flags is None else frozenset(f.lower() for f in flags)
    if machine in ("x86_64", "amd64", "i686", "x86"):
        if flags:
            return bool(flags & X86_NATIVE_BF16)
        return _torch_capability() in ("AVX512_BF16", "AMX", "AMX_BF16")
    if machine in ("aarch64", "arm64"):
        return bool(flags & ARM_NATIVE_BF16)
    return False


def cpu_kind(flags: frozenset[str] | set[str] | None = None) -> str:
    """One of CPU_KINDS from the CPU's flags: "AMX" (amx_tile/amx_bf16), "AVX-512 BF16" (avx512_bf16), "AVX2",
    else "other". Without flags to read (not Linux), torch's capability string, which names the same features."""
    flags = cpu_flags() if flags is None else frozenset(f.lower() for f in flags)
    if not flags:
        return _TORCH_KINDS.get(_torch_capability(), "other")
    if flags & {"amx_tile", "amx_bf16"}:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX-512 BF16"
    return "AVX2" if "avx2" in flags else "other"


def kind_named(text: str | None) -> str | None:
    """The CPU kind a description names ("AMD EPYC (2 cores, AVX-512 BF16, native bf16)", "Intel Xeon (AMX,
    AVX-512 BF16), 2-core VM": the first of CPU_KINDS among its comma-separated words), else None."""
    words = {w.strip() for w in str(text or "").replace("(", ",").replace(")", ",").split(",")}
    return next((kind for kind in CPU_KINDS[:-1] if kind in words), None)


def cpu_identity() -> dict[str, str]:
    """{"cpu": the model name, "cpu_kind": one of CPU_KINDS}: how every measurement record names its machine."""
    return {"cpu": cpu_model(), "cpu_kind": cpu_kind()}


def _torch_capability() -> str:
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability()).upper()
    except (ImportError, AttributeError):
        return ""


def describe() -> str:
    """"AMD EPYC (2 cores, AVX2, bf16 emulated)" — the line a user sees for this CPU."""
    import os

    flags = cpu_flags()
    isa = next((name for flag, name in (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"),
                                        ("avx2", "AVX2"), ("sve", "SVE"), ("asimd", "NEON")) if flag in flags), None)
    bf16 = "native bf16" if native_bf16(flags) else "bf16 emulated"
    parts = [f"{os.cpu_count()} cores"] + ([isa] if isa else []) + [bf16]
    return f"{cpu_model()} ({', '.join(parts)})"


BUSY_SHARE = 0.10  # other processes used more than this share of the CPUs: a timing is "under load"


def load_text(share: float) -> str:
    """"under load (other processes used 45% of the CPUs)": how a loaded measurement is labelled everywhere."""
    return f"under load (other processes used {100 * share:.0f}% of the CPUs)"


def under_load(share: float | None) -> bool:
    """Whether a measurement that saw this share of other processes' work (OtherLoad.share) was taken under load."""
    return share is not None and share > BUSY_SHARE


class OtherLoad:
    """How busy the other processes kept this machine's CPUs while a measurement ran: started with the object,
    read with `share()` (0: idle apart from this process; 1: every core busy with others). None where the kernel's
    counters cannot be read (not Linux)."""

    _STAT = Path("/proc/stat")

    def __init__(self):
        import os
        import time

        self._cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        self._busy0, self._own0, self._t0 = self._busy_s(), self._own_s(), time.perf_counter()

    def _busy_s(self) -> float | None:
        """Seconds the CPUs this process may run on spent busy since boot (every process's work; idle and I/O wait
        left out). None where a CPU's line is missing: the counters are not this machine's."""
        import os

        try:
            lines = self._STAT.read_text().splitlines()
        except OSError:
            return None
        busy, seen = 0, set()
        for line in lines:
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in self._cpus:
                continue
            fields = [int(x) for x in values]
            busy += sum(fields[:8]) - fields[3] - (fields[4] if len(fields) > 4 else 0)
            seen.add(int(name[3:]))
        return busy / os.sysconf("SC_CLK_TCK") if seen == set(self._cpus) else None

    @staticmethod
    def _own_s() -> float:
        import os

        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def share(self) -> float | None:
        import time

        busy = self._busy_s()
        if busy is None or self._busy0 is None:
            return None
        wall = time.perf_counter() - self._t0
        others = (busy - self._busy0) - (self._own_s() - self._own0)
        return max(0.0, others / (len(self._cpus) * wall)) if wall > 0 else None
