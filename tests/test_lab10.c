/* tests/test_lab10.c - lab10 (M010: why the model-parallel RNG tracker is necessary), launched
   as a program under mpirun (never Criterion under mpirun).

   The facts of fixed-nonce runs are checked against expectations computed here from the
   definitions, not by the library: Megatron's seeds (seed', seed' + 2718 + tp_rank), which
   regions are replicated or sharded over TP with SP off and on and so which mask pairs must be
   equal, what each rule's single stream gives (one stream alike on every rank: all equal; a
   stream per rank: all different), the offsets of a forward (the embedding's and two hidden
   draws per layer of N x H, one attention draw per layer of B x heads/TP x S x S), and for each
   recompute variant the groups, the layers whose gradients a replay without the snapshot
   corrupts, and where the streams end with and without each restore step. Also: worlds the
   lab cannot use, the fault hooks missing from ordinary library builds, the empty sheet's
   score, the reference answers' scores, predictions written after the first run, and sheets of
   misconceptions and negated truths that must earn nothing. */
#include <criterion/criterion.h>

#include <limits.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define RUN_LIMIT_S 120.0

/* the lab's model, as its template states it */
#define LAYERS 4
#define HIDDEN 16
#define HEADS 4
#define SEQ 8
#define MBS 2
#define SEED 1234
#define N_HIDDEN (SEQ * MBS * HIDDEN)                 /* one hidden-dropout draw */
#define N_ATTN(tp) (MBS * (HEADS / (tp)) * SEQ * SEQ) /* one attention draw per rank */

LS_LAB_SUITE(lab10, OUT_CAP, 300);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* Runs ./lab10 on np ranks with the sheet and results in the temp dir. */
static int run_lab(int np, const char *sheet, const char *extra, cJSON **doc) {
    char cmd[1024], res[256];
    snprintf(res, sizeof res, "%s/results/lab10.json", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab10 --answers '%s' --results '%s' %s", sheet, res,
             extra ? extra : "");
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    if (doc != NULL) *doc = mc_test_json_load(res);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   expectations from the definitions */

static const char *const sites[4] = {"embedding", "attention_probs", "attention_out", "mlp_out"};

/* Replicated over TP: the hidden activation without SP (embedding output and the two hidden
   dropouts); sharded: the attention heads always, everything under SP. */
static int sharded(int sp, int site) { return site == 1 || sp; }

static void expect_table(const cJSON *doc, int sp, const char *rule) {
    for (int s = 0; s < 4; s++) {
        char key[128];
        snprintf(key, sizeof key, "facts.masks.%s.%s.%s", sp ? "sp_on" : "sp_off", rule, sites[s]);
        const char *want = strcmp(rule, "one_seed") == 0        ? "equal"      /* one stream */
                           : strcmp(rule, "per_rank_seed") == 0 ? "different"  /* rank's own */
                           : sharded(sp, s)                     ? "different"
                                                                : "equal";
        cr_expect_str_eq(ls_gets(doc, key), want, "%s", key);
    }
}

/* The recompute groups of a variant: block n -> {0}..{n-1}; uniform n -> runs of n. */
typedef struct groups {
    int n, first[LAYERS], count[LAYERS];
} groups;

static groups variant_groups(int block, int n) {
    groups g = {0};
    for (int l = 0; l < LAYERS && (!block || l < n); l += block ? 1 : n) {
        g.first[g.n] = l;
        g.count[g.n++] = block ? 1 : (l + n <= LAYERS ? n : LAYERS - l);
    }
    return g;
}

/* Recompute facts for the variant (groups g) against the offsets the draws imply. */
static void expect_recompute(const cJSON *doc, groups g, int tp) {
    const int h = N_HIDDEN, a = N_ATTN(tp);
    const int def_end = (1 + 2 * LAYERS) * h, mp_end = LAYERS * a;
    int replayed = 0;
    for (int k = 0; k < g.n; k++) replayed += g.count[k];
    const int top_first = g.first[g.n - 1], top_end = top_first + g.count[g.n - 1];
    const int low_end = g.first[0] + g.count[0];
    cr_expect_eq(ls_getd(doc, "facts.recompute.default_offset_per_iteration"), def_end);
    cr_expect_eq(ls_getd(doc, "facts.recompute.model_parallel_offset_per_iteration"), mp_end);
    const cJSON *grp = ls_get(doc, "facts.recompute.groups");
    cr_assert_eq(cJSON_GetArraySize(grp), g.n);
    for (int k = 0; k < g.n; k++) {
        const cJSON *one = cJSON_GetArrayItem(grp, k);
        cr_expect_eq(cJSON_GetArraySize(one), g.count[k]);
        cr_expect_eq(cJSON_GetArrayItem(one, 0)->valueint, g.first[k]);
    }
    /* the loss never changes: recompute only changes backward */
    static const char *const modes[5] = {"none", "restore_both", "no_restore", "snapshot_only",
                                         "outer_only"};
    for (int m = 0; m < 5; m++) {
        char key[128];
        snprintf(key, sizeof key, "facts.recompute.modes.%s.loss_equal_reference", modes[m]);
        cr_expect(ls_getb(doc, key), "%s", key);
    }
    /* gradients: exact exactly when the snapshot is restored */
    cr_expect(ls_getb(doc, "facts.recompute.grad_error_zero.restore_both"));
    cr_expect(ls_getb(doc, "facts.recompute.grad_error_zero.snapshot_only"));
    cr_expect_not(ls_getb(doc, "facts.recompute.grad_error_zero.no_restore"));
    cr_expect_not(ls_getb(doc, "facts.recompute.grad_error_zero.outer_only"));
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.restore_both.grad_max_abs_error"), 0.0);
    cr_expect_gt(ls_getd(doc, "facts.recompute.modes.no_restore.grad_max_abs_error"), 1e-3);
    cr_expect(ls_getb(doc, "facts.recompute.modes.restore_both.replay_masks_equal_forward"));
    cr_expect_not(ls_getb(doc, "facts.recompute.modes.no_restore.replay_masks_equal_forward"));
    /* the corrupted layers: the replayed ones and everything below the highest of them */
    const cJSON *wrong = ls_get(doc, "facts.recompute.modes.no_restore.wrong_grad_layers");
    cr_expect_eq(cJSON_GetArraySize(wrong), top_end, "wrong layers: %d, expected 0..%d",
                 cJSON_GetArraySize(wrong), top_end - 1);
    for (int l = 0; l < cJSON_GetArraySize(wrong); l++)
        cr_expect_eq(cJSON_GetArrayItem(wrong, l)->valueint, l);
    cr_expect(ls_getb(doc, "facts.recompute.modes.no_restore.embedding_grad_wrong"));
    cr_expect_eq(
        cJSON_GetArraySize(ls_get(doc, "facts.recompute.modes.snapshot_only.wrong_grad_layers")),
        0);
    /* where the streams end */
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.none.default_offset_after"), def_end);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.none.model_parallel_offset_after"), mp_end);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.restore_both.default_offset_shift"), 0);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.outer_only.default_offset_shift"), 0);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.no_restore.default_offset_shift"),
                 2 * replayed * h);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.no_restore.model_parallel_offset_shift"),
                 replayed * a);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.snapshot_only.default_offset_shift"),
                 (1 + 2 * low_end) * h - def_end);
    cr_expect_eq(ls_getd(doc, "facts.recompute.modes.snapshot_only.model_parallel_offset_shift"),
                 low_end * a - mp_end);
    cr_expect_str_eq(ls_gets(doc, "facts.recompute.later_randomness.restore_both"), "same");
    cr_expect_str_eq(ls_gets(doc, "facts.recompute.later_randomness.no_restore"), "shifted");
    cr_expect_str_eq(ls_gets(doc, "facts.recompute.later_randomness.snapshot_only"), "repeats");
    cr_expect_str_eq(ls_gets(doc, "facts.recompute.later_randomness.outer_only"), "same");
    /* the follow-up: the first replay (the highest group) and the shifts */
    cr_expect_eq(ls_getd(doc, "facts.followup.replay_offset_restored"), (1 + 2 * top_first) * h);
    cr_expect_eq(ls_getd(doc, "facts.followup.replay_offset_unrestored"), def_end);
    cr_expect_eq(ls_getd(doc, "facts.followup.shift_no_restore"), 2 * replayed * h);
    cr_expect_eq(ls_getd(doc, "facts.followup.shift_no_outer"), (1 + 2 * low_end) * h - def_end);
    cr_expect_not(ls_getb(doc, "facts.followup.loss_changes"));
    cr_expect_eq(cJSON_GetArraySize(ls_get(doc, "facts.followup.wrong_grad_layers")), top_end);
}

static void expect_masks_and_training(const cJSON *doc, int tp) {
    cr_expect_eq(ls_getd(doc, "facts.seeds.default_rng"), SEED);
    const cJSON *mp = ls_get(doc, "facts.seeds.model_parallel_rng");
    cr_assert_eq(cJSON_GetArraySize(mp), tp);
    for (int r = 0; r < tp; r++)
        cr_expect_eq(cJSON_GetArrayItem(mp, r)->valueint, SEED + 2718 + r, "rank %d", r);
    cr_expect_eq(ls_getd(doc, "facts.model.hidden_draw_elements"), N_HIDDEN);
    cr_expect_eq(ls_getd(doc, "facts.model.attention_draw_elements_per_rank"), N_ATTN(tp));
    for (int sp = 0; sp < 2; sp++) {
        expect_table(doc, sp, "tracker");
        expect_table(doc, sp, "one_seed");
        expect_table(doc, sp, "per_rank_seed");
    }
    /* statistics: independent masks agree with probability 1 - 2p(1-p); identical ones always */
    const double ind = 1.0 - 2.0 * 0.1 * 0.9;
    cr_expect_float_eq(ls_getd(doc, "facts.masks.independent_agreement"), ind, 1e-9);
    cr_expect_float_eq(ls_getd(doc, "facts.masks.sp_on.sharded_statistics.tracker.agreement"), ind,
                       0.08);
    cr_expect_float_eq(
        ls_getd(doc, "facts.masks.sp_off.sharded_statistics.single_rank_pieces.agreement"), ind,
        0.08);
    cr_expect_eq(ls_getd(doc, "facts.masks.sp_on.sharded_statistics.one_seed.agreement"), 1.0);
    cr_expect_float_eq(
        ls_getd(doc, "facts.masks.sp_on.sharded_statistics.one_seed.dropped_on_both"), 0.1, 0.03);
    cr_expect_eq(ls_getd(doc, "facts.masks.replicated_statistics_sp_off.tracker.agreement"), 1.0);
    cr_expect(ls_getb(doc, "facts.masks.replicated_equal_single_rank"));
    cr_expect_eq(ls_getd(doc, "facts.masks.sp_off.wrong_regions.one_seed"), 1);     /* the heads */
    cr_expect_eq(ls_getd(doc, "facts.masks.sp_off.wrong_regions.per_rank_seed"), 3); /* replicas */
    cr_expect_eq(ls_getd(doc, "facts.masks.sp_on.wrong_regions.one_seed"), 4);
    cr_expect_eq(ls_getd(doc, "facts.masks.sp_on.wrong_regions.per_rank_seed"), 0);
    /* B: with every dropout on a replicated activation only a seed per rank breaks the step */
    cr_expect(ls_getb(doc, "facts.training.matches_single_rank.tracker"));
    cr_expect(ls_getb(doc, "facts.training.matches_single_rank.one_seed"));
    cr_expect_not(ls_getb(doc, "facts.training.matches_single_rank.per_rank_seed"));
    cr_expect(ls_getb(doc, "facts.training.replicas_agree.tracker"));
    cr_expect_not(ls_getb(doc, "facts.training.replicas_agree.per_rank_seed"));
    cr_expect_lt(ls_getd(doc, "facts.training.tracker.loss_abs_diff"), 1e-5);
    cr_expect_gt(ls_getd(doc, "facts.training.per_rank_seed.loss_abs_diff"), 1e-4);
    cr_expect_eq(ls_getd(doc, "facts.training.tracker.replica_grad_spread"), 0.0);
}

/* D: the RNG file holds the streams where iteration 1 left them. */
static void expect_checkpoint(const cJSON *doc, int tp) {
    char want[96];
    const char *rng = ls_gets(doc, "facts.checkpoint.rng_file_tp0");
    snprintf(want, sizeof want, "current %d %d", SEED, (1 + 2 * LAYERS) * N_HIDDEN);
    cr_expect(mc_test_contains(rng, want), "RNG file lacks \"%s\":\n%s", want, rng);
    snprintf(want, sizeof want, "stream model-parallel-rng %d %d", SEED + 2718,
             LAYERS * N_ATTN(tp));
    cr_expect(mc_test_contains(rng, want), "RNG file lacks \"%s\":\n%s", want, rng);
    cr_expect(ls_getb(doc, "facts.checkpoint.resume_equal.rng_loaded"));
    cr_expect_not(ls_getb(doc, "facts.checkpoint.resume_equal.no_load_rng"));
    cr_expect(ls_getb(doc, "facts.checkpoint.rng_loaded.rng_restored"));
    cr_expect_eq(ls_getd(doc, "facts.checkpoint.rng_loaded.grad_max_abs_diff"), 0.0);
    cr_expect_gt(ls_getd(doc, "facts.checkpoint.no_load_rng.grad_max_abs_diff"), 1e-4);
    cr_expect_str_eq(ls_gets(doc, "facts.checkpoint.no_load_rng_masks"), "repeats");
}

/* ---------------------------------------------------------------------------------------------
   runs */

Test(lab10, default_run_measures_masks_training_recompute_and_checkpoints) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/answers/lab10.md", tmp_dir);   /* missing: written */
    cJSON *doc = NULL;
    double t0 = mc_test_now();
    int rc = run_lab(2, sheet, "--nonce 10a000", &doc);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "lab10 exited %d\n%s", rc, out);
    cr_assert_not_null(doc, "no results\n%s", out);
    cr_expect(secs < 60.0, "the default run took %.1f s", secs);
    cr_expect(mc_test_contains(out, "A. Dropout masks across the 2 TP ranks"), "%s", out);
    cr_expect(mc_test_contains(out, "== Summary =="), "%s", out);
    cr_expect(!mc_test_contains(out, "check failed"), "%s", out);
    cr_expect(ls_getb(doc, "run.all_checks_held"));
    expect_masks_and_training(doc, 2);
    /* nonce 10a000: F1, layer 0 checkpointed alone */
    cr_expect_str_eq(ls_gets(doc, "facts.followup.variant"), "F1");
    expect_recompute(doc, variant_groups(1, 1), 2);
    expect_checkpoint(doc, 2);
    /* the empty sheet the run wrote scores (almost) nothing and says what to do next */
    double total = ls_total_score(out);
    cr_expect(total >= 0.0 && total <= 0.5, "empty sheet scored %.2f\n%s", total, out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);
    cJSON_Delete(doc);
}

/* F2 (uniform 2: every layer replayed) and F3 (block 2: layers 0 and 1). */
Test(lab10, followup_variants_checkpoint_other_layers) {
    static const struct {
        const char *nonce, *variant;
        int block, n;
    } cases[] = {{"10a002", "F2", 0, 2}, {"10a001", "F3", 1, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sheet[256], extra[64];
        snprintf(sheet, sizeof sheet, "%s/%s.md", tmp_dir, cases[i].nonce);
        snprintf(extra, sizeof extra, "--nonce %s", cases[i].nonce);
        cJSON *doc = NULL;
        int rc = run_lab(2, sheet, extra, &doc);
        cr_assert_eq(rc, 0, "lab10 --nonce %s exited %d\n%s", cases[i].nonce, rc, out);
        cr_assert_not_null(doc);
        cr_expect_str_eq(ls_gets(doc, "facts.followup.variant"), cases[i].variant);
        expect_recompute(doc, variant_groups(cases[i].block, cases[i].n), 2);
        cJSON_Delete(doc);
    }
}

/* TP = 4 on 4 ranks: four model-parallel seeds, the same tables, attention draws of 128. */
Test(lab10, four_tp_ranks_give_four_seeds_and_the_same_rules) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/tp4.md", tmp_dir);
    cJSON *doc = NULL;
    int rc = run_lab(4, sheet, "--tp 4 --nonce 10a000", &doc);
    cr_assert_eq(rc, 0, "lab10 --tp 4 exited %d\n%s", rc, out);
    cr_assert_not_null(doc);
    expect_masks_and_training(doc, 4);
    expect_recompute(doc, variant_groups(1, 1), 4);
    expect_checkpoint(doc, 4);
    cJSON_Delete(doc);
}

/* ---------------------------------------------------------------------------------------------
   refusals */

Test(lab10, worlds_it_cannot_use_exit_2_with_the_rule) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/x.md", tmp_dir);
    int rc = run_lab(4, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 4 at tp 2 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs world == tp") && mc_test_contains(out, "dp=2"), "%s",
              out);
    rc = run_lab(1, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 1 exited %d\n%s", rc, out);
    rc = run_lab(3, sheet, "--tp 3", NULL);
    cr_expect_eq(rc, 2, "tp 3 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs tp = 2 or 4 (got tp=3)"), "%s", out);
    rc = run_lab(2, sheet, "--tp 1 --pp 2", NULL);
    cr_expect_eq(rc, 2, "pp 2 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs pp=cp=ep=1"), "%s", out);
}

/* The RNG fault hooks exist only in the library build lab10 links. */
Test(lab10, ordinary_library_builds_compile_the_rng_faults_out) {
    static const char *const hooks[] = {"mc_fault_dropout_stream", "mc_fault_recompute_rng"};
    for (int i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "nm build/mc_impl.o | grep -c %s", hooks[i]);
        int rc = mc_test_run(cmd, 30, out, OUT_CAP);
        cr_expect_neq(rc, 0, "the ordinary build exports %s:\n%s", hooks[i], out);
        snprintf(cmd, sizeof cmd, "nm build/mc_impl_faults.o | grep -c ' T %s'", hooks[i]);
        rc = mc_test_run(cmd, 30, out, OUT_CAP);
        cr_expect_eq(rc, 0, "build/mc_impl_faults.o lacks %s:\n%s", hooks[i], out);
    }
}

/* ---------------------------------------------------------------------------------------------
   grading */

static void expect_reference_scores(const char *ref) {
    char sheet[256], res[256];
    snprintf(sheet, sizeof sheet, "%s/ref.md", tmp_dir);
    snprintf(res, sizeof res, "%s/results", tmp_dir);
    mc_test_remove_dir(res);
    char *text = ls_read_file(ref);
    cr_assert_not_null(text, "missing %s", ref);
    ls_write_file(sheet, text);   /* the run reads the nonce from its header and locks its preds */
    free(text);
    int rc = run_lab(2, sheet, NULL, NULL);
    cr_assert_eq(rc, 0, "lab10 on %s exited %d\n%s", ref, rc, out);
    double total = ls_total_score(out);
    cr_expect_geq(total, 14.0, "%s scored %.2f/15\n%s", ref, total, out);
    cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions not locked\n%s", ref, out);
    cr_expect(mc_test_contains(out, "no misconception fired"), "%s\n%s", ref, out);
}

Test(lab10, reference_answers_score_at_least_14) {
    expect_reference_scores("answers/reference/lab10.md");
    expect_reference_scores("answers/reference/lab10.zh.md");
}

/* Predictions written after the first run for a nonce earn nothing. */
Test(lab10, predictions_filled_after_the_first_run_earn_nothing) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/late.md", tmp_dir);
    int rc = run_lab(2, sheet, "--nonce 10a000", NULL);   /* locks the empty preds */
    cr_assert_eq(rc, 0, "%s", out);
    char *ref = ls_read_file("answers/reference/lab10.md");
    cr_assert_not_null(ref);
    ls_write_file(sheet, ref);
    free(ref);
    rc = run_lab(2, sheet, "--nonce 10a000", NULL);
    cr_assert_eq(rc, 0, "%s", out);
    double total = ls_total_score(out);
    /* the 4.9 prediction points are lost; the prose and the evidence (10.1) still count */
    cr_expect(total > 5.0 && total <= 15.0 - 4.9 + 1e-9, "late predictions: %.2f/15\n%s", total,
              out);
    cr_expect(mc_test_contains(out, "not predicted before the first run"), "%s", out);
}

/* A sheet of misconceptions in the learner's words loses points, a sheet of negated truths and
   one of keyword lists earn none. */
static void write_sheet(const char *path, const char *const boxes[7]) {
    static const char *const heads[7] = {
        "### M1 What the tracker is for", "### M2 Randomness under TP and SP",
        "### M3 Recompute restores the RNG state", "### M4 Checkpoints and reproducibility",
        "### FU1 The function itself changes", "### FU2 When to save and when to restore",
        "### FU3 The outer RNG progress"};
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "# lab10 — M010\n<!-- nonce: 10a000 ; probe_rank: 1 ; followup: F1 -->\n\n"
               "## Main question\n\n");
    for (int i = 0; i < 7; i++) {
        if (i == 4) fprintf(f, "## Follow-up (M010-F1)\n\n");
        fprintf(f, "%s\n%s\n\n", heads[i], boxes[i]);
    }
    fclose(f);
}

Test(lab10, misconceptions_cost_points_negations_and_keyword_lists_earn_nothing) {
    static const char *const wrong[7] = {
        "A single seed is enough for all the dropouts, so no tracker is needed.",
        "With SP the hidden dropout masks are the same on every TP rank.",
        "Recompute automatically gives the same masks because it just reruns the same ops.",
        "A checkpoint only needs the weights and the optimizer state.",
        "The replay is harmless because the dropout is random anyway, nothing more to say.",
        "Nothing has to be saved at any point of the checkpointed region for dropout.",
        "The outer stream does not matter for the run at all, it can stay anywhere."};
    static const char *const negated[7] = {
        "It is not true that replicated regions need the same mask on every TP rank.",
        "The attention dropout does not draw from the model-parallel rng.",
        "Recompute does not save and restore the RNG states before the re-run.",
        "A checkpoint does not need to save the RNG states of the tracker.",
        "The dropout mask is not part of the function the layer computes.",
        "The RNG states need not be saved before the checkpointed forward.",
        "After the replay the outer progress is never restored by anyone."};
    static const char *const keywords[7] = {
        "tracker model-parallel-rng default generator replicated sharded same different mask",
        "attention dropout hidden dropout SP sequence parallel model-parallel-rng different",
        "recompute save restore RNG states snapshot same masks exact gradients",
        "checkpoint save RNG states tracker resume reproduce no-load-rng repeat",
        "dropout mask function different function gradient original mask A mask B",
        "save before forward restore recompute snapshot RNG states backward",
        "restore outer progress later dropouts repeat shift stream"};
    const char *const *sheets[3] = {wrong, negated, keywords};
    const char *names[3] = {"wrong", "negated", "keywords"};
    for (int k = 0; k < 3; k++) {
        char sheet[256], res[256], cmd[768];
        snprintf(sheet, sizeof sheet, "%s/%s.md", tmp_dir, names[k]);
        write_sheet(sheet, sheets[k]);
        /* grade against the results of one run for this nonce */
        snprintf(res, sizeof res, "%s/results/lab10.json", tmp_dir);
        if (access(res, R_OK) != 0) {
            int rc = run_lab(2, sheet, NULL, NULL);
            cr_assert_eq(rc, 0, "%s", out);
        }
        snprintf(cmd, sizeof cmd, "./lab10 --grade-only --answers '%s' --results '%s'", sheet, res);
        int rc = mc_test_run(cmd, 60, out, OUT_CAP);
        cr_assert_eq(rc, 0, "grading %s exited %d\n%s", names[k], rc, out);
        double total = ls_total_score(out);
        cr_expect(total >= 0.0 && total <= 0.5, "%s sheet scored %.2f\n%s", names[k], total, out);
        if (k == 0) {
            static const char *const fire[] = {"MC1 ", "MC2 ", "MC3 ", "MC7 "};
            for (int i = 0; i < 4; i++)
                cr_expect(mc_test_contains(out, fire[i]), "%s did not fire\n%s", fire[i], out);
            cr_expect(mc_test_contains(out, "penalties -1.50"), "%s", out);
        } else {
            cr_expect(mc_test_contains(out, "no misconception fired"), "%s\n%s", names[k], out);
        }
    }
}
