"""DLPack producers that misbehave give a TypeError naming the op and the argument (found by
fuzz/api_arguments.py): a ``__dlpack_device__`` that is not a pair of ints used to raise
"'NoneType' object is not subscriptable", and a ``__dlpack__`` that raises BufferError (the
protocol's "cannot export", NumPy's for bfloat16) escaped as it was."""

from __future__ import annotations

from typing import Any

import numpy as np
import onednn_convt as oc
import pytest


class Producer:
    """A DLPack producer of ``shape`` ones (one array type: the weights are one too)."""

    def __init__(self, shape: tuple[int, ...], device: Any = (1, 0), buffer_error: bool = False) -> None:
        self.device, self.buffer_error = device, buffer_error
        self.array = np.ones(shape, np.float32)

    def __array_namespace__(self) -> Any:
        return np

    def __dlpack__(self, **_: Any) -> Any:
        if self.buffer_error:
            raise BufferError("cannot export this dtype")
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> Any:
        return self.device


def W() -> Producer:
    return Producer((4, 3, 3, 3))


X = (1, 4, 5, 5)


@pytest.mark.parametrize("device", [None, "cpu", (), ("1", 0), (True, 0)])
def test_a_device_that_is_not_a_pair_of_ints_is_a_type_error(device: Any) -> None:
    with pytest.raises(TypeError, match=r"ConvTranspose: argument 'src' \(Producer\) reports its device"):
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(Producer(X, device), W())


def test_a_buffer_error_from_the_producer_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="ConvTranspose: argument 'src' .*cannot be exported through DLPack"):
        oc.ConvTranspose(data_format="NCX", weights_format="IOX")(Producer(X, buffer_error=True), W())


def test_a_well_behaved_producer_still_runs() -> None:
    got = oc.ConvTranspose(data_format="NCX", weights_format="IOX")(Producer(X), W())
    assert got.shape == (1, 3, 7, 7)
