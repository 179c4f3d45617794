/* tests/test_lab09.c - lab09 (M009, the micro-batch calculator) as a program.

   ./lab09 runs under mpirun through mc_test_mpirun (never Criterion's own process). Every fact
   of a fixed-nonce run is checked against what the test computes itself:
     - the calculator's micro-batches and DP of each layout against GBS / (MBS x DP) and
       world / TP, the samples per step and per rank against GBS and TP (x PP), the grad-sync
       and DP-collective counts against one per step;
     - every layout's losses against the single-rank run (relative 1e-5, the equivalence
       suite's tolerance), the broken mode's against the fair run (they must differ);
     - the bubble against (p - 1) / (m + p - 1) where the lab compared it, its median from the
       iterations it kept, the micro-batches in flight against min(p - r, m);
     - the ramp-up table against Megatron's formula, written out here;
     - the follow-up variant against its own layout's DP, micro-batches and ranks per sample.
   Then the reference answers (English and Chinese) must score at least 14 of 15, an empty
   sheet near 0, and worlds the lab cannot use must be refused with exit status 2. */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define RUN_LIMIT_S 240.0

LS_LAB_SUITE(lab09, OUT_CAP, 0);

/* ---------------------------------------------------------------------------------------------
   helpers */

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

static double rel_diff(double a, double ref) { return fabs(a - ref) / fmax(fabs(ref), 1.0); }

/* Runs ./lab09 on np ranks with the given sheet and extra flags; results in the temp dir. */
static int run_lab(int np, const char *sheet, const char *flags, char *res, size_t cap) {
    tmp_path(res, cap, "results/lab09.json");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./lab09 --answers '%s' --results '%s' %s", sheet, res, flags);
    return mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
}

/* ---------------------------------------------------------------------------------------------
   the facts, against the test's own arithmetic */

static void check_fixed_gbs(const cJSON *doc, int world, int steps) {
    const cJSON *a = ls_get(doc, "facts.fixed_gbs");
    int gbs = ls_geti(a, "global_batch_size"), mbs = ls_geti(a, "micro_batch_size");
    cr_expect_eq(mbs, 1);
    cr_expect_eq(gbs, world * mbs, "the fixed global batch is world x MBS");
    const cJSON *single = ls_get(a, "single_rank");
    cr_expect_eq(ls_geti(single, "num_microbatches"), gbs / mbs, "one rank runs GBS / MBS");
    const cJSON *ref = ls_get(single, "losses");
    cr_assert_eq(cJSON_GetArraySize(ref), steps);
    cr_expect_lt(cJSON_GetArrayItem(ref, steps - 1)->valuedouble,
                 cJSON_GetArrayItem(ref, 0)->valuedouble, "the loss falls over %d steps", steps);
    const cJSON *cfgs = ls_get(a, "configs");
    int n = cJSON_GetArraySize(cfgs), want_n = 0;
    for (int tp = 1; tp <= world && tp <= 8; tp *= 2) want_n++;
    cr_assert_eq(n, want_n, "the TP ladder of world %d has %d layouts", world, want_n);
    double prev_slot = 1e300;
    for (int i = 0; i < n; i++) {
        const cJSON *c = cJSON_GetArrayItem(cfgs, i);
        int tp = 1 << i, dp = world / tp, m = gbs / (mbs * dp);
        char key[64];
        cr_expect_eq(ls_geti(c, "tp"), tp);
        cr_expect_eq(ls_geti(c, "dp"), dp, "TP %d: DP = %d / %d", tp, world, tp);
        cr_expect_eq(ls_geti(c, "num_microbatches"), m, "TP %d: M = %d / (%d x %d)", tp, gbs, mbs,
                     dp);
        cr_expect_eq(ls_geti(c, "microbatches_run"), m);
        snprintf(key, sizeof key, "facts.microbatches.tp%d", tp);
        cr_expect_eq(ls_geti(doc, key), m);
        snprintf(key, sizeof key, "facts.dp_sizes.tp%d", tp);
        cr_expect_eq(ls_geti(doc, key), dp);
        cr_expect_eq(ls_geti(c, "distinct_samples_per_step"), gbs, "TP %d: GBS distinct samples",
                     tp);
        cr_expect_eq(ls_geti(c, "ranks_per_sample"), tp, "TP %d: each sample on TP ranks", tp);
        cr_expect_eq(ls_geti(c, "backwards_per_step"), m);
        cr_expect_eq(ls_geti(c, "backwards_with_grad_sync"), 1, "TP %d: sync on for the last only",
                     tp);
        cr_expect_eq(ls_geti(c, "dp_collectives_per_step"), ls_geti(c, "ddp_buckets"),
                     "TP %d: one DP collective per bucket per step", tp);
        const cJSON *l = ls_get(c, "losses");
        cr_assert_eq(cJSON_GetArraySize(l), steps);
        for (int k = 0; k < steps; k++) {
            double got = cJSON_GetArrayItem(l, k)->valuedouble;
            double want = cJSON_GetArrayItem(ref, k)->valuedouble;
            cr_expect_leq(rel_diff(got, want), 1e-5, "TP %d step %d: loss %.7f vs one rank %.7f",
                          tp, k + 1, got, want);
        }
        double slot = ls_getd(c, "activation_slot_bytes");
        cr_expect(slot > 0 && slot < prev_slot, "TP %d: a micro-batch's activations shrink with TP "
                  "(%.0f after %.0f bytes)", tp, slot, prev_slot);
        prev_slot = slot;
    }
    cr_expect_str_eq(ls_get(doc, "facts.losses_equal")->valuestring, "within_tolerance");
    /* broken mode: the largest TP with M = 1 runs a global batch of MBS x DP */
    const cJSON *big = cJSON_GetArrayItem(cfgs, n - 1), *bad = ls_get(a, "broken_fixed_m");
    cr_expect_eq(ls_geti(bad, "global_batch_size"), mbs * ls_geti(big, "dp"));
    cr_expect_eq(ls_geti(bad, "num_microbatches"), 1);
    double worst = 0;
    for (int k = 0; k < steps; k++)
        worst = fmax(worst, rel_diff(cJSON_GetArrayItem(ls_get(bad, "losses"), k)->valuedouble,
                                     cJSON_GetArrayItem(ls_get(big, "losses"), k)->valuedouble));
    cr_expect_gt(worst, 1e-3, "a smaller global batch must change the losses (%.2e)", worst);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void check_bubble(const cJSON *doc) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const cJSON *pairs = ls_get(doc, "facts.bubble.pairs"), *pr;
    cr_assert_gt(cJSON_GetArraySize(pairs), 1, "at least two (p, m)");
    cJSON_ArrayForEach(pr, pairs) {
        int p = ls_geti(pr, "p"), m = ls_geti(pr, "m");
        double formula = (double)(p - 1) / (double)(m + p - 1);
        cr_expect_float_eq(ls_getd(pr, "formula"), formula, 1e-4, "p %d m %d", p, m);
        int compared = cJSON_IsTrue(ls_get(pr, "compared"));
        if (p > cores) cr_expect(!compared, "p %d > %ld cores cannot be compared", p, cores);
        /* the measured value is the median of the quiet iterations when compared */
        double v[64];
        int n = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, ls_get(pr, "iterations")) {
            cr_expect_geq(ls_getd(it, "bubble"), 0.0);
            cr_expect_lt(ls_getd(it, "bubble"), 1.0);
            if (n < 64 && (!compared || cJSON_IsTrue(ls_get(it, "quiet"))))
                v[n++] = ls_getd(it, "bubble");
        }
        cr_assert_gt(n, 0, "p %d m %d: no iteration", p, m);
        qsort(v, (size_t)n, sizeof v[0], cmp_double);
        double median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
        cr_expect_float_eq(ls_getd(pr, "measured"), median, 2e-4, "p %d m %d: median", p, m);
        char key[32];
        snprintf(key, sizeof key, "facts.bubble.p%d_m%d", p, m);
        double replay = ls_getd(pr, "replay_free_communication");
        cr_expect(replay >= 0 && replay < 1, "p %d m %d: the kept timeline replays (%g)", p, m,
                  replay);
        if (compared) {
            /* a balanced pipeline with free communication is the floor (how far above it the
               timeline sits depends on the host's load: reported, not tested) */
            cr_expect_geq(ls_getd(pr, "measured"),
                          formula - ls_getd(doc, "facts.bubble.floor_tolerance"),
                          "p %d m %d: measured %.3f below (p-1)/(m+p-1) = %.3f", p, m,
                          ls_getd(pr, "measured"), formula);
            cr_expect_float_eq(ls_getd(doc, key), ls_getd(pr, "measured"), 1e-9);
        } else {
            cr_expect(cJSON_IsNull(ls_get(doc, key)), "%s: only compared bubbles are predicted",
                      key);
            cr_log_info("p %d m %d: not compared (median CPU share %.2f)", p, m,
                        ls_getd(pr, "median_cpu_share"));
        }
        const cJSON *stages = ls_get(pr, "stages"), *st;
        cr_assert_eq(cJSON_GetArraySize(stages), p);
        cJSON_ArrayForEach(st, stages) {
            int r = ls_geti(st, "stage");
            int in_flight = p - r < m ? p - r : m, warmup = p - r - 1 < m ? p - r - 1 : m;
            cr_expect_eq(ls_geti(st, "in_flight"), in_flight, "p %d m %d stage %d", p, m, r);
            cr_expect_eq(ls_geti(st, "warmup"), warmup, "p %d m %d stage %d warmup", p, m, r);
            double slot = ls_getd(st, "activation_slot_bytes");
            cr_expect_gt(slot, 0);
            cr_expect_float_eq(ls_getd(st, "activation_peak_bytes"), slot * in_flight, 0.5);
            cr_expect_gt(ls_getd(st, "busy_ms"), 0);
            const cJSON *ex = ls_get(st, "expected");
            cr_expect_eq(ls_geti(ex, "in_flight"), in_flight);
            if (cJSON_GetObjectItemCaseSensitive(ex, "activation_slot_bytes") != NULL) {
                double est = ls_getd(ex, "activation_slot_bytes");   /* mc_memory_estimate */
                cr_expect_leq(fabs(slot - est), 0.02 * est + 4096, "p %d m %d stage %d: slot %.0f "
                              "bytes, estimate %.0f", p, m, r, slot, est);
                cr_expect_eq(ls_geti(st, "receive_buffers"), ls_geti(ex, "receive_buffers"));
            }
            int buffers = ls_geti(st, "receive_buffers");
            cr_expect(buffers >= 1 && buffers <= in_flight + 1, "p %d m %d stage %d: %d buffers",
                      p, m, r, buffers);
        }
    }
}

static void check_rampup(const cJSON *doc, int world) {
    const cJSON *c = ls_get(doc, "facts.rampup");
    int dp = ls_geti(c, "dp"), mbs = ls_geti(c, "micro_batch_size");
    cr_expect_eq(dp, world / 2);
    int start = ls_geti(c, "start"), inc = ls_geti(c, "increment"),
        gbs = ls_geti(c, "global_batch_size");
    long long samples = (long long)ls_getd(c, "samples");
    int n_inc = (gbs - start) / inc;
    double per_inc = (double)samples / n_inc;
    long long consumed = 0;
    const cJSON *row;
    int i = 0;
    cJSON_ArrayForEach(row, ls_get(c, "table")) {
        int want = consumed > samples ? gbs : start + (int)floor((double)consumed / per_inc) * inc;
        cr_expect_eq((long long)ls_getd(row, "consumed_samples"), consumed, "row %d", i);
        cr_expect_eq(ls_geti(row, "global_batch_size"), want, "row %d (%lld consumed)", i,
                     consumed);
        cr_expect_eq(ls_geti(row, "num_microbatches"), want / (mbs * dp));
        cr_expect_eq(ls_geti(row, "microbatches_run"), want / (mbs * dp));
        char key[64];
        snprintf(key, sizeof key, "facts.rampup.microbatches_by_iteration.it%d", i + 1);
        cr_expect_eq(ls_geti(doc, key), want / (mbs * dp));
        consumed += want;
        i++;
    }
    cr_expect_eq(i, 6);
    cr_expect_str_eq(ls_get(doc, "facts.calculator_refusal.status")->valuestring,
                     "MC_ERR_INVALID_DESC");
    cr_expect(mc_test_contains(ls_get(doc, "facts.calculator_refusal.message")->valuestring,
                               "not divisible"));
}

static void check_followup(const cJSON *doc, int world, const char *variant, int gbs, int mbs,
                           int tp, int pp) {
    const cJSON *f = ls_get(doc, "facts.followup");
    int dp = world / (tp * pp);
    cr_expect_str_eq(ls_get(f, "variant")->valuestring, variant);
    cr_expect_eq(ls_geti(f, "global_batch_size"), gbs);
    cr_expect_eq(ls_geti(f, "micro_batch_size"), mbs);
    cr_expect_eq(ls_geti(f, "tp"), tp);
    cr_expect_eq(ls_geti(f, "pp"), pp);
    cr_expect_eq(ls_geti(f, "dp_size"), dp);
    cr_expect_eq(ls_geti(f, "num_microbatches"), gbs / (mbs * dp));
    cr_expect_eq(ls_geti(f, "ranks_per_sample"), tp * pp, "TP x PP ranks share each sample");
    cr_expect_eq(ls_geti(f, "distinct_samples_per_step"), gbs);
    cr_expect_leq(ls_getd(f, "max_rel_diff_vs_single_rank"), 1e-5);
    cr_expect_eq(ls_geti(f, "single_rank.num_microbatches"), gbs / mbs);
    const cJSON *cp = ls_get(f, "with_cp");
    cr_expect_eq(ls_geti(cp, "dp"),
                 world / (ls_geti(cp, "tp") * ls_geti(cp, "pp") * ls_geti(cp, "cp")));
}

/* ---------------------------------------------------------------------------------------------
   runs */

Test(lab09, world8_english_reference_run, .timeout = 300) {
    char sheet[256], res[256], empty[256], cmd[1024];
    ls_copy_reference(tmp_dir, "lab09.md", sheet, sizeof sheet);
    double t0 = mc_test_now();
    int rc = run_lab(8, sheet, "", res, sizeof res);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "./lab09 on 8 ranks exited %d:\n%s", rc, out);
    cr_log_info("lab09 on 8 ranks: %.1f s", secs);
    cr_expect(mc_test_contains(out, "== A. fixed global batch 8"), "%s", out);
    cJSON *doc = ls_load_json(res);
    int steps = ls_geti(doc, "facts.steps");
    cr_expect_eq(steps, 5);
    check_fixed_gbs(doc, 8, steps);
    check_bubble(doc);
    check_rampup(doc, 8);
    check_followup(doc, 8, "F1", 16, 2, 2, 2);   /* nonce 7f3a91 */
    cr_expect(cJSON_IsArray(ls_get(doc, "figures")) &&
              cJSON_GetArraySize(ls_get(doc, "figures")) == 1);
    char svg_path[300];
    snprintf(svg_path, sizeof svg_path, "%s/results/lab09.timeline.svg", tmp_dir);
    char *svg = ls_read_file(svg_path);
    cr_expect(svg != NULL && mc_test_contains(svg, "<svg") && mc_test_contains(svg, "</svg>") &&
                  mc_test_contains(svg, "F0 on stage 0"),
              "the timeline figure is an SVG document");
    free(svg);
    cJSON_Delete(doc);

    double score = ls_total_score_strict(out);
    cr_expect_geq(score, 14.0, "the English reference scores %.2f:\n%s", score, out);

    /* an empty sheet for the same nonce, graded against the same results */
    tmp_path(empty, sizeof empty, "empty.md");
    snprintf(cmd, sizeof cmd, "./lab09 --init --nonce 7f3a91 --answers '%s' >/dev/null && "
             "./lab09 --grade-only --answers '%s' --results '%s'", empty, empty, res);
    mc_test_run(cmd, 30, out, OUT_CAP);
    score = ls_total_score_strict(out);
    cr_expect(score >= 0 && score <= 0.5, "an empty sheet scores %.2f:\n%s", score, out);
    cr_expect(mc_test_contains(out, "What to do next"), "the empty sheet gets the next steps");
}

Test(lab09, world8_chinese_reference_run_variant_f2, .timeout = 300) {
    char sheet[256], res[256];
    ls_copy_reference(tmp_dir, "lab09.zh.md", sheet, sizeof sheet);
    int rc = run_lab(8, sheet, "", res, sizeof res);
    cr_assert_eq(rc, 0, "./lab09 exited %d:\n%s", rc, out);
    double score = ls_total_score_strict(out);
    cr_expect_geq(score, 14.0, "the Chinese reference scores %.2f:\n%s", score, out);
    cJSON *doc = ls_load_json(res);
    check_followup(doc, 8, "F2", 12, 1, 4, 2);   /* nonce c0ffee */
    cJSON_Delete(doc);
}

Test(lab09, world4_quick_runs_the_shorter_ladder, .timeout = 240) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab09.md");
    int rc = run_lab(4, sheet, "--quick --nonce d00d01", res, sizeof res);
    cr_assert_eq(rc, 0, "./lab09 on 4 ranks exited %d:\n%s", rc, out);
    cJSON *doc = ls_load_json(res);
    cr_expect_eq(ls_geti(doc, "facts.steps"), 2);
    check_fixed_gbs(doc, 4, 2);
    check_bubble(doc);
    check_rampup(doc, 4);
    check_followup(doc, 4, "F3", 12, 3, 1, 2);   /* d00d01: DP 2 on 4 ranks */
    cJSON_Delete(doc);
}

Test(lab09, world6_is_refused_with_a_clear_message, .timeout = 60) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab09.md");
    int rc = run_lab(6, sheet, "", res, sizeof res);
    cr_expect_eq(rc, 2, "a world of 6 exits 2, got %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "power-of-two world") && mc_test_contains(out, "got 6 ranks") &&
                  mc_test_contains(out, "mpirun -np 8"),
              "the message names the rule, the value and the fix:\n%s", out);
    cr_expect(access(res, F_OK) != 0, "no results for a refused world");
}

Test(lab09, layout_flags_are_refused, .timeout = 60) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab09.md");
    int rc = run_lab(8, sheet, "--tp 2", res, sizeof res);
    cr_expect_eq(rc, 2, "--tp exits 2, got %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "chooses its own layouts"), "%s", out);
}

Test(lab09, help_names_the_lab_flags, .timeout = 30) {
    int rc = mc_test_run("./lab09 --help", 20, out, OUT_CAP);
    cr_expect_eq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "--steps K") && mc_test_contains(out, "--pairs PxM"), "%s",
              out);
}
