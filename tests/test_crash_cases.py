"""The inputs that crash oneDNN 3.2 (spec.md Part II section 3) raise exceptions instead.

oneDNN 3.2 kills the process (SIGFPE, abort, ``std::bad_alloc``) on some invalid
attributes. Each case runs in a child interpreter, so a crash shows up as one failed test
with the reproducing call rather than taking pytest down. Every case is run twice: through
the public API (the Python layer refuses it) and straight through ``_core.compile`` with
the crashing arguments (the C++ layer refuses it on its own: never trust the caller).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onednn_convt as oc
import pytest
from onednn_convt import _core

_PRELUDE = """
import numpy as np
import onednn_convt as oc
from onednn_convt import _core

def dense(shape, dtype="f32"):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return (list(shape), strides[::-1], dtype)

def attrs(rank=2, **changes):
    a = dict(strides=[1] * rank, pads_begin=[0] * rank, pads_end=[0] * rank, dilations=[1] * rank,
             auto_pad="None", groups=1, data_format="NCX", weights_format="IOX")
    a.update(changes)
    return a

NCX = dict(data_format="NCX", weights_format="IOX")
x = np.ones((1, 4, 5, 5), np.float32)      # src / diff_src, NCX
w = np.ones((4, 6, 3, 3), np.float32)      # IOX: IC=4, OC/G=6
y = np.ones((1, 6, 7, 7), np.float32)      # dst / diff_dst
"""

# (id, the call, the exception it must raise). The spec's crash list, per op where it crashes.
PUBLIC = [
    ("fwd_groups_0", "oc.ConvTranspose(groups=0, **NCX)(x, w)", "ValueError"),
    ("bwd_d_groups_0", "oc.ConvTransposeBackwardData(groups=0, **NCX)(y, w)", "ValueError"),
    ("bwd_d_strides_0", "oc.ConvTransposeBackwardData(strides=0, **NCX)(y, w)", "ValueError"),
    ("bwd_d_strides_0_in_list", "oc.ConvTransposeBackwardData(strides=[1, 0], **NCX)(y, w)", "ValueError"),
    ("fwd_strides_length", "oc.ConvTranspose(strides=[1, 1, 1], **NCX)(x, w)", "ValueError"),
    ("fwd_strides_length_short", "oc.ConvTranspose(strides=[2], dilations=[1, 1], **NCX)(np.ones((1, 4, 5, 5, 5), np.float32), np.ones((4, 6, 3, 3, 3), np.float32))", "ValueError"),
    ("bwd_d_strides_length", "oc.ConvTransposeBackwardData(strides=[1, 1, 1], **NCX)(y, w)", "ValueError"),
    ("bwd_d_groups_minus_1", "oc.ConvTransposeBackwardData(groups=-1, **NCX)(y, w)", "ValueError"),
    ("bwd_d_weights_o_mismatch", "oc.ConvTransposeBackwardData(**NCX)(y, np.ones((4, 5, 3, 3), np.float32))", "ValueError"),
    ("bwd_d_grouped_o_mismatch", "oc.ConvTransposeBackwardData(groups=2, **NCX)(y, w)", "ValueError"),
    ("bwd_d_docs_grouped_layout", "oc.ConvTransposeBackwardData(groups=2, **NCX)(y, np.ones((2, 6, 3, 3), np.float32))", "ValueError"),
    ("bwd_w_groups_0", "oc.ConvTransposeBackwardWeights(groups=0, weights_shape=(4, 6, 3, 3), **NCX)(x, y)", "ValueError"),
    ("bwd_w_strides_length", "oc.ConvTransposeBackwardWeights(strides=[1], weights_shape=(4, 6, 3, 3), **NCX)(np.ones((1, 4, 5, 5, 5), np.float32), np.ones((1, 6, 7, 7, 7), np.float32))", "ValueError"),
]

# The same crashing arguments handed to the native layer directly. BackwardData runs as the
# library's Convolution in the package (D9), so both library kinds are covered.
CORE = [
    ("fwd_groups_0", 'compile("ConvTranspose", attrs(groups=0), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3])], dense([1, 6, 7, 7]))'),
    ("bwd_d_groups_0", 'compile("ConvTransposeBackwardData", attrs(groups=0), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("bwd_d_strides_0", 'compile("ConvTransposeBackwardData", attrs(strides=[0, 0]), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("fwd_strides_length", 'compile("ConvTranspose", attrs(strides=[1]), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3])], dense([1, 6, 7, 7]))'),
    ("bwd_d_strides_length", 'compile("ConvTransposeBackwardData", attrs(strides=[1, 1, 1]), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("bwd_d_groups_minus_1", 'compile("ConvTransposeBackwardData", attrs(groups=-1), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("bwd_d_weights_o_mismatch", 'compile("ConvTransposeBackwardData", attrs(), [dense([1, 6, 7, 7]), dense([4, 5, 3, 3])], dense([1, 4, 5, 5]))'),
    ("bwd_d_docs_grouped_layout", 'compile("ConvTransposeBackwardData", attrs(groups=2), [dense([1, 6, 7, 7]), dense([2, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("conv_groups_0", 'compile("Convolution", attrs(groups=0, weights_format="OIX"), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("conv_strides_0", 'compile("Convolution", attrs(strides=[0, 0], weights_format="OIX"), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("conv_strides_length", 'compile("Convolution", attrs(strides=[1], weights_format="OIX"), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("conv_groups_minus_1", 'compile("Convolution", attrs(groups=-1, weights_format="OIX"), [dense([1, 6, 7, 7]), dense([4, 6, 3, 3])], dense([1, 4, 5, 5]))'),
    ("bwd_w_groups_0", 'compile("ConvTransposeBackwardWeights", attrs(groups=0, weights_shape=[4, 6, 3, 3]), [dense([1, 4, 5, 5]), dense([1, 6, 7, 7])], dense([4, 6, 3, 3]))'),
    ("bwd_w_strides_0", 'compile("ConvTransposeBackwardWeights", attrs(strides=[0, 0], weights_shape=[4, 6, 3, 3]), [dense([1, 4, 5, 5]), dense([1, 6, 7, 7])], dense([4, 6, 3, 3]))'),
    # ConvolutionBackwardWeights (BackwardWeights in 2-D/3-D NXC, onednn_convt.lowerings)
    ("conv_bwd_w_groups_0", 'compile("ConvolutionBackwardWeights", attrs(groups=0, weights_format="OIX", weights_shape=[4, 6, 3, 3]), [dense([1, 6, 7, 7]), dense([1, 4, 5, 5])], dense([4, 6, 3, 3]))'),
    ("conv_bwd_w_strides_0", 'compile("ConvolutionBackwardWeights", attrs(strides=[0, 0], weights_format="OIX", weights_shape=[4, 6, 3, 3]), [dense([1, 6, 7, 7]), dense([1, 4, 5, 5])], dense([4, 6, 3, 3]))'),
    ("conv_bwd_w_channels", 'compile("ConvolutionBackwardWeights", attrs(weights_format="OIX", weights_shape=[4, 6, 3, 3]), [dense([1, 6, 7, 7]), dense([1, 5, 5, 5])], dense([4, 6, 3, 3]))'),
    ("conv_bwd_w_groups_split", 'compile("ConvolutionBackwardWeights", attrs(groups=4, weights_format="OIX", weights_shape=[4, 6, 3, 3]), [dense([1, 6, 7, 7]), dense([1, 4, 5, 5])], dense([4, 6, 3, 3]))'),
    # a bias the core adds after the library op (bias_axis): 1-D, last, f32, one value per
    # entry of that axis, not constant; it would be read out of bounds otherwise
    ("host_bias_length", 'compile("ConvTranspose", attrs(), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3]), dense([5])], dense([1, 6, 7, 7]), bias_axis=1)'),
    ("host_bias_axis", 'compile("ConvTranspose", attrs(), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3]), dense([6])], dense([1, 6, 7, 7]), bias_axis=4)'),
    ("host_bias_rank", 'compile("ConvTranspose", attrs(), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3]), dense([1, 6])], dense([1, 6, 7, 7]), bias_axis=1)'),
    ("host_bias_bf16", 'compile("ConvTranspose", attrs(), [dense([1, 4, 5, 5], "bf16"), dense([4, 6, 3, 3], "bf16"), dense([6], "bf16")], dense([1, 6, 7, 7], "bf16"), bias_axis=1)'),
    ("host_bias_constant", 'compile("ConvTranspose", attrs(), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3]), dense([6])], dense([1, 6, 7, 7]), constant=[2], bias_axis=1)'),
    ("host_bias_alone", 'compile("ConvTranspose", attrs(), [dense([6])], dense([1, 6, 7, 7]), bias_axis=1)'),
    # not a crash but a wrong answer: oneDNN's consistency check overflows and accepts it
    ("fwd_pads_overflow", 'compile("ConvTranspose", attrs(pads_end=[2**62, 0]), [dense([1, 4, 5, 5]), dense([4, 6, 3, 3])], dense([1, 6, 7, 7]))'),
]


def run_child(call: str, expected: str) -> None:
    """Run ``call`` in a fresh interpreter; it must raise ``expected`` and exit normally."""
    script = _PRELUDE + textwrap.dedent(f"""
        try:
            {call}
        except Exception as e:
            print(type(e).__name__ + ": " + str(e))
        else:
            print("no exception")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    repro = f"reproduce with: python -c {script!r}"
    assert proc.returncode == 0, f"crashed with exit code {proc.returncode}: {call}\n{proc.stderr[-2000:]}\n{repro}"
    out = proc.stdout.strip()
    assert out.startswith(expected + ": "), f"{call} -> {out!r}, expected {expected}\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize(("call", "expected"), [c[1:] for c in PUBLIC], ids=[c[0] for c in PUBLIC])
def test_public_api_refuses(call, expected):
    run_child(call, expected)


@pytest.mark.parametrize("call", [c[1] for c in CORE], ids=[c[0] for c in CORE])
def test_native_layer_refuses_on_its_own(call):
    run_child("_core." + call, "ValueError")


def test_child_reports_a_crash_as_a_failure():
    """The harness itself: a child killed by a signal fails the test with the call in the message."""
    with pytest.raises(AssertionError, match=r"crashed with exit code -6: import os; os.abort\(\)"):
        run_child("import os; os.abort()", "ValueError")


def test_executor_refuses_dtypes_other_than_the_compiled_ones():
    """The fast path hands NumPy's pointers to oneDNN as they are: an Executor made for a
    2-byte dtype over an f32 partition would read past the arrays, so it is refused."""
    op = oc.ConvTranspose()
    x, w = np.ones((1, 5, 3), np.float32), np.ones((2, 4, 3), np.float32)
    op(x, w)
    compiled, f16 = op.last_plan.compiled, np.dtype(np.float16)
    with pytest.raises(ValueError, match="input dtype differs"):
        _core.Executor(compiled, [f16, f16], np.dtype(np.float32))
    with pytest.raises(ValueError, match="output dtype differs"):
        _core.Executor(compiled, [np.dtype(np.float32)] * 2, f16)
    with pytest.raises(ValueError, match="finite_code"):
        _core.Executor(compiled, [np.dtype(np.float32)] * 2, np.dtype(np.float32), "bf16")
    for order in ([0, 0], [0, 2], [1]):  # an input twice, out of range, missing
        with pytest.raises(ValueError, match="order"):
            _core.Executor(compiled, [np.dtype(np.float32)] * 2, np.dtype(np.float32), "", order)
