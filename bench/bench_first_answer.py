"""Time to the first answer: from `make serve` (`python -m deployments.launch CONFIG
--verbose`, a fresh Ray on a free port; `--cli`: `flm-serve serve MODEL`) to the first chat
answer, and where the seconds go:

    .venv/bin/python bench/bench_first_answer.py [--runs N] [--quick] [--config C] [--cli]
                                                 [--compare KEY=VALUE ...]

Phases, from the launcher's --verbose console (Serve's lines carry their own time stamps;
other lines are stamped when they arrive):
  python + imports   the launcher starts, up to ray.init's first line
  ray start          up to "Started a local Ray instance"
  serve start        Serve's controller, proxy and HAProxy up ("Started Serve")
  app build          the controller imports and builds the app ("Imported and built app")
  replicas           the replicas start, import our packages and load the model, up to
                     the start block ("ready in")
  first answer       a one-token chat request, sent every 0.1 s from the start, answered
                     (minus the start block)
The other side, alternated with it in the same run, is the floor: a fresh Python process
that imports npu, loads the same model and computes one token (no Ray, no HTTP). The ratio
is serve / floor. The CPU kernels' build, which a fresh clone pays once (`make setup` does
it), is timed apart: `python -m npu.engine.cpu_kernels` into an empty cache directory.
--quick: one run of each with flm-tiny (configs/tiny.yaml), no kernel build. --compare KEY=VALUE ...: a
third side, `make serve` with those settings added (e.g. a Ray setting of
configs/serve.env changed), alternated with the others, its ratio to the plain one printed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PY = sys.executable
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")
MILESTONES = (  # (phase, text of the line that ends it)
    ("python + imports", "Token authentication is enabled"),
    ("ray start", "Started a local Ray instance"),
    ("serve start", "Started Serve in namespace"),
    ("app build", "Imported and built app"),
    ("replicas", "ready in "),
)
FLOOR = """
import sys, time, numpy as np
t = time.perf_counter()
from npu import load_model
from npu.load.loader import default_model_path
name = sys.argv[1]
model = load_model(default_model_path() if name == "smollm2-135m" else name)
logits = model.engine.prefill("s", model.tokenizer.encode("hi"))
int(np.argmax(logits))
print(time.perf_counter() - t)
"""


def _line_time(line: str, arrived: float, t0_wall: float, t0: float) -> float:
    m = STAMP.search(line)
    if m:
        wall = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        return wall - t0_wall
    return arrived - t0


def serve_once(config: Path, model: str, extra: dict[str, str] | None = None, *,
               cli: bool = False) -> dict[str, float]:
    """One `make serve` (`cli`: `flm-serve serve MODEL`) from nothing to its first answer:
    each milestone's second."""
    import httpx

    from deployments.launch.serve_env import free_port

    port = free_port()
    text = config.read_text().replace("port: 8000", f"port: {port}")
    folder = Path(tempfile.mkdtemp(prefix="bench-first-"))
    (folder / "serve.yaml").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(extra or {})
    t0_wall, t0 = time.time(), time.monotonic()
    command = ([str(Path(PY).parent / "flm-serve"), "serve", model, "--port", str(port),
                "--verbose"] if cli else
               [PY, "-m", "deployments.launch", "--verbose", str(folder / "serve.yaml")])
    proc = subprocess.Popen(command, cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen: dict[str, float] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.monotonic()
            for phase, text in MILESTONES:
                if phase not in seen and text in line:
                    seen[phase] = _line_time(line, now, t0_wall, t0)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the launcher exited with {proc.returncode}")
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body,
                               timeout=120)
                if r.status_code == 200:
                    seen["first answer"] = time.monotonic() - t0
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > 600:
                raise RuntimeError("no answer in 600 s")
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        reader.join(timeout=5)
    return seen


def floor_once(model: str) -> float:
    t = time.monotonic()
    subprocess.run([PY, "-c", FLOOR, model], cwd=ROOT, check=True, capture_output=True)
    return time.monotonic() - t


def kernel_build() -> float:
    with tempfile.TemporaryDirectory() as cache:
        t = time.monotonic()
        subprocess.run([PY, "-m", "npu.engine.cpu_kernels"], cwd=ROOT, check=True,
                       capture_output=True, env={**os.environ, "FLM_CACHE": cache})
        return time.monotonic() - t


def breakdown(seen: dict[str, float]) -> list[tuple[str, float]]:
    """Each phase's own seconds, from the previous milestone seen. The first answer can
    come before the start block is printed (its model was up): then "replicas" ends at the
    answer and "first answer" is 0."""
    seen = dict(seen)
    if "replicas" in seen and "first answer" in seen:
        seen["replicas"] = min(seen["replicas"], seen["first answer"])
    out, last = [], 0.0
    for phase in [p for p, _ in MILESTONES] + ["first answer"]:
        if phase in seen:
            out.append((phase, seen[phase] - last))
            last = seen[phase]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--config", default=None)
    ap.add_argument("--compare", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cli", action="store_true",
                    help="`flm-serve serve MODEL` instead of `make serve`'s launcher")
    args = ap.parse_args()
    extra = dict(kv.split("=", 1) for kv in args.compare)
    if args.quick:
        args.runs, config, model = 1, ROOT / "configs" / "tiny.yaml", "flm-tiny"
    else:
        config = Path(args.config) if args.config else ROOT / "configs" / "flm.yaml"
        model = "smollm2-135m"
    what = f"flm-serve serve {model}" if args.cli else f"make serve ({config.name}, {model})"
    print(f"time to first answer: {what}, {args.runs} run(s), sides alternated")
    totals, floors, others = [], [], []
    for run in range(args.runs):
        floors.append(floor_once(model))
        seen = serve_once(config, model, cli=args.cli)
        totals.append(seen["first answer"])
        parts = "  ".join(f"{p} {s:5.1f}" for p, s in breakdown(seen))
        print(f"run {run + 1}: serve {totals[-1]:5.1f} s  ({parts})")
        print(f"run {run + 1}: floor (import npu, load, one token, no Ray) {floors[-1]:5.1f} s")
        if extra:
            seen = serve_once(config, model, extra, cli=args.cli)
            others.append(seen["first answer"])
            parts = "  ".join(f"{p} {s:5.1f}" for p, s in breakdown(seen))
            print(f"run {run + 1}: serve with {args.compare} {others[-1]:5.1f} s  ({parts})")
    if not args.quick:
        print(f"cpu kernels' build into an empty cache (once per clone): {kernel_build():.1f} s")
    best_s, best_f = min(totals), min(floors)
    print(f"best serve {best_s:.1f} s, best floor {best_f:.1f} s: ratio serve / floor "
          f"{best_s / best_f:.1f}x")
    if others:
        print(f"best serve with {args.compare} {min(others):.1f} s: ratio to plain serve "
              f"{min(others) / best_s:.2f}")


if __name__ == "__main__":
    main()
