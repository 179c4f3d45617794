/* tests/test_lab11.c - lab11 (M011: the schedule runs the application's forward_step and
   loss_func), launched as a program under mpirun (never Criterion under mpirun).

   The facts of fixed-nonce runs are checked against expectations computed here, not by the
   library: the layout (default order tp-cp-ep-dp-pp, rank = dp + 2 pp on PP=2 x DP=2),
   M = GBS / (MBS x DP), 1F1B's op order from its definition (warmup = P - stage - 1 forwards,
   then one forward and one backward, then the remaining backwards), Megatron's sampler (DP rank
   d reads samples n * DP + d), the backward seed 1 / (tokens x M), and each fault's expected
   symptoms. Also: worlds the lab cannot use, the fault hook missing from ordinary library
   builds, the empty sheet's score, the reference answers' scores, and a learner's edit of
   labs/lab11_task.c (the lab still runs, checks and grades). */
#include <criterion/criterion.h>

#include <limits.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define RUN_LIMIT_S 120.0
#define GBS 8
#define MBS 1
#define SEQ 8

LS_LAB_SUITE(lab11, OUT_CAP, 300);

/* ---------------------------------------------------------------------------------------------
   helpers */

static int rank_int(const cJSON *obj, const char *dotted, int rank) {
    char key[160];
    snprintf(key, sizeof key, "%s.rank%d", dotted, rank);
    return ls_geti(obj, key);
}

/* Runs ./lab11 (or another build) on np ranks with the sheet and results in the temp dir. */
static int run_lab(const char *binary, int np, const char *sheet, const char *extra,
                   cJSON **doc) {
    char cmd[1024], res[256];
    snprintf(res, sizeof res, "%s/results/lab11.json", tmp_dir);
    snprintf(cmd, sizeof cmd, "%s --answers '%s' --results '%s' %s", binary, sheet, res,
             extra ? extra : "");
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    if (doc != NULL) *doc = mc_test_json_load(res);
    return rc;
}

/* 1F1B on stage s of P for M micro-batches, from its definition: "F0 F1 B0 ...". */
static void one_f_one_b(int P, int s, int M, char *buf, size_t cap) {
    int warmup = P - s - 1 < M ? P - s - 1 : M, f = 0, b = 0;
    size_t used = 0;
    buf[0] = '\0';
#define L11T_OP(kind, id) used += (size_t)snprintf(buf + used, cap - used, "%s%c%d", used ? " " : "", kind, id)
    for (int i = 0; i < warmup; i++) L11T_OP('F', f++);
    for (int i = 0; i < M - warmup; i++) {
        L11T_OP('F', f++);
        L11T_OP('B', b++);
    }
    while (b < M) L11T_OP('B', b++);
#undef L11T_OP
}

/* The trace of a rank with micro-batch `drop` removed (-1: none) and the ids shifted. */
static void trace_without(int P, int s, int M, int drop, char *buf, size_t cap) {
    char base[512];
    one_f_one_b(P, s, M - 1, base, sizeof base);
    size_t used = 0;
    buf[0] = '\0';
    char *save = NULL;
    for (char *op = strtok_r(base, " ", &save); op != NULL; op = strtok_r(NULL, " ", &save)) {
        int id = atoi(op + 1);
        if (id >= drop) id++;
        used += (size_t)snprintf(buf + used, cap - used, "%s%c%d", used ? " " : "", op[0], id);
    }
}

static void expect_trace(const cJSON *doc, const char *run, int rank, const char *want) {
    char key[128];
    snprintf(key, sizeof key, "facts.%s.trace.rank%d", run, rank);
    const char *have = ls_get(doc, key)->valuestring;
    cr_expect_str_eq(have, want, "%s: %s, expected %s", key, have, want);
}

/* The sample ids DP rank d reads in the first `n` micro-batch steps (MBS 1, DP 2). */
static void expect_samples(const cJSON *list, int d, int n, const char *what) {
    cr_assert_eq(cJSON_GetArraySize(list), n, "%s: %d samples, expected %d", what,
                 cJSON_GetArraySize(list), n);
    for (int i = 0; i < n; i++)
        cr_expect_eq(cJSON_GetArrayItem(list, i)->valueint, i * 2 + d, "%s[%d]", what, i);
}

static void expect_losses_match(const cJSON *doc, const char *run) {
    char a[96], b[96];
    snprintf(a, sizeof a, "facts.%s.loss", run);
    snprintf(b, sizeof b, "facts.%s.single_rank_loss", run);
    const cJSON *x = ls_get(doc, a), *y = ls_get(doc, b);
    cr_assert_eq(cJSON_GetArraySize(x), cJSON_GetArraySize(y));
    for (int i = 0; i < cJSON_GetArraySize(x); i++) {
        double p = cJSON_GetArrayItem(x, i)->valuedouble, q = cJSON_GetArrayItem(y, i)->valuedouble;
        cr_expect(fabs(p - q) <= 1e-5 * fabs(q), "%s iteration %d: %.7g vs single rank %.7g", run,
                  i + 1, p, q);
    }
}

/* ---------------------------------------------------------------------------------------------
   the default run: world 4 = PP 2 x DP 2 */

Test(lab11, default_run_measures_the_contract_the_second_task_and_three_faults) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/answers/lab11.md", tmp_dir);   /* missing: written */
    cJSON *doc = NULL;
    double t0 = mc_test_now();
    int rc = run_lab("./lab11", 4, sheet, "--nonce 5e1109", &doc);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "lab11 exited %d\n%s", rc, out);
    cr_assert_not_null(doc, "no results\n%s", out);
    cr_expect(secs < 60.0, "the default run took %.1f s", secs);
    cr_expect(mc_test_contains(out, "A. The callback contract"), "%s", out);
    cr_expect(mc_test_contains(out, "diagnosis from the symptoms: recipe"), "%s", out);

    const int P = 2, DP = 2, M = GBS / (MBS * DP), world = P * DP;
    cr_expect_eq(ls_geti(doc, "facts.num_microbatches"), M);
    cr_expect_eq(ls_geti(doc, "facts.batch.calculator_num_microbatches"), M);
    cr_expect_eq(ls_geti(doc, "facts.batch.gbs_over_mbs"), GBS / MBS);
    char key[128], want[512];
    for (int r = 0; r < world; r++) {
        int stage = r / DP, d = r % DP, last = stage == P - 1;
        snprintf(key, sizeof key, "facts.layers.rank%d", r);
        const cJSON *layers = ls_get(doc, key);
        cr_expect_eq(cJSON_GetArraySize(layers), 2);
        cr_expect_eq(cJSON_GetArrayItem(layers, 0)->valueint, 2 * stage);
        cr_expect_eq(rank_int(doc, "facts.stage_of_rank", r), stage);
        /* A: forward_step everywhere, the loss on the last stage only */
        cr_expect_eq(rank_int(doc, "facts.clean.forward_step_calls", r), M, "rank %d", r);
        cr_expect_eq(rank_int(doc, "facts.clean.backward_calls", r), M, "rank %d", r);
        cr_expect_eq(rank_int(doc, "facts.clean.loss_func_calls", r), last ? M : 0, "rank %d", r);
        cr_expect_eq(rank_int(doc, "facts.clean.warmup", r), P - stage - 1, "rank %d", r);
        cr_expect_eq(rank_int(doc, "facts.clean.batches_read", r), M, "rank %d", r);
        one_f_one_b(P, stage, M, want, sizeof want);
        expect_trace(doc, "clean", r, want);
        snprintf(key, sizeof key, "facts.clean.samples.rank%d", r);
        expect_samples(ls_get(doc, key), d, M, key);
        /* B: the same schedule */
        expect_trace(doc, "second_task", r, want);
        cr_expect_eq(rank_int(doc, "facts.second_task.loss_func_calls", r), last ? M : 0);
        /* C: library - micro-batch (probe 2) mod M dropped on every stage */
        trace_without(P, stage, M, 2 % M, want, sizeof want);
        expect_trace(doc, "faults.library", r, want);
        snprintf(key, sizeof key, "facts.faults.library.samples.rank%d", r);
        expect_samples(ls_get(doc, key), d, M - 1, key);   /* the iterator is read M - 1 times */
        /* recipe: M = GBS / MBS, the schedule still follows its table */
        one_f_one_b(P, stage, GBS / MBS, want, sizeof want);
        expect_trace(doc, "faults.recipe", r, want);
        snprintf(key, sizeof key, "facts.faults.recipe.samples.rank%d", r);
        expect_samples(ls_get(doc, key), d, GBS / MBS, key);
        one_f_one_b(P, stage, M, want, sizeof want);
        expect_trace(doc, "faults.data", r, want);
    }
    cr_expect_float_eq(ls_getd(doc, "facts.clean.seed_scale"), 1.0 / (SEQ * MBS * M), 1e-9);
    cr_expect(ls_getb(doc, "facts.clean.trace_matches_table"));
    cr_expect(ls_getb(doc, "facts.clean.matches_single_rank"));
    expect_losses_match(doc, "clean");
    cr_expect_eq(ls_getd(doc, "facts.clean.schedule_param_change"), 0.0);
    cr_expect_gt(ls_getd(doc, "facts.clean.optimizer_step_param_change"), 0.0);
    cr_expect_str_eq(ls_get(doc, "facts.clean.who_steps_optimizer")->valuestring, "application");
    cr_expect_str_eq(ls_get(doc, "facts.clean.diagnosis")->valuestring, "none");
    /* training lowers the held-out loss below ln V */
    cr_expect_lt(ls_getd(doc, "facts.clean.eval_loss_aligned_labels"), log(32.0) - 0.2);

    cr_expect(ls_getb(doc, "facts.second_task.same_schedule_function"));
    cr_expect(ls_getb(doc, "facts.second_task.trace_identical"));
    cr_expect(ls_getb(doc, "facts.second_task.calls_identical"));
    cr_expect(ls_getb(doc, "facts.second_task.loss_differs"));
    cr_expect(ls_getb(doc, "facts.second_task.matches_single_rank"));
    expect_losses_match(doc, "second_task");
    cr_expect_gt(fabs(cJSON_GetArrayItem(ls_get(doc, "facts.second_task.loss"), 0)->valuedouble -
                      cJSON_GetArrayItem(ls_get(doc, "facts.clean.loss"), 0)->valuedouble), 1e-4);

    /* the library fault: M - 1 calls, a hole in the ids, a result the single rank disagrees with */
    cr_expect_eq(ls_geti(doc, "facts.faults.library.forward_calls"), M - 1);
    cr_expect_eq(ls_geti(doc, "facts.faults.library.dropped_microbatch"), 2 % M);
    cr_expect_eq(
        cJSON_GetArrayItem(ls_get(doc, "facts.faults.library.missing_microbatches"), 0)->valueint,
        2 % M);
    cr_expect_not(ls_getb(doc, "facts.faults.library.trace_matches_table"));
    cr_expect_not(ls_getb(doc, "facts.faults.library.matches_single_rank"));
    cr_expect_eq(ls_geti(doc, "facts.faults.library.samples_per_iteration"), (M - 1) * MBS * DP);
    cr_expect_str_eq(ls_get(doc, "facts.faults.library.class")->valuestring, "library");
    /* the recipe fault: the library did what it was told, on twice the global batch */
    cr_expect_eq(ls_geti(doc, "facts.faults.recipe.forward_calls"), GBS / MBS);
    cr_expect(ls_getb(doc, "facts.faults.recipe.trace_matches_table"));
    cr_expect(ls_getb(doc, "facts.faults.recipe.matches_single_rank"));
    cr_expect_eq(ls_geti(doc, "facts.faults.recipe.samples_per_iteration"), GBS * DP);
    cr_expect_str_eq(ls_get(doc, "facts.faults.recipe.class")->valuestring, "recipe");
    /* the data fault: structurally clean, equal to the single rank, caught by the data check */
    cr_expect_eq(ls_geti(doc, "facts.faults.data.forward_calls"), M);
    cr_expect(ls_getb(doc, "facts.faults.data.trace_matches_table"));
    cr_expect(ls_getb(doc, "facts.faults.data.matches_single_rank"));
    cr_expect_gt(ls_geti(doc, "facts.faults.data.label_check_failures"), 0);
    cr_expect_eq(ls_geti(doc, "facts.clean.label_check_failures"), 0);
    cr_expect_gt(ls_getd(doc, "facts.faults.data.eval_loss_aligned_labels"),
                 ls_getd(doc, "facts.clean.eval_loss_aligned_labels"));
    cr_expect_str_eq(ls_get(doc, "facts.faults.data.class")->valuestring, "data");

    /* the follow-up of nonce 5e1109: F2 (recipe), probe rank 2 = stage 1, DP rank 0 */
    cr_expect_str_eq(ls_get(doc, "facts.followup.variant")->valuestring, "F2");
    cr_expect_eq(ls_geti(doc, "facts.followup.probe_rank"), 2);
    cr_expect_eq(ls_geti(doc, "facts.followup.probe_warmup"), 0);
    cr_expect_eq(ls_geti(doc, "facts.followup.probe_forward_calls"), GBS / MBS);
    cr_expect_eq(ls_geti(doc, "facts.followup.probe_loss_calls"), GBS / MBS);
    expect_samples(ls_get(doc, "facts.followup.probe_samples"), 0, GBS / MBS, "probe_samples");
    cr_expect_str_eq(ls_get(doc, "facts.followup.fix_side")->valuestring, "application");

    /* the empty sheet the run wrote scores (almost) nothing and says what to do next */
    double total = ls_total_score(out);
    cr_expect(total >= 0.0 && total <= 0.5, "empty sheet scored %.2f\n%s", total, out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);
    cJSON_Delete(doc);
}

/* Variants F1 (library, probe 1 on stage 0) and F3 (data, probe 3 on the last stage). */
Test(lab11, followup_variants_read_the_probe_rank_view_of_their_fault) {
    static const struct {
        const char *nonce, *variant, *fix;
        int probe, forward, loss, n_samples;
    } cases[] = {{"5e1100", "F1", "library", 1, 3, 0, 3}, {"5e1106", "F3", "application", 3, 4, 4, 4}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sheet[256], extra[64];
        snprintf(sheet, sizeof sheet, "%s/%s.md", tmp_dir, cases[i].nonce);
        snprintf(extra, sizeof extra, "--nonce %s", cases[i].nonce);
        cJSON *doc = NULL;
        int rc = run_lab("./lab11", 4, sheet, extra, &doc);
        cr_assert_eq(rc, 0, "lab11 --nonce %s exited %d\n%s", cases[i].nonce, rc, out);
        cr_assert_not_null(doc);
        cr_expect_str_eq(ls_get(doc, "facts.followup.variant")->valuestring, cases[i].variant);
        cr_expect_eq(ls_geti(doc, "facts.followup.probe_rank"), cases[i].probe);
        cr_expect_eq(ls_geti(doc, "facts.followup.probe_forward_calls"), cases[i].forward);
        cr_expect_eq(ls_geti(doc, "facts.followup.probe_loss_calls"), cases[i].loss);
        cr_expect_eq(ls_geti(doc, "facts.followup.probe_warmup"), cases[i].probe < 2 ? 1 : 0);
        expect_samples(ls_get(doc, "facts.followup.probe_samples"), cases[i].probe % 2,
                       cases[i].n_samples, cases[i].nonce);
        cr_expect_str_eq(ls_get(doc, "facts.followup.fix_side")->valuestring, cases[i].fix);
        /* the library fault drops the probe's micro-batch id */
        cr_expect_eq(ls_geti(doc, "facts.faults.library.dropped_microbatch"), cases[i].probe % 4);
        cJSON_Delete(doc);
    }
}

/* PP = 4 on the same ranks: stages in between read no data; the recipe fault needs DP > 1. */
Test(lab11, four_stages_show_middle_stages_that_read_nothing) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/pp4.md", tmp_dir);
    cJSON *doc = NULL;
    int rc = run_lab("./lab11", 4, sheet, "--pp 4 --nonce 5e1109", &doc);
    cr_assert_eq(rc, 0, "lab11 --pp 4 exited %d\n%s", rc, out);
    cr_assert_not_null(doc);
    const int M = GBS / MBS;
    char want[512];
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(rank_int(doc, "facts.clean.forward_step_calls", r), M);
        cr_expect_eq(rank_int(doc, "facts.clean.batches_read", r), (r == 0 || r == 3) ? M : 0,
                     "rank %d", r);
        cr_expect_eq(rank_int(doc, "facts.clean.loss_func_calls", r), r == 3 ? M : 0);
        one_f_one_b(4, r, M, want, sizeof want);
        expect_trace(doc, "clean", r, want);
    }
    cr_expect(ls_getb(doc, "facts.clean.matches_single_rank"));
    cr_expect(cJSON_GetObjectItemCaseSensitive(ls_get(doc, "facts.faults"), "recipe") == NULL,
              "the recipe fault is not injected at DP = 1");
    cr_expect(mc_test_contains(out, "[recipe] skipped"), "%s", out);
    cJSON_Delete(doc);
}

/* ---------------------------------------------------------------------------------------------
   refusals */

Test(lab11, worlds_and_flags_it_cannot_use_exit_2_with_the_rule) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/x.md", tmp_dir);
    int rc = run_lab("./lab11", 6, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 6 (DP 3) exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "divisible") && mc_test_contains(out, "DP=3"), "%s", out);
    rc = run_lab("./lab11", 3, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 3 exited %d\n%s", rc, out);
    rc = run_lab("./lab11", 4, sheet, "--pp 1", NULL);
    cr_expect_eq(rc, 2, "pp 1 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs pp >= 2"), "%s", out);
    rc = run_lab("./lab11", 4, sheet, "--iters 0", NULL);
    cr_expect_eq(rc, 2, "--iters 0 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "--iters between 1 and 32 (got '0')"), "%s", out);
    rc = run_lab("./lab11", 8, sheet, "--tp 2", NULL);
    cr_expect_eq(rc, 2, "tp 2 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "tp=cp=ep=1"), "%s", out);
}

/* The fault hook exists only in the library build lab11 links. */
Test(lab11, ordinary_library_builds_compile_the_fault_hook_out) {
    int rc = mc_test_run("nm build/mc_impl.o | grep -c mc_fault_schedule_drop_microbatch", 30,
                         out, OUT_CAP);
    cr_expect_neq(rc, 0, "the ordinary build exports the fault hook:\n%s", out);
    rc = mc_test_run("nm build/mc_impl_faults.o | grep -c ' T mc_fault_schedule_drop_microbatch'",
                     30, out, OUT_CAP);
    cr_expect_eq(rc, 0, "build/mc_impl_faults.o lacks the fault hook:\n%s", out);
}

/* ---------------------------------------------------------------------------------------------
   grading */

static void expect_reference_scores(const char *ref) {
    char sheet[256], cmd[512];
    snprintf(sheet, sizeof sheet, "%s/ref.md", tmp_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/results'", tmp_dir);
    cr_assert_eq(system(cmd), 0);
    char *text = ls_read_file(ref);
    cr_assert_not_null(text, "missing %s", ref);
    ls_write_file(sheet, text);   /* the run reads the nonce from its header and locks its preds */
    free(text);
    int rc = run_lab("./lab11", 4, sheet, NULL, NULL);
    cr_assert_eq(rc, 0, "lab11 on %s exited %d\n%s", ref, rc, out);
    double total = ls_total_score(out);
    cr_expect_geq(total, 14.0, "%s scored %.2f/15\n%s", ref, total, out);
    cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions not locked\n%s", ref, out);
    cr_expect(mc_test_contains(out, "no misconception fired"), "%s\n%s", ref, out);
}

Test(lab11, reference_answers_score_at_least_14) {
    expect_reference_scores("answers/reference/lab11.md");
    expect_reference_scores("answers/reference/lab11.zh.md");
}

/* Predictions written after the first run for a nonce earn nothing. */
Test(lab11, predictions_filled_after_the_first_run_earn_nothing) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/late.md", tmp_dir);
    int rc = run_lab("./lab11", 4, sheet, "--nonce 5e1109", NULL);   /* locks the empty preds */
    cr_assert_eq(rc, 0, "%s", out);
    char *ref = ls_read_file("answers/reference/lab11.md");
    cr_assert_not_null(ref);
    ls_write_file(sheet, ref);
    free(ref);
    rc = run_lab("./lab11", 4, sheet, "--nonce 5e1109", NULL);
    cr_assert_eq(rc, 0, "%s", out);
    double total = ls_total_score(out);
    cr_expect(total > 5.0 && total <= 15.0 - 4.0, "late predictions: %.2f/15\n%s", total, out);
    cr_expect(mc_test_contains(out, "not predicted before the first run"), "%s", out);
}

/* ---------------------------------------------------------------------------------------------
   a learner's edit of labs/lab11_task.c */

Test(lab11, an_edited_task_file_still_runs_checks_and_grades) {
    if (access("build/megatron_c_cuda.o", F_OK) == 0)
        cr_skip_test("a CUDA build: this test compiles the CPU link line only");
    char edited[PATH_MAX], binary[PATH_MAX], cmd[3 * PATH_MAX];
    snprintf(edited, sizeof edited, "%s/lab11_task.c", tmp_dir);
    snprintf(binary, sizeof binary, "%s/lab11_edited", tmp_dir);
    /* the learner's change: task "prev" predicts the token two steps back instead of one */
    ls_write_edited("labs/lab11_task.c", "b.tokens[(s > 0 ? s - 1 : 0) * B + j]",
                    "b.tokens[(s > 1 ? s - 2 : 0) * B + j]", edited);
    snprintf(cmd, sizeof cmd,
             "mpicc -std=c11 -O2 -I. -Ilabs -D_GNU_SOURCE -I/usr/include/cjson -DMC_COMM_MPI "
             "-DMC_FAULT_HOOKS labs/lab11.c '%s' build/mc_impl_faults.o build/lab_common.o "
             "build/lab_driver.o build/lab_svg.o build/grader.o -o '%s' -lcjson -lcmark "
             "-lunistring -lm %s", edited, binary, ls_fast_libs());
    int rc = mc_test_run(cmd, 120, out, OUT_CAP);
    cr_assert_eq(rc, 0, "the edited task does not build:\n%s", out);

    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/edited.md", tmp_dir);
    cJSON *edited_doc = NULL, *orig = NULL;
    rc = run_lab(binary, 4, sheet, "--nonce 5e1109", &edited_doc);
    cr_assert_eq(rc, 0, "the edited lab exited %d\n%s", rc, out);
    cr_expect(ls_total_score(out) >= 0.0, "the edited lab did not grade\n%s", out);
    cr_assert_not_null(edited_doc);
    rc = run_lab("./lab11", 4, sheet, "--nonce 5e1109", &orig);
    cr_assert_eq(rc, 0, "%s", out);
    /* the schedule did not change, the task did, and both still equal their single-rank runs */
    for (int r = 0; r < 4; r++) {
        char key[96];
        snprintf(key, sizeof key, "facts.second_task.trace.rank%d", r);
        cr_expect_str_eq(ls_get(edited_doc, key)->valuestring, ls_get(orig, key)->valuestring);
    }
    cr_expect(ls_getb(edited_doc, "facts.second_task.matches_single_rank"));
    cr_expect(ls_getb(edited_doc, "facts.second_task.trace_identical"));
    double a = cJSON_GetArrayItem(ls_get(edited_doc, "facts.second_task.loss"), 1)->valuedouble;
    double b = cJSON_GetArrayItem(ls_get(orig, "facts.second_task.loss"), 1)->valuedouble;
    cr_expect_gt(fabs(a - b), 1e-4, "the edit changed nothing: %.6f vs %.6f", a, b);
    cJSON_Delete(edited_doc);
    cJSON_Delete(orig);
}
