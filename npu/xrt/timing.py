"""A timing model of NPU launches, for the simulator: what a token would cost on hardware.

A launch costs its submission overhead (50-130 us alone; about 70 us a launch inside a
runlist), plus a hardware-context switch (0.4-0.5 ms) when it runs in another context than
the launch before it, plus the bytes it reads from memory (weights, activations, KV) at the
configured bandwidth (the op's own where its manifest gives `gbps`: published GEMV designs
reach 20-35 GB/s). Launches do not overlap. The figures are assumptions stated here, not
measurements: change them with the hardware's.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TimingModel:
    launch_us: float = 100.0
    runlist_launch_us: float = 70.0
    context_switch_us: float = 450.0
    gbps: float = 60.0  # memory bandwidth the NPU reaches, GB/s


@dataclass
class Clock:
    """Modelled time, accumulated launch by launch."""

    model: TimingModel = field(default_factory=TimingModel)
    seconds: float = 0.0
    launches: int = 0
    switches: int = 0
    bytes_read: int = 0
    _context: object = None

    def launch(self, context: object, nbytes: int, *, in_runlist: bool,
               gbps: float = 0.0) -> None:
        """One launch reading `nbytes`, at `gbps` (the kernel's) or else the model's."""
        m = self.model
        us = m.runlist_launch_us if in_runlist else m.launch_us
        if self._context is not None and context is not self._context:
            us += m.context_switch_us
            self.switches += 1
        self._context = context
        self.seconds += us * 1e-6 + nbytes / ((gbps or m.gbps) * 1e9)
        self.launches += 1
        self.bytes_read += nbytes

    def wait(self, seconds: float) -> None:
        """Time spent waiting on a run that never completes (until its timeout)."""
        self.seconds += seconds
