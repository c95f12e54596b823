"""Bool arguments take a bool (NumPy's too) and nothing else: ``strict="False"`` used to be
read by its truth value, as strict=True."""

from __future__ import annotations

from typing import Any

import numpy as np
import onednn_convt as oc
import pytest

NOT_BOOLS = ["False", "no", "", 0, 1, 0.0, None, [False], b"0"]
OPS = [oc.ConvTranspose, oc.ConvTransposeBackwardData, oc.ConvTransposeBackwardWeights]


@pytest.mark.parametrize("value", NOT_BOOLS)
@pytest.mark.parametrize("cls", OPS, ids=lambda c: c.__name__)
def test_strict_takes_a_bool_only(cls: Any, value: Any) -> None:
    with pytest.raises(TypeError, match=rf"{cls.__name__}: argument 'strict' expected a bool"):
        cls(strict=value)


@pytest.mark.parametrize("value", NOT_BOOLS)
def test_strict_of_the_functions_and_the_legacy_op(value: Any) -> None:
    x, w = np.ones((1, 5, 5, 4), np.float32), np.ones((3, 3, 2, 4), np.float32)
    with pytest.raises(TypeError, match="argument 'strict' expected a bool"):
        oc.conv_transpose(x, w, strict=value)
    with pytest.raises(TypeError, match="ConvTransposeBackpropFilters: .*argument 'strict' expected a bool"):
        oc.ConvTransposeBackpropFilters(strict=value)


def test_strict_false_emulates_and_numpy_bools_are_bools() -> None:
    x, w = np.ones((1, 5, 5, 4), np.float16), np.ones((3, 3, 2, 4), np.float16)
    for value in (False, np.bool_(False)):
        op = oc.ConvTranspose(strict=value)
        assert op.strict is False
        assert op(x, w).dtype == np.float16
    assert oc.ConvTranspose(strict=np.bool_(True)).strict is True


@pytest.mark.parametrize("value", ["False", 0, None, 1.0])
def test_set_debug_fill_and_set_autotune_take_a_bool_only(value: Any) -> None:
    before = oc.debug_fill()
    with pytest.raises(TypeError, match="set_debug_fill: argument 'enabled' expected a bool"):
        oc.set_debug_fill(value)
    assert oc.debug_fill() is before
    with pytest.raises(TypeError, match="set_autotune: argument 'on' expected a bool"):
        oc.set_autotune(value)
