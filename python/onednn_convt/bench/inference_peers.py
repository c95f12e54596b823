"""Inference runtimes as peers, where they fit: ONNX Runtime and OpenVINO.

Both run a forward graph, built here from the configuration with the weights as constants
of the graph, as an exported model holds them; so each is timed against our call with the
weights bound as constant (``op.with_constant_weights``), side by side in one process.

* ``fwd``: ONNX ``ConvTranspose``; OpenVINO ``ConvolutionBackpropData`` (one group) or
  ``GroupConvolutionBackpropData``, then an ``Add`` for a bias.
* ``bwd_d``: BackwardData is the strided convolution of diff_dst with the same weights read
  as (O = IC, I = OC/groups, X...), no flip: ONNX ``Conv``; OpenVINO ``Convolution`` or
  ``GroupConvolution``. Its output has the src's size when ``output_padding`` is smaller
  than the stride (every layer of the suites); otherwise the configuration does not fit.
* ``bwd_w`` does not fit: neither runtime has an inference op for a weights gradient.

Layouts and dtypes:

* ONNX Runtime: NCX only (ONNX's convolutions are NCHW; an NXC row would time transposes
  around them). OpenVINO: NCX, and NXC as an OpenVINO user with channels-last data runs it,
  the graph NCHW and its input and output declared NHWC (``PrePostProcessor``): its CPU
  plugin then picks its channels-last kernel.
* ONNX Runtime: f32 (its CPU execution provider has f32 kernels for these ops only).
* OpenVINO: f32, with ``INFERENCE_PRECISION_HINT`` f32 (on a bf16 CPU its default is bf16);
  bf16 where the CPU plugin lists BF16 among its capabilities: the f32 graph with the hint
  bf16, fed the bf16 inputs widened to f32 (exact), as OpenVINO runs bf16 on a CPU; f16
  where it lists FP16.

Threads: ONNX Runtime's intra-op pool and OpenVINO's ``INFERENCE_NUM_THREADS`` get the
bench's thread count; ONNX Runtime's threads do not spin between calls (they would slow
the call timed next to them).
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from .suites import Case, Config

#: the peers, by their package names
PEERS = ("onnxruntime", "openvino")

#: each peer's short name, the prefix of its fields in a result record (``ort_ms``, ...)
PREFIX = {"onnxruntime": "ort", "openvino": "ov"}

#: the ONNX opset the graphs are written in (ConvTranspose and Conv as since opset 11)
ONNX_OPSET = 17


@functools.cache
def _module(name: str) -> Any:
    """``onnxruntime``, ``openvino`` or ``onnx``, or None if it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def missing(peer: str) -> Optional[str]:
    """What is missing to run ``peer`` (None: nothing): ONNX Runtime needs ``onnx`` too, to
    write its graphs."""
    needed = ("onnxruntime", "onnx") if peer == "onnxruntime" else (peer,)
    absent = [m for m in needed if _module(m) is None]
    if not absent:
        return None
    return f"{' and '.join(absent)} not installed (pip install 'onednn-convt[bench]')"


def versions(peers: tuple[str, ...]) -> dict[str, Optional[str]]:
    """The version of each of ``peers`` (None where it is not installed)."""
    out: dict[str, Optional[str]] = {}
    for peer in peers:
        mod = _module(peer)
        out[peer] = None if mod is None else str(mod.__version__)
    return out


@functools.cache
def _openvino_capabilities() -> tuple[str, ...]:
    core = _module("openvino").Core()
    return tuple(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def unfit(peer: str, cfg: Config) -> Optional[str]:
    """Why ``peer`` cannot run ``cfg`` as the same computation (None: it can)."""
    lay = cfg.layer
    if cfg.op == "bwd_w":
        return "no inference op computes a weights gradient"
    if peer == "onnxruntime" and cfg.data_format != "NCX":
        return "NCX only (ONNX's convolutions are NCHW)"
    if cfg.op == "bwd_d" and lay.output_padding >= lay.stride:
        return "BackwardData as a convolution: output_padding >= stride adds an output row"
    if peer == "onnxruntime" and cfg.dtype != "f32":
        return f"f32 only (the CPU execution provider has no {cfg.dtype} kernel for these ops)"
    absent = missing(peer)
    if absent is not None:
        return absent
    if peer == "openvino" and cfg.dtype != "f32":
        capability = {"bf16": "BF16", "f16": "FP16"}[cfg.dtype]
        if capability not in _openvino_capabilities():
            return f"{cfg.dtype}: this CPU's plugin lacks {capability} among its capabilities"
    return None


@dataclass(frozen=True)
class PeerCall:
    """A configuration compiled in a peer.

    Attributes:
        run: runs it, returning the result as float32 in the configuration's layout
            (OpenVINO's is its output buffer, which the next run overwrites).
        precision: the dtype its kernel computes in, as the peer reports it (``f32``,
            ``bf16``, ``f16``): OpenVINO may keep f32 where bf16 was asked for (it does on
            an AMD Zen4).
    """

    run: Callable[[], np.ndarray]
    precision: str


def call(peer: str, case: Case, threads: int) -> PeerCall:
    """``case`` built and compiled in ``peer``, which must fit it (:func:`unfit`); its inputs
    in the configuration's layouts."""
    cfg = case.config
    assert unfit(peer, cfg) is None, (peer, cfg.key)
    inputs = case.f32_args()
    data, weights = inputs[0], inputs[1]
    bias = inputs[2] if cfg.bias else None
    if peer == "onnxruntime":
        return _onnxruntime(cfg, data, weights, bias, threads)
    return _openvino(cfg, data, weights, bias, threads)


def _geometry(cfg: Config) -> dict[str, list[int]]:
    lay = cfg.layer
    rank = len(lay.spatial)
    pb, pe = lay.pads
    return {"strides": [lay.stride] * rank, "pads_begin": [pb] * rank, "pads_end": [pe] * rank,
            "dilations": [lay.dilation] * rank, "kernel": list(lay.kernel),
            "output_padding": [lay.output_padding] * rank}


def _onnxruntime(cfg: Config, data: np.ndarray, weights: np.ndarray, bias: Optional[np.ndarray],
                 threads: int) -> PeerCall:
    onnx, ort = _module("onnx"), _module("onnxruntime")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    g = _geometry(cfg)
    attrs: dict[str, Any] = {"strides": g["strides"], "pads": g["pads_begin"] + g["pads_end"],
                             "dilations": g["dilations"], "kernel_shape": g["kernel"], "group": cfg.layer.groups}
    constants = [numpy_helper.from_array(weights, "w")]
    names = ["x", "w"]
    if bias is not None:
        constants.append(numpy_helper.from_array(bias, "b"))
        names.append("b")
    if cfg.op == "fwd":
        node = helper.make_node("ConvTranspose", names, ["y"], output_padding=g["output_padding"], **attrs)
    else:  # BackwardData: the convolution with the weights as (O = IC, I = OC/groups, X...)
        node = helper.make_node("Conv", names, ["y"], **attrs)
    f32 = onnx.TensorProto.FLOAT
    graph = helper.make_graph([node], cfg.key, [helper.make_tensor_value_info("x", f32, list(data.shape))],
                              [helper.make_tensor_value_info("y", f32, None)], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = {"x": np.ascontiguousarray(data)}

    def run() -> np.ndarray:
        return np.asarray(session.run(None, feed)[0])

    return PeerCall(run, "f32")


def _openvino(cfg: Config, data: np.ndarray, weights: np.ndarray, bias: Optional[np.ndarray],
              threads: int) -> PeerCall:
    ov = _module("openvino")
    ops = ov.opset13
    g = _geometry(cfg)
    groups = cfg.layer.groups
    channels_last = cfg.data_format == "NXC"
    if channels_last:  # the graph is NCHW: (N, X..., C) data and (X..., O, I) weights moved
        weights = np.moveaxis(weights, (-1, -2), (0, 1))
        logical = [data.shape[0], data.shape[-1], *data.shape[1:-1]]
    else:
        logical = list(data.shape)
    x = ops.parameter(logical, ov.Type.f32, name="x")
    w = weights if groups == 1 else weights.reshape(groups, weights.shape[0] // groups, *weights.shape[1:])
    filters = ops.constant(np.ascontiguousarray(w))
    common = {"strides": g["strides"], "pads_begin": g["pads_begin"], "pads_end": g["pads_end"],
              "dilations": g["dilations"]}
    if cfg.op == "fwd":
        make = ops.convolution_backprop_data if groups == 1 else ops.group_convolution_backprop_data
        y = make(x, filters, output_padding=g["output_padding"], **common)
    else:  # BackwardData: the convolution with the weights as (O = IC, I = OC/groups, X...)
        y = (ops.convolution if groups == 1 else ops.group_convolution)(x, filters, **common)
    if bias is not None:
        y = ops.add(y, ops.constant(bias.reshape(1, -1, *[1] * len(g["kernel"]))))
    model = ov.Model([y], [x], cfg.key)
    if channels_last:
        model = _channels_last_io(ov, model, len(g["kernel"]), list(data.shape))
    compiled = ov.Core().compile_model(model, "CPU", {  # the precision hint is the dtype's code
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": cfg.dtype, "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    feed = {0: np.ascontiguousarray(data)}

    def run() -> np.ndarray:
        request.infer(feed)
        return np.asarray(request.get_output_tensor(0).data)

    return PeerCall(run, _openvino_precision(compiled))


#: OpenVINO's layout names per spatial rank: (channels first, channels last)
_OPENVINO_LAYOUTS = {1: ("NCW", "NWC"), 2: ("NCHW", "NHWC"), 3: ("NCDHW", "NDHWC")}


def _channels_last_io(ov: Any, model: Any, rank: int, shape: list[int]) -> Any:
    """``model`` (NCHW) with its input and output tensors declared channels-last, the
    input of ``shape``: OpenVINO's way to take channels-last data."""
    from openvino.preprocess import PrePostProcessor

    first, last = (ov.Layout(name) for name in _OPENVINO_LAYOUTS[rank])
    steps = PrePostProcessor(model)
    steps.input().tensor().set_layout(last).set_shape(shape)
    steps.input().model().set_layout(first)
    steps.output().model().set_layout(first)
    steps.output().tensor().set_layout(last)
    return steps.build()


#: OpenVINO's names of its runtime precisions, as dtype codes
_OPENVINO_DTYPES = {"f32": "f32", "fp32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16"}


def _openvino_precision(compiled: Any) -> str:
    """The precision OpenVINO's convolution node runs in, from the compiled model's runtime
    graph (``?`` if it names none)."""
    for node in compiled.get_runtime_model().get_ordered_ops():
        info = node.get_rt_info()
        if "layerType" in info and str(info["layerType"].astype(str)) in ("Convolution", "Deconvolution"):
            name = str(info["runtimePrecision"].astype(str)).lower() if "runtimePrecision" in info else "?"
            return _OPENVINO_DTYPES.get(name, name)
    return "?"
