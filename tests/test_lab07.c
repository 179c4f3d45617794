/* tests/test_lab07.c - lab07 (M007: pre_process, post_process and parallel_output).

   lab07 runs as a program under mpirun (mc_test_mpirun), never under Criterion's own process.
   Each run's facts are checked against expectations computed here, not copied from a run:
     - every stage's parameters from this file's own list of GPT tensors and their TP split
       (the lab uses a formula of its own), and the flags and modules from the stage position;
     - the embedding groups from the rank grid (mc_grid_group_members);
     - the P2P and logits bytes from the shapes (N = S x B tokens, H, V, TP, M);
     - the tied-embedding run: zero difference with the embedding-group all-reduce, and without
       it 2 x lr after the first AdamW step (Adam's first update is +-lr on every element with
       a gradient, and the two copies get gradients of opposite signs somewhere);
     - the follow-up's layout, probe stage and counts from the nonce derivation;
     - the reference run against the one frozen in tests/fixtures/lab07/results.json.
   The grading tests score the reference answers and a few fixture sheets against the frozen
   results: the references >= 14, the empty sheet 0, every misconception fires in both
   languages, negated truths, keyword lists and copies of the prompts earn nothing. */
#include <criterion/criterion.h>

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
#define REF_NONCE "a70001"   /* the reference answers' run: F1, probe rank 6 */

/* The lab's model, as its answer sheet describes it. */
#define H 64
#define F 256
#define V 1024               /* a multiple of 128 x TP for TP 1, 2, 4: never padded */
#define P 32                 /* positions */
#define S 32
#define B 2
#define M 4
#define LAYERS_PER_STAGE 2
#define LR 1e-3

LS_LAB_SUITE(lab07, OUT_CAP, 0);

/* ---------------------------------------------------------------------------------------------
   helpers */

static const cJSON *item(const cJSON *doc, const char *dotted, int i) {
    const cJSON *a = ls_get(doc, dotted);
    cr_assert(cJSON_IsArray(a) && i < cJSON_GetArraySize(a), "%s has no element %d", dotted, i);
    return cJSON_GetArrayItem(a, i);
}

/* Runs ./lab07 on np ranks with the nonce; results in tmp_dir/<tag>/results.json. */
static int run_lab(int np, const char *nonce, const char *tag, char *res, size_t cap) {
    char sheet[256], cmd[1024];
    snprintf(sheet, sizeof sheet, "%s/%s/sheet.md", tmp_dir, tag);
    snprintf(res, cap, "%s/%s/results.json", tmp_dir, tag);
    /* the reference nonce's run is compared with the frozen one the reference answers quote,
       which ran on the reference loops: the default table's BLAS sums in another order */
    snprintf(cmd, sizeof cmd, "%s./lab07 --nonce %s --answers '%s' --results '%s'",
             strcmp(tag, "ref") == 0 ? "env MC_CPU_REFERENCE=1 " : "", nonce, sheet, res);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(np, cmd, 300, out, OUT_CAP);
    cr_log_info("lab07 -np %d --nonce %s took %.1f s", np, nonce, mc_test_now() - t0);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
   expectations computed here */

/* One tensor of a GPT stage: rows x cols, and whether TP splits it. */
typedef struct tensor {
    long long rows, cols;
    int split;
} tensor;

/* Elements one TP rank holds of a stage: the transformer layer's twelve tensors (two
   LayerNorms, QKV and fc1 split on their rows, proj and fc2 on their columns, the row-parallel
   biases whole), the embeddings on a stage that embeds, the final norm and the output layer on
   a stage with the head (none of its own when it reads its own tied word embedding). */
static long long rank_params(int tp, int pre, int post, int untied) {
    const tensor layer[] = {
        {1, H, 0},     {1, H, 0},          /* input_layernorm weight, bias */
        {3 * H, H, 1}, {1, 3 * H, 1},      /* linear_qkv weight, bias */
        {H, H, 1},     {1, H, 0},          /* linear_proj weight (split on its input), bias */
        {1, H, 0},     {1, H, 0},          /* pre_mlp_layernorm */
        {F, H, 1},     {1, F, 1},          /* linear_fc1 */
        {H, F, 1},     {1, H, 0},          /* linear_fc2 */
    };
    long long n = 0;
    for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++)
        n += layer[i].rows * layer[i].cols / (layer[i].split ? tp : 1);
    n *= LAYERS_PER_STAGE;
    if (pre) n += (long long)V / tp * H + (long long)P * H;
    if (post) n += 2 * H + (untied || !pre ? (long long)V / tp * H : 0);
    return n;
}

static uint32_t fnv1a(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static const char *flags_word(int s, int pp) {
    return s == 0 && s == pp - 1 ? "both" : s == 0 ? "pre" : s == pp - 1 ? "post" : "none";
}

/* Stage s's facts on the default layout (PP 4 x TP 2). */
static void expect_stage(const cJSON *st, int s) {
    const int pp = 4, tp = 2;
    int first = s == 0, last = s == pp - 1;
    char key[32];
    cr_expect_eq((int)ls_getd(st, "stage"), s);
    cr_expect_str_eq(ls_gets(st, "flags"), flags_word(s, pp));
    cr_expect_eq(ls_truth(st, "pre_process"), first, "stage %d", s);
    cr_expect_eq(ls_truth(st, "post_process"), last, "stage %d", s);
    cr_expect_eq(ls_truth(st, "is_first_stage"), first);
    cr_expect_eq(ls_truth(st, "is_last_stage"), last);
    cr_expect_eq((long long)ls_getd(st, "params"), rank_params(tp, first, last, 0),
                 "stage %d: %.0f", s, ls_getd(st, "params"));
    /* its modules, in Megatron's names */
    const cJSON *mods = ls_get(st, "modules");
    int k = 0;
    if (first) {
        cr_expect_str_eq(cJSON_GetArrayItem(mods, k++)->valuestring, "embedding.word_embeddings");
        cr_expect_str_eq(cJSON_GetArrayItem(mods, k++)->valuestring,
                         "embedding.position_embeddings");
    }
    for (int l = 0; l < LAYERS_PER_STAGE; l++) {
        snprintf(key, sizeof key, "decoder.layers.%d", LAYERS_PER_STAGE * s + l);
        cr_expect_str_eq(cJSON_GetArrayItem(mods, k++)->valuestring, key);
    }
    if (last) {
        cr_expect_str_eq(cJSON_GetArrayItem(mods, k++)->valuestring, "decoder.final_layernorm");
        cr_expect(mc_test_contains(cJSON_GetArrayItem(mods, k++)->valuestring, "output_layer"));
    }
    cr_expect_eq(cJSON_GetArraySize(mods), k, "stage %d has %d modules", s, cJSON_GetArraySize(mods));
    cr_expect_eq((int)ls_getd(st, "embedding_group_size"), first || last ? 2 : 0, "stage %d", s);
    cr_expect_str_eq(ls_gets(st, "input"), first ? "tokens" : "activation");
    /* B: what crosses the stage boundaries (fp32 activations [S x B, H] per micro-batch) */
    long long boundary = (long long)M * S * B * H * 4;
    cr_expect_eq(ls_truth(st, "reads_tokens"), first);
    cr_expect_eq(ls_truth(st, "reads_labels"), last);
    cr_expect_eq((long long)ls_getd(st, "p2p.forward_sent_bytes"), last ? 0 : boundary, "stage %d",
                 s);
    cr_expect_eq((long long)ls_getd(st, "p2p.forward_received_bytes"), first ? 0 : boundary);
    cr_expect_eq((long long)ls_getd(st, "p2p.backward_sent_bytes"), first ? 0 : boundary);
    cr_expect_eq((long long)ls_getd(st, "p2p.backward_received_bytes"), last ? 0 : boundary);
    /* E: the same stage with both flags on */
    cr_expect_eq((long long)ls_getd(st, "all_flags_on_params"), rank_params(tp, 1, 1, 0));
    cr_expect(!ls_truth(st, "all_flags_on.returns_activation_to_send"), "stage %d", s);
    cr_expect(!ls_truth(st, "all_flags_on.received_activation_changes_result"), "stage %d", s);
    cr_expect(!ls_truth(st, "all_flags_on.returns_input_grad_to_send"), "stage %d", s);
    if (!first) cr_expect(ls_truth(st, "received_activation_changes_result"), "stage %d", s);
    cr_expect_gt(ls_getd(st, "all_flags_on_memory_bytes"), ls_getd(st, "memory_bytes"), "stage %d",
                 s);
}

/* The follow-up's layout and probe, from the nonce (lab_common.h's derivation). */
static void expect_followup(const cJSON *doc, const char *nonce, int world) {
    static const int layouts[3][3] = {{1, 8, 0}, {4, 2, 0}, {2, 4, 1}};   /* tp, pp, untied */
    uint32_t h = fnv1a(nonce);
    int variant = 1 + (int)((h >> 16) % 3), probe = (int)(h % 8);
    int tp = layouts[variant - 1][0], pp = layouts[variant - 1][1];
    int untied = layouts[variant - 1][2];
    char want[4];
    snprintf(want, sizeof want, "F%d", variant);
    cr_expect_str_eq(ls_gets(doc, "facts.followup.variant"), want);
    cr_expect_eq((int)ls_getd(doc, "facts.followup.tp"), tp);
    cr_expect_eq((int)ls_getd(doc, "facts.followup.pp"), pp);
    cr_expect_eq((int)ls_getd(doc, "facts.followup.dp"), world / (tp * pp));
    cr_expect_eq(ls_truth(doc, "facts.followup.tied_embeddings"), !untied);
    mc_grid g;
    cr_assert_eq(mc_grid_init(&g, &(mc_grid_desc){.world = world, .tp = tp, .pp = pp}), MC_OK);
    mc_rank_coords c;
    cr_assert_eq(mc_grid_coords(&g, probe, &c), MC_OK);
    int first = c.pp == 0, last = c.pp == pp - 1;
    cr_expect_eq((int)ls_getd(doc, "facts.followup.probe_rank"), probe);
    cr_expect_eq((int)ls_getd(doc, "facts.followup.probe_stage"), c.pp);
    cr_expect_eq(ls_truth(doc, "facts.followup.probe_flags.pre_process"), first);
    cr_expect_eq(ls_truth(doc, "facts.followup.probe_flags.post_process"), last);
    cr_expect_str_eq(ls_gets(doc, "facts.followup.probe_input"), first ? "tokens" : "activation");
    cr_expect_eq((long long)ls_getd(doc, "facts.followup.probe_params"),
                 rank_params(tp, first, last, untied));
    cr_expect_eq((long long)ls_getd(doc, "facts.followup.mistake_extra_params"),
                 rank_params(tp, 1, 1, untied) - rank_params(tp, first, last, untied));
    for (int s = 0; s < pp; s++) {
        const cJSON *st = item(doc, "facts.followup.stages", s);
        cr_expect_eq((long long)ls_getd(st, "params"), rank_params(tp, s == 0, s == pp - 1, untied),
                     "%s stage %d", want, s);
        cr_expect_str_eq(ls_gets(st, "flags"), flags_word(s, pp));
    }
}

/* What every run on the default layout must show, whatever the nonce. */
static void expect_common_facts(const cJSON *doc, const char *nonce, int world) {
    const int tp = 2, pp = 4;
    cr_expect_str_eq(ls_gets(doc, "nonce"), nonce);
    cr_expect_eq((int)ls_getd(doc, "facts.world"), world);
    cr_expect_eq((int)ls_getd(doc, "facts.layout.dp"), world / 8);
    for (int s = 0; s < pp; s++) expect_stage(item(doc, "facts.stages", s), s);
    cr_expect_eq((int)ls_getd(doc, "facts.heaviest_stage"), 0, "stage 0 holds the position "
                 "embedding on top of what the last stage's head holds");
    /* the single-rank model: every stage's unsharded tensors once, the tied copy left out */
    long long single = rank_params(1, 1, 1, 0) + (long long)(pp - 1) *
                       (rank_params(1, 0, 0, 0));
    cr_expect_eq((long long)ls_getd(doc, "facts.single_rank_params"), single);
    cr_expect_eq((long long)ls_getd(doc, "facts.unsharded_params_sum_without_tied_copy"), single);
    cr_expect_eq((long long)ls_getd(doc, "facts.tied_copy_params"), (long long)V * H);
    /* the embedding groups of the rank grid: stage 0 and the last stage, same TP and DP rank */
    mc_grid g;
    cr_assert_eq(mc_grid_init(&g, &(mc_grid_desc){.world = world, .tp = tp, .pp = pp}), MC_OK);
    int n = mc_grid_num_groups(&g, MC_GROUP_EMBEDDING);
    const cJSON *eg = ls_get(doc, "facts.embedding_groups");
    cr_assert_eq(cJSON_GetArraySize(eg), n);
    for (int i = 0; i < n; i++) {
        int members[4];
        cr_assert_eq(mc_grid_group_members(&g, MC_GROUP_EMBEDDING, i, members, 4), 2);
        cr_expect_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(eg, i), 0)->valueint, members[0]);
        cr_expect_eq(cJSON_GetArrayItem(cJSON_GetArrayItem(eg, i), 1)->valueint, members[1]);
    }
    /* C: logits of one micro-batch on a last-stage rank, fp32 */
    long long N = S * B;
    cr_expect_eq((long long)ls_getd(doc, "facts.logits_on.held"), N * V / tp * 4);
    cr_expect_eq((long long)ls_getd(doc, "facts.logits_on.moved"), 0);
    cr_expect_eq((long long)ls_getd(doc, "facts.logits_off.held"), N * V * 4);
    cr_expect_eq((long long)ls_getd(doc, "facts.logits_off.moved"), (tp - 1) * N * V / tp * 4);
    cr_expect_eq((int)ls_getd(doc, "facts.parallel_output.on.loss_all_reduces"), 3);
    cr_expect_eq((long long)ls_getd(doc, "facts.parallel_output.on.loss_bytes"), 3 * N * 4);
    cr_expect_eq((int)ls_getd(doc, "facts.parallel_output.off.all_gathers"), 1);
    cr_expect(ls_truth(doc, "facts.parallel_output.gathered_equals_shards"));
    cr_expect(ls_truth(doc, "facts.parallel_output.tp_ranks_hold_same_full_logits"));
    cr_expect_leq(
        ls_getd(doc, "facts.parallel_output.plain_ce_on_gathered_vs_vocab_parallel_max_rel"), 1e-5);
    cr_expect_lt(item(doc, "facts.parallel_output.shard_argmax_as_token_id_agrees", 1)->valuedouble,
                 0.5, "TP rank 1's local argmax is rarely the global token id");
    cr_expect_leq(
        ls_getd(doc, "facts.parallel_output.label_smoothing.library_vs_unsharded_max_abs"), 1e-5);
    cr_expect_gt(ls_getd(doc, "facts.parallel_output.label_smoothing."
                          "megatron_shard_formula_between_tp_ranks_max_abs"), 1e-4);
    /* D: the two copies of the tied embedding */
    int K = (int)ls_getd(doc, "facts.tied.steps");
    cr_assert_geq(K, 2);
    for (int k = 0; k < K; k++) {
        cr_expect_eq(item(doc, "facts.tied.synced.max_abs_diff_by_step", k)->valuedouble, 0.0,
                     "step %d: synchronised copies differ", k + 1);
        cr_expect_gt(item(doc, "facts.tied.skipped.max_abs_diff_by_step", k)->valuedouble, 0.0);
    }
    cr_expect_float_eq(ls_getd(doc, "facts.skipped_max_diff_step1"), 2 * LR, 0.01 * 2 * LR);
    cr_expect_gt(item(doc, "facts.tied.skipped.max_abs_diff_by_step", K - 1)->valuedouble,
                 item(doc, "facts.tied.skipped.max_abs_diff_by_step", 0)->valuedouble,
                 "the copies keep drifting");
    cr_expect_eq((int)ls_getd(doc, "facts.tied.first_divergent_step"), 1);
    cr_expect_str_eq(ls_gets(doc, "facts.tied_diff.synced"), "zero");
    cr_expect_str_eq(ls_gets(doc, "facts.tied_diff.skipped"), "nonzero");
    cr_expect_leq(ls_getd(doc, "facts.tied.synced.max_rel_loss_diff_vs_single_rank"), 1e-5);
    cr_expect_gt(ls_getd(doc, "facts.tied.skipped.max_rel_loss_diff_vs_single_rank"), 1e-5);
    cr_expect_leq(ls_getd(doc, "facts.tied.synced.first_vs_single_rank_embedding"), 5e-5 * K);
    cr_expect_gt(ls_getd(doc, "facts.tied.skipped.first_vs_single_rank_embedding"), LR);
    cr_expect(ls_truth(doc, "facts.tied.embedding_alone_in_its_ddp_bucket"));
    for (int k = 0; k < K; k++)   /* the synchronised run is the single-rank run */
        cr_expect_float_eq(item(doc, "facts.tied.synced.losses", k)->valuedouble,
                           item(doc, "facts.tied.single_rank.losses", k)->valuedouble, 1e-4);
    /* E */
    long long extra = 0;
    for (int s = 0; s < pp; s++)
        extra += rank_params(tp, 1, 1, 0) - rank_params(tp, s == 0, s == pp - 1, 0);
    cr_expect_eq((long long)ls_getd(doc, "facts.mistake.extra_params_per_tp_rank"), extra);
    cr_expect_str_eq(ls_gets(doc, "facts.mistake.schedule_on_first_stage.status"), "MC_ERR_STATE");
    cr_expect(mc_test_contains(ls_gets(doc, "facts.mistake.schedule_on_first_stage.message"),
                               "returned no output to send"));
    /* the run's own checks */
    cr_expect(ls_truth(doc, "run.all_checks_held"));
}

/* ---------------------------------------------------------------------------------------------
   runs */

Test(lab07, default_world_reference_nonce, .timeout = 300) {
    char res[300];
    int rc = run_lab(8, REF_NONCE, "ref", res, sizeof res);
    cr_assert_eq(rc, 0, "lab07 -np 8 exited %d:\n%s", rc, out);
    const char *sections[] = {"== A.", "== B.", "== C.", "== D.", "== E.", "== F.", "== Grading"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        cr_expect(mc_test_contains(out, sections[i]), "no section %s in:\n%s", sections[i], out);
    cr_expect(mc_test_contains(out, "Total 0.00/15"), "an empty sheet scores 0:\n%s", out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);
    cJSON *doc = ls_load_json(res);
    expect_common_facts(doc, REF_NONCE, 8);
    expect_followup(doc, REF_NONCE, 8);
    /* the same run as the frozen one the reference answers quote */
    cJSON *frozen = ls_load_json("tests/fixtures/lab07/results.json");
    int K = (int)ls_getd(doc, "facts.tied.steps");
    for (int k = 0; k < K; k++) {
        cr_expect_float_eq(item(doc, "facts.tied.skipped.losses", k)->valuedouble,
                           item(frozen, "facts.tied.skipped.losses", k)->valuedouble, 1e-6);
        cr_expect_float_eq(item(doc, "facts.tied.skipped.max_abs_diff_by_step", k)->valuedouble,
                           item(frozen, "facts.tied.skipped.max_abs_diff_by_step", k)->valuedouble,
                           1e-8);
    }
    for (int s = 0; s < 4; s++)
        cr_expect_eq(ls_getd(item(doc, "facts.stages", s), "memory_bytes"),
                     ls_getd(item(frozen, "facts.stages", s), "memory_bytes"));
    cJSON_Delete(frozen);
    cJSON_Delete(doc);
}

Test(lab07, variants_f2_and_f3, .timeout = 400) {
    const char *nonces[] = {"070707", "007007"};   /* F2 (probe 0), F3 (probe 3) */
    for (int i = 0; i < 2; i++) {
        char res[300], tag[16];
        snprintf(tag, sizeof tag, "v%d", i);
        int rc = run_lab(8, nonces[i], tag, res, sizeof res);
        cr_assert_eq(rc, 0, "lab07 --nonce %s exited %d:\n%s", nonces[i], rc, out);
        cJSON *doc = ls_load_json(res);
        expect_followup(doc, nonces[i], 8);
        cJSON_Delete(doc);
    }
}

Test(lab07, world16_with_two_replicas, .timeout = 400) {
    char res[300];
    int rc = run_lab(16, REF_NONCE, "w16", res, sizeof res);
    cr_assert_eq(rc, 0, "lab07 -np 16 exited %d:\n%s", rc, out);
    cJSON *doc = ls_load_json(res);
    /* DP 2 with the distributed optimizer: the reduce-scatter runs before the embedding-group
       all-reduce (Megatron-LM #844) and the copies still stay equal to the single-rank run */
    expect_common_facts(doc, REF_NONCE, 16);
    expect_followup(doc, REF_NONCE, 16);
    cJSON_Delete(doc);
}

Test(lab07, worlds_it_cannot_use_exit_2, .timeout = 120) {
    struct {
        int np;
        const char *args, *says;
    } c[] = {
        {4, "", "lab07 needs 8 to 16 ranks: got 4; try mpirun -np 8"},
        {12, "", "world % (tp*pp*cp) == 0"},
        {12, "--tp 1 --pp 4", "needs 8 or 16 ranks"},
        {8, "--pp 2", "needs a pipeline of 3 to 16 stages"},
        {8, "--tp 8 --pp 1", "needs a pipeline of 3 to 16 stages"},
        {8, "--tp 4 --pp 4", "world % (tp*pp*cp) == 0"},
        {8, "--vpp 2", "without --vpp"},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./lab07 %s --answers '%s/s.md' --results '%s/r.json'", c[i].args,
                 tmp_dir, tmp_dir);
        int rc = mc_test_mpirun(c[i].np, cmd, 60, out, OUT_CAP);
        cr_expect_eq(rc, LAB_EXIT_USAGE, "np %d %s: exit %d:\n%s", c[i].np, c[i].args, rc, out);
        cr_expect(mc_test_contains(out, c[i].says), "np %d %s: want \"%s\" in:\n%s", c[i].np,
                  c[i].args, c[i].says, out);
    }
}

Test(lab07, init_writes_the_variant_question, .timeout = 30) {
    char cmd[512], sheet[300];
    snprintf(sheet, sizeof sheet, "%s/init.md", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab07 --init --nonce %s --answers '%s'", REF_NONCE, sheet);
    cr_assert_eq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "%s", out);
    char *text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    cr_expect(mc_test_contains(text, "<!-- nonce: a70001 ; probe_rank: 6 ; followup: F1"), "%s",
              text);
    cr_expect(mc_test_contains(text, "TP 1 x PP 8") && mc_test_contains(text, "Predict rank 6's"),
              "F1's question with the probe rank: %s", text);
    cr_expect(!mc_test_contains(text, "{variant_question}") && !mc_test_contains(text, "{nonce}") &&
              !mc_test_contains(text, "{probe_rank}"));
    free(text);
}

/* ---------------------------------------------------------------------------------------------
   grading against the frozen run */

static void grade(const char *sheet, gr_report *rep) {
    ls_grade("labs/rubric/lab07.json", "tests/fixtures/lab07/results.json", sheet, rep);
}

static double text_points(const gr_report *rep) { return ls_points_of(rep, "claim", "evid"); }

Test(lab07, rubric_items_are_the_seed_points, .timeout = 30) {
    gr_rubric_item *items = NULL;
    int n = gr_rubric_items("labs/rubric/lab07.json", &items), points = 0;
    cr_assert_gt(n, 0);
    for (int i = 0; i < n; i++) points += !items[i].is_penalty;
    cr_expect_eq(points, 8, "the rubric has %d score items, the seed 8 score points", points);
    free(items);
    cJSON *r = ls_load_json("labs/rubric/lab07.json");
    cr_expect_eq((int)ls_getd(r, "schema"), 2);
    /* M007: pre/post 3, stage-local model and data flow 3, parallel_output 2, tied sync 2;
       follow-up: first/last duties 2, middle-stage input 1, the mistake 1, imbalance 1 */
    const char *ids[] = {"M1", "M2", "M3", "M4", "FU1", "FU2", "FU3", "FU4"};
    const char *seed[] = {"pre/post定义", "stage-local模型与数据流", "parallel_output语义",
                          "tied embedding特殊同步", "first/last职责", "中间stage输入",
                          "解释错误后果", "联系stage参数不均衡"};
    const double weight[] = {3, 3, 2, 2, 2, 1, 1, 1};
    for (int s = 0; s < 8; s++) {
        const cJSON *it = item(r, "items", s);
        cr_expect_str_eq(ls_gets(it, "id"), ids[s], "the seed's order");
        cr_expect(mc_test_contains(ls_gets(it, "seed"), seed[s]), "%s: %s", ids[s],
                  ls_gets(it, "seed"));
        cr_expect_float_eq(ls_getd(it, "points"), weight[s], 1e-9);
        double total = 0.0;
        const char *parts[] = {"predictions", "claims", "evidence"};
        for (int p = 0; p < 3; p++) {
            const cJSON *e;
            cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(it, parts[p]))
                total += ls_getd(e, "points");
        }
        cr_expect_float_eq(total, weight[s], 1e-9, "%s carries %g points, the seed gives %g",
                           ids[s], total, weight[s]);
    }
    cJSON_Delete(r);
}

Test(lab07, references_score_at_least_14, .timeout = 30) {
    const char *refs[] = {"answers/reference/lab07.md", "answers/reference/lab07.zh.md"};
    for (int i = 0; i < 2; i++) {
        gr_report rep;
        grade(refs[i], &rep);
        cr_expect_geq(rep.total, 14.0, "%s scores %.2f", refs[i], rep.total);
        cr_expect_eq(rep.n_pred_unlocked, 0, "%s: predictions locked by the frozen run", refs[i]);
        cr_expect(rep.locked, "%s", refs[i]);
        cr_expect_float_eq(rep.penalty_total, 0.0, 1e-9, "%s: no misconception", refs[i]);
        gr_report_free(&rep);
    }
}

Test(lab07, empty_sheet_scores_zero, .timeout = 30) {
    gr_report rep;
    grade("tests/fixtures/lab07/empty.md", &rep);
    cr_expect_leq(rep.total, 0.5, "the empty template scores %.2f", rep.total);
    cr_expect(rep.near_empty, "the empty sheet gets the what-to-do-next text");
    gr_report_free(&rep);
}

Test(lab07, misconceptions_fire_and_cost_points, .timeout = 30) {
    const char *sheets[] = {"tests/fixtures/lab07/misconceptions.md",
                            "tests/fixtures/lab07/misconceptions.zh.md"};
    for (int s = 0; s < 2; s++) {
        gr_report rep;
        grade(sheets[s], &rep);
        const char *ids[] = {"MC1", "MC2", "MC3", "MC4", "MC5", "MC6", "MC7"};
        for (int i = 0; i < 7; i++)
            cr_expect(ls_fired(&rep, ids[i]), "%s: %s did not fire", sheets[s], ids[i]);
        cr_expect_float_eq(rep.penalty_total, 3.0, 1e-9, "%s: the penalties reach the cap",
                           sheets[s]);
        /* the main boxes hold the misconceptions: their clauses earn nothing */
        cr_expect_leq(rep.main_score, 1.0, "%s: main part %.2f", sheets[s], rep.main_score);
        gr_report_free(&rep);
    }
}

Test(lab07, negated_truths_and_prompt_copies_earn_nothing, .timeout = 30) {
    const char *sheets[] = {"tests/fixtures/lab07/negated.md", "tests/fixtures/lab07/negated.zh.md",
                            "tests/fixtures/lab07/prompt_copy.md"};
    for (int i = 0; i < 3; i++) {
        gr_report rep;
        grade(sheets[i], &rep);
        cr_expect_leq(text_points(&rep), 0.5, "%s: its text earns %.2f", sheets[i],
                      text_points(&rep));
        gr_report_free(&rep);
    }
}

Test(lab07, keyword_bullets_stay_under_the_low_bar, .timeout = 30) {
    /* Part A0.7: a sheet a rater labels <= 3 must score <= 4 */
    const char *sheets[] = {"tests/fixtures/lab07/keywords.md", "tests/fixtures/lab07/keywords.zh.md"};
    for (int i = 0; i < 2; i++) {
        gr_report rep;
        grade(sheets[i], &rep);
        cr_expect_leq(rep.total, 4.0, "%s scores %.2f", sheets[i], rep.total);
        gr_report_free(&rep);
    }
}
