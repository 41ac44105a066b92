from __future__ import annotations

from pathlib import Path

import pytest

from npu.load.tiny import ensure_tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """flm-tiny, generated into a fresh cache for this test run."""
    return ensure_tiny(tmp_path_factory.mktemp("flm-cache"))
