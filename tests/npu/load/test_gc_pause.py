"""A load holds Python's cyclic collector off (npu.load.gc_pause) and gives it back as it
found it, however loads overlap or end."""

from __future__ import annotations

import gc
import threading

import pytest

import npu.load.loader as loader
from npu import load_model
from npu.load.gc_pause import gc_paused


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_off_within_and_as_it_was_after() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("a load that fails")
    assert gc.isenabled()
    gc.disable()  # off before: off after
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_loads_share_one_pause() -> None:
    entered, release = threading.Event(), threading.Event()

    def other_load() -> None:
        with gc_paused():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other_load)
    with gc_paused():
        thread.start()
        assert entered.wait(10)
    assert not gc.isenabled()  # the other load still runs
    release.set()
    thread.join(10)
    assert gc.isenabled()


def test_load_model_loads_with_the_collector_off(monkeypatch) -> None:
    seen = []
    real = loader._load

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    monkeypatch.setattr(loader, "_load", spy)
    assert load_model("flm-tiny").engine is not None
    assert seen == [False] and gc.isenabled()
