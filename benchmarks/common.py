"""Timing and bookkeeping shared by the benchmarks.

Every comparison is measured in one process with interleaved repetitions: repetition r runs each
candidate once (in an order rotated by r, so no candidate always runs first), and a ratio is taken
per repetition between candidates of the same repetition. On a shared machine, load that arrives
during a repetition then falls on both sides of its ratio; we report the median over repetitions and
the min–max range, next to the load average before and after.
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

PACKAGES = ("torch", "numpy", "onnx", "onnxruntime", "onnxsim", "scipy")


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def interleaved(fns: dict[str, Callable[[], Any]], reps: int, inner: int = 1, warmup: int = 1,
                device: torch.device | str = "cpu") -> dict[str, list[float]]:
    """Seconds per call of each fn, `reps` interleaved repetitions of `inner` calls each."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    sync(device)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            sync(device)
            t0 = time.perf_counter()
            for _ in range(inner):
                fns[name]()
            sync(device)
            times[name].append((time.perf_counter() - t0) / inner)
    return times


def summary(ts: list[float], scale: float = 1.0) -> dict[str, float]:
    """Median, min–max and 10th–90th percentiles of timings (times `scale`, e.g. 1e3 for ms)."""
    q = statistics.quantiles(ts, n=10, method="inclusive") if len(ts) > 1 else [ts[0]] * 9
    return {"median": statistics.median(ts) * scale, "min": min(ts) * scale, "max": max(ts) * scale,
            "p10": q[0] * scale, "p90": q[-1] * scale, "reps": len(ts)}


def paired_ratio(a: list[float], b: list[float]) -> dict[str, float]:
    """a/b per repetition (both from the same repetition): median, min–max, 10th–90th percentiles."""
    return summary([x / y for x, y in zip(a, b)])


def load() -> list[float]:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    out = {"cpu": cpu_name(), "cores_available": cores, "torch_threads": torch.get_num_threads(),
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "memory_gib": mem,
           "platform": platform.platform(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def compiler_version() -> str | None:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not cxx:
        return None
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for pkg in PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    out["c++"] = compiler_version()
    return out


class Section:
    """Times one benchmark section and records the load around it."""

    def __init__(self, name: str, log: Callable[[str], None]):
        self.name, self.log = name, log

    def __enter__(self) -> "Section":
        self.t0, self.load0 = time.perf_counter(), load()
        self.log(f"[{self.name}] load {self.load0}")
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.t0
        self.log(f"[{self.name}] {self.seconds:.1f}s, load {load()}")

    def meta(self) -> dict[str, Any]:
        return {"seconds": round(time.perf_counter() - self.t0, 2), "load_before": self.load0, "load_after": load(),
                "torch_threads": torch.get_num_threads(), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "command": " ".join(["python -m benchmarks.run", *sys.argv[1:]])}


def commit() -> str | None:
    """The repository's HEAD (short hash, "+dirty" with uncommitted changes), or None outside a git checkout."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")
