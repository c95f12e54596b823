"""Shape formulas: layouts, auto_pad, output sizes (spec sections 4 and 5, D4, D8).

Notation per spatial dim: s stride, d dilation, k kernel, ek = d*(k-1)+1 effective kernel,
pb/pe pads_begin/pads_end, op output_padding.

- ConvTranspose:  dst = s*(src-1) + ek - pb - pe + op, with 0 <= op < s.
- BackwardData:   diff_src = floor((diff_dst + pb + pe - ek) / s) + 1 (the inverse, which
  absorbs any output_padding < s).
- auto_pad (every op, D8): VALID -> 0/0; SAME_* -> total = max(0, ek - s), SAME_UPPER puts
  the odd pad at the end, SAME_LOWER at the start.
"""

from __future__ import annotations

from typing import Sequence

Shape = tuple[int, ...]


def effective_kernel(k: int, d: int) -> int:
    """Kernel extent with dilation d (1 = none)."""
    return d * (k - 1) + 1


def split_activation(shape: Sequence[int], data_format: str) -> tuple[int, int, Shape]:
    """(N, C, spatial dims) of an activation tensor in NCX or NXC."""
    if data_format == "NCX":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[0], shape[-1], tuple(shape[1:-1])


def join_activation(n: int, c: int, spatial: Sequence[int], data_format: str) -> Shape:
    """Inverse of :func:`split_activation`."""
    if data_format == "NCX":
        return (n, c, *spatial)
    return (n, *spatial, c)


def split_weights(shape: Sequence[int], weights_format: str) -> tuple[int, int, Shape]:
    """(I, O, kernel) of ConvTranspose weights: IOX = (I, O, X...), XOI = (X..., O, I).

    I is the full input channel count IC and O is OC/groups (D4).
    """
    if weights_format == "IOX":
        return shape[0], shape[1], tuple(shape[2:])
    return shape[-1], shape[-2], tuple(shape[:-2])


def join_weights(i: int, o: int, kernel: Sequence[int], weights_format: str) -> Shape:
    """Inverse of :func:`split_weights`."""
    if weights_format == "IOX":
        return (i, o, *kernel)
    return (*kernel, o, i)


def resolve_pads(
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    auto_pad: str,
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
) -> tuple[Shape, Shape]:
    """Explicit (pads_begin, pads_end) for an auto_pad value in the library's spelling.

    The forward ConvTranspose's rule, which depends only on k, d and s; the backward ops use
    it too so that they stay the adjoints of the forward op (D8).
    """
    if auto_pad == "None":
        return tuple(pads_begin), tuple(pads_end)
    if auto_pad == "VALID":
        zeros = (0,) * len(kernel)
        return zeros, zeros
    begin, end = [], []
    for k, s, d in zip(kernel, strides, dilations):
        total = max(0, effective_kernel(k, d) - s)
        b = total // 2 if auto_pad == "SAME_UPPER" else (total + 1) // 2
        begin.append(b)
        end.append(total - b)
    return tuple(begin), tuple(end)


def conv_transpose_full(src: int, k: int, s: int, d: int, pb: int, pe: int) -> int:
    """ConvTranspose output size without output_padding."""
    return s * (src - 1) + effective_kernel(k, d) - pb - pe


def conv_transpose_output(
    src: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
    output_padding: Sequence[int],
) -> Shape:
    """Spatial dims of ConvTranspose's dst."""
    return tuple(
        conv_transpose_full(x, k, s, d, b, e) + p
        for x, k, s, d, b, e, p in zip(src, kernel, strides, dilations, pads_begin, pads_end, output_padding)
    )


def backward_data_output(
    diff_dst: Sequence[int],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    pads_begin: Sequence[int],
    pads_end: Sequence[int],
) -> Shape:
    """Spatial dims of ConvTransposeBackwardData's diff_src (the convolution formula)."""
    return tuple(
        (y + b + e - effective_kernel(k, d)) // s + 1
        for y, k, s, d, b, e in zip(diff_dst, kernel, strides, dilations, pads_begin, pads_end)
    )


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides, in elements, of a C-contiguous array of ``shape`` (a dim of size 0 counts as
    1, so that the strides stay positive)."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))
