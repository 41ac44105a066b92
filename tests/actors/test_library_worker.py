"""actors/library_worker.py without Serve: the memory budget's choice of models to unload."""

from __future__ import annotations

import pytest

from actors.errors import RequestError
from actors.library_worker import room_for


def test_nothing_is_unloaded_while_the_model_fits() -> None:
    assert room_for(10, [("a", 30, True), ("b", 30, True)], 100) == []


def test_the_least_recently_used_idle_models_make_room() -> None:
    held = [("old", 40, True), ("busy", 40, False), ("new", 40, True)]
    assert room_for(30, held, 130) == ["old"]
    assert room_for(70, held, 130) == ["old", "new"]


def test_a_model_over_the_budget_alone_is_507_with_both_sizes() -> None:
    with pytest.raises(RequestError) as err:
        room_for(5_000_000_000, [], 4_000_000_000)
    assert err.value.status == 507 and err.value.code == "model_too_large"
    assert "5,000 MB" in err.value.message and "4,000 MB" in err.value.message


def test_models_serving_requests_are_never_unloaded_under_them() -> None:
    with pytest.raises(RequestError) as err:
        room_for(50, [("busy", 80, False), ("idle", 10, True)], 100)
    assert err.value.status == 503 and "serving requests" in err.value.message
