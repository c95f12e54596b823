"""``onednn-convt conformance``: run graph JSON cases and harness files, report, exit status.

Examples::

    onednn-convt conformance                       # the bundled suite
    onednn-convt conformance harness_f32 op/ -k bwd_w --junit-xml report.xml
    onednn-convt conformance --cases-root DIR --line '--reset --dt=bf16 --case=op/f32/deconv.json'
    onednn-convt conformance --dump 'ConvTranspose(strides=2, data_format="NCX", weights_format="IOX")' \\
        --shapes 1x8x5x5 8x4x3x3 --dt bf16 -o case.json
    onednn-convt conformance --dump 'ConvTranspose(data_format="NCX", weights_format="IOX",
        post_ops=[PostOp("Add", dequantize=Dequantize(scales=1)), "ReLU"],
        src_dequantize=Dequantize(scales=0.5, zps=2), weights_dequantize=Dequantize(scales=2),
        dst_quantize=Quantize(scales=1, dtype="s8"))' --shapes 1x8x5x5 8x4x3x3 - 1x4x7x7

Exit status: 0 when no case failed or errored, 1 otherwise, 2 for a usage error (a bad
option, a ``--dump`` call or ``--shapes`` that does not describe a call, a path that does
not exist). A bad case file is never a usage error: it is an INVALID case naming it, and the
others run. ``--dump`` writes only shapes: huge ones are written without allocating them;
dims must be 1 to 2**31 - 1, and a call whose output shape would not be positive is refused.
Errors are one line on standard error, never a traceback.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import arguments

#: Op classes --dump accepts.
DUMP_KINDS = (
    "ConvTranspose",
    "ConvTransposeBackwardData",
    "ConvTransposeBackwardWeights",
    "ConvTransposeBackpropFilters",
)
#: Classes a --dump call may build its fused attributes from (with literal arguments).
DUMP_HELPERS = ("PostOp", "Dequantize", "Quantize")
#: dtype prefixes of --shapes entries (``u8:1x8x5x5``)
SHAPE_CODES = ("f32", "bf16", "f16", "u8", "s8")


def _shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (e.g. 1/4), got {text!r}") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError(
            f"expected 1 <= I <= N in I/N (shards are numbered from 1), got {text!r}"
        )
    return i, n


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``onednn-convt conformance``."""
    parser.description = (
        "Run oneDNN graph JSON cases (single ConvTranspose ops, or a ConvTranspose with the "
        "Dequantize, BiasAdd, post-op and Quantize ops the package fuses) and benchdnn-style "
        "harness files through onednn_convt and judge each against onednn_convt.reference."
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="JSON files, harness files (any other file) or directories (searched for *.json and "
        "harness* files); none: the bundled suite",
    )
    parser.add_argument(
        "-k",
        dest="keywords",
        action="append",
        default=[],
        metavar="TEXT",
        help="run only cases whose line or location contains TEXT (case-insensitive; "
        "repeat: any of them)",
    )
    parser.add_argument(
        "--dt",
        metavar="DT[,DT...]",
        help="run only cases of these dtypes (f32, bf16, f16; int8: int8 patterns); with --dump: "
        "the dtype of the call's float inputs",
    )
    parser.add_argument(
        "--shard",
        type=_shard,
        metavar="I/N",
        help="run only the I-th of N equal parts of the selected cases (1 <= I <= N)",
    )
    parser.add_argument(
        "-j", "--jobs", type=arguments.up_to_cpus("a worker process count"), default=1, metavar="N",
        help="worker processes, at most the CPUs this process may use (default 1)"
    )
    parser.add_argument("--junit-xml", metavar="FILE", help="write a JUnit XML report")
    parser.add_argument("--json", metavar="FILE", help="write a JSON report")
    parser.add_argument(
        "--fail-on-unsupported",
        action="store_true",
        help="count UNSUPPORTED cases as failed (default: skipped)",
    )
    parser.add_argument(
        "--strict-dtypes",
        action="store_true",
        help="do not emulate bf16/f16 where the CPU has no kernel: such cases are UNSUPPORTED",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="print every case with its details"
    )
    parser.add_argument(
        "--cases-root",
        metavar="DIR",
        help="where --case= paths are looked up when not next to the harness file",
    )
    parser.add_argument(
        "--line",
        action="append",
        default=[],
        metavar="LINE",
        help="a harness line to run (repeatable), e.g. '--reset --case=op/f32/deconv.json'",
    )
    parser.add_argument("--list", action="store_true", help="list the selected cases and exit")
    parser.add_argument(
        "--dump-failures",
        metavar="DIR",
        help="write the graph JSON of each failed case (overrides applied) into DIR",
    )
    dump = parser.add_argument_group("writing a case (--dump)")
    dump.add_argument(
        "--dump",
        metavar="CALL",
        help="write the graph JSON of a call instead of running cases; CALL is the op "
        "construction with literal keywords, e.g. 'ConvTranspose(strides=2, auto_pad=\"same_upper\")'",
    )
    dump.add_argument(
        "--shapes",
        nargs="+",
        default=[],
        metavar="SHAPE",
        help="the call's input shapes in order, e.g. 1x8x5x5 8x4x3x3; ws:8x4x3x3 is a "
        "weights_shape input (ConvTransposeBackwardWeights) with those values; a fused "
        "ConvTranspose takes src, weights, bias ('-' for none), then each binary post-op's "
        "tensor; DT:SHAPE (u8:1x8x5x5) sets one input's dtype (int8 calls default to u8 src, "
        "s8 weights and dequantized tensors, f32 bias and other tensors)",
    )
    dump.add_argument(
        "-o", "--output", metavar="FILE", help="where --dump writes (default: standard output)"
    )


def parse_call(text: str) -> tuple[str, dict[str, Any]]:
    """(op class name, keyword attributes) of ``Kind(attr=literal, ...)``.

    Raises:
        ValueError: not a call of one of DUMP_KINDS with literal keyword arguments.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"--dump: {text!r} is not a Python call: {e.msg}") from None
    if not isinstance(node, ast.Call):
        raise ValueError(f"--dump: expected Kind(attr=value, ...), got {text!r}")
    name = _callee(node)
    if name not in DUMP_KINDS:
        raise ValueError(f"--dump: op {name or text!r} expected one of {', '.join(DUMP_KINDS)}")
    if node.args or any(kw.arg is None for kw in node.keywords):
        raise ValueError("--dump: attributes are keyword arguments (strides=2, ...)")
    kwargs: dict[str, Any] = {}
    for kw in node.keywords:
        assert kw.arg is not None
        try:
            kwargs[kw.arg] = _value(kw.value)
        except ValueError as e:
            detail = f" ({e})" if str(e) else ""
            raise ValueError(
                f"--dump: attribute {kw.arg} expected a literal value or {', '.join(DUMP_HELPERS)}"
                f"(...) with literal arguments, got {ast.unparse(kw.value)}{detail}"
            ) from None
    return name, kwargs


def _callee(node: ast.Call) -> str:
    """The called name of ``Kind(...)`` or ``module.Kind(...)``, else ``""``."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else ""


def _value(node: ast.expr) -> Any:
    """A literal, or a PostOp/Dequantize/Quantize built from literals, in lists or tuples."""
    import onednn_convt

    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_value(e) for e in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.Call):
        name = _callee(node)
        if name not in DUMP_HELPERS or any(kw.arg is None for kw in node.keywords):
            raise ValueError(f"{ast.unparse(node)} is not a call of {', '.join(DUMP_HELPERS)}")
        args = [_value(a) for a in node.args]
        kwargs = {kw.arg: _value(kw.value) for kw in node.keywords if kw.arg is not None}
        try:
            return getattr(onednn_convt, name)(*args, **kwargs)
        except (TypeError, ValueError) as e:
            raise ValueError(str(e)) from None
    return ast.literal_eval(node)


def dump_call(call: str, shapes: Sequence[str], dt: Optional[str]) -> str:
    """Graph JSON of ``call`` applied to zero arrays of ``shapes`` in dtype ``dt``."""
    import numpy as np

    import onednn_convt
    from onednn_convt.dtypes import FLOAT_DTYPES, SHAPE_DTYPE
    from onednn_convt.post_ops import INT8_DTYPES

    from ..limits import INT32_MAX
    from .export import to_graph_json
    from .graph_json import MAX_NDIMS, short

    name, kwargs = parse_call(call)
    code = dt or "f32"
    if code not in FLOAT_DTYPES:
        raise ValueError(f"--dt: expected f32, bf16 or f16 with --dump, got {code!r}")
    try:
        op = getattr(onednn_convt, name)(**kwargs)
    except TypeError as e:
        raise ValueError(f"--dump: {e}") from None
    f = getattr(op, "fusion", None)
    defaults: list[str] = []
    if f is not None and f.int8:  # src, weights, bias, then each binary post-op's tensor
        defaults = ["u8", "s8", "f32"] + [
            "s8" if p.dequantize is not None else "f32" for p in f.binary
        ]
    arrays: list[Any] = []
    dtypes = {**FLOAT_DTYPES, **INT8_DTYPES}
    for i, text in enumerate(shapes):
        if text == "-" and f is not None and i == 2:
            arrays.append(None)  # no bias
            continue
        prefix, sep, rest = text.partition(":")
        ws = prefix == "ws" and bool(sep)
        given = prefix if sep and prefix in SHAPE_CODES else None
        dims_text = rest if sep and (ws or given) else text
        try:
            dims = [int(d) for d in dims_text.split("x")]
        except ValueError:
            raise ValueError(
                f"--shapes: {short(text)} expected AxBxC, DT:AxBxC (DT one of {', '.join(SHAPE_CODES)}) or ws:AxBxC"
            ) from None
        if len(dims) > MAX_NDIMS or not all(1 <= d <= INT32_MAX for d in dims):
            raise ValueError(
                f"--shapes: {short(text)} expected at most {MAX_NDIMS} dims, each from 1 to 2**31 - 1 "
                "(oneDNN's 32-bit shapes)"
            )
        if ws:
            arrays.append(np.asarray(dims, SHAPE_DTYPE))
            continue
        c = given or (defaults[i] if i < len(defaults) else code)
        # only the shape, dtype and memory order are written: a view of one element
        # stands for the array (dense strides), whatever its size
        try:
            arrays.append(np.broadcast_to(np.zeros((), dtypes[c]), dims))
        except ValueError as e:  # more elements than NumPy indexes
            raise ValueError(f"--shapes: {short(text)}: too large to describe ({e})") from None
    return to_graph_json(op, *arrays)


def _select(cases: list[Any], args: argparse.Namespace) -> list[Any]:
    if args.keywords:
        words = [k.lower() for k in args.keywords]
        cases = [c for c in cases if any(w in f"{c.location} {c.id}".lower() for w in words)]
    if args.dt:
        wanted = {d.strip() for d in args.dt.split(",")}
        unknown = wanted - {"f32", "bf16", "f16", "int8"}
        if unknown:
            raise ValueError(
                f"--dt: expected f32, bf16, f16 or int8, got {', '.join(sorted(unknown))}"
            )

        def dtype_of(c: Any) -> Optional[str]:
            return "int8" if c.pattern is not None and c.pattern.int8 else c.dtype

        cases = [c for c in cases if dtype_of(c) is None or dtype_of(c) in wanted]
    if args.shard:
        i, n = args.shard
        cases = cases[i - 1 :: n]
    return cases


def run(args: argparse.Namespace) -> int:
    """Run ``onednn-convt conformance``; returns the exit status."""
    from . import report
    from .collect import collect
    from .judge import FAILED
    from .runner import run_cases

    try:
        if args.dump:
            text = dump_call(args.dump, args.shapes, args.dt)
            if args.output:
                unwritable = arguments.make_writable_file("-o", args.output)
                if unwritable:
                    raise ValueError(unwritable)
                with open(args.output, "w", encoding="utf-8") as f:
                    f.write(text)
            else:
                sys.stdout.write(text)
            return 0
        unwritable = _unwritable_outputs(args)
        if unwritable:
            raise ValueError(unwritable)
        cases = _select(collect(args.paths, cases_root=args.cases_root, lines=args.line), args)
    except (ValueError, TypeError, OverflowError, MemoryError, RecursionError, OSError) as e:
        # usage errors: a bad --dump call or --shapes, a path that does not exist, an
        # unwritable -o; never a traceback (a bad case file is a case, not an error here)
        print(f"onednn-convt conformance: error: {_message(e)}", file=sys.stderr)
        return 2
    if args.list:
        for c in cases:
            print(f"{c.location}  {c.id}")
        print(f"{len(cases)} cases")
        return 0
    start = time.perf_counter()
    reporter = report.Reporter(
        len(cases), verbose=args.verbose, fail_on_unsupported=args.fail_on_unsupported
    )
    results = run_cases(
        cases,
        jobs=args.jobs,
        strict_dtypes=args.strict_dtypes,
        on_result=lambda i, r: reporter.add(r),
    )
    seconds = time.perf_counter() - start
    if args.junit_xml or args.json:
        env = report.environment()
        common = dict(fail_on_unsupported=args.fail_on_unsupported)
        if args.junit_xml:
            report.write_junit(args.junit_xml, results, seconds, properties=env, **common)
        if args.json:
            report.write_json(args.json, results, seconds, env=env, **common)
    if args.dump_failures:
        _dump_failures(args.dump_failures, [r for r in results if r.outcome == FAILED])
    counts = reporter.finish(seconds)
    return 0 if counts["failed"] == 0 and counts["errors"] == 0 else 1


def _unwritable_outputs(args: argparse.Namespace) -> str:
    """Why a report or dump path cannot be written ('' if each can): checked before any case
    runs, so that a run's results are not lost at its end."""
    for option, file in (("--junit-xml", args.junit_xml), ("--json", args.json)):
        if file is not None:
            why = arguments.make_writable_file(option, file)
            if why:
                return why
    if args.dump_failures is not None:
        if not args.dump_failures:
            return "--dump-failures: expected a directory, got ''"
        return arguments.make_writable_dir("--dump-failures", Path(args.dump_failures))
    return ""


def _message(e: BaseException) -> str:
    """One line for an error: its message, cut to a few hundred characters, or its type."""
    from .graph_json import QUOTE_CHARS

    text = str(e).strip() or type(e).__name__
    if isinstance(e, (MemoryError, OverflowError, RecursionError)):
        text = f"{type(e).__name__}: {text}"
    return text if len(text) <= 4 * QUOTE_CHARS else text[: 4 * QUOTE_CHARS] + "..."


def _dump_failures(directory: str, failed: Sequence[Any]) -> None:
    from .export import case_graph_json

    os.makedirs(directory, exist_ok=True)
    for n, r in enumerate(failed, 1):
        path = os.path.join(directory, f"failure_{n:03d}_{r.case.kind}.json")
        try:
            text = case_graph_json(r.case)
        except (ValueError, TypeError) as e:
            print(f"could not write {path}: {e}", file=sys.stderr)
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path} for {r.case.id}")
