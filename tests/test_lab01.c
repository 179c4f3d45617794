/* tests/test_lab01.c - lab01 (M001): the recipe, the core-API script and the fused backend.

   ./lab01 runs as a program under mpirun (mc_test_mpirun), never under Criterion's own process.
   Its facts are checked against what this file works out by itself from the lab's documented
   model (4 layers, 4 micro-batches of 4 x 64 tokens, 2 iterations, byte vocabulary):
     - op counts per rank from the model's structure: 4 linears forward and 8 GEMMs backward
       per layer (with TP > 1 two more forward: the row-parallel biases, added after the TP
       all-reduce), the output layer's 3 GEMMs on the last stage, one attention op per layer and
       micro-batch, two embeddings on the first stage, 2 LayerNorms per layer (+ the final one on
       the last stage), one AdamW op per step;
     - the first loss of a freshly initialised model (std 0.02) is close to ln(256);
     - the recipe and the script run the same arithmetic: equal losses; the fused table only
       changes the GEMM's summation order: equal to the reference within 1e-4;
     - the loop owner is the file that called mc_optimizer_step.
   Also: the worlds it refuses (exit 2 with the rule), the empty sheet's score, a sheet of
   misconceptions, and the two reference answers graded from real runs. */
#include <criterion/criterion.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "labs/grader.h"
#include "labs/lab_common.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)

/* The lab's model, as its header comment documents it. */
enum { LAYERS = 4, SEQ = 64, MICRO_BATCH = 4, MICROBATCHES = 4, ITERS = 2, VOCAB = 256 };

LS_LAB_SUITE(lab01, OUT_CAP, 240);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* ./lab01 `args` on np ranks, results in the temp dir; the run must exit 0. */
static cJSON *run_lab(int np, const char *args, const char *sheet) {
    char cmd[1024], res[160];
    snprintf(res, sizeof res, "%s/results/lab01.json", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab01 %s --answers '%s' --results '%s'", args, sheet, res);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(np, cmd, 220, out, OUT_CAP);
    cr_log_info("lab01 -np %d %s: %.1f s", np, args, mc_test_now() - t0);
    cr_assert_eq(rc, 0, "lab01 -np %d %s exited %d:\n%s", np, args, rc, out);
    cJSON *doc = mc_test_json_load(res);
    cr_assert_not_null(doc, "%s is missing or not JSON", res);
    return doc;
}

/* The count of one backend op in a path's probe-rank trace (0 when absent). */
static double op_count(const cJSON *doc, const char *path, const char *op) {
    char key[128];
    snprintf(key, sizeof key, "facts.paths.%s.backend_ops", path);
    cJSON *v = cJSON_GetObjectItemCaseSensitive(ls_get(doc, key), op);
    return v != NULL ? v->valuedouble : 0.0;
}

/* The count of the edge caller -> callee in a path's probe-rank trace (0 when absent). */
static double edge_count(const cJSON *doc, const char *path, const char *from, const char *to) {
    char key[128];
    snprintf(key, sizeof key, "facts.paths.%s.edges", path);
    const cJSON *e;
    cJSON_ArrayForEach(e, ls_get(doc, key)) {
        if (!strcmp(ls_gets(e, "from"), from) && !strcmp(ls_gets(e, "to"), to))
            return ls_getd(e, "n");
    }
    return 0.0;
}

static const char *const paths[] = {"recipe", "core_api", "fused"};

/* The op counts of the probe rank against the model's structure, in every path. */
static void expect_structure(const cJSON *doc, int pp) {
    int probe = (int)ls_getd(doc, "probe_rank"), tp = (int)ls_getd(doc, "config.tp");
    int stage = probe / (tp * ((int)ls_getd(doc, "config.world") / (tp * pp)));   /* PP outermost */
    int layers = LAYERS / pp, first = stage == 0, last = stage == pp - 1;
    double mb = (double)ITERS * MICROBATCHES;
    cr_expect_eq((int)ls_getd(doc, "facts.probe_stage"), stage);
    for (int p = 0; p < 3; p++) {
        const char *k = paths[p];
        cr_expect_eq(op_count(doc, k, "gemm"), mb * ((12 + 2 * (tp > 1)) * layers + 3 * last),
                     "%s gemm", k);
        cr_expect_eq(op_count(doc, k, "attention_forward"), mb * layers, "%s attention", k);
        cr_expect_eq(op_count(doc, k, "attention_backward"), mb * layers, "%s attention", k);
        cr_expect_eq(op_count(doc, k, "layernorm_forward"), mb * (2 * layers + last), "%s ln", k);
        cr_expect_eq(op_count(doc, k, "embedding_forward"), mb * 2 * first, "%s embedding", k);
        cr_expect_eq(op_count(doc, k, "cross_entropy_loss"), mb * last, "%s loss", k);
        cr_expect_eq(op_count(doc, k, "adamw"), ITERS, "%s: one AdamW op per step", k);
        char key[96];
        snprintf(key, sizeof key, "facts.paths.%s.world.ops_outside_core", k);
        cr_expect_eq(ls_getd(doc, key), 0, "%s: every backend op ran inside a core call", k);
    }
}

/* Losses: recipe == script bit for bit, everything against the single-rank reference. */
static void expect_losses(const cJSON *doc, int tp) {
    const cJSON *ref = ls_get(doc, "facts.loss.reference");
    cr_assert_eq(cJSON_GetArraySize(ref), ITERS);
    for (int it = 0; it < ITERS; it++) {
        double want = cJSON_GetArrayItem(ref, it)->valuedouble, l[3];
        for (int p = 0; p < 3; p++) {
            char key[64];
            snprintf(key, sizeof key, "facts.paths.%s.loss", paths[p]);
            l[p] = cJSON_GetArrayItem(ls_get(doc, key), it)->valuedouble;
            cr_expect(fabs(l[p] - want) <= 1e-4 * fabs(want), "%s iteration %d: %.17g vs the "
                      "reference %.17g", paths[p], it + 1, l[p], want);
        }
        cr_expect_eq(l[0], l[1], "iteration %d: the recipe and the script give one loss", it + 1);
        if (it == 0 && tp == 1)   /* a forward over whole layers: the same sums, in order */
            cr_expect_eq(l[1], want, "iteration 1 equals the single-rank reference exactly");
    }
    double first = cJSON_GetArrayItem(ref, 0)->valuedouble;
    cr_expect(fabs(first - log((double)VOCAB)) < 0.1, "a fresh model's loss %.4f is near ln(%d)",
              first, VOCAB);
    cr_expect_str_eq(ls_gets(doc, "facts.loss_recipe_vs_core"), "identical");
    cr_expect_str_neq(ls_gets(doc, "facts.loss_core_vs_fused"), "different");
}

/* Who called the optimizer step, the schedule and the hooks. */
static void expect_ownership(const cJSON *doc, const char *schedule) {
    cr_expect_str_eq(ls_gets(doc, "facts.loop_owner.recipe"), "recipe");
    cr_expect_str_eq(ls_gets(doc, "facts.loop_owner.core_api"), "script");
    cr_expect_str_eq(ls_gets(doc, "facts.loop_owner.fused"), "script");
    cr_expect_str_eq(ls_gets(doc, "facts.paths.recipe.loop_site"), "pretrain_gpt.c:train");
    cr_expect_str_eq(ls_gets(doc, "facts.paths.core_api.loop_site"), "lab01.c:lab01_script_train");
    cr_expect_eq(edge_count(doc, "recipe", "pretrain_gpt.c:train", "mc_optimizer_step"), ITERS);
    cr_expect_eq(edge_count(doc, "core_api", "lab01.c:lab01_script_train", "mc_optimizer_step"),
                 ITERS);
    cr_expect_eq(edge_count(doc, "recipe", schedule, "pretrain_gpt.c:hook_forward"),
                 ITERS * MICROBATCHES, "the schedule calls the recipe's forward hook");
    cr_expect_eq(edge_count(doc, "core_api", schedule, "lab01.c:lab01_script_forward"),
                 ITERS * MICROBATCHES, "the schedule calls the script's forward hook");
    cr_expect_eq(edge_count(doc, "recipe", "pretrain_gpt.c:main", "mc_comm_init_world"), 1,
                 "the recipe initialises its own world");
    cr_expect(ls_getb(doc, "facts.paths.recipe.recipe_entry"));
    cr_expect(!ls_getb(doc, "facts.paths.core_api.recipe_entry"));
    cr_expect(ls_getb(doc, "facts.recipe_calls_core"));
    cr_expect(ls_getb(doc, "facts.script_owns.data") && ls_getb(doc, "facts.script_owns.loop"));
    cr_expect(!ls_getb(doc, "facts.script_owns.model") &&
              !ls_getb(doc, "facts.script_owns.schedule") &&
              !ls_getb(doc, "facts.script_owns.optimizer"));
    for (int p = 0; p < 3; p++) {
        char key[64];
        snprintf(key, sizeof key, "facts.paths.%s.schedule", paths[p]);
        cr_expect_str_eq(ls_gets(doc, key), schedule);
    }
}

/* The accelerated table: with OpenBLAS built in, exactly the GEMMs of the fused path. */
static void expect_backend(const cJSON *doc) {
#if defined(MC_WITH_CBLAS)
    cr_expect_str_eq(ls_gets(doc, "facts.fused_backend.table"), "cpu-cblas");
    cr_expect_str_eq(ls_gets(doc, "facts.fused_backend.accelerated_op_names"), "gemm");
    cr_expect_eq(ls_getd(doc, "facts.paths.fused.accelerated_calls"),
                 ls_getd(doc, "facts.paths.fused.gemm_calls"));
    cr_expect_eq(ls_getd(doc, "facts.paths.fused.world.accelerated_calls"),
                 ls_getd(doc, "facts.paths.fused.world.gemm_calls"));
    cr_expect_str_eq(ls_gets(doc, "facts.fused_ops_in"), "fused");
#else
    cr_expect_str_eq(ls_gets(doc, "facts.fused_ops_in"), "none");
#endif
    cr_expect_eq(ls_getd(doc, "facts.paths.recipe.world.accelerated_calls"), 0);
    cr_expect_eq(ls_getd(doc, "facts.paths.core_api.world.accelerated_calls"), 0);
    cr_expect(ls_getb(doc, "facts.same_op_counts"));
    cr_expect_eq(ls_getd(doc, "facts.gemm_formula_mismatches"), 0);
}

/* ---------------------------------------------------------------------------------------------
   runs */

Test(lab01, default_run_traces_three_paths) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/answers/lab01.md", tmp_dir);   /* missing: the template */
    cJSON *doc = run_lab(2, "--nonce d00d42", sheet);
    const char *sections[] = {"== A. The recipe path", "== B. The core-API path",
                              "== C. The fused path", "== D. The single-rank reference",
                              "== E. Step time", "== Measured ==", " iteration        2/", 
                              "loop owner: recipe (pretrain_gpt.c:train called mc_optimizer_step"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        cr_expect(mc_test_contains(out, sections[i]), "no \"%s\" in:\n%s", sections[i], out);
    cr_expect_float_eq(mc_test_lab_total(out), 0.0, 1e-9, "the empty sheet scores 0:\n%s", out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);

    cr_expect_str_eq(ls_gets(doc, "lab"), "lab01");
    cr_expect_str_eq(ls_gets(doc, "question"), "M001");
    cr_expect_eq(ls_getd(doc, "config.world"), 2);
    cr_expect_eq(ls_getd(doc, "config.pp"), 2);
    cr_expect_eq(ls_getd(doc, "probe_rank"), 1);
    cr_expect_str_eq(ls_gets(doc, "followup_variant"), "F1");
    cr_expect(ls_getb(doc, "run.all_checks_held"), "%s", out);
    cr_expect_eq(ls_getd(doc, "facts.model.layers"), LAYERS);
    cr_expect_eq(ls_getd(doc, "facts.model.seq_length"), SEQ);
    cr_expect_eq(ls_getd(doc, "facts.model.global_batch"), MICRO_BATCH * MICROBATCHES);
    expect_structure(doc, 2);
    expect_losses(doc, 1);
    expect_ownership(doc, "forward_backward_pipelining_without_interleaving");
    expect_backend(doc);
    cr_expect_gt(ls_getd(doc, "facts.step_ms.core_api"), 0);
    cr_expect_gt(ls_getd(doc, "facts.step_ms.fused"), 0);
    cr_expect_str_eq(ls_gets(doc, "facts.followup.path"), "core_api");
    cr_expect_str_eq(ls_gets(doc, "facts.followup.experiment_kind"), "core_api");
    cr_expect(!ls_getb(doc, "facts.followup.fused_backend"));
    cr_expect(ls_getb(doc, "facts.followup.direct_calls.model") &&
              ls_getb(doc, "facts.followup.direct_calls.schedule") &&
              ls_getb(doc, "facts.followup.direct_calls.config"));
    /* the recipe read the script's tokens: one window of seq + 1 per sample, and one spare */
    struct stat sb;
    char tokens[160];
    snprintf(tokens, sizeof tokens, "%s/results/lab01.tokens.bin", tmp_dir);
    cr_assert_eq(stat(tokens, &sb), 0, "no %s", tokens);
    cr_expect_eq((long)sb.st_size, (long)ITERS * MICRO_BATCH * MICROBATCHES * SEQ + SEQ + 2);
    /* the sheet carries the follow-up of this nonce */
    char *text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    cr_expect(mc_test_contains(text, "here the project is the core-API path of this run"), "%s",
              text);
    free(text);
    cJSON_Delete(doc);
}

/* The other follow-up (the fused path), and other worlds: one rank without a pipeline, and
   TP=2 x PP=2 on four ranks (row-parallel sums: the reference agrees within tolerance). */
Test(lab01, other_variant_and_worlds) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/f2.md", tmp_dir);
    cJSON *doc = run_lab(2, "--nonce a1b2c3 --no-timing", sheet);
    cr_expect_str_eq(ls_gets(doc, "followup_variant"), "F2");
    cr_expect_str_eq(ls_gets(doc, "facts.followup.path"), "fused");
#if defined(MC_WITH_CBLAS)
    cr_expect_str_eq(ls_gets(doc, "facts.followup.experiment_kind"), "core_api_fused");
    cr_expect(ls_getb(doc, "facts.followup.fused_backend"));
#endif
    cr_expect(mc_test_json_at(doc, "facts.step_ms") == NULL, "--no-timing skips E");
    cJSON_Delete(doc);

    snprintf(sheet, sizeof sheet, "%s/one.md", tmp_dir);
    doc = run_lab(1, "--nonce d00d42 --pp 1 --no-timing", sheet);
    expect_structure(doc, 1);
    expect_losses(doc, 1);
    expect_ownership(doc, "forward_backward_no_pipelining");
    cJSON_Delete(doc);

    snprintf(sheet, sizeof sheet, "%s/four.md", tmp_dir);
    doc = run_lab(4, "--nonce d00d42 --tp 2 --no-timing", sheet);
    cr_expect_eq(ls_getd(doc, "config.tp"), 2);
    expect_structure(doc, 2);
    expect_losses(doc, 2);
    expect_backend(doc);
    cJSON_Delete(doc);
}

Test(lab01, worlds_it_cannot_use_exit_2_with_the_rule) {
    static const struct { int np; const char *args, *why; } bad[] = {
        {3, "", "needs world % (tp*pp*cp) == 0: got 3 ranks for tp=1 pp=2"},
        {4, "--cp 2 --pp 1", "cp=1 and ep=1 (pretrain_gpt has no context or expert"},
        {3, "--tp 3 --pp 1", "tp to divide the 4 attention heads: got tp=3"},
        {2, "--pp 2 --vpp 4", "pp x vpp to divide the 4 layers: got pp=2 vpp=4"},
        {10, "", "lab01 needs 1 to 8 ranks: got 10"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cmd[512], res[160];
        snprintf(res, sizeof res, "%s/r%zu.json", tmp_dir, i);
        snprintf(cmd, sizeof cmd, "./lab01 --nonce d00d42 %s --answers '%s/a.md' --results '%s'",
                 bad[i].args, tmp_dir, res);
        int rc = mc_test_mpirun(bad[i].np, cmd, 60, out, OUT_CAP);
        cr_expect_eq(rc, 2, "-np %d %s exited %d:\n%s", bad[i].np, bad[i].args, rc, out);
        cr_expect(mc_test_contains(out, bad[i].why), "-np %d %s: no \"%s\" in:\n%s", bad[i].np,
                  bad[i].args, bad[i].why, out);
        cr_expect_neq(access(res, F_OK), 0, "a refused world writes no results");
    }
}

/* Every library function the recipe calls is traced: labs/lab01.c defines a seam macro for each
   mc_* function that examples/pretrain_gpt.c and the pretrain_gpt_args.h it includes call (the
   error-text helpers aside), so a new call in the recipe shows up here instead of going
   untraced. */
Test(lab01, every_library_call_of_the_recipe_is_traced) {
    static const char *const recipe_files[] = {"examples/pretrain_gpt.c",
                                                "examples/pretrain_gpt_args.h"};
    char *lab = lab_read_text("labs/lab01.c", NULL);
    cr_assert_not_null(lab);
    int calls = 0;
    for (int f = 0; f < 2; f++) {
    char *recipe = lab_read_text(recipe_files[f], NULL);
    cr_assert_not_null(recipe, "missing %s", recipe_files[f]);
    for (const char *p = recipe; (p = strstr(p, "mc_")) != NULL; p += 3) {
        if (p > recipe && (p[-1] == '_' || isalnum((unsigned char)p[-1]))) continue;
        size_t n = 3;
        while (p[n] == '_' || isalnum((unsigned char)p[n])) n++;
        if (p[n] != '(') continue;   /* not a call */
        char name[96], macro[128];
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        if (!strcmp(name, "mc_err_name") || !strcmp(name, "mc_last_error")) continue;
        snprintf(macro, sizeof macro, "#define %s(...)", name);
        cr_expect(mc_test_contains(lab, macro), "%s calls %s, which lab01.c does not trace "
                  "(add \"%s\")", recipe_files[f], name, macro);
        calls++;
    }
    free(recipe);
    }
    cr_expect_gt(calls, 20, "the recipe's library calls were found (%d)", calls);
    free(lab);
}

/* ---------------------------------------------------------------------------------------------
   grading */

static const char misconceptions_sheet[] =
    "# lab01\n"
    "<!-- nonce: d00d42 ; probe_rank: 1 ; followup: F1 (generated by ./lab01 --init, do not "
    "edit) -->\n"
    "## Main question\n"
    "### M1 The three\n"
    "Megatron-Core runs the training loop and drives the iterations. Transformer Engine "
    "is part of Megatron-Core.\n"
    "### M3 Integration and debug responsibility\n"
    "Using Megatron means running pretrain_gpt.py. The fused path must give bit-identical "
    "losses.\n";

Test(lab01, misconceptions_cost_points) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/wrong.md", tmp_dir);
    cr_assert_eq(lab_write_text_atomic(misconceptions_sheet, sheet), 0);
    cJSON_Delete(run_lab(2, "--nonce d00d42 --no-timing", sheet));
    const char *fired[] = {"MC_MLM_RECIPE", "MC_CORE_LOOP", "MC_TE_IN_CORE", "MC_FUSED_EXACT"};
    for (size_t i = 0; i < sizeof fired / sizeof fired[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "[MISC] %s ", fired[i]);
        cr_expect(mc_test_contains(out, want), "%s did not fire:\n%s", fired[i], out);
    }
    cr_expect(mc_test_contains(out, "see NVIDIA/Megatron-LM #713"), "the citation is shown");
    double score = mc_test_lab_total(out);
    cr_expect(score >= 0 && score < 1.0, "score %.2f", score);
}

/* Grading means, not keywords: the right ideas under a denial, or as noun bullets with no
   verb, earn nothing (grading_design.md Part A0, 3 and 4); the same ideas stated in other
   words than the reference's still earn. */
static const char negated_sheet[] =
    "# lab01\n"
    "<!-- nonce: d00d42 ; probe_rank: 1 ; followup: F1 (generated by ./lab01 --init, do not "
    "edit) -->\n"
    "### M1 The three\n"
    "It is not true that Megatron-LM is the application layer that parses the arguments, "
    "builds the data and runs the training loop.\n"
    "A common misconception is that Megatron-Core is the reusable library with GPTModel, "
    "parallel_state and the pipeline schedules.\n"
    "It is wrong to say that Transformer Engine is the accelerated backend with fused "
    "kernels and FP8.\n"
    "### M2 The call picture\n"
    "It is not the case that the application calls the core and the core calls the backend "
    "ops.\n"
    "### M3 Responsibility\n"
    "It is false that \"we used Megatron\" has to say which one: the recipe, the core API or "
    "a parallel linear layer.\n"
    "### FU1\n"
    "That code does not call TransformerConfig, GPTModel or get_forward_backward_func "
    "itself.\n"
    "### FU2\n"
    "The script does not own the training loop.\n"
    "- TransformerConfig, GPTModel, get_forward_backward_func, parallel_state\n"
    "- schedule, micro-batches, inside one iteration\n"
    "### FU4\n"
    "- MCore API experiment, not Megatron-LM recipe, not TE, not FP8\n";

static const char paraphrased_followup[] =
    "# lab01\n"
    "<!-- nonce: d00d42 ; probe_rank: 1 ; followup: F1 (generated by ./lab01 --init, do not "
    "edit) -->\n"
    "### FU1\n"
    "The script builds a TransformerConfig and a GPTModel and gets the schedule from "
    "get_forward_backward_func.\n"
    "### FU2\n"
    "The loop is owned by the lab's script. Within an iteration the pipeline schedule "
    "interleaves the forward and backward passes of the micro-batches.\n"
    "### FU3\n"
    "这条路径没有经过 recipe。它的算子也没有用到加速后端。\n"
    "### FU4\n"
    "It would be an overclaim to call this a Megatron-LM recipe run.\n";

Test(lab01, denials_and_noun_bullets_earn_nothing) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/negated.md", tmp_dir);
    cr_assert_eq(lab_write_text_atomic(negated_sheet, sheet), 0);
    cJSON_Delete(run_lab(2, "--nonce d00d42 --no-timing", sheet));
    double score = mc_test_lab_total(out);
    cr_expect(score >= 0 && score < 0.5, "denied and verb-less ideas scored %.2f:\n%s", score,
              out);

    snprintf(sheet, sizeof sheet, "%s/paraphrased.md", tmp_dir);
    cr_assert_eq(lab_write_text_atomic(paraphrased_followup, sheet), 0);
    cJSON_Delete(run_lab(2, "--nonce d00d42 --no-timing", sheet));
    static const char *const earned[] = {"FU1.objects", "FU2.script_loop",
                                         "FU2.schedule_inside", "FU3.recipe", "FU3.fused_f1",
                                         "FU4.no_overclaim"};
    for (size_t i = 0; i < sizeof earned / sizeof earned[0]; i++) {
        char line[96];
        const char *at_line = strstr(out, earned[i]);
        cr_expect_not_null(at_line, "%s is not in the report:\n%s", earned[i], out);
        if (at_line == NULL) continue;
        snprintf(line, sizeof line, "%.*s", (int)strcspn(at_line, "\n"), at_line);
        cr_expect(strstr(line, "not found") == NULL, "%s was not earned: %s", earned[i], line);
    }
}

/* Each reference answer, graded from a real run of its own nonce (the run locks its
   predictions), scores at least 14 of 15 and fires no misconception. */
Test(lab01, reference_answers_score_at_least_14) {
    static const struct { const char *path, *nonce, *variant; } refs[] = {
        {"answers/reference/lab01.md", "d00d42", "F1"},
        {"answers/reference/lab01.zh.md", "a1b2c3", "F2"}};
    for (int i = 0; i < 2; i++) {
        char nonce[17], variant[8], args[64], results[128];
        int probe = -1;
        cr_assert_geq(gr_read_header(refs[i].path, nonce, &probe, variant), 0,
                      "%s has no sheet header", refs[i].path);
        cr_expect(!strcmp(nonce, refs[i].nonce) && !strcmp(variant, refs[i].variant),
                  "%s is written for nonce %s (%s), not %s (%s)", refs[i].path, refs[i].nonce,
                  refs[i].variant, nonce, variant);
        snprintf(results, sizeof results, "%s/results", tmp_dir);   /* a fresh ledger per sheet */
        mc_test_remove_dir(results);
        snprintf(args, sizeof args, "--nonce %s", refs[i].nonce);
        cJSON_Delete(run_lab(2, args, refs[i].path));
        double score = mc_test_lab_total(out);
        cr_expect_geq(score, 14.0, "%s scored %.2f:\n%s", refs[i].path, score, out);
        cr_expect(mc_test_contains(out, "no misconception fired"), "%s:\n%s", refs[i].path, out);
        cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions locked:\n%s",
                  refs[i].path, out);
    }
}
