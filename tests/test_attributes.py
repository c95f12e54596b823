"""The attribute schema and decisions D2, D3, D5, D6, D7 (spec.md Part I)."""

from __future__ import annotations

import inspect

import numpy as np
import onednn_convt as oc
import pytest
from helpers import OPS, Config, assert_close
from onednn_convt import schema

CLASSES = {name: getattr(oc, name) for name in OPS}
COMMON = ["strides", "pads_begin", "pads_end", "dilations", "auto_pad", "groups", "data_format", "weights_format"]

# spec Part II section 2 (library spelling), plus D6: output_padding on every op.
EXPECTED_NAMES = {
    "ConvTranspose": COMMON + ["output_padding"],
    "ConvTransposeBackwardData": COMMON + ["output_padding"],
    "ConvTransposeBackwardWeights": COMMON + ["output_padding", "weights_shape"],
}
DEFAULTS = {"strides": 1, "pads_begin": 0, "pads_end": 0, "dilations": 1, "auto_pad": "None", "groups": 1,
                "data_format": "NXC", "weights_format": "XOI"}


@pytest.mark.parametrize("op", OPS)
def test_schema_names_match_the_library(op):
    assert [a.name for a in schema.OP_ATTRIBUTES[op]] == EXPECTED_NAMES[op]
    kinds = {a.name: a.kind for a in schema.OP_ATTRIBUTES[op]}
    assert {n for n, k in kinds.items() if k == "string"} == {"auto_pad", "data_format", "weights_format"}
    assert kinds["groups"] == "s64"


FUSION_ARGS = {"post_ops", "src_dequantize", "weights_dequantize", "dst_quantize"}


@pytest.mark.parametrize("op", OPS)
def test_constructor_takes_exactly_the_schema_attributes(op):
    params = inspect.signature(CLASSES[op]).parameters
    # besides the library's attributes: strict, and ConvTranspose's fusion (tests/test_fusion.py)
    extra = {"strict"} | (FUSION_ARGS if op == "ConvTranspose" else set())
    assert list(params) == [n for n in params if n in EXPECTED_NAMES[op] or n in extra]
    assert set(params) == set(EXPECTED_NAMES[op]) | extra
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


@pytest.mark.parametrize("op", OPS)
def test_defaults(op):
    attrs = CLASSES[op]().attrs
    for name, value in DEFAULTS.items():
        assert attrs[name] == value, name
    if op == "ConvTranspose":
        assert attrs["output_padding"] == 0
    else:
        assert attrs["output_padding"] is None  # not given: nothing to check against (D6)
    if op == "ConvTransposeBackwardWeights":
        assert attrs["weights_shape"] is None


def _run(op: str, cfg: Config, t: dict, **attrs):
    if op == "ConvTranspose":
        return oc.ConvTranspose(**attrs)(t["src"], t["weights"])
    if op == "ConvTransposeBackwardData":
        return oc.ConvTransposeBackwardData(**attrs)(t["diff_dst"], t["weights"])
    return oc.ConvTransposeBackwardWeights(**attrs)(t["src"], t["diff_dst"], cfg.weights_shape)


def _reference(op: str, cfg: Config, t: dict):
    if op == "ConvTranspose":
        return cfg.ref_forward(t["src"], t["weights"]), cfg.fwd_reduction
    if op == "ConvTransposeBackwardData":
        return cfg.ref_backward_data(t["diff_dst"], t["weights"]), cfg.bwd_data_reduction
    return cfg.ref_backward_weights(t["src"], t["diff_dst"]), cfg.bwd_weights_reduction


@pytest.mark.parametrize("op", OPS)
def test_omitted_attributes_are_the_neutral_values(op):
    """D5: strides, pads and dilations may be left out; defaults are NXC and XOI."""
    cfg = Config(src=(4, 5), kernel=(3, 2), data_format="NXC", weights_format="XOI")
    t = cfg.tensors(np.random.default_rng(31))
    bare = _run(op, cfg, t)
    explicit = _run(op, cfg, t, strides=[1, 1], pads_begin=[0, 0], pads_end=[0, 0], dilations=[1, 1],
                    auto_pad="None", groups=1, data_format="NXC", weights_format="XOI")
    np.testing.assert_array_equal(bare, explicit)
    ref, reduction = _reference(op, cfg, t)
    assert_close(bare, ref, "f32", reduction)


@pytest.mark.parametrize("op", OPS)
def test_single_int_is_broadcast_to_every_spatial_dim(op):
    cfg = Config(src=(3, 4, 3), kernel=(2, 3, 2), strides=2, dilations=2, pads_begin=1, pads_end=2)
    t = cfg.tensors(np.random.default_rng(32))
    common = {"data_format": "NCX", "weights_format": "IOX"}
    ints = _run(op, cfg, t, strides=2, dilations=2, pads_begin=1, pads_end=2, **common)
    lists = _run(op, cfg, t, strides=(2, 2, 2), dilations=[2, 2, 2], pads_begin=np.array([1, 1, 1]),
                 pads_end=(2, 2, 2), **common)
    np.testing.assert_array_equal(ints, lists)
    ref, reduction = _reference(op, cfg, t)
    assert_close(ints, ref, "f32", reduction)


SPELLINGS = {
    "None": ["None", "none", "NONE", "nOnE"],
    "SAME_UPPER": ["SAME_UPPER", "same_upper", "Same_Upper"],
    "SAME_LOWER": ["SAME_LOWER", "same_lower"],
    "VALID": ["VALID", "valid", "Valid"],
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("library", list(SPELLINGS))
def test_auto_pad_spellings(op, library):
    """D2: documented and library spellings, any case, all mean the library value."""
    cfg = Config(src=(5,), kernel=(3,), strides=2, pads_begin=1, pads_end=1, auto_pad=library)
    t = cfg.tensors(np.random.default_rng(33))
    common = {"strides": 2, "pads_begin": 1, "pads_end": 1, "data_format": "NCX", "weights_format": "IOX"}
    results = []
    for spelling in SPELLINGS[library]:
        assert CLASSES[op](auto_pad=spelling).attrs["auto_pad"] == library
        results.append(_run(op, cfg, t, auto_pad=spelling, **common))
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])
    ref, reduction = _reference(op, cfg, t)
    assert_close(results[0], ref, "f32", reduction)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("fmt", ["OIX", "XIO", "oix"])
def test_convolution_weights_formats_are_refused_with_a_hint(op, fmt):
    """D3: OIX/XIO are Convolution formats listed for these ops by mistake."""
    with pytest.raises(ValueError, match=r"weights_format.*Convolution") as info:
        CLASSES[op](weights_format=fmt)
    assert op in str(info.value) and "IOX" in str(info.value)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("name", "value", "library"), [("weights_format", "iox", "IOX"), ("weights_format", "Xoi", "XOI"),
                                                        ("data_format", "ncx", "NCX"), ("data_format", "nXc", "NXC")])
def test_formats_take_any_case(op, name, value, library):
    """Every spelling the package takes is case-insensitive (auto_pad, formats, post-op kinds,
    qtype, dtype codes): the op keeps the library's spelling and runs the same."""
    assert CLASSES[op](**{name: value}).attrs[name] == library


@pytest.mark.parametrize("op", OPS)
def test_lower_case_formats_compute_the_same(op):
    cfg = Config(src=(5,), kernel=(3,), strides=2)
    t = cfg.tensors(np.random.default_rng(35))
    common = {"strides": 2, "data_format": "NCX", "weights_format": "IOX"}
    lower = {"strides": 2, "data_format": "ncx", "weights_format": "iox"}
    np.testing.assert_array_equal(_run(op, cfg, t, **common), _run(op, cfg, t, **lower))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("name", "value"), [("data_format", "NCHW"), ("data_format", "nc"), ("weights_format", "OI")])
def test_other_format_spellings_are_refused(op, name, value):
    with pytest.raises(ValueError, match=f"{op}: attribute '{name}' expected one of .* \\(any case\\)"):
        CLASSES[op](**{name: value})


@pytest.mark.parametrize("op", ["ConvTransposeBackwardData", "ConvTransposeBackwardWeights"])
def test_output_padding_on_backward_ops_is_checked_not_passed_on(op):
    """D6: accepted (the forward's value), checked against the shapes, never given to oneDNN."""
    cfg = Config(src=(5,), kernel=(3,), strides=3, output_padding=2)
    t = cfg.tensors(np.random.default_rng(34))
    common = cfg.attrs(op, output_padding=False)
    ok = CLASSES[op](output_padding=2, **common)
    result = _run(op, cfg, t, output_padding=2, **common)
    ref, reduction = _reference(op, cfg, t)
    assert_close(result, ref, "f32", reduction)
    _run(op, cfg, t, **common)  # not given: any value below the stride fits
    with pytest.raises(ValueError, match=f"{op}: spatial dim 0 of 'diff_dst'"):
        _run(op, cfg, t, output_padding=1, **common)
    if op == "ConvTransposeBackwardData":
        ok(t["diff_dst"], t["weights"])
    else:
        ok(t["src"], t["diff_dst"], cfg.weights_shape)
    assert "output_padding" not in ok.last_plan.lowering.attrs


def test_weights_shape_precedence_and_absence():
    """D7: the input wins; the attribute alone works; neither raises ValueError."""
    cfg = Config(src=(4,), kernel=(3,), strides=2)
    t = cfg.tensors(np.random.default_rng(35))
    wrong_kernel = (cfg.ic, cfg.oc, 2)  # kernel 2 also fits these sizes (residual 1 < stride)
    op = oc.ConvTransposeBackwardWeights(weights_shape=wrong_kernel, **cfg.attrs("x", output_padding=False))
    assert op(t["src"], t["diff_dst"]).shape == wrong_kernel
    assert op(t["src"], t["diff_dst"], np.array(cfg.weights_shape, np.int64)).shape == cfg.weights_shape
    assert op.last_plan.lowering.attrs["weights_shape"] == list(cfg.weights_shape)
    neither = oc.ConvTransposeBackwardWeights(**cfg.attrs("x", output_padding=False))
    with pytest.raises(ValueError, match="ConvTransposeBackwardWeights: weights_shape expected as input 2 or as the attribute"):
        neither(t["src"], t["diff_dst"])


def test_backward_ops_pass_resolved_pads_and_no_auto_pad():
    """D8: every op hands oneDNN explicit pads and auto_pad None."""
    cfg = Config(src=(5, 6), kernel=(3, 4), strides=2, dilations=(2, 1), auto_pad="SAME_LOWER")
    t = cfg.tensors(np.random.default_rng(36))
    for op in OPS:
        obj = CLASSES[op](**cfg.attrs(op))
        if op == "ConvTranspose":
            obj(t["src"], t["weights"])
        elif op == "ConvTransposeBackwardData":
            obj(t["diff_dst"], t["weights"])
        else:
            obj(t["src"], t["diff_dst"], cfg.weights_shape)
        lowered = obj.last_plan.lowering.attrs
        assert lowered["auto_pad"] == "None", op
        assert (tuple(lowered["pads_begin"]), tuple(lowered["pads_end"])) == cfg.pads == ((2, 1), (1, 1)), op


def test_repr_names_the_op_and_its_attributes():
    text = repr(oc.ConvTranspose(strides=2, auto_pad="same_upper", groups=3))
    assert text.startswith("ConvTranspose(") and "strides=2" in text
    assert "auto_pad='SAME_UPPER'" in text and "groups=3" in text


def test_functional_forms_accept_list_attributes():
    cfg = Config(src=(4, 4), kernel=(2, 3), strides=(2, 1), pads_end=(1, 0))
    t = cfg.tensors(np.random.default_rng(37))
    attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.attrs().items()}
    got = oc.conv_transpose(t["src"], t["weights"], **attrs)
    assert_close(got, cfg.ref_forward(t["src"], t["weights"]), "f32", cfg.fwd_reduction)


@pytest.mark.parametrize("cls", [oc.ConvTranspose, oc.ConvTransposeBackwardData, oc.ConvTransposeBackwardWeights],
                         ids=lambda c: c.__name__)
def test_constructor_defaults_are_the_schemas(cls):
    """The schema (onednn_convt.schema.OP_ATTRIBUTES) holds each attribute's default; the
    op constructors' keyword defaults and the docstring say the same."""
    from onednn_convt import schema

    params = inspect.signature(cls.__init__).parameters
    for a in schema.OP_ATTRIBUTES[cls.op_name]:
        assert a.name in params, f"{cls.__name__} takes no {a.name}"
        assert params[a.name].default == a.default, f"{cls.__name__}({a.name}=...) defaults to {params[a.name].default!r}, the schema to {a.default!r}"
        if a.default is not None and a.kind == "string":
            assert f'"{a.default}" (default)' in cls.__doc__, f"{cls.__name__}'s docstring does not give {a.name}'s default"
    assert cls().attrs == schema.normalize(cls.op_name, {}), "an op built with no argument has the schema's attributes"
