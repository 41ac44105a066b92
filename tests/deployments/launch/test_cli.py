"""flm-serve serve: the options become the same Serve config as configs/*.yaml, and a model
that cannot be served is one line before Ray starts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from deployments.launch import cli

ROOT = Path(__file__).resolve().parents[3]


def _config(*argv: str) -> dict:
    return cli.config_for(cli._parser().parse_args(["serve", *argv]))


def test_the_default_model_is_configs_flm_yaml() -> None:
    assert _config("smollm2-135m") == yaml.safe_load((ROOT / "configs/flm.yaml").read_text())


def test_options_reach_the_config(tmp_path, monkeypatch) -> None:
    from tests.actors.test_library import write_gguf

    gguf = write_gguf(tmp_path / "My Model.Q4_0.gguf")
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages }}")
    cfg = _config(str(gguf), "--host", "0.0.0.0", "--port", "9000", "--replicas", "2",
                  "--api-key", "k", "--max-batch", "4", "--chat-template", str(template))
    assert cfg["http_options"] == {"host": "0.0.0.0", "port": 9000}
    args = cfg["applications"][0]["args"]
    assert args["api_key"] == "k"
    model = args["models"][0]
    assert model == {"name": "my-model.q4_0", "path": str(gguf.resolve()), "device": "cpu",
                     "replicas": 2, "max_batch": 4, "chat_template": str(template.resolve())}
    assert _config("flm-tiny", "--name", "tiny")["applications"][0]["args"]["models"][0][
        "name"] == "tiny"
    assert _config("flm-tiny", "--rerank")["applications"][0]["args"]["models"][0][
        "rerank"] is True
    monkeypatch.setenv("FLM_API_KEY", "from-env")
    assert _config("flm-tiny")["applications"][0]["args"]["api_key"] == "from-env"


@pytest.mark.parametrize("argv,text", [
    (["/no/such/model"], "no model at /no/such/model"),
    (["README.md"], "is not a .gguf file"),
    (["tests"], "holds neither config.json"),
    (["flm-tiny", "--port", "0"], "--port 0 is out of range"),
    (["flm-tiny", "--replicas", "0"], "--replicas 0 is out of range"),
    (["flm-tiny", "--device", "npu"], "--device npu needs --kernel-dir"),
    (["flm-tiny", "--chat-template", "/nope.jinja"], "no such file"),
    # the worker's load refused it, after Ray started: "no model could be loaded"
    (["smollm2-135m", "--quantize", "q8_0"], "--quantize q8_0: smollm2-135m is a GGUF file"),
])
def test_a_bad_option_is_one_line(argv: list[str], text: str, capsys) -> None:
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flm-serve: ") and text in err and err.count("\n") == 1


def test_help_documents_every_option(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    for opt in ("--name", "--host", "--port", "--replicas", "--api-key", "--device",
                "--kernel-dir", "--npu-mode", "--max-batch", "--quantize",
                "--chat-template"):
        assert opt in out


def test_npu_options_reach_the_model_entry(capsys, tmp_path) -> None:
    assert cli.main(["serve", "flm-tiny", "--device", "npu", "--kernel-dir", str(tmp_path),
                     "--npu-mode", "layer", "--print-config"]) == 0
    model = yaml.safe_load(capsys.readouterr().out)["applications"][0]["args"]["models"][0]
    assert (model["device"], model["npu_mode"]) == ("npu", "layer")
    assert model["kernel_dir"] == str(tmp_path)


def test_print_config_is_a_serve_config(capsys) -> None:
    assert cli.main(["serve", "flm-tiny", "--print-config"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["applications"][0]["import_path"] == "deployments.app:build_app"


def test_models_dir_and_its_options_reach_the_config(tmp_path) -> None:
    args = _config("--models-dir", str(tmp_path), "--max-loaded-models", "3",
                   "--keep-alive", "10m", "--max-batch", "4")["applications"][0]["args"]
    assert args["models"] == [] and args["models_dir"] == str(tmp_path.resolve())
    assert args["keep_alive"] == "10m"
    assert args["library"] == {"max_loaded_models": 3, "max_batch": 4, "replicas": 1}
    both = _config("flm-tiny", "--models-dir", str(tmp_path))["applications"][0]["args"]
    assert [m["name"] for m in both["models"]] == ["flm-tiny"] and both["models_dir"]
    assert "allow_delete" not in args  # (found probing live: no flag for what 403 asks)
    assert _config("--models-dir", str(tmp_path), "--allow-delete")["applications"][0][
        "args"]["allow_delete"] is True


@pytest.mark.parametrize("argv,text", [
    ([], "give a model"),
    (["--models-dir", "/no/such/dir"], "--models-dir /no/such/dir: no such directory"),
    (["--models-dir", ".", "--keep-alive", "soon"], "--keep-alive: keep_alive 'soon'"),
    (["--models-dir", ".", "--max-loaded-models", "0"], "--max-loaded-models 0 is out of"),
    (["--models-dir", ".", "--rerank"], "--rerank applies to the model given"),
])
def test_a_bad_library_option_is_one_line(argv: list[str], text: str, capsys) -> None:
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("flm-serve: ") and text in err and err.count("\n") == 1


@pytest.mark.parametrize("flag", [[], ["--verbose"]])
def test_verbose_reaches_the_launcher(flag: list[str], monkeypatch) -> None:
    from deployments.launch import launcher

    seen: list[list[str]] = []
    kwargs: list[dict] = []
    monkeypatch.setattr(launcher, "main",
                        lambda argv, **kw: seen.append(argv) or kwargs.append(kw) or 0)
    assert cli.main(["serve", "smollm2-135m", *flag]) == 0
    assert seen[0][1:] == flag and seen[0][0].endswith("serve.yaml")
    # the config (it holds an API key) is the launcher's to remove however the run ends,
    # and a busy port's message names --port, not that file
    assert kwargs[0] == {"remove": (str(Path(seen[0][0]).parent),), "port_option": "--port"}
    assert not Path(seen[0][0]).parent.exists()


def test_the_api_key_reaches_the_app_through_the_environment_not_the_args(
        monkeypatch, capsys) -> None:
    # Serve's controller logs an app's args ("Importing application 'flm' with arguments
    # {... 'api_key': ...}") into Ray's world-readable log files
    from deployments.launch import launcher

    # set, then deleted: monkeypatch restores it as it was (unset) after the test, the key
    # the command line puts there included (a later server of this run would want it)
    monkeypatch.setenv("FLM_API_KEY", "")
    monkeypatch.delenv("FLM_API_KEY")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(launcher, "joins_cluster", lambda: False)
    written: list[dict] = []
    monkeypatch.setattr(launcher, "main", lambda argv, **kw: written.append(
        yaml.safe_load(Path(argv[0]).read_text())) or 0)
    assert cli.main(["serve", "smollm2-135m", "--api-key", "s3cret"]) == 0
    assert "api_key" not in written[0]["applications"][0]["args"]
    assert "s3cret" not in str(written[0])
    assert os.environ["FLM_API_KEY"] == "s3cret"  # what the Ray this run starts inherits
    # --print-config still shows the whole config (one to run elsewhere)
    assert cli.main(["serve", "smollm2-135m", "--api-key", "k2", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["applications"][0]["args"][
        "api_key"] == "k2"


def test_a_file_that_is_no_gguf_is_one_line_before_ray_starts(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"XXXX" + bytes(60))
    assert cli.main(["serve", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "is not a GGUF file" in err and err.count("\n") == 1


def test_a_gguf_file_that_cannot_be_served_is_one_line_before_ray_starts(
        tmp_path, capsys) -> None:
    """Found probing live: a cut file, a Phi-3 file and a folder of GGUF files were refused
    only after Ray had started, 45-60 s later; now the header says, at once."""
    from tests.actors.test_library import write_gguf

    good = write_gguf(tmp_path / "good.gguf")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:40])
    (tmp_path / "phi").mkdir()
    phi = write_gguf(tmp_path / "phi" / "phi.gguf", "phi3")
    folder = tmp_path / "many"
    folder.mkdir()
    write_gguf(folder / "a.gguf")
    write_gguf(folder / "b.gguf")
    for argv, text in (([str(cut)], "cut.gguf: cannot be read"),
                       ([str(phi)], "architecture 'phi3' is not supported"),
                       ([str(phi.parent)], "architecture 'phi3' is not supported"),
                       ([str(folder)], f"serve them all with --models-dir {folder}")):
        assert cli.main(["serve", *argv, "--print-config"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("flm-serve: ") and text in err and err.count("\n") == 1, err
    assert cli.main(["serve", str(good), "--print-config"]) == 0
