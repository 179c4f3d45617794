/* tests/test_lab05.c - lab05 (M005: TransformerConfig is a contract).

   lab05 runs as a program under mpirun (mc_test_mpirun), never under Criterion's own process.
   Each run's facts are checked against expectations computed here, not copied from a run:
     - the validator's violation counts against this file's own reading of the rules;
     - #468's layer count and the padded vocabulary from their formulas;
     - the step count, the follow-up variant and the changed value from the nonce derivation;
     - the checkpoint's fingerprint against mc_gpt_config_math_fingerprint of the model;
     - the layout continuation against the uninterrupted run (and both against the run frozen
       in tests/fixtures/lab05/results.json), the forced math change against the tolerance.
   The grading tests score the reference answers and a few fixture sheets against the frozen
   results: the references >= 14, the empty sheet 0, misconceptions fire, negated truths,
   keyword lists and a copy of the prompts earn (almost) nothing for their text. */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "labs/grader.h"
#include "labs/lab_common.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define REF_NONCE "003039"   /* the reference answers' run: F2, probe rank 2 */

LS_LAB_SUITE(lab05, OUT_CAP, 0);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* Runs ./lab05 on np ranks with the nonce; results in tmp_dir/<tag>/results.json. */
static int run_lab(int np, const char *nonce, const char *tag, char *res, size_t cap) {
    char sheet[256], cmd[1024];
    snprintf(sheet, sizeof sheet, "%s/%s/sheet.md", tmp_dir, tag);
    snprintf(res, cap, "%s/%s/results.json", tmp_dir, tag);
    snprintf(cmd, sizeof cmd, "./lab05 --nonce %s --answers '%s' --results '%s'", nonce, sheet,
             res);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(np, cmd, 240, out, OUT_CAP);
    cr_log_info("lab05 -np %d --nonce %s took %.1f s", np, nonce, mc_test_now() - t0);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   expectations computed here */

/* The eight configurations of Experiment A as the answer sheet describes them. */
typedef struct rule_case {
    const char *name;
    int layers, hidden, heads, ffn, groups, seq, tp, pp, vpp, sp, full_recompute;
} rule_case;

static const rule_case cases[] = {
    {"baseline", 4, 64, 4, 256, 0, 32, 2, 2, 0, 0, 0},
    {"tp8_shapes", 12, 768, 12, 3004, 0, 1024, 8, 1, 0, 0, 0},
    {"mr468", 80, 8192, 64, 0, 0, 4096, 8, 16, 2, 0, 0},
    {"sp_no_tp", 12, 768, 12, 0, 0, 1024, 1, 1, 0, 1, 0},
    {"vpp_pp1", 12, 768, 12, 0, 0, 1024, 1, 1, 2, 0, 0},
    {"recompute_full", 12, 768, 12, 0, 0, 1024, 1, 1, 0, 0, 1},
    {"gqa", 24, 1024, 16, 0, 3, 1024, 2, 1, 0, 0, 0},
    {"combined", 30, 1024, 16, 0, 0, 1000, 3, 4, 0, 1, 0},
};

/* Megatron's rules (and this build's: no GQA), one count per violated rule. */
static int expected_violations(const rule_case *c) {
    int ffn = c->ffn ? c->ffn : 4 * c->hidden, groups = c->groups ? c->groups : c->heads;
    int n = 0;
    n += c->heads % c->tp != 0;
    n += ffn % c->tp != 0;
    n += groups != c->heads;                               /* no grouped-query attention */
    n += groups % c->tp != 0 && c->tp % groups != 0;       /* query groups against TP */
    n += c->layers % c->pp != 0;
    n += c->vpp > 0 && c->pp <= 1;
    n += c->vpp > 0 && c->layers % (c->pp * c->vpp) != 0;  /* Megatron-LM #468 */
    n += c->sp && c->tp <= 1;
    n += c->sp && c->tp > 1 && c->seq % c->tp != 0;
    n += c->full_recompute ? 2 : 0;                        /* no method, no layer count */
    return n;
}

static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static mc_gpt_config model_config(void) {
    mc_gpt_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = 4, c.hidden_size = 64, c.num_attention_heads = 4, c.ffn_hidden_size = 256;
    c.vocab_size = 256, c.seq_length = 32, c.micro_batch_size = 2;
    c.tensor_model_parallel_size = 2, c.pipeline_model_parallel_size = 2;
    return c;
}

static double max_rel(const cJSON *a, const cJSON *b) {
    int n = cJSON_GetArraySize(a);
    cr_assert_eq(n, cJSON_GetArraySize(b), "arrays of different lengths");
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        double x = cJSON_GetArrayItem(a, i)->valuedouble, y = cJSON_GetArrayItem(b, i)->valuedouble;
        double d = fabs(x - y) / fmax(fabs(y), 1e-30);
        if (!(d <= worst)) worst = d;
    }
    return worst;
}

/* What every successful run must show, whatever the nonce. */
static void expect_common_facts(const cJSON *doc, const char *nonce, int world, const char *res) {
    uint32_t h = fnv1a(nonce);
    int k1 = 12 + (int)((h >> 4) % 5), k2 = 3;
    cr_expect_str_eq(ls_gets(doc, "nonce"), nonce);
    cr_expect_eq((int)ls_getd(doc, "facts.world"), world);

    /* A */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char key[96];
        snprintf(key, sizeof key, "facts.validator.violations.%s", cases[i].name);
        cr_expect_eq((int)ls_getd(doc, key), expected_violations(&cases[i]),
                     "%s: measured %d, rules %d", cases[i].name, (int)ls_getd(doc, key),
                     expected_violations(&cases[i]));
    }
    cr_expect(ls_truth(doc, "facts.validator.mr468.pp_only_check_passes"), "80 %% 16 == 0");
    cr_expect_eq((int)ls_getd(doc, "facts.validator.mr468.layers_built_by_division"),
                 80 / (16 * 2) * 16 * 2);
    cr_expect_str_eq(ls_gets(doc, "facts.validator.mr468.num_layers_to_build"),
                     "MC_ERR_INVALID_DESC");
    const int tps[3] = {1, 2, 8};
    const char *keys[3] = {"facts.validator.padded_vocab.tp1", "facts.validator.padded_vocab.tp2",
                           "facts.validator.padded_vocab.tp8"};
    for (int i = 0; i < 3; i++) {
        int m = 128 * tps[i];
        cr_expect_eq((int)ls_getd(doc, keys[i]), (50257 + m - 1) / m * m, "%s", keys[i]);
    }

    /* B: the uninterrupted run and the checkpoint */
    const cJSON *u = ls_get(doc, "facts.training.uninterrupted_losses");
    cr_assert_eq(cJSON_GetArraySize(u), k1 + k2, "K1 + K2 = %d + %d losses", k1, k2);
    cr_expect_lt(cJSON_GetArrayItem(u, k1 - 1)->valuedouble, cJSON_GetArrayItem(u, 0)->valuedouble,
                 "the run trains");
    cr_expect_eq((int)ls_getd(doc, "facts.checkpoint.iteration"), k1);
    cr_expect_eq((int)ls_getd(doc, "facts.checkpoint.saved_tp"), 2);
    cr_expect_eq((int)ls_getd(doc, "facts.checkpoint.saved_pp"), 2);
    cr_expect_eq((int)ls_getd(doc, "facts.checkpoint.saved_dp"), world / 4);
    mc_gpt_config cfg = model_config();
    char hex[20];
    snprintf(hex, sizeof hex, "%016llx",
             (unsigned long long)mc_gpt_config_math_fingerprint(&cfg));
    cr_expect_str_eq(ls_gets(doc, "facts.checkpoint.math_fingerprint"), hex);
    /* the metadata on disk says the same */
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%.*s.ckpt", (int)(strlen(res) - 5), res);
    snprintf(path, sizeof path, "%s/%s", dir, MC_CKPT_LATEST_FILE);
    char *latest = lab_read_text(path, NULL);
    cr_assert_not_null(latest, "no %s", path);
    cr_expect_eq(atoi(latest), k1);
    free(latest);
    snprintf(path, sizeof path, "%s/iter_%07d/%s", dir, k1, MC_CKPT_METADATA_FILE);
    char *meta = lab_read_text(path, NULL);
    cr_assert_not_null(meta, "no %s", path);
    char line[64];
    snprintf(line, sizeof line, "\nmath_fingerprint %s\n", hex);
    cr_expect(mc_test_contains(meta, line), "%s lacks %s", path, line + 1);
    snprintf(line, sizeof line, "\nlayout tp 2 pp 2 dp %d ", world / 4);
    cr_expect(mc_test_contains(meta, line), "%s lacks %s", path, line + 1);
    free(meta);

    /* C: TP=1 PP=1 reference and the resharded continuation */
    cr_expect_leq(max_rel(ls_get(doc, "facts.training.tp1_reference_losses"), u), 1e-5);
    cr_expect_str_eq(ls_gets(doc, "facts.reload.layout.outcome"), "reshard");
    cr_expect(ls_truth(doc, "facts.reload.layout.resharded"));
    cr_expect_eq((int)ls_getd(doc, "facts.reload.layout.ranks"), world / 4);
    cr_expect_eq((int)ls_getd(doc, "facts.reload.layout.layout.tp"), 1);
    cr_expect_eq((int)ls_getd(doc, "facts.reload.layout.layout.pp"), 1);
    cr_expect_eq((int)ls_getd(doc, "facts.reload.layout.first_iteration"), k1 + 1);
    cJSON *tail = cJSON_CreateArray();
    for (int i = k1; i < k1 + k2; i++)
        cJSON_AddItemToArray(tail, cJSON_CreateNumber(cJSON_GetArrayItem(u, i)->valuedouble));
    cr_expect_leq(max_rel(ls_get(doc, "facts.reload.layout.losses"), tail), 1e-5,
                  "the resharded run continues on the uninterrupted losses");
    cr_expect_leq(ls_getd(doc, "facts.reload.layout.token_loss_max_abs_diff"), 1e-4);
    cr_expect(!ls_truth(doc, "facts.outcomes.layout_loss_moves"));

    /* D: the math change, refused then forced */
    cr_expect_str_eq(ls_gets(doc, "facts.reload.math.refused.outcome"), "refuse");
    cr_expect_str_eq(ls_gets(doc, "facts.reload.math.refused.status"), "MC_ERR_INVALID_DESC");
    cr_expect_str_eq(ls_gets(doc, "facts.reload.math.forced.outcome"), "allow");
    cr_expect(ls_truth(doc, "facts.reload.math.forced.math_mismatch_ignored"));
    cr_expect_gt(ls_getd(doc, "facts.reload.math.forced.max_rel_diff"), 1e-4,
                 "the forced loss moves");
    cr_expect_gt(ls_getd(doc, "facts.reload.math.forced.token_loss_mean_abs_diff"), 1e-3);
    cr_expect(ls_truth(doc, "facts.outcomes.math_forced_loss_moves"));
    cr_expect_str_eq(ls_gets(doc, "facts.reload.untie_forced.outcome"), "refuse");
    cr_expect(
        mc_test_contains(ls_gets(doc, "facts.reload.untie_forced.message"), "output_layer.weight"));

    /* E: full recompute */
    cr_expect_str_eq(ls_gets(doc, "facts.reload.perf.outcome"), "allow");
    cr_expect_leq(ls_getd(doc, "facts.reload.perf.max_rel_diff"), 1e-6);
    cr_expect(!ls_truth(doc, "facts.outcomes.perf_loss_moves"));
    cJSON_Delete(tail);
}

/* The variant's change as the nonce gives it: field, new value, the fields that differ. */
static void expect_math_change(const cJSON *doc, const char *nonce) {
    uint32_t h = fnv1a(nonce);
    int variant = 1 + (int)((h >> 16) % 3);
    char want_variant[4];
    snprintf(want_variant, sizeof want_variant, "F%d", variant);
    cr_expect_str_eq(ls_gets(doc, "facts.reload.math.variant"), want_variant);
    const char *msg = ls_gets(doc, "facts.reload.math.refused.message");
    if (variant == 1) {
        static const char *eps[3] = {"0.01", "0.03", "0.1"};
        cr_expect_str_eq(ls_gets(doc, "facts.reload.math.field"), "layernorm_epsilon");
        cr_expect_str_eq(ls_gets(doc, "facts.reload.math.to"), eps[(h >> 8) % 3]);
        cr_expect_eq((int)ls_getd(doc, "facts.reload.math.fields_named"), 1);
        cr_expect(mc_test_contains(msg, "layernorm_epsilon"), "%s", msg);
    } else if (variant == 2) {
        cr_expect_str_eq(ls_gets(doc, "facts.reload.math.field"), "num_attention_heads");
        cr_expect_str_eq(ls_gets(doc, "facts.reload.math.to"), (h >> 8) % 2 ? "8" : "2");
        cr_expect_eq((int)ls_getd(doc, "facts.reload.math.fields_named"), 3);
        cr_expect(mc_test_contains(msg, "num_attention_heads") &&
                      mc_test_contains(msg, "kv_channels") &&
                      mc_test_contains(msg, "num_query_groups"), "%s", msg);
    } else {
        cr_expect_str_eq(ls_gets(doc, "facts.reload.math.field"), "num_layers");
        cr_expect_str_eq(ls_gets(doc, "facts.reload.math.to"), "2");
        cr_expect_eq((int)ls_getd(doc, "facts.reload.math.fields_named"), 1);
        cr_expect(mc_test_contains(msg, "num_layers: 4 vs 2"), "%s", msg);
    }
}

/* ---------------------------------------------------------------------------------------------
   runs */

Test(lab05, default_world_reference_nonce, .timeout = 300) {
    char res[300];
    int rc = run_lab(4, REF_NONCE, "ref", res, sizeof res);
    cr_assert_eq(rc, 0, "lab05 -np 4 exited %d:\n%s", rc, out);
    const char *sections[] = {"== A.", "== B.", "== C.", "== D.", "== E.", "== Grading"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        cr_expect(mc_test_contains(out, sections[i]), "no section %s in:\n%s", sections[i], out);
    cr_expect(mc_test_contains(out, "Total 0.00/15"), "an empty sheet scores 0:\n%s", out);
    cJSON *doc = ls_load_json(res);
    expect_common_facts(doc, REF_NONCE, 4, res);
    expect_math_change(doc, REF_NONCE);
    /* the same run as the frozen one the reference answers quote */
    cJSON *frozen = ls_load_json("tests/fixtures/lab05/results.json");
    cr_expect_leq(max_rel(ls_get(doc, "facts.training.uninterrupted_losses"),
                          ls_get(frozen, "facts.training.uninterrupted_losses")), 1e-5);
    cr_expect_leq(max_rel(ls_get(doc, "facts.reload.math.forced.losses"),
                          ls_get(frozen, "facts.reload.math.forced.losses")), 1e-5);
    cr_expect_str_eq(ls_gets(doc, "facts.checkpoint.math_fingerprint"),
                     ls_gets(frozen, "facts.checkpoint.math_fingerprint"));
    cJSON_Delete(frozen);
    cJSON_Delete(doc);
}

Test(lab05, variants_f1_and_f3, .timeout = 400) {
    const char *nonces[] = {"00abf5", "00e9d3"};   /* F1 (eps 0.03), F3 */
    for (int i = 0; i < 2; i++) {
        char res[300], tag[16];
        snprintf(tag, sizeof tag, "v%d", i);
        int rc = run_lab(4, nonces[i], tag, res, sizeof res);
        cr_assert_eq(rc, 0, "lab05 --nonce %s exited %d:\n%s", nonces[i], rc, out);
        cJSON *doc = ls_load_json(res);
        expect_common_facts(doc, nonces[i], 4, res);
        expect_math_change(doc, nonces[i]);
        cJSON_Delete(doc);
    }
}

Test(lab05, world8_reloads_on_two_ranks, .timeout = 400) {
    char res[300];
    int rc = run_lab(8, REF_NONCE, "w8", res, sizeof res);
    cr_assert_eq(rc, 0, "lab05 -np 8 exited %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "sub-communicator of 2 ranks, DP=2"), "%s", out);
    cJSON *doc = ls_load_json(res);
    expect_common_facts(doc, REF_NONCE, 8, res);
    cr_expect_eq((int)ls_getd(doc, "facts.training.save_dp"), 2);
    cr_expect_eq((int)ls_getd(doc, "facts.reload.layout.layout.dp"), 2);
    /* the same global batch: the same losses as the 4-rank run frozen in the fixture */
    cJSON *frozen = ls_load_json("tests/fixtures/lab05/results.json");
    cr_expect_leq(max_rel(ls_get(doc, "facts.training.uninterrupted_losses"),
                          ls_get(frozen, "facts.training.uninterrupted_losses")), 1e-5);
    cJSON_Delete(frozen);
    cJSON_Delete(doc);
}

Test(lab05, worlds_it_cannot_use_exit_2, .timeout = 120) {
    struct {
        int np;
        const char *args, *says;
    } c[] = {
        {2, "", "lab05 needs 4 to 16 ranks: got 2; try mpirun -np 4"},
        {6, "", "needs world % (tp*pp*cp) == 0: got 6 ranks"},
        {12, "", "must split over DP = world / 4 = 3"},
        {4, "--tp 1 --pp 4", "it saves at TP=2 PP=2"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./lab05 %s --answers '%s/s.md' --results '%s/r.json'", c[i].args,
                 tmp_dir, tmp_dir);
        int rc = mc_test_mpirun(c[i].np, cmd, 60, out, OUT_CAP);
        cr_expect_eq(rc, LAB_EXIT_USAGE, "np %d %s: exit %d:\n%s", c[i].np, c[i].args, rc, out);
        cr_expect(mc_test_contains(out, c[i].says), "np %d: want \"%s\" in:\n%s", c[i].np,
                  c[i].says, out);
    }
}

Test(lab05, init_writes_the_variant_question, .timeout = 30) {
    char cmd[512], sheet[300];
    snprintf(sheet, sizeof sheet, "%s/init.md", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab05 --init --nonce 00e9d3 --answers '%s'", sheet);
    cr_assert_eq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "%s", out);
    char *text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    cr_expect(mc_test_contains(text, "<!-- nonce: 00e9d3 ; probe_rank: 2 ; followup: F3"), "%s",
              text);
    cr_expect(mc_test_contains(text, "num_layers changed from 4 to 2"), "F3's question: %s", text);
    cr_expect(!mc_test_contains(text, "{variant_question}") && !mc_test_contains(text, "{nonce}"));
    free(text);
}

/* ---------------------------------------------------------------------------------------------
   grading against the frozen run */

static void grade(const char *sheet, gr_report *rep) {
    ls_grade("labs/rubric/lab05.json", "tests/fixtures/lab05/results.json", sheet, rep);
}

/* Points the text earned (explanations and evidence), predictions and penalties left out. */
static double text_points(const gr_report *rep) { return ls_points_of(rep, "expl", "evid"); }

Test(lab05, rubric_items_are_the_seed_points, .timeout = 30) {
    gr_rubric_item *items = NULL;
    int n = gr_rubric_items("labs/rubric/lab05.json", &items);
    cr_assert_gt(n, 0);
    free(items);
    cJSON *r = ls_load_json("labs/rubric/lab05.json");
    /* M005: contract 3, three combined constraints 3, checkpoint/layout 2, versioning 2;
       follow-up: silent example 2, reshardable vs immutable 1, fingerprint 1, fail fast 1 */
    const char *ids[] = {"M1", "M2", "M3", "M4", "FU1", "FU2", "FU3", "FU4"};
    const double weight[] = {3, 3, 2, 2, 2, 1, 1, 1};
    for (int s = 0; s < 8; s++) {
        double total = 0.0;
        const cJSON *e;
        cJSON_ArrayForEach(e, ls_get(r, "points")) if (!strcmp(ls_gets(e, "section"), ids[s]))
            total += ls_getd(e, "points");
        cJSON_ArrayForEach(e, ls_get(r, "evidence")) if (!strcmp(ls_gets(e, "section"), ids[s]))
            total += ls_getd(e, "points");
        cJSON_ArrayForEach(e, ls_get(r, "predictions")) if (!strcmp(ls_gets(e, "id"), ids[s])) {
            const cJSON *it;
            cJSON_ArrayForEach(it, ls_get(e, "items")) total += ls_getd(it, "points");
        }
        cr_expect_float_eq(total, weight[s], 1e-9, "%s carries %g points, the seed gives %g",
                           ids[s], total, weight[s]);
    }
    cJSON_Delete(r);
}

Test(lab05, references_score_at_least_14, .timeout = 30) {
    const char *refs[] = {"answers/reference/lab05.md", "answers/reference/lab05.zh.md"};
    for (int i = 0; i < 2; i++) {
        gr_report rep;
        grade(refs[i], &rep);
        cr_expect_geq(rep.total, 14.0, "%s scores %.2f", refs[i], rep.total);
        cr_expect_eq(rep.n_pred_unlocked, 0, "%s: predictions locked by the frozen run", refs[i]);
        cr_expect_float_eq(rep.penalty_total, 0.0, 1e-9, "%s: no misconception", refs[i]);
        gr_report_free(&rep);
    }
}

Test(lab05, empty_sheet_scores_zero, .timeout = 30) {
    gr_report rep;
    grade("tests/fixtures/lab05/empty.md", &rep);
    cr_expect_leq(rep.total, 0.5, "the empty template scores %.2f", rep.total);
    cr_expect(rep.near_empty, "the empty sheet gets the what-to-do-next text");
    gr_report_free(&rep);
}

Test(lab05, misconceptions_fire_and_cost_points, .timeout = 30) {
    const char *sheets[] = {"tests/fixtures/lab05/misconceptions.md",
                            "tests/fixtures/lab05/misconceptions.zh.md"};
    for (int s = 0; s < 2; s++) {
        gr_report rep;
        grade(sheets[s], &rep);
        const char *ids[] = {"MC1", "MC2", "MC3", "MC4", "MC5"};
        for (int i = 0; i < 5; i++)
            cr_expect(ls_fired(&rep, ids[i]), "%s: %s did not fire", sheets[s], ids[i]);
        cr_expect_leq(rep.total, 2.0, "%s scores %.2f", sheets[s], rep.total);
        gr_report_free(&rep);
    }
}

Test(lab05, negated_truths_keywords_and_prompt_copies_earn_little, .timeout = 30) {
    const char *sheets[] = {"tests/fixtures/lab05/negated.md", "tests/fixtures/lab05/keywords.md",
                            "tests/fixtures/lab05/prompt_copy.md",
                            "tests/fixtures/lab05/negated.zh.md",
                            "tests/fixtures/lab05/keywords.zh.md"};
    for (int i = 0; i < 5; i++) {
        gr_report rep;
        grade(sheets[i], &rep);
        cr_expect_leq(text_points(&rep), 1.0, "%s: its text earns %.2f", sheets[i],
                      text_points(&rep));
        gr_report_free(&rep);
    }
}
