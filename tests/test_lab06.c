/* tests/test_lab06.c - lab06 (M006: what ModuleSpec solves), launched as a program under mpirun
   (mc_test_mpirun), never with Criterion under mpirun.

   The facts of a fixed-nonce run are checked against expectations computed here:
     - the model's parameter tensors from its registration rule: word and position embedding,
       12 per layer, the final norm's two, the untied output layer;
     - the module's forward calls from the schedule: one per layer and micro-batch, twice that
       when full recompute replays every layer;
     - which cells each broken copy must fail, from what its mistake can reach (below), and
       the size of the errors against the lab's tolerance;
     - renamed_param's missing keys: linear_qkv's weight and bias in every layer;
     - the follow-up variant and probe rank from the nonce's FNV-1a hash.
   Then: the worlds it refuses, the sheet --init writes, grading against the run frozen in
   tests/fixtures/lab06/results.json (the empty sheet, misconceptions, negated truths, keyword
   lists, prompt copies), the reference answers on live runs (>= 14, locked, no
   misconception), the rubric's weights against the seed's, and an edit of
   labs/lab06_attention.c that the matrix must catch in the right cell. */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "labs/grader.h"
#include "labs/lab_common.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define RUN_LIMIT_S 180.0
#define NONCE "006002"       /* the English reference's run: F2 (global_heads), probe rank 1 */
#define LAYERS 4
#define MICROBATCHES 4
#define TOLERANCE 1e-4       /* the lab's relative tolerance for loss and gradients */

LS_LAB_SUITE(lab06, OUT_CAP, 300);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* Runs `binary` on np ranks with the sheet; the results go to tmp_dir/<tag>.json. */
static int run_lab(const char *binary, int np, const char *sheet, const char *extra,
                   const char *tag, char *res, size_t cap) {
    char cmd[1024];
    snprintf(res, cap, "%s/%s.json", tmp_dir, tag);
    snprintf(cmd, sizeof cmd, "%s --answers '%s' --results '%s' %s", binary, sheet, res,
             extra ? extra : "");
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    cr_log_info("%s -np %d %s took %.1f s", binary, np, extra ? extra : "", mc_test_now() - t0);
    return rc;
}

static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 16777619u;
    }
    return h;
}

/* ---------------------------------------------------------------------------------------------
   expectations computed here */

static const char *const cells[] = {"tp1", "tp2", "rng", "pp2", "ckpt", "fallback"};
#define N_CELLS 6

/* Which cells a module must fail (1) or pass (0), from what its mistake can reach:
     no_causal_mask  computes another function: every cell that compares numbers with the
                     local attention (tp1, tp2, pp2) fails; rng compares the module with itself,
                     ckpt its keys and values, fallback runs the local attention;
     global_heads    at TP=1 the model's heads are the rank's heads: only tp2 splits them;
     default_rng     only rng runs dropout and reads the streams;
     shared_cache    only 1F1B (pp2, stage 0) keeps two micro-batches in flight: without
                     pipelining every backward follows its own forward, and full recompute
                     replays the forward right before its backward;
     renamed_param   computes what builtin computes under other keys: only ckpt.
   local, builtin and yours (as shipped) pass every cell. */
static const struct {
    const char *module;
    int fails[N_CELLS];
    const char *first;
} rows[] = {
    {"local", {0, 0, 0, 0, 0, 0}, "none"},
    {"builtin", {0, 0, 0, 0, 0, 0}, "none"},
    {"yours", {0, 0, 0, 0, 0, 0}, "none"},
    {"no_causal_mask", {1, 1, 0, 1, 0, 0}, "tp1"},
    {"global_heads", {0, 1, 0, 0, 0, 0}, "tp2"},
    {"default_rng", {0, 0, 1, 0, 0, 0}, "rng"},
    {"shared_cache", {0, 0, 0, 1, 0, 0}, "pp2"},
    {"renamed_param", {0, 0, 0, 0, 1, 0}, "ckpt"},
};
#define N_ROWS (int)(sizeof rows / sizeof rows[0])

static void expect_matrix(const cJSON *doc) {
    char key[160];
    for (int r = 0; r < N_ROWS; r++) {
        for (int k = 0; k < N_CELLS; k++) {
            snprintf(key, sizeof key, "facts.rows.%s.cells.%s", rows[r].module, cells[k]);
            const char *want = rows[r].fails[k] ? "fail" : "pass";
            cr_expect_str_eq(ls_gets(doc, key), want, "%s: %s, want %s", key, ls_gets(doc, key),
                             want);
            /* the numeric cells' errors: within the tolerance, or far outside it */
            if (k == 0 || k == 1 || k == 3) {
                snprintf(key, sizeof key, "facts.rows.%s.detail.%s.grad_rel_err", rows[r].module,
                         cells[k]);
                double e = ls_getd(doc, key);
                if (rows[r].fails[k])
                    cr_expect_gt(e, 100 * TOLERANCE, "%s = %g: a mistake, not rounding", key, e);
                else
                    cr_expect_leq(e, TOLERANCE, "%s = %g", key, e);
            }
        }
        snprintf(key, sizeof key, "facts.rows.%s.first_failure", rows[r].module);
        cr_expect_str_eq(ls_gets(doc, key), rows[r].first, "%s", key);
        if (r >= 3) {
            snprintf(key, sizeof key, "facts.catches.%s", rows[r].module);
            cr_expect_str_eq(ls_gets(doc, key), rows[r].first, "%s", key);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
   the experiment */

Test(lab06, fixed_nonce_run_against_expectations) {
    char sheet[256], res[256];
    snprintf(sheet, sizeof sheet, "%s/sheet.md", tmp_dir);
    int rc = run_lab("./lab06", 2, sheet, "--nonce " NONCE, "run", res, sizeof res);
    cr_assert_eq(rc, 0, "lab06 exited %d:\n%s", rc, out);
    cJSON *doc = ls_load_json(res);

    /* A: one model, the parameter table the model registers (not the module) */
    int tensors = 2 + 12 * LAYERS + 2 + 1;
    cr_expect_eq((int)ls_getd(doc, "facts.spec.parameter_tensors"), tensors);
    cr_expect(ls_truth(doc, "facts.spec.param_table_identical"));
    double local = ls_getd(doc, "facts.spec.activation_bytes.local");
    double builtin = ls_getd(doc, "facts.spec.activation_bytes.builtin");
    double yours = ls_getd(doc, "facts.spec.activation_bytes.yours");
    /* builtin keeps [B, NHl, S] log-sum-exps instead of [B, NHl, S, S] probabilities; yours keeps
       the probabilities as the local attention does, plus its draw and scratch */
    cr_expect_lt(builtin, local, "builtin %g vs local %g bytes", builtin, local);
    cr_expect_geq(yours, local, "yours %g vs local %g bytes", yours, local);
    cr_expect_str_eq(ls_gets(doc, "facts.spec.builtin_cache_vs_local"), "smaller");

    /* the model calls the module once per layer and micro-batch, twice under full recompute */
    cr_expect_eq((int)ls_getd(doc, "facts.spec.attention_calls_per_step"), LAYERS * MICROBATCHES);
    cr_expect_eq((int)ls_getd(doc, "facts.spec.attention_calls_with_recompute"),
                 2 * LAYERS * MICROBATCHES);

    /* the refused shape: 4 heads of 9 */
    cr_expect_str_eq(ls_gets(doc, "facts.spec.fallback_runs"), "local");
    cr_expect(ls_truth(doc, "facts.spec.fallback_identical"));
    cr_expect_eq((int)ls_getd(doc, "facts.spec.fallback_module_calls"), 0);
    cr_expect(mc_test_contains(ls_gets(doc, "facts.spec.fallback_reason"), "head_dim 9"), "%s",
              ls_gets(doc, "facts.spec.fallback_reason"));
    cr_expect_str_eq(ls_gets(doc, "facts.rows.yours.fallback_runs"), "module",
                     "yours accepts head_dim 9 and must match the local model there");

    /* B: the matrix */
    expect_matrix(doc);
    cr_expect_str_eq(ls_gets(doc, "facts.rows.local.dropout_streams"), "model-parallel-rng");
    cr_expect_str_eq(ls_gets(doc, "facts.rows.builtin.dropout_streams"), "model-parallel-rng");
    cr_expect_str_eq(ls_gets(doc, "facts.rows.default_rng.dropout_streams"), "default-rng");
    cr_expect(ls_truth(doc, "facts.rows.default_rng.recompute_bit_identical"),
              "the default generator is in the recompute snapshot too");
    cr_expect(!ls_truth(doc, "facts.keys_unchanged.renamed_param"));
    cr_expect(ls_truth(doc, "facts.keys_unchanged.builtin"));
    cr_expect_eq((int)ls_getd(doc, "facts.rows.renamed_param.keys_missing"), 2 * LAYERS);
    cr_expect_str_eq(ls_gets(doc, "facts.rows.renamed_param.first_missing_key"),
                     "decoder.layers.0.self_attention.linear_qkv.weight");
    cr_expect_str_eq(ls_gets(doc, "facts.rows.renamed_param.first_new_key"),
                     "decoder.layers.0.self_attention.query_key_value.weight");
    cr_expect_str_eq(ls_gets(doc, "facts.renamed_load"), "error");
    cr_expect(
        mc_test_contains(ls_gets(doc, "facts.renamed_load_message"), "query_key_value.weight"),
        "%s", ls_gets(doc, "facts.renamed_load_message"));

    /* C: timing ran side by side */
    cr_expect_gt(ls_getd(doc, "facts.perf.tokens_per_s.local"), 0.0);
    cr_expect_gt(ls_getd(doc, "facts.perf.tokens_per_s.builtin"), 0.0);
    cr_expect_float_eq(ls_getd(doc, "facts.perf.ratio_to_local.local"), 1.0, 1e-9);

    /* the follow-up from the nonce: variant 1 + (h >> 16) mod 5, probe h mod 2 */
    uint32_t h = fnv1a(NONCE);
    char variant[8], key[96];
    snprintf(variant, sizeof variant, "F%u", 1 + (h >> 16) % 5);
    cr_expect_str_eq(ls_gets(doc, "facts.followup.variant"), variant);
    cr_expect_eq((int)ls_getd(doc, "probe_rank"), (int)(h % 2));
    const char *module = ls_gets(doc, "facts.followup.module");
    static const char *const by_variant[] = {"no_causal_mask", "global_heads", "default_rng",
                                             "shared_cache", "renamed_param"};
    cr_expect_str_eq(module, by_variant[(h >> 16) % 5]);
    for (int k = 0; k < N_CELLS; k++) {
        snprintf(key, sizeof key, "facts.rows.%s.cells.%s", module, cells[k]);
        char fkey[64];
        snprintf(fkey, sizeof fkey, "facts.followup.%s", cells[k]);
        cr_expect_str_eq(ls_gets(doc, fkey), ls_gets(doc, key), "%s", fkey);
    }
    /* the run's own checks all held */
    cr_expect(mc_test_contains(out, "wrote "), "%s", out);
    cr_expect(!mc_test_contains(out, "check failed"), "%s", out);
    cJSON_Delete(doc);
}

Test(lab06, worlds_it_cannot_use_exit_2, .timeout = 120) {
    const int worlds[] = {1, 3, 4};
    for (int i = 0; i < 3; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./lab06 --answers '%s/s.md' --results '%s/r.json'", tmp_dir,
                 tmp_dir);
        int rc = mc_test_mpirun(worlds[i], cmd, 60, out, OUT_CAP);
        cr_expect_eq(rc, LAB_EXIT_USAGE, "np %d: exit %d:\n%s", worlds[i], rc, out);
        char says[96];
        snprintf(says, sizeof says, "lab06 needs exactly 2 ranks: got %d; try mpirun -np 2",
                 worlds[i]);
        cr_expect(mc_test_contains(out, says), "np %d: want \"%s\" in:\n%s", worlds[i], says, out);
    }
}

Test(lab06, init_writes_the_variant_question, .timeout = 30) {
    char cmd[512], sheet[300];
    snprintf(sheet, sizeof sheet, "%s/init.md", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab06 --init --nonce 006001 --answers '%s'", sheet);
    cr_assert_eq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "%s", out);
    char *text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    uint32_t h = fnv1a("006001");
    char header[96];
    snprintf(header, sizeof header, "<!-- nonce: 006001 ; probe_rank: %u ; followup: F%u", h % 2,
             1 + (h >> 16) % 5);
    cr_expect(mc_test_contains(text, header), "want \"%s\" in:\n%s", header, text);
    cr_expect(mc_test_contains(text, "the broken copy shared_cache"), "F4's question: %s", text);
    cr_expect(!mc_test_contains(text, "{variant_question}") && !mc_test_contains(text, "{nonce}"));
    free(text);
}

/* ---------------------------------------------------------------------------------------------
   grading against the frozen run */

static void grade(const char *sheet, gr_report *rep) {
    ls_grade("labs/rubric/lab06.json", "tests/fixtures/lab06/results.json", sheet, rep);
}

static double text_points(const gr_report *rep) { return ls_points_of(rep, "expl", "evid"); }

Test(lab06, the_frozen_run_is_this_labs_matrix, .timeout = 30) {
    cJSON *doc = ls_load_json("tests/fixtures/lab06/results.json");
    cr_expect_str_eq(ls_gets(doc, "nonce"), NONCE);
    expect_matrix(doc);
    cJSON_Delete(doc);
}

Test(lab06, rubric_items_are_the_seed_points, .timeout = 30) {
    cJSON *r = ls_load_json("labs/rubric/lab06.json");
    /* M006: what a spec does 3, spec / config / module 2, checkpoint and parallel risks 2, the
       full test matrix 3; follow-up: interface / reference 1, TP / PP correctness 2,
       checkpoint 1, performance and fallback 1 */
    const char *ids[] = {"M1", "M2", "M3", "M4", "FU1", "FU2", "FU3", "FU4"};
    const double weight[] = {3, 2, 2, 3, 1, 2, 1, 1};
    cr_expect_eq(cJSON_GetArraySize(ls_get(r, "items")), 8, "one item per seed point");
    for (int s = 0; s < 8; s++) {
        const cJSON *item = cJSON_GetArrayItem(ls_get(r, "items"), s);
        cr_assert_not_null(item, "item %d is missing", s);
        cr_expect_str_eq(ls_gets(item, "id"), ids[s], "item %d is %s, the seed's is %s", s,
                         ls_gets(item, "id"), ids[s]);
        double total = 0.0;
        static const char *const parts[] = {"predictions", "claims", "evidence"};
        for (int k = 0; k < 3; k++) {
            const cJSON *e;
            cJSON_ArrayForEach(e, ls_get(item, parts[k])) total += ls_getd(e, "points");
        }
        cr_expect_float_eq(ls_getd(item, "points"), weight[s], 1e-9,
                           "%s is worth %g, the seed gives %g", ids[s], ls_getd(item, "points"),
                           weight[s]);
        cr_expect_float_eq(total, weight[s], 1e-9, "%s carries %g points, the seed gives %g",
                           ids[s], total, weight[s]);
    }
    cr_expect_eq(cJSON_GetArraySize(ls_get(r, "variants")), 5, "one follow-up per broken copy");
    cJSON_Delete(r);
}

Test(lab06, empty_sheet_scores_zero, .timeout = 30) {
    gr_report rep;
    grade("tests/fixtures/lab06/empty.md", &rep);
    cr_expect_leq(rep.total, 0.5, "the empty template scores %.2f", rep.total);
    cr_expect(rep.near_empty, "the empty sheet gets the what-to-do-next text");
    gr_report_free(&rep);
}

Test(lab06, misconceptions_fire_and_cost_points, .timeout = 30) {
    struct {
        const char *sheet;
        const char *ids[6];
    } c[] = {
        {"tests/fixtures/lab06/misconceptions.md", {"MC1", "MC2", "MC3", "MC4", "MC5", "MC6"}},
        {"tests/fixtures/lab06/misconceptions.zh.md",
         {"MC1", "MC2", "MC3", "MC4", "MC5", "MC6"}},
    };
    for (int s = 0; s < 2; s++) {
        gr_report rep;
        grade(c[s].sheet, &rep);
        for (int i = 0; i < 6; i++)
            cr_expect(ls_fired(&rep, c[s].ids[i]), "%s: %s did not fire", c[s].sheet, c[s].ids[i]);
        cr_expect_leq(rep.total, 1.0, "%s scores %.2f", c[s].sheet, rep.total);
        gr_report_free(&rep);
    }
}

Test(lab06, negated_truths_keywords_and_prompt_copies_earn_little, .timeout = 30) {
    const char *sheets[] = {
        "tests/fixtures/lab06/negated.md",  "tests/fixtures/lab06/negated.zh.md",
        "tests/fixtures/lab06/keywords.md", "tests/fixtures/lab06/keywords.zh.md",
        "tests/fixtures/lab06/prompt_copy.md"};
    for (int i = 0; i < 5; i++) {
        gr_report rep;
        grade(sheets[i], &rep);
        cr_expect_leq(text_points(&rep), 1.0, "%s: its text earns %.2f", sheets[i],
                      text_points(&rep));
        gr_report_free(&rep);
    }
}

Test(lab06, references_on_the_frozen_run_score_at_least_14, .timeout = 30) {
    gr_report rep;
    grade("answers/reference/lab06.md", &rep);
    cr_expect_geq(rep.total, 14.0, "the English reference scores %.2f", rep.total);
    cr_expect_eq(rep.n_pred_unlocked, 0, "predictions locked by the frozen run");
    cr_expect_float_eq(rep.penalty_total, 0.0, 1e-9, "no misconception");
    gr_report_free(&rep);
}

/* Each reference on a run of its own: the run reads the nonce from the sheet, locks its
   predictions and grades them against what it measured. */
static void expect_reference_on_a_live_run(const char *ref, const char *tag) {
    char sheet[256], res[256];
    snprintf(sheet, sizeof sheet, "%s/%s.md", tmp_dir, tag);
    char *text = lab_read_text(ref, NULL);
    cr_assert_not_null(text, "missing %s", ref);
    cr_assert_eq(lab_write_text_atomic(text, sheet), 0);
    free(text);
    int rc = run_lab("./lab06", 2, sheet, NULL, tag, res, sizeof res);
    cr_assert_eq(rc, 0, "lab06 on %s exited %d\n%s", ref, rc, out);
    double total = ls_total_score(out);
    cr_expect_geq(total, 14.0, "%s scored %.2f/15\n%s", ref, total, out);
    cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions not locked\n%s", ref, out);
    cr_expect(mc_test_contains(out, "no misconception fired"), "%s\n%s", ref, out);
}

Test(lab06, reference_answers_score_at_least_14_on_live_runs) {
    expect_reference_on_a_live_run("answers/reference/lab06.md", "ref_en");
    expect_reference_on_a_live_run("answers/reference/lab06.zh.md", "ref_zh");
}

/* ---------------------------------------------------------------------------------------------
   a learner's edit of labs/lab06_attention.c */

Test(lab06, an_edited_attention_is_caught_by_the_rng_cell) {
    if (access("build/megatron_c_cuda.o", F_OK) == 0)
        cr_skip_test("a CUDA build: this test compiles the CPU link line only");
    char edited[PATH_MAX], binary[PATH_MAX], cmd[3 * PATH_MAX];
    snprintf(edited, sizeof edited, "%s/lab06_attention.c", tmp_dir);
    snprintf(binary, sizeof binary, "%s/lab06_edited", tmp_dir);
    /* the learner's change: the probability dropout from the default generator */
    ls_write_edited("labs/lab06_attention.c",
                    "lab06_draw_dropout(g, MC_RNG_MODEL_PARALLEL, n_probs, &d)",
                    "lab06_draw_dropout(g, MC_RNG_DEFAULT, n_probs, &d)", edited);
    snprintf(cmd, sizeof cmd,
             "mpicc -std=c11 -O2 -I. -Ilabs -D_GNU_SOURCE -I/usr/include/cjson -DMC_COMM_MPI "
             "labs/lab06.c '%s' labs/lab06_builtin.c build/mc_impl.o build/lab_common.o "
             "build/lab_driver.o build/lab_svg.o build/grader.o -o '%s' -lcjson -lcmark "
             "-lunistring -lm %s", edited, binary, ls_fast_libs());
    int rc = mc_test_run(cmd, 120, out, OUT_CAP);
    cr_assert_eq(rc, 0, "the edited module does not build:\n%s", out);
    char sheet[256], res[256];
    snprintf(sheet, sizeof sheet, "%s/edited.md", tmp_dir);
    rc = run_lab(binary, 2, sheet, "--nonce " NONCE, "edited", res, sizeof res);
    cr_assert_eq(rc, 0, "the edited lab exited %d (yours is graded, not checked)\n%s", rc, out);
    cJSON *doc = ls_load_json(res);
    for (int k = 0; k < N_CELLS; k++) {
        char key[96];
        snprintf(key, sizeof key, "facts.rows.yours.cells.%s", cells[k]);
        cr_expect_str_eq(ls_gets(doc, key), k == 2 ? "fail" : "pass", "%s", key);
    }
    cr_expect_str_eq(ls_gets(doc, "facts.rows.yours.dropout_streams"), "default-rng");
    cr_expect_str_eq(ls_gets(doc, "facts.rows.yours.first_failure"), "rng");
    cJSON_Delete(doc);
}
