"""A full ELF's control scratchpad: per-launch values a kernel reads without its instruction
stream being rebuilt.

XRT gives each run of an ELF kernel its own scratchpad (`run.get_ctrl_scratchpad_bo()`,
xrt_kernel.h; in pyxrt since Xilinx/XRT@6dd06dc947, the master that became 2.25; it throws
for a run whose ELF has no scratchpad section). Which word holds which value is aiecc's
`--get-scratchpad-parameters` output, `params.txt`: a count, then one line per parameter,
`<name> <index> <type> [<kind>]` (kind `core`, the default, or `addr`). The host writes a
value as mlir-aie's `ParameterScratchpad` does (runtime_lib/test_lib/parameter_scratchpad.h,
Xilinx/mlir-aie at 978fc1bc; amd/IRON's full-ELF callables drive it, one persistent run
handle per image), which we
follow in our own words:

- `core` values go through the firmware's UPDATE_REG increment: the word is the value's bits
  shifted left by 2, minus what this run's scratchpad last carried for it (a delta, modulo
  2^32), so the core, whose register accumulates the deltas, reads the value back (>> 2).
  A run handle's scratchpad therefore has state: every launch writes every value again (the
  same value is a delta of 0), and a new run handle starts from 0.
- `addr` values (buffer offsets the firmware adds to a descriptor) are written as they are.

The scratchpad is synced to the device after the writes, before the run starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from npu.xrt.adapter import XRTError

KINDS = ("core", "addr")


class Param(msgspec.Struct, frozen=True):
    index: int  # the scratchpad word
    type: str
    kind: str  # "core" | "addr"


def parse_params(text: str, where: str = "params.txt") -> dict[str, Param]:
    """params.txt -> {name: Param}; its count must match its lines."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if not lines or len(lines[0]) != 1 or not lines[0][0].isdigit():
        raise XRTError(f"{where}: the first line must be the parameter count")
    count, out = int(lines[0][0]), {}
    for fields in lines[1:]:
        if len(fields) not in (3, 4) or not fields[1].isdigit():
            raise XRTError(f"{where}: {' '.join(fields)!r} is not '<name> <index> <type> "
                           "[<kind>]'")
        kind = fields[3] if len(fields) == 4 else "core"
        if kind not in KINDS:
            raise XRTError(f"{where}: parameter {fields[0]} has kind {kind!r}, not core or addr")
        if int(fields[1]) >= count:
            raise XRTError(f"{where}: parameter {fields[0]} at word {fields[1]}, past the "
                           f"{count} words the file declares")
        out[fields[0]] = Param(index=int(fields[1]), type=fields[2], kind=kind)
    if len(out) != count:
        raise XRTError(f"{where}: declares {count} parameters and lists {len(out)}")
    return out


def load_params(path: Path) -> dict[str, Param]:
    try:
        return parse_params(Path(path).read_text(), str(path))
    except OSError as exc:
        raise XRTError(f"cannot read {path}: {exc}") from None


class Scratchpad:
    """The words one run handle's scratchpad carries, written as the firmware reads them."""

    def __init__(self, params: dict[str, Param]) -> None:
        self.params = params
        size = max((p.index for p in params.values()), default=-1) + 1
        self.words = np.zeros(size, dtype=np.uint32)
        self._last = np.zeros(size, dtype=np.uint32)  # the encoded value last written

    def write(self, name: str, value: int) -> None:
        p = self.params.get(name)
        if p is None:
            raise XRTError(f"the scratchpad has no parameter {name!r} (it has "
                           f"{', '.join(self.params) or 'none'})")
        bits = int(value) & 0xFFFFFFFF
        if p.kind == "addr":
            self.words[p.index] = bits
            return
        encoded = (bits << 2) & 0xFFFFFFFF
        self.words[p.index] = (encoded - int(self._last[p.index])) & 0xFFFFFFFF
        self._last[p.index] = encoded


def read_value(param: Param, raw: np.ndarray, accumulated: np.ndarray) -> int:
    """What a core reads for `param` (the device side, for the simulator): a core value from
    the register the deltas accumulated in, an address as written; int32."""
    source = accumulated if param.kind == "core" else raw
    word = int(np.asarray(source[param.index], dtype=np.uint32).view(np.int32))
    return word >> 2 if param.kind == "core" else word  # the core shifts back (arithmetic)


def sync(xrt: Any, bo: Any, pad: Scratchpad) -> None:
    """The scratchpad's words into its buffer, synced to the device."""
    size = bo.size()
    if pad.words.nbytes > size:
        raise XRTError(f"the control scratchpad holds {size} bytes; its parameters need "
                       f"{pad.words.nbytes}")
    xrt.to_device(bo, pad.words)
