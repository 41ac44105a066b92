"""flm-serve: serve one model, or a folder of them, without writing a config, as
`llama-server -m FILE` (or `ollama serve`) does.

    flm-serve serve [PATH_OR_NAME] [--models-dir DIR] [--name ID] [--host H] [--port P]
                    [--replicas N] [--max-loaded-models N] [--keep-alive DURATION]
                    [--api-key KEY] [--device cpu|npu|auto] [--kernel-dir DIR] [--verbose]
                    [--npu-mode auto|linear|block|layer] [...]

It writes the same Serve config as configs/*.yaml (one app, `deployments.app:build_app`,
one model and/or a folder of models loaded on first use) into a private file and runs it
through `deployments.launch`, with its clean start and stop. A model path that cannot be
served is one line before Ray starts.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from deployments.launch import folders, launcher

NAMES = ("smollm2-135m", "flm-tiny")  # built-in models (no file to give)
API_KEY_VAR = "FLM_API_KEY"  # --api-key's default (deployments.app reads it too)
QUANTIZE = ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "f16", "bf16")


class UsageError(Exception):
    """A bad argument, said in one line."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flm-serve", description="An OpenAI- and Ollama-compatible LLM server on Ray "
                                      "Serve, for AMD Ryzen AI NPUs and CPUs.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    c = sub.add_parser("npu-check", help="launch each NPU kernel shape once against numpy",
                       description="`python -m npu.xrt.check`: each linear kernel shape of "
                                   "a kernel directory launched once on the NPU and "
                                   "compared with numpy (its options follow).")
    c.add_argument("check_args", nargs="*", metavar="--kernel-dir DIR ...")
    s = sub.add_parser("serve", help="serve one model (Ctrl-C stops it)",
                       description="Serve one model on the OpenAI and Ollama APIs. The same "
                                   "app as `serve run configs/flm.yaml`, built from these "
                                   "options.")
    s.add_argument("model", metavar="PATH_OR_NAME", nargs="?",
                   help="a .gguf file, a directory holding one, a Hugging Face model "
                        "directory (config.json and safetensors), or a built-in name: "
                        + ", ".join(NAMES) + " (optional with --models-dir)")
    s.add_argument("--models-dir", metavar="DIR",
                   help="serve every model in DIR (GGUF files, split files as one, Hugging "
                        "Face directories), each loaded on its first request and unloaded "
                        "when idle; new files show up without a restart")
    s.add_argument("--max-loaded-models", type=int, default=2,
                   help="--models-dir: models one worker holds at once; loading one more "
                        "unloads the least recently used (default: %(default)s)")
    s.add_argument("--keep-alive", default="5m",
                   help="--models-dir: how long a model stays loaded after its last request "
                        "(a duration such as 5m or 1h, seconds, -1 for ever; default: "
                        "%(default)s; Ollama's keep_alive overrides it per request)")
    s.add_argument("--allow-delete", action="store_true",
                   help="--models-dir: Ollama's /api/delete may delete a model's GGUF files "
                        "(without it, only aliases and variants)")
    s.add_argument("--name", help="the model id clients send as `model` (default: the "
                                  "built-in name, or the file or directory name)")
    s.add_argument("--host", default="127.0.0.1",
                   help="the address the API listens on (default: %(default)s; 0.0.0.0 "
                        "for every interface)")
    s.add_argument("--port", type=int, default=8000, help="the API's port (default: "
                                                          "%(default)s)")
    s.add_argument("--replicas", type=int, default=1,
                   help="worker replicas of the model (default: %(default)s; with --device "
                        "npu, one per NPU)")
    s.add_argument("--api-key", help="require `Authorization: Bearer KEY` on every API "
                                     "route (default: $FLM_API_KEY, else none)")
    s.add_argument("--device", choices=("cpu", "npu", "auto"), default="cpu",
                   help="where the model runs (default: %(default)s; auto: the NPUs when "
                        "pyxrt finds one and --kernel-dir is given)")
    s.add_argument("--kernel-dir", help="the NPU kernel directory (npu1/ and/or npu2/, each "
                                        "with manifest.json, xclbins, instruction streams)")
    s.add_argument("--npu-mode", choices=["auto", "linear", "block", "layer"],
                   help="what runs on the NPU: linear layers, attention and MLP blocks, or "
                        "whole layers (default: auto, the most the kernel directory has)")
    s.add_argument("--max-batch", type=int, default=8,
                   help="sequences one worker decodes together (default: %(default)s)")
    s.add_argument("--quantize", choices=QUANTIZE,
                   help="hold a Hugging Face checkpoint's matrices in this block format")
    s.add_argument("--chat-template", help="a Jinja file used instead of the model's own "
                                           "chat template")
    s.add_argument("--rerank", action="store_true",
                   help="serve a decoder reranker's Hugging Face directory (Qwen3-Reranker) "
                        "on /v1/rerank (its llama.cpp GGUF file is one without this)")
    s.add_argument("--verbose", "-v", action="store_true",
                   help="also show Ray's and Serve's own INFO lines on the console (they "
                        "are always in Ray's log files; FLM_VERBOSE=1 does the same)")
    s.add_argument("--print-config", action="store_true",
                   help="print the Serve config and exit (it runs with `serve run`)")
    return p


def _model_name(path: str) -> str:
    if path in NAMES:
        return path
    stem = Path(path.rstrip("/")).name
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    return re.sub(r"[^A-Za-z0-9._:-]+", "-", stem).strip("-").lower() or "model"


def _check_path(path: str) -> str:
    """`path` made absolute, once it names something servable (a GGUF file's header read,
    as llama-server refuses a file it cannot load at once, before Ray starts: its
    architecture and tokenizer run here; a directory one model, not a folder of them)."""
    if path in NAMES:
        return path
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise UsageError(f"{path} is not a .gguf file; give a GGUF file or a model "
                             "directory")
        try:
            with p.open("rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        if magic != b"GGUF":
            raise UsageError(f"{path} is not a GGUF file (it does not begin with GGUF's "
                             f"magic bytes, but {magic!r})")
        _check_gguf(p)
        return str(p.resolve())
    if p.is_dir():
        ggufs = sorted(f for f in p.glob("*.gguf") if not f.name.startswith("."))
        if not (p / "config.json").exists() and not ggufs:
            raise UsageError(f"{path} holds neither config.json (a Hugging Face model) nor "
                             "a .gguf file")
        if not (p / "config.json").exists():
            if len(ggufs) > 1:  # a models folder given as the model: say how to serve it
                names = ", ".join(f.name for f in ggufs[:4]) + (", ..." if len(ggufs) > 4
                                                                 else "")
                raise UsageError(f"{path} holds several GGUF files ({names}): name one, or "
                                 f"serve them all with --models-dir {path}")
            _check_gguf(ggufs[0])
        return str(p.resolve())
    raise UsageError(f"no model at {path}: give a .gguf file, a model directory, or one of "
                     + ", ".join(NAMES))


def _is_gguf(path: str) -> bool:
    """Whether a checked model path is served from a GGUF file (smollm2-135m is one)."""
    if path in NAMES:
        return path == "smollm2-135m"
    p = Path(path)
    return p.is_file() or not (p / "config.json").exists()


def _check_gguf(path: Path) -> None:
    from actors.library import gguf_problem  # (its imports: only for a path to check)

    problem = gguf_problem(path)
    if problem is not None:
        raise UsageError(f"{path.parent / problem}")


def config_for(args: argparse.Namespace) -> dict[str, Any]:
    """The Serve config (the structure of configs/*.yaml) of the `serve` options.

    Raises:
        UsageError: an option that cannot work, named.
    """
    for opt in ("port", "replicas", "max_batch"):
        value = getattr(args, opt)
        if value < 1 or (opt == "port" and value > 65535):
            raise UsageError(f"--{opt.replace('_', '-')} {value} is out of range")
    if args.device == "npu" and not args.kernel_dir:
        raise UsageError("--device npu needs --kernel-dir (the NPU kernel directory)")
    if args.chat_template and not Path(args.chat_template).is_file():
        raise UsageError(f"--chat-template {args.chat_template}: no such file")
    if args.model is None and not args.models_dir:
        raise UsageError("give a model (a .gguf file, a model directory, or one of "
                         + ", ".join(NAMES) + ") or --models-dir DIR")
    if args.rerank and args.model is None:
        raise UsageError("--rerank applies to the model given (a decoder reranker's Hugging "
                         "Face directory), not to --models-dir's models")
    app_args: dict[str, Any] = {"models": []}
    if args.model is not None:
        path = _check_path(args.model)
        if args.quantize and _is_gguf(path):  # the loader refuses it, once Ray has started
            raise UsageError(f"--quantize {args.quantize}: {args.model} is a GGUF file, which "
                             "keeps its own formats (--quantize is for a Hugging Face "
                             "checkpoint)")
        model: dict[str, Any] = {"name": args.name or _model_name(args.model), "path": path,
                                 "device": args.device, "replicas": args.replicas,
                                 "max_batch": args.max_batch}
        for key in ("quantize", "kernel_dir", "npu_mode"):
            if getattr(args, key):
                model[key] = getattr(args, key)
        if args.chat_template:
            model["chat_template"] = str(Path(args.chat_template).resolve())
        if args.rerank:
            model["rerank"] = True
        app_args["models"].append(model)
    if args.models_dir:
        app_args.update(_library_args(args))
    api_key = args.api_key or os.environ.get(API_KEY_VAR)
    if api_key:
        app_args["api_key"] = api_key
    return {"proxy_location": "HeadOnly",
            "http_options": {"host": args.host, "port": args.port},
            "applications": [{"name": "flm", "route_prefix": "/",
                              "import_path": "deployments.app:build_app", "args": app_args}]}


def _library_args(args: argparse.Namespace) -> dict[str, Any]:
    """The app args of --models-dir and its options."""
    from actors.keep_alive import keep_alive_seconds

    folder = Path(args.models_dir).expanduser()
    if not folder.is_dir():
        raise UsageError(f"--models-dir {args.models_dir}: no such directory")
    if args.max_loaded_models < 1:
        raise UsageError(f"--max-loaded-models {args.max_loaded_models} is out of range")
    if args.device == "npu":
        raise UsageError("--models-dir serves on the CPU for now; drop --device npu")
    try:
        keep_alive_seconds(args.keep_alive)
    except ValueError as exc:
        raise UsageError(f"--keep-alive: {exc}") from None
    return {"models_dir": str(folder.resolve()), "keep_alive": args.keep_alive,
            **({"allow_delete": True} if args.allow_delete else {}),
            "library": {"max_loaded_models": args.max_loaded_models,
                        "max_batch": args.max_batch, "replicas": args.replicas}}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["npu-check"]:  # its own process (the launcher does not load npu), and
        # its own options (--help included)
        return subprocess.call([sys.executable, "-m", "npu.xrt.check", *argv[1:]])
    args = _parser().parse_args(argv)
    try:
        config = config_for(args)
    except UsageError as exc:
        print(f"flm-serve: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(yaml.safe_dump(config, sort_keys=False), end="")
        return 0
    app_args = config["applications"][0]["args"]
    if "api_key" in app_args and not launcher.joins_cluster():
        # the key reaches the app through the environment of the Ray this run starts, not
        # the config's args, which Serve's controller logs (world-readable files in /tmp/ray)
        os.environ[API_KEY_VAR] = app_args.pop("api_key")
    text = yaml.safe_dump(config, sort_keys=False)
    folder = folders.private_folder("cli-")  # 0700: the API key stays private
    try:
        path = Path(folder) / "serve.yaml"
        path.write_text(text)
        return launcher.main([str(path), *(["--verbose"] if args.verbose else [])],
                             remove=(folder,), port_option="--port")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
