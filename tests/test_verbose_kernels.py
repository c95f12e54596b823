"""benchmarks/verbose_kernels.py's reading of oneDNN's verbose lines and of a bench run's slow
rows (the tool that names the kernel limiting each slow row)."""

from __future__ import annotations

import json

from helpers import benchmark_script


def _tool():
    return benchmark_script("verbose_kernels")


# oneDNN 3.2's form (ours), then the newer one PyTorch's bundled oneDNN prints; other lines
# (create, info) are not calls
OURS = """onednn_verbose,info,oneDNN v3.2.0
onednn_verbose,create:cache_miss,cpu,deconvolution,jit:avx512_core,forward_inference,src_f32::blocked:acdb::f0,,,g32mb8,0.5
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_bf16::blocked:acdb::f0 dst_bf16::blocked:aBcd8b::f0,,,8x256x16x16,0.056
onednn_verbose,exec,cpu,deconvolution,conv:any+jit_bf16:avx512_core_bf16,forward_inference,src_bf16:a:blocked:aBcd8b::f0,,alg:deconvolution_direct,g32mb8_kh2,0.153
onednn_verbose,exec,cpu,reorder,jit:uni,undef,src_bf16::blocked:aBcd8b::f0 dst_bf16::blocked:acdb::f0,,,8x256x16x16,0.117
onednn_verbose,exec,cpu,deconvolution,conv:any+jit_bf16:avx512_core_bf16,forward_inference,src_bf16:a:blocked:aBcd8b::f0,,alg:deconvolution_direct,g32mb8_kh2,0.179
onednn_verbose,exec,cpu,convolution,jit_bf16:avx512_core_bf16,forward_inference,src_bf16::blocked:acdb::f0,,alg:convolution_direct,g32mb8_kh1,0.3
"""
THEIRS = """onednn_verbose,v1,primitive,exec,cpu,deconvolution,brg_deconv:avx512_core,forward_training,src:f32::blocked:acdb::f0,attr-scratchpad:user,alg:deconvolution_direct,mb8_ic256oc256,8.65
"""


def test_verbose_lines_of_both_onednn_versions_are_read():
    tool = _tool()
    ours = tool._kernels(OURS)
    assert [(k, impl, ms) for k, impl, _, ms in ours.lines] == [
        ("reorder", "jit:uni", 0.056), ("deconvolution", "conv:any+jit_bf16:avx512_core_bf16", 0.153),
        ("reorder", "jit:uni", 0.117), ("deconvolution", "conv:any+jit_bf16:avx512_core_bf16", 0.179),
        ("convolution", "jit_bf16:avx512_core_bf16", 0.3)]
    assert ours.lines[1][2] == "forward_inference | src_bf16:a:blocked:aBcd8b::f0 | g32mb8_kh2"
    # the two deconvolution calls (0.332 ms together) limit it, not the one 0.3 ms convolution
    kind, impl, calls, ms = ours.limiting
    assert (kind, impl, calls) == ("deconvolution", "conv:any+jit_bf16:avx512_core_bf16", 2)
    assert abs(ms - 0.332) < 1e-9 and abs(ours.reorder_ms - 0.173) < 1e-9
    theirs = tool._kernels(THEIRS)
    assert theirs.limiting == ("deconvolution", "brg_deconv:avx512_core", 1, 8.65)
    assert theirs.lines[0][2] == "forward_training | src:f32::blocked:acdb::f0 | mb8_ic256oc256"
    # a call of reorders alone is limited by its largest reorder
    assert tool._kernels(OURS.split("\n")[2] + "\n").limiting[:3] == ("reorder", "jit:uni", 1)


def test_slow_rows_of_a_bench_run_with_the_candidate_each_ran(tmp_path):
    tool = _tool()
    rows = [{"key": "s/a/fwd/f32/NCX", "vs_torch": 0.97, "lowering": "ConvTranspose"},
            {"key": "s/b/fwd/f32/NCX", "vs_torch": 0.80, "lowering": "MatMul (tuned: MatMul (tiles))"},
            {"key": "s/c/fwd/f32/NCX", "vs_torch": 0.91, "lowering": "Polyphase (4 phases, stride 1: ConvTranspose)"},
            {"key": "s/d/fwd/f32/NCX", "vs_torch": None, "lowering": "ConvTranspose"}]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": rows}))
    slow = tool._bench_rows(str(path), 0.95)
    assert [r["key"] for r in slow] == ["s/b/fwd/f32/NCX", "s/c/fwd/f32/NCX"]  # slowest first
    assert [tool._tuned_name(r["lowering"]) for r in slow] == ["MatMul (tiles)", None]


def test_each_primitive_keeps_its_median_time_over_the_calls():
    tool = _tool()
    one = OURS.split("\n")[2:4]  # a reorder, then a deconvolution
    calls = [ln.rsplit(",", 1)[0] + f",{ms}" for pair in ((1.0, 5.0), (9.0, 2.0), (2.0, 3.0)) for ln, ms in zip(one, pair)]
    k = tool._kernels("\n".join(calls), 3)
    assert [(kind, ms) for kind, _, _, ms in k.lines] == [("reorder", 2.0), ("deconvolution", 3.0)]
    # calls that ran different primitives: the last call's lines as they are
    assert [ms for *_, ms in tool._kernels("\n".join(calls[:3] + [OURS.split("\n")[6]]), 2).lines] == [9.0, 0.3]
