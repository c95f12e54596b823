#!/bin/sh
# Regenerate every shipped rules table (python/onednn_convt/lowering/tables/) from the tuning
# runs kept in benchmarks/results/, with the provenance each was measured with. Run from the
# repository root after adding a CPU's runs here (and a line for them below).
set -eu
MAKE="python benchmarks/make_rules.py"
R=benchmarks/results

SPR="Intel Sapphire Rapids (Intel Xeon, family 6 model 143)"
$MAKE $R/sapphirerapids/tune_avx512_core_amx.json $R/sapphirerapids/tune_tiny_avx512_core_amx.json \
    --cpu sapphirerapids --cpu-name "$SPR" --date 2026-11-25 \
    --note "the models suite (--skip-slow) and the tiny suite, measured by an earlier session (before the polyphase lowering and the broad suite)"
for isa in avx2 avx512_core avx512_core_bf16 avx512_core_fp16; do
    cap=$(echo $isa | tr a-z A-Z)
    $MAKE $R/sapphirerapids/tune_$isa.json $R/sapphirerapids/tune_tiny_$isa.json \
        --cpu sapphirerapids --cpu-name "$SPR" --date 2026-11-25 --capped \
        --note "measured under ONEDNN_MAX_CPU_ISA=$cap: for that cap on this CPU only (a cap changes the instructions, not the machine)"
done

# Zen4: measured on a real Zen4 (the earlier table came from the shared measurements of another
# machine, tune_*_shared.json, kept for the record): the models suite (--skip-slow), both broad
# halves and the tiny suite, each tuned three times in three passes (tune_S, tune_S_again,
# tune_S_third), a process each; each candidate keeps its middle time of the three (--repeats),
# so that one pass's stall decides nothing. The two layers added to the fit half after the first
# pass (espnet-up2, grouped8-up) were tuned in the third pass and twice on their own
# (tune_broad_fit_added*); the three DCGAN layers at the training step's batch 16 (dcgan-*-b16)
# were added later, tuned three times on their own (tune_broad_fit_b16*). The holdout half was kept out while the rules fitted without it
# were checked on it (benchmarks/NOTES.md). On 2026-11-30 layers were tuned again, three times,
# after candidates were added (--remeasured): the grouped layers (Per group), the 2-D k16 s8
# layers (64-phase Polyphase), and the layers whose taps tile the output (MatMul (tiles) for
# BackwardData and BackwardWeights; then their NCX forwards, once the tiles MatMul's read src as
# stored: tune_tilesfwd_*; then the 2-D layers with at most 8 output channels, forward, once
# MatMul (columns) was a candidate: tune_columns_*; then the same six layers' BackwardData and
# BackwardWeights: tune_fewbwd_*; and StarGAN's up-sampler forward: tune_stargan_*; then the bf16
# NXC BackwardData of the layers with at most 8 output channels and a stride, once Space-to-depth
# was a candidate: tune_s2d_*, merged with the tune_fewbwd_* passes of the same six; then, on
# 2026-12-01, the NCX BackwardWeights of the nine such layers with diff_dst at least 4x src, once
# the tiles MatMul computed their IOX weights by rows: tune_tilesrows_*, --supersede, since their
# tune_tiles_* records timed the tiles MatMul's old form; then the forwards of the six layers
# with at most 8 output channels, once MatMul (columns) read NXC src through a transposed view
# and permuted by oneDNN: tune_colnxc_*, superseding tune_columns_*). Their new
# records choose for calls, the records they replace for polyphase phases: a re-tune moves no
# phase (make_rules.py).
Z4=$R/zen4
# FLAG, then each name's three re-tune passes (tune_NAME_remeasured, _again, _third), pass by pass
passes() {
    flag=$1; shift
    for pass in "" _again _third; do
        for name in "$@"; do
            printf ' %s %s' "$flag" "$Z4/tune_${name}_remeasured$pass.json"
        done
    done
}
$MAKE --repeats $Z4/tune_models.json $Z4/tune_models_again.json $Z4/tune_models_third.json \
    $Z4/tune_broad_fit.json $Z4/tune_broad_fit_again.json $Z4/tune_broad_fit_third.json \
    $Z4/tune_broad_fit_added.json $Z4/tune_broad_fit_added_again.json \
    $Z4/tune_broad_holdout.json $Z4/tune_broad_holdout_again.json $Z4/tune_broad_holdout_third.json \
    $Z4/tune_tiny.json $Z4/tune_tiny_again.json $Z4/tune_tiny_third.json \
    $Z4/tune_broad_fit_b16.json $Z4/tune_broad_fit_b16_again.json $Z4/tune_broad_fit_b16_third.json \
    $(passes --remeasured fit_newcands) $(passes --remeasured grouped32) $(passes --remeasured grouped8) \
    $(passes --remeasured holdout_newcands) $(passes --remeasured tiles_models tiles_fit tiles_holdout) \
    $(passes --remeasured tilesfwd_models tilesfwd_fit tilesfwd_holdout) \
    $(passes --remeasured columns_fit columns_holdout) $(passes --remeasured fewbwd_fit fewbwd_holdout) \
    $(passes --remeasured stargan_holdout) $(passes --remeasured s2d_fit s2d_holdout) \
    $(passes --supersede tilesrows_models tilesrows_fit tilesrows_holdout) \
    $(passes --supersede colnxc_fit colnxc_holdout) \
    --date 2026-11-27 \
    --note "the models suite (--skip-slow), both halves of the broad suite and the tiny suite, every dtype (f16 emulated here), on this machine, each configuration tuned three times (each candidate's middle time); the holdout half was added after the rules fitted without it had been checked on it, and DCGAN's batch-16 layers of the training step (dcgan-*-b16) later the same day; tuned again three times on 2026-11-30 (tune_*_remeasured*.json) after candidates were added: the grouped layers (grouped8-up, grouped32-up, stylegan2-up8, stylegan2-up16: Per group; a Polyphase chosen by a 6% margin on grouped32-up ran 1.3-1.7x slower than ConvTranspose) and the 2-D k16 s8 layers (centernet-ida8, fcn-up8: 64-phase Polyphase); tuned again three times on 2026-11-30 (tune_tiles_*_remeasured*.json) after MatMul (tiles) became a BackwardWeights candidate and its BackwardData wrote diff_src itself: the layers whose taps tile the output (stride = kernel), BackwardData and BackwardWeights; their NCX forwards tuned again three times on 2026-11-30 (tune_tilesfwd_*_remeasured*.json) once the tiles forward read src as stored; the forwards of the 2-D layers with at most 8 output channels (dcgan-g5, dcgan-g5-b16, pix2pix-out, fsrcnn-x2, fsrcnn-x3, lapsrn-img) tuned again three times on 2026-11-30 (tune_columns_*_remeasured*.json) once MatMul (columns) was a candidate; the BackwardData and BackwardWeights of the same six layers tuned again three times on 2026-11-30 (tune_fewbwd_*_remeasured*.json), after the held-out bench ran FSRCNN x3's f32 NXC BackwardData as ConvTransposeBackwardData at 2.1x Convolution's time (its three first passes had disagreed: 1.29x, 0.96x, 1.39x); StarGAN's up-sampler forward tuned again three times on 2026-11-30 (tune_stargan_*), after the bench ran its f32 NXC forward as a Polyphase its passes had chosen by 0.8%, at 0.79-0.86 of PyTorch's speed; the bf16 NXC BackwardData of the strided layers with at most 8 output channels (the six above, convtasnet-dec, wavegan-up5) tuned again three times on 2026-11-30 (tune_s2d_*) once Space-to-depth was a candidate, each candidate's middle time over these and the tune_fewbwd_* passes; the NCX BackwardWeights of the nine layers whose taps tile the output with diff_dst at least four times src's elements (conv3d, espnet-up2, unet3d-up, nnunet-up4, maskrcnn-mask, dssd-deconv, erfnet-out, vnet-up2, nnunet-up1) tuned again three times on 2026-12-01 (tune_tilesrows_*, superseding their tune_tiles_* records, which timed the tiles MatMul before it computed those IOX weights by rows); the forwards of the six layers with at most 8 output channels tuned again three times on 2026-12-01 (tune_colnxc_*, superseding their tune_columns_* records, which timed MatMul (columns) before NXC src was read through a transposed view and the sum's permutes ran as oneDNN Reorders); the records those re-tunes replaced choose polyphase phases alone (\"calls\": false), the re-tuned ones calls alone: a re-tune moves no phase"

# Zen5: the broad suite's holdout half was kept out while the rules were checked on it (benchmarks/NOTES.md);
# the shipped table has every layer measured here. Every configuration was tuned twice: the
# full runs, the *_ncx runs minutes before them and the *_nxc and tiny_again runs an hour
# after; each candidate keeps its higher time of the two (--repeats: a choice must hold in both).
# The bf16 forward and BackwardWeights configurations were tuned again, twice, once a polyphase
# call checked its dst for Inf/NaN once rather than per phase (up to 10x faster in bf16): those
# runs (*_bf16poly*) replace the earlier records of the same configurations (--remeasured), for
# polyphase phases too (--retuned-phases: the table was made so, and its figures measured so).
Z=$R/zen5
$MAKE --repeats $Z/tune_models.json $Z/tune_models_ncx.json $Z/tune_models_nxc.json \
    $Z/tune_broad_fit.json $Z/tune_broad_fit_ncx.json $Z/tune_broad_fit_nxc.json \
    $Z/tune_broad_holdout.json $Z/tune_broad_holdout_ncx.json $Z/tune_broad_holdout_nxc.json \
    $Z/tune_tiny.json $Z/tune_tiny_again.json \
    --remeasured $Z/tune_models_bf16poly.json --remeasured $Z/tune_models_bf16poly_again.json \
    --remeasured $Z/tune_broad_fit_bf16poly.json --remeasured $Z/tune_broad_fit_bf16poly_again.json \
    --remeasured $Z/tune_broad_holdout_bf16poly.json --remeasured $Z/tune_broad_holdout_bf16poly_again.json \
    --retuned-phases --date 2026-11-26 \
    --note "the models suite (--skip-slow), both halves of the broad suite and the tiny suite, f32 and bf16 (f16 on the tiny suite only: emulated here), on this machine with the polyphase and channels-last lowerings, each configuration tuned twice (each candidate's higher time; bf16 forward and BackwardWeights tuned again, twice, after a polyphase speed-up); the holdout half was added after the rules fitted without it had been checked on it"

# Zen3: an AVX2-only CPU (no AVX-512, no VNNI; bf16 and f16 computed in f32), measured on a
# real Zen3 once per suite (the models suite twice: tune_models_again), f32 and bf16 on the
# broad halves, every dtype on the models and tiny suites. The holdout half was kept out while
# the rules fitted without it were checked on it (benchmarks/NOTES.md). Its re-tunes below choose
# polyphase phases too (--retuned-phases: the table was made so, and its figures measured so).
Z3=$R/zen3
# The bf16 (broad halves) and bf16/f16 (models) configurations were tuned again, once, when the
# polyphase lowering computed in f32 became a candidate ("Polyphase in f32"): those runs
# (*_f32poly) replace the earlier records of the same configurations (--remeasured). So do the
# runs of the two layers of 64 phases (k16 s8: centernet-ida8, fcn-up8), tuned twice, f32 and
# bf16, when the polyphase lowering took up to 64 phases (*_phases64*; each candidate keeps the
# higher of its two times). The 120 random layers of benchmarks/random_layers.py, seeds 1-3
# (tune_random_sS, _again, _third: three passes, each candidate's middle time), choose for
# calls but not for polyphase phases ("phases": false); seed 4 stays out, held out. Seeds 5
# and 6 (80 more layers, drawn and tuned the same way, per group a candidate from the start)
# were added later, and 40 grouped and depthwise layers of seed 9 (random_layers.py draw --seed 9
# --kinds grouped,depthwise), the kinds behind most of seed 4's rows below 0.80. The grouped
# layers (2-8 groups) of seeds 1-3 and of the broad suite were tuned again, f32, three passes,
# once the per-group lowering became a candidate (*_grouped*): those runs replace their earlier
# records (--remeasured; each candidate's middle time). The bf16 configurations of the four
# suite layers whose f32 copies pass 64 MiB (hifigan, centernet-ida8, centernet-ida4,
# wavegan-up5) were tuned again, twice, once an emulated call's large staging memory stopped
# taking fresh pages on every call (*_bf16staging*): the library ops had been timed with that
# tax (CenterNet's BackwardData NCX 39 ms, against 18-21 without it). HiFi-GAN's runs
# (tune_models_bf16staging*) stay out: its two changed choices ran 0.84-1.04x the old ones,
# old against new alternated (the tax is a tenth of its 300 ms calls). The NCX forwards of the
# random seeds' 1-D dense layers (benchmarks/random_layers_1d_dense.json, f32, three times)
# were tuned again once the MatMul lowering read a long NCX src as stored
# (tune_random_1d_ncxmatmul*): its times there had included a oneDNN reorder of src. The
# suites' 1-D layers were tuned again too (f32 and bf16, twice): the MatMul won no new
# configuration there, and the 12 choices that moved between near-equal candidates ran 1.01x
# the old ones (0.88-1.19x), old against new alternated; those runs stay out.
# The small random layers (random_layers.py draw --small, seeds 20, 21 and 23: 0.1-5 M
# multiply-adds, batch 1-16, at most 128 channels; *_small_t*) fill the corner the other runs
# left empty: calls of tens to hundreds of microseconds, where each op's fixed costs decide.
# The table's nearest layers there had been large ones, whose polyphase and MatMul choices ran
# up to 270x slower than the library op on small ones (benchmarks/NOTES.md); seed 22 held out.
$MAKE --repeats $Z3/tune_models.json $Z3/tune_models_again.json $Z3/tune_tiny.json \
    $Z3/tune_broad_fit.json $Z3/tune_broad_holdout.json \
    $Z3/tune_random_s1.json $Z3/tune_random_s1_again.json $Z3/tune_random_s1_third.json \
    $Z3/tune_random_s2.json $Z3/tune_random_s2_again.json $Z3/tune_random_s2_third.json \
    $Z3/tune_random_s3.json $Z3/tune_random_s3_again.json $Z3/tune_random_s3_third.json \
    $Z3/tune_random_s5.json $Z3/tune_random_s5_again.json $Z3/tune_random_s5_third.json \
    $Z3/tune_random_s6.json $Z3/tune_random_s6_again.json $Z3/tune_random_s6_third.json \
    $Z3/tune_random_s9_grouped.json $Z3/tune_random_s9_grouped_again.json $Z3/tune_random_s9_grouped_third.json \
    $Z3/tune_small_t20.json $Z3/tune_small_t20_again.json $Z3/tune_small_t20_third.json \
    $Z3/tune_small_t21.json $Z3/tune_small_t21_again.json $Z3/tune_small_t21_third.json \
    $Z3/tune_small_t23.json $Z3/tune_small_t23_again.json $Z3/tune_small_t23_third.json \
    --remeasured $Z3/tune_models_f32poly.json --remeasured $Z3/tune_broad_fit_f32poly.json \
    --remeasured $Z3/tune_broad_holdout_f32poly.json \
    --remeasured $Z3/tune_broad_fit_phases64.json --remeasured $Z3/tune_broad_fit_phases64_again.json \
    --remeasured $Z3/tune_broad_holdout_phases64.json --remeasured $Z3/tune_broad_holdout_phases64_again.json \
    --remeasured $Z3/tune_random_grouped.json --remeasured $Z3/tune_random_grouped_again.json \
    --remeasured $Z3/tune_random_grouped_third.json \
    --remeasured $Z3/tune_broad_fit_grouped.json --remeasured $Z3/tune_broad_fit_grouped_again.json \
    --remeasured $Z3/tune_broad_fit_grouped_third.json \
    --remeasured $Z3/tune_broad_holdout_grouped.json --remeasured $Z3/tune_broad_holdout_grouped_again.json \
    --remeasured $Z3/tune_broad_holdout_grouped_third.json \
    --remeasured $Z3/tune_broad_fit_bf16staging.json --remeasured $Z3/tune_broad_fit_bf16staging_again.json \
    --remeasured $Z3/tune_broad_holdout_bf16staging.json --remeasured $Z3/tune_broad_holdout_bf16staging_again.json \
    --remeasured $Z3/tune_random_1d_ncxmatmul.json --remeasured $Z3/tune_random_1d_ncxmatmul_again.json \
    --remeasured $Z3/tune_random_1d_ncxmatmul_third.json \
    --retuned-phases --date 2026-11-29 \
    --note "the models suite (--skip-slow, tuned twice: each candidate's higher time), both halves of the broad suite (f32 and bf16) and the tiny suite, once each, on this machine (avx2: bf16 and f16 computed in f32); bf16 and f16 tuned again, once, with the polyphase lowering computed in f32; the two k16 s8 layers tuned again, twice, with up to 64 polyphase phases; the holdout half was added after the rules fitted without it had been checked on it; and 240 random layers (benchmarks/random_layers.py seeds 1-3, 5 and 6, and the grouped and depthwise layers of seed 9; f32, tuned three times each: each candidate's middle time; seed 4 held out), which choose for problems but not for polyphase phases; the grouped layers (2-8 groups) tuned again, three times, f32, with the per-group lowering; the bf16 configurations of the broad suite's three layers whose f32 copies pass 64 MiB tuned again, twice, once their staging memory was kept; the NCX forwards of the random 1-D dense layers tuned again, three times, once the MatMul lowering read a long NCX src as stored; and 90 small random layers (benchmarks/random_layers.py --small, seeds 20, 21 and 23: 0.1-5 M multiply-adds, calls of tens to hundreds of microseconds; f32 and bf16, tuned three times each: each candidate's middle time; seed 22 held out), which choose for problems but not for polyphase phases"

$MAKE --default --date 2026-11-30
