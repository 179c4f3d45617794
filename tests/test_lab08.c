/* tests/test_lab08.c - lab08 (M008, one training iteration stage by stage) as a program.

   ./lab08 runs under mpirun through mc_test_mpirun (never Criterion's own process). The facts of
   fixed-nonce runs are checked against what the test knows independently:
     - the stage, finalize and optimizer orders against Megatron's train_step,
       finalize_model_grads and optimizer.step, written out here;
     - each stage's warm-up against min(pp - stage - 1, M), every rank's forwards and backwards
       against M, one backward with grad sync on, every bucket launched exactly once, the
       buckets of a later pipeline stage against Megatron's rule (no bucketing past pp rank 0:
       one bucket, plus the tied embedding's own under the distributed optimizer);
     - the losses against the single-rank run (relative 1e-5), identical DP replicas and tied
       copies, the checkpoint read back; the special syncs' grads against the single-rank grads;
       the broken mode's replicas (diverged with plain DDP, identical but wrong with the
       distributed optimizer), each broken replica against a run on its own samples;
     - the follow-up variant's launches against its overlap setting;
     - one SVG per rank and the event dump, well formed.
   Then the reference answers (English and Chinese) must score at least 14 of 15, an empty sheet
   near 0, and worlds the lab cannot use must be refused with exit status 2. */
#include <criterion/criterion.h>

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
#define WORLD 8
#define PP 2
#define M 4

LS_LAB_SUITE(lab08, OUT_CAP, 0);

/* ---------------------------------------------------------------------------------------------
   helpers */

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

static int run_lab(int np, const char *sheet, const char *flags, char *res, size_t cap) {
    tmp_path(res, cap, "results/lab08.json");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./lab08 --answers '%s' --results '%s' %s", sheet, res, flags);
    return mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
}

/* ---------------------------------------------------------------------------------------------
   the facts, against the test's own expectations */

static void expect_order(const cJSON *doc, const char *path, const char *const *names, int n) {
    for (int i = 0; i < n; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", path, names[i]);
        cr_expect_eq(ls_geti(doc, key), i + 1, "%s: %s should be stage %d of Megatron's order",
                     path, names[i], i + 1);
    }
}

static void check_iteration(const cJSON *doc) {
    /* Megatron: train_step, then training_log, then save_checkpoint */
    static const char *const stages[] = {"forward_backward", "finalize_model_grads",
                                         "optimizer_step", "logging", "checkpoint"};
    /* finalize_model_grads: finish_grad_sync, layernorm (SP) grads, embedding grads */
    static const char *const fin[] = {"dp_grad_sync", "layernorm_grad_sync",
                                      "embedding_grad_sync"};
    /* optimizer.step: grad norm, clip, the update, the param all-gather, then the scheduler */
    static const char *const opt[] = {"grad_norm", "clip_grads", "adamw_update",
                                      "param_all_gather", "lr_scheduler"};
    expect_order(doc, "facts.stage_order", stages, 5);
    expect_order(doc, "facts.finalize_order", fin, 3);
    expect_order(doc, "facts.optimizer_order", opt, 5);
    cr_expect_eq(ls_geti(doc, "facts.warmup_forwards.stage0"), PP - 0 - 1);
    cr_expect_eq(ls_geti(doc, "facts.warmup_forwards.stage1"), 0);
    cr_expect_eq(ls_geti(doc, "facts.backwards_with_grad_sync"), 1);
    cr_expect_str_eq(ls_gets(doc, "facts.comm_done_when_backward_returns"), "no");
    cr_expect_str_eq(ls_gets(doc, "facts.teardown_before_finish"), "refused");
    cr_expect_str_eq(ls_gets(doc, "facts.timeline.teardown_probe.status"), "MC_ERR_BUSY");

    const cJSON *ranks = ls_get(doc, "facts.timeline.ranks"), *r;
    cr_assert_eq(cJSON_GetArraySize(ranks), WORLD);
    int stage0_buckets = -1;
    cJSON_ArrayForEach(r, ranks) {
        int rank = ls_geti(r, "rank"), stage = ls_geti(r, "stage");
        /* the default layout: TP fastest, then DP, then PP */
        cr_expect_eq(stage, rank / 4, "rank %d is on stage %d", rank, rank / 4);
        cr_expect_eq(ls_geti(r, "tp_rank"), rank % 2);
        cr_expect_eq(ls_geti(r, "dp_rank"), rank / 2 % 2);
        int warm = PP - stage - 1 < M ? PP - stage - 1 : M;
        cr_expect_eq(ls_geti(r, "warmup_forwards"), warm, "rank %d warm-up", rank);
        cr_expect(cJSON_IsTrue(ls_get(r, "trace_matches_schedule")), "rank %d trace", rank);
        cr_expect_eq(ls_geti(r, "forwards"), M);
        cr_expect_eq(ls_geti(r, "backwards"), M);
        cr_expect_eq(ls_geti(r, "backwards_with_grad_sync"), 1);
        int buckets = ls_geti(r, "buckets");
        cr_expect_eq(
            ls_geti(r, "launched_during_backward") + ls_geti(r, "launched_by_finish_grad_sync"),
            buckets, "rank %d: every bucket launched once", rank);
        cr_expect_eq(ls_geti(r, "launched_during_backward"), buckets,
                     "overlap on: inside backward");
        cr_expect_eq(ls_geti(r, "in_flight_at_backward_return"), buckets,
                     "rank %d: nothing was waited for before finalize", rank);
        cr_expect_eq(ls_geti(r, "finish_grad_sync_waits"), buckets);
        cr_expect_gt(ls_getd(r, "dp_complete_after_backward_ms"), 0.0,
                     "rank %d: the last bucket completed after backward returned", rank);
        cr_expect_gt(ls_geti(r, "tp_collectives_in_forward_backward"), 0);
        cr_expect_gt(ls_geti(r, "p2p_calls"), 0);
        if (stage == 1)   /* no bucketing past pp rank 0; the tied embedding has its own */
            cr_expect_eq(buckets, 2, "rank %d (last stage): %d buckets", rank, buckets);
        else if (stage0_buckets < 0)
            stage0_buckets = buckets;
        else
            cr_expect_eq(buckets, stage0_buckets, "stage-0 ranks share one layout");
    }
    cr_expect_gt(stage0_buckets, 2, "stage 0 splits its grads into buckets of 2048 elements");

    const cJSON *loss = ls_get(doc, "facts.timeline.losses"),
                *ref = ls_get(doc, "facts.timeline.single_rank_losses");
    cr_assert_eq(cJSON_GetArraySize(loss), 3);
    for (int k = 0; k < 3; k++) {
        double a = cJSON_GetArrayItem(loss, k)->valuedouble, b = cJSON_GetArrayItem(ref, k)->valuedouble;
        cr_expect_leq(fabs(a - b) / fabs(b), 1e-5, "iteration %d: loss %.7f vs one rank %.7f", k + 1,
                      a, b);
    }
    cr_expect_lt(cJSON_GetArrayItem(loss, 2)->valuedouble, cJSON_GetArrayItem(loss, 0)->valuedouble,
                 "the loss falls over three steps");
    cr_expect_eq(ls_getd(doc, "facts.timeline.dp_replica_divergence"), 0.0);
    cr_expect_eq(ls_getd(doc, "facts.timeline.tied_embedding_copy_diff"), 0.0);
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.timeline.checkpoint_reads_back")));
    cr_expect_leq(ls_getd(doc, "facts.timeline.max_param_diff_vs_single_rank"), 3e-4);
    double coeff = ls_getd(doc, "facts.timeline.clip_coeff"),
           norm = ls_getd(doc, "facts.timeline.grad_norm");
    cr_expect_float_eq(coeff, fmin(1.0, 0.5 / (norm + 1e-6)), 1e-5, "clip coefficient = clip / norm");
}

static void check_special_and_broken(const cJSON *doc) {
    const cJSON *s = ls_get(doc, "facts.special_grad_syncs");
    /* 2 layers per stage x (2 LayerNorms x (weight + bias) + 2 row-parallel biases) x hidden 32 */
    cr_expect_eq(ls_geti(s, "sp_grad_elements_per_rank"), 2 * 6 * 32);
    cr_expect_eq(ls_geti(s, "embedding_grad_elements_per_rank"), 64 / 2 * 32,
                 "the vocab shard x H");
    cr_expect_gt(ls_getd(s, "layernorm_tp_diff_before"), 1e-6);
    cr_expect_eq(ls_getd(s, "layernorm_tp_diff_after"), 0.0);
    cr_expect_leq(ls_getd(s, "layernorm_after_vs_single_rank"), 1e-4);
    cr_expect_leq(ls_getd(s, "layernorm_lab_sum_vs_single_rank"), 1e-4);
    cr_expect_gt(ls_getd(s, "layernorm_before_vs_single_rank"), 1e-2);
    cr_expect_gt(ls_getd(s, "embedding_stage_diff_before"), 1e-6);
    cr_expect_eq(ls_getd(s, "embedding_stage_diff_after"), 0.0);
    cr_expect_leq(ls_getd(s, "embedding_after_vs_single_rank"), 1e-4);
    cr_expect_str_eq(ls_gets(doc, "facts.layernorm_grads_equal_before_sync"), "no");

    const cJSON *b = ls_get(doc, "facts.broken_mode");
    cr_expect_eq(ls_getd(b, "correct_dp_divergence"), 0.0);
    cr_expect_leq(ls_getd(b, "correct_vs_single_rank"), 3e-4);
    cr_expect_gt(ls_getd(b, "ddp_dp_divergence"), 1e-4, "plain DDP: the replicas drift apart");
    cr_expect_leq(ls_getd(b, "ddp_vs_replica_single_rank"), 3e-4,
                  "each broken replica trained on its own samples alone");
    cr_expect_eq(ls_getd(b, "distopt_dp_divergence"), 0.0, "the param all-gather re-syncs them");
    cr_expect_gt(ls_getd(b, "distopt_vs_correct"), 1e-4, "... but they are wrong");
    cr_expect_str_eq(ls_gets(doc, "facts.broken_ddp_replicas"), "diverge");
    cr_expect_str_eq(ls_gets(doc, "facts.broken_distopt_replicas"), "identical");
    /* the first loss is computed before any step: the same in all three runs */
    double c0 = cJSON_GetArrayItem(ls_get(b, "correct_losses"), 0)->valuedouble;
    cr_expect_float_eq(cJSON_GetArrayItem(ls_get(b, "ddp_losses"), 0)->valuedouble, c0, 1e-12);
    cr_expect(fabs(cJSON_GetArrayItem(ls_get(b, "ddp_losses"), 2)->valuedouble -
                   cJSON_GetArrayItem(ls_get(b, "correct_losses"), 2)->valuedouble) > 1e-6,
              "the broken run's later losses differ from the correct run's");
}

static void check_followup(const cJSON *doc, const char *variant, int probe, int overlap,
                           int want_buckets) {
    const cJSON *f = ls_get(doc, "facts.followup");
    cr_expect_str_eq(ls_gets(f, "variant"), variant);
    cr_expect_eq(ls_geti(f, "probe_rank"), probe);
    cr_expect_eq(ls_geti(f, "probe_stage"), probe / 4);
    int buckets = ls_geti(f, "buckets");
    if (want_buckets > 0) cr_expect_eq(buckets, want_buckets, "%s rank %d buckets", variant, probe);
    cr_expect_eq(
        ls_geti(f, "launched_during_backward") + ls_geti(f, "launched_by_finish_grad_sync"),
        buckets);
    if (overlap) {
        cr_expect_eq(ls_geti(f, "launched_during_backward"), buckets);
        cr_expect_eq(ls_geti(f, "outstanding_at_backward_return"), buckets);
    } else {
        cr_expect_eq(ls_geti(f, "launched_during_backward"), 0, "overlap off: nothing in backward");
        cr_expect_eq(ls_geti(f, "outstanding_at_backward_return"), 0);
        cr_expect_eq(ls_geti(f, "finish_grad_sync_waits"), 0, "blocking collectives: no waits");
    }
    cr_expect_str_eq(ls_gets(f, "param_gather_before_next_forward"), "yes");
    cr_expect_leq(ls_getd(f, "param_gather_complete_ms"), ls_getd(f, "next_forward_ms"));
    cr_expect_leq(ls_getd(f, "max_loss_rel_diff"), 1e-5);
}

static void check_figures(const cJSON *doc) {
    cr_expect_eq(cJSON_GetArraySize(ls_get(doc, "figures")), WORLD, "one SVG per rank");
    for (int r = 0; r < WORLD; r++) {
        char path[300];
        snprintf(path, sizeof path, "%s/results/lab08.timeline.rank%d.svg", tmp_dir, r);
        char *svg = ls_read_file(path);
        cr_expect(svg != NULL && mc_test_contains(svg, "<svg") && mc_test_contains(svg, "</svg>") &&
                      mc_test_contains(svg, "last backward returned") &&
                      mc_test_contains(svg, "DP buckets (async)"),
                  "%s is the rank's timeline", path);
        free(svg);
    }
    char path[300];
    snprintf(path, sizeof path, "%s/results/lab08.timeline.json", tmp_dir);
    cJSON *ev = ls_load_json(path);
    const cJSON *ranks = ls_get(ev, "ranks"), *rk;
    cr_assert_eq(cJSON_GetArraySize(ranks), WORLD);
    cJSON_ArrayForEach(rk, ranks) {
        int n = 0, compute = 0, async = 0, waits = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, rk) {
            n++;
            const char *kind = cJSON_GetObjectItem(e, "kind")->valuestring;
            compute += strcmp(kind, "compute") == 0;
            async += strcmp(kind, "async") == 0;
            waits += strcmp(kind, "wait") == 0;
            double c = ls_getd(e, "t_call_ms"), rt = ls_getd(e, "t_return_ms");
            cr_expect_leq(c, rt + 1e-3, "an event returns after its call");
        }
        cr_expect_gt(n, 50);
        cr_expect_eq(compute, 2 * M, "M forwards and M backwards");
        cr_expect_gt(async, 0);
        cr_expect_geq(waits, 1);
    }
    cJSON_Delete(ev);
}

/* ---------------------------------------------------------------------------------------------
   runs */

Test(lab08, world8_english_reference_run, .timeout = 300) {
    char sheet[256], res[256], empty[256], cmd[1024];
    ls_copy_reference(tmp_dir, "lab08.md", sheet, sizeof sheet);
    double t0 = mc_test_now();
    int rc = run_lab(WORLD, sheet, "", res, sizeof res);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "./lab08 on 8 ranks exited %d:\n%s", rc, out);
    cr_log_info("lab08 on 8 ranks: %.1f s", secs);
    cr_expect(mc_test_contains(out, "== A. one training iteration on a timeline"), "%s", out);
    cr_expect(mc_test_contains(out, "the SVG timeline of rank 0 is"), "%s", out);
    cJSON *doc = ls_load_json(res);
    check_iteration(doc);
    check_special_and_broken(doc);
    check_followup(doc, "F1", 6, 1, 2);   /* nonce 7f3a91: rank 6 on the last stage */
    check_figures(doc);
    cr_expect(cJSON_IsTrue(ls_get(doc, "run.all_checks_held")));
    cJSON_Delete(doc);

    double score = ls_total_score_strict(out);
    cr_expect_geq(score, 14.0, "the English reference scores %.2f:\n%s", score, out);

    tmp_path(empty, sizeof empty, "empty.md");
    snprintf(cmd, sizeof cmd, "./lab08 --init --nonce 7f3a91 --answers '%s' >/dev/null && "
             "./lab08 --grade-only --answers '%s' --results '%s'", empty, empty, res);
    mc_test_run(cmd, 30, out, OUT_CAP);
    score = ls_total_score_strict(out);
    cr_expect(score >= 0 && score <= 0.5, "an empty sheet scores %.2f:\n%s", score, out);
    cr_expect(mc_test_contains(out, "What to do next"), "the empty sheet gets the next steps");
}

Test(lab08, world8_chinese_reference_run_variant_f2, .timeout = 300) {
    char sheet[256], res[256];
    ls_copy_reference(tmp_dir, "lab08.zh.md", sheet, sizeof sheet);
    int rc = run_lab(WORLD, sheet, "", res, sizeof res);
    cr_assert_eq(rc, 0, "./lab08 exited %d:\n%s", rc, out);
    double score = ls_total_score_strict(out);
    cr_expect_geq(score, 14.0, "the Chinese reference scores %.2f:\n%s", score, out);
    cJSON *doc = ls_load_json(res);
    /* nonce c0ffee: rank 0 on stage 0, one bucket for the chunk and the embedding's own */
    check_followup(doc, "F2", 0, 1, 2);
    cJSON_Delete(doc);
}

Test(lab08, variant_f3_overlap_off_launches_nothing_in_backward, .timeout = 300) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab08.md");
    int rc = run_lab(WORLD, sheet, "--nonce d00d01", res, sizeof res);
    cr_assert_eq(rc, 0, "./lab08 exited %d:\n%s", rc, out);
    cJSON *doc = ls_load_json(res);
    check_followup(doc, "F3", 2, 0, 0);   /* nonce d00d01: rank 2 on stage 0 */
    cJSON_Delete(doc);
}

Test(lab08, world4_without_data_parallel_is_refused, .timeout = 60) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab08.md");
    int rc = run_lab(4, sheet, "", res, sizeof res);
    cr_expect_eq(rc, 2, "a world of 4 (DP 1) exits 2, got %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs DP >= 2") && mc_test_contains(out, "got 4 ranks") &&
                  mc_test_contains(out, "mpirun -np 8"),
              "the message names the rule, the value and the fix:\n%s", out);
    cr_expect(access(res, F_OK) != 0, "no results for a refused world");
}

Test(lab08, world6_is_refused, .timeout = 60) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab08.md");
    int rc = run_lab(6, sheet, "", res, sizeof res);
    cr_expect_eq(rc, 2, "a world of 6 exits 2, got %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "got 6 ranks"), "%s", out);
}

Test(lab08, tp1_is_refused_sequence_parallel_needs_tp, .timeout = 60) {
    char sheet[256], res[256];
    tmp_path(sheet, sizeof sheet, "answers/lab08.md");
    int rc = run_lab(WORLD, sheet, "--tp 1", res, sizeof res);
    cr_expect_eq(rc, 2, "--tp 1 exits 2, got %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs tp in {2, 4}") && mc_test_contains(out, "tp=1"), "%s",
              out);
}
