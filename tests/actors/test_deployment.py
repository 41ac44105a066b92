"""ModelWorker's constructor outside Serve: a model that cannot load is a replica that
answers why, never a constructor that raises (Serve would restart it over and over)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

from actors import deployment
from actors.config import WorkerConfig


def test_an_npu_worker_without_pyxrt_answers_why(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # `import pyxrt` fails
    monkeypatch.setattr("npu.xrt.adapter.XRT_PYTHON", str(tmp_path / "no-xrt"))
    monkeypatch.setattr(deployment, "device_index", lambda device: 0)
    monkeypatch.setattr(deployment.serve, "get_replica_context",
                        lambda: SimpleNamespace(replica_id="r1"))
    config = WorkerConfig(name="flm-tiny", path="flm-tiny", device="npu",
                          kernel_dir=str(tmp_path))
    worker = deployment.ModelWorker.func_or_class(config)
    assert worker.worker is None
    assert "pyxrt is not importable" in worker.failure
    assert worker.unavailable().status == 500
