"""What a measurement is taken on: the machine, package versions, load, and peak memory.

Memory in MiB (``memory_mb`` of each result):
  ``inference_peak``  peak resident set size during the runs minus the RSS just before the first
                      run: what inference allocates (activations, workspaces, arena growth).
                      Linux: the kernel's high-water mark (VmHWM) is reset by writing 5 to
                      /proc/self/clear_refs before the runs and read after them, so the peak is
                      exact, not sampled. Elsewhere a 1 ms RSS sampling thread estimates it.
  ``process_peak``    VmHWM from session creation to the end of the timed runs (absolute: the
                      interpreter, onnxruntime, the weights, and inference).
  ``ru_maxrss``       getrusage's peak RSS of the whole worker, model building included.
"""

from __future__ import annotations

import os
import platform
import resource
import sys
import threading
import time

MIB = 2**20
VERSIONED = ("ortflash", "onnxruntime", "onnxruntime-extensions", "onnx", "onnx-ir", "numpy", "onnxscript", "torch")


def machine_info() -> dict:
    """CPU model, cores, memory and OS of this machine, for the results files."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "memory_gib": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def versions(packages: tuple[str, ...] = VERSIONED) -> dict[str, str]:
    """Installed versions of the packages that decide a result (those not installed are left out)."""
    from importlib import metadata

    out = {}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def rss() -> int:
    """Resident set size of this process now, in bytes."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return maxrss()


def maxrss() -> int:
    """getrusage's peak RSS of this process, in bytes (macOS reports bytes, Linux KiB)."""
    v = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return v if sys.platform == "darwin" else v * 1024


def _hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakProbe:
    """Peak RSS between start() and stop(): the kernel's reset high-water mark, else sampling."""

    def __init__(self, interval: float = 0.001) -> None:
        hwm = _hwm() if _reset_hwm() else None
        # a kernel that ignores clear_refs leaves the old, higher mark: then sample instead
        self.exact = hwm is not None and hwm <= rss() + 4 * MIB
        self.method = (
            "VmHWM reset through /proc/self/clear_refs (exact)"
            if self.exact
            else f"RSS sampled every {interval * 1000:g} ms (estimate)"
        )
        self.interval = interval
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.exact:
            _reset_hwm()
            return
        self._peak = rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, rss())
            time.sleep(self.interval)

    def stop(self) -> int:
        """The peak RSS in bytes since start()."""
        if self.exact:
            return max(_hwm() or 0, rss())
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return max(self._peak, rss())
