/* test_rank_grid.c - the rank grid (Megatron's RankGenerator) against the worked examples of
   megatron_semantics.md section 1.5, Megatron's own docstring and unit-test cases, the lab03
   follow-up variants, and properties checked over many layouts up to 1024 ranks. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "megatron_c.h"
#include "test_util.h"

TestSuite(rank_grid, .timeout = 60);

/* ---------------------------------------------------------------------------------------------
   helpers */

static mc_grid_desc grid_desc(int world, int tp, int pp, int cp, int ep, int etp,
                              const char *order) {
    mc_grid_desc d;
    memset(&d, 0, sizeof d);
    d.world = world;
    d.tp = tp;
    d.pp = pp;
    d.cp = cp;
    d.ep = ep;
    d.etp = etp;
    d.order = order;
    return d;
}

static mc_grid make_grid(int world, int tp, int pp, int cp, int ep, int etp, const char *order) {
    mc_grid g;
    mc_grid_desc d = grid_desc(world, tp, pp, cp, ep, etp, order);
    int rc = mc_grid_init(&g, &d);
    cr_assert_eq(rc, MC_OK, "mc_grid_init(world %d tp %d pp %d cp %d ep %d etp %d order %s): %s %s",
                 world, tp, pp, cp, ep, etp, order ? order : "(default)", mc_err_name(rc),
                 mc_last_error());
    return g;
}

/* Compares every group of `kind` with `expected` (n_groups rows of group_size ranks). */
static void expect_groups(const mc_grid *g, mc_group_kind kind, const int *expected, int n_groups,
                          int group_size) {
    int got[1024];
    int i, j;
    cr_assert_eq(mc_grid_num_groups(g, kind), n_groups, "%s: number of groups",
                 mc_group_kind_name(kind));
    cr_assert_eq(mc_grid_group_size(g, kind), group_size, "%s: group size",
                 mc_group_kind_name(kind));
    for (i = 0; i < n_groups; i++) {
        int n = mc_grid_group_members(g, kind, i, got, 1024);
        cr_assert_eq(n, group_size, "%s[%d]: member count %d", mc_group_kind_name(kind), i, n);
        for (j = 0; j < n; j++)
            cr_expect_eq(got[j], expected[i * group_size + j], "%s[%d] member %d: got %d, want %d",
                         mc_group_kind_name(kind), i, j, got[j], expected[i * group_size + j]);
    }
}

/* Members of the group of `kind` holding `rank`. */
static int group_holding(const mc_grid *g, mc_group_kind kind, int rank, int *out, int cap) {
    int index = -1, pos = -1;
    int rc = mc_grid_group_of(g, kind, rank, &index, &pos);
    if (rc != MC_OK) return rc;
    return mc_grid_group_members(g, kind, index, out, cap);
}

static void expect_init_error(mc_grid_desc d, const char *const *needles, int n_needles) {
    mc_grid g;
    int rc, i;
    memset(&g, 0x5a, sizeof g);
    rc = mc_grid_init(&g, &d);
    cr_assert_eq(rc, MC_ERR_INVALID_DESC, "want MC_ERR_INVALID_DESC, got %s (%s)", mc_err_name(rc),
                 mc_last_error());
    for (i = 0; i < n_needles; i++)
        cr_expect(mc_test_contains(mc_last_error(), needles[i]), "message \"%s\" lacks \"%s\"",
                  mc_last_error(), needles[i]);
}

/* ---------------------------------------------------------------------------------------------
   worked example A: world 8, TP 2, PP 2, DP 2, default order (rank = tp + 2 dp + 4 pp) */

Test(rank_grid, example_a_coordinates) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, NULL);
    static const int table[8][3] = {{0, 0, 0}, {1, 0, 0}, {0, 1, 0}, {1, 1, 0},
                                    {0, 0, 1}, {1, 0, 1}, {0, 1, 1}, {1, 1, 1}};
    int r;
    cr_assert_eq(g.dp, 2);
    cr_assert_eq(g.edp, 2);
    cr_assert_str_eq(g.order, "tp-cp-ep-dp-pp");
    cr_assert_eq(g.desc.etp, 2, "etp defaults to tp");
    for (r = 0; r < 8; r++) {
        mc_rank_coords c;
        cr_assert_eq(mc_grid_coords(&g, r, &c), MC_OK);
        cr_expect_eq(c.rank, r);
        cr_expect_eq(c.tp, table[r][0], "rank %d tp", r);
        cr_expect_eq(c.dp, table[r][1], "rank %d dp", r);
        cr_expect_eq(c.pp, table[r][2], "rank %d pp", r);
        cr_expect_eq(c.cp, 0, "rank %d cp", r);
        cr_expect_eq(c.etp, table[r][0], "rank %d etp (ETP = TP)", r);
        cr_expect_eq(c.ep, 0, "rank %d ep", r);
        cr_expect_eq(c.edp, table[r][1], "rank %d edp (EDP = DP)", r);
    }
}

Test(rank_grid, example_a_groups) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, NULL);
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7};
    static const int pp[] = {0, 4, 1, 5, 2, 6, 3, 7};
    static const int pos[] = {0, 1, 2, 3};
    static const int mp[] = {0, 1, 4, 5, 2, 3, 6, 7};
    static const int tp_dp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int singles[] = {0, 1, 2, 3, 4, 5, 6, 7};
    expect_groups(&g, MC_GROUP_TP, tp, 4, 2);
    expect_groups(&g, MC_GROUP_DP, dp, 4, 2);
    expect_groups(&g, MC_GROUP_DP_CP, dp, 4, 2);
    expect_groups(&g, MC_GROUP_PP, pp, 4, 2);
    expect_groups(&g, MC_GROUP_EMBEDDING, pp, 4, 2);
    expect_groups(&g, MC_GROUP_POSITION_EMBEDDING, pos, 4, 1);
    expect_groups(&g, MC_GROUP_MP, mp, 2, 4);
    expect_groups(&g, MC_GROUP_TP_DP, tp_dp, 2, 4);
    expect_groups(&g, MC_GROUP_TP_DP_CP, tp_dp, 2, 4);
    expect_groups(&g, MC_GROUP_TP_CP, tp, 4, 2);
    expect_groups(&g, MC_GROUP_CP, singles, 8, 1);
    /* expert grid with EP = 1, ETP = TP */
    expect_groups(&g, MC_GROUP_EP, singles, 8, 1);
    expect_groups(&g, MC_GROUP_EXPERT_TP, tp, 4, 2);
    expect_groups(&g, MC_GROUP_TP_EP, tp, 4, 2);
    expect_groups(&g, MC_GROUP_TP_EP_PP, mp, 2, 4);
    expect_groups(&g, MC_GROUP_EXPERT_DP, dp, 4, 2);
}

Test(rank_grid, example_a_probe_rank_5) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, NULL);
    mc_rank_coords c;
    int members[8], index = -1, pos = -1;
    cr_assert_eq(mc_grid_coords(&g, 5, &c), MC_OK);
    cr_expect_eq(c.tp, 1);
    cr_expect_eq(c.dp, 0);
    cr_expect_eq(c.pp, 1);
    cr_assert_eq(mc_grid_group_of(&g, MC_GROUP_EMBEDDING, 5, &index, &pos), MC_OK);
    cr_expect_eq(index, 1);
    cr_expect_eq(pos, 1, "rank 5 is the last member of its embedding group");
    cr_assert_eq(group_holding(&g, MC_GROUP_EMBEDDING, 5, members, 8), 2);
    cr_expect_eq(members[0], 1);
    cr_expect_eq(members[1], 5);
}

/* A': same sizes, order "tp-pp-dp" (rank = tp + 2 pp + 4 dp) */
Test(rank_grid, example_a_prime_order_tp_pp_dp) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, "tp-pp-dp");
    static const int pp[] = {0, 2, 1, 3, 4, 6, 5, 7};
    static const int dp[] = {0, 4, 1, 5, 2, 6, 3, 7};
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int pos[] = {0, 1, 4, 5};
    static const int mp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int tp_dp[] = {0, 1, 4, 5, 2, 3, 6, 7};
    mc_rank_coords c;
    /* missing size-1 axes are appended in Megatron's dict order: ep, then cp */
    cr_assert_str_eq(g.order, "tp-pp-dp-ep-cp");
    cr_assert_str_eq(g.desc.order, "tp-pp-dp", "desc.order keeps the caller's string");
    expect_groups(&g, MC_GROUP_PP, pp, 4, 2);
    expect_groups(&g, MC_GROUP_DP, dp, 4, 2);
    expect_groups(&g, MC_GROUP_TP, tp, 4, 2);
    expect_groups(&g, MC_GROUP_EMBEDDING, pp, 4, 2);
    expect_groups(&g, MC_GROUP_POSITION_EMBEDDING, pos, 4, 1);
    expect_groups(&g, MC_GROUP_MP, mp, 2, 4);
    expect_groups(&g, MC_GROUP_TP_DP, tp_dp, 2, 4);
    cr_assert_eq(mc_grid_coords(&g, 6, &c), MC_OK);
    cr_expect_eq(c.tp, 0);
    cr_expect_eq(c.pp, 1);
    cr_expect_eq(c.dp, 1);
}

/* Megatron's test_different_initialize_order_unconsistency: the order changes the dp, pp and
   model-parallel groups but never the tp or cp groups. */
Test(rank_grid, order_changes_dp_pp_mp_but_not_tp_cp) {
    static const mc_group_kind same[] = {MC_GROUP_TP, MC_GROUP_CP};
    static const mc_group_kind differ[] = {MC_GROUP_DP, MC_GROUP_PP, MC_GROUP_MP, MC_GROUP_TP_DP};
    /* EP 2 keeps EDP == DP (CP folds into the expert data-parallel axis), so Megatron accepts
       an order that does not end with pp. */
    mc_grid a = make_grid(16, 2, 2, 2, 2, 0, "tp-cp-ep-dp-pp");
    mc_grid b = make_grid(16, 2, 2, 2, 2, 0, "tp-cp-ep-pp-dp");
    int ma[16], mb[16];
    size_t k;
    int r;
    for (k = 0; k < sizeof same / sizeof same[0]; k++)
        for (r = 0; r < 16; r++) {
            int na = group_holding(&a, same[k], r, ma, 16);
            int nb = group_holding(&b, same[k], r, mb, 16);
            cr_assert_eq(na, nb);
            cr_expect_arr_eq(ma, mb, sizeof(int) * (size_t)na, "%s group of rank %d differs",
                             mc_group_kind_name(same[k]), r);
        }
    for (k = 0; k < sizeof differ / sizeof differ[0]; k++) {
        int changed = 0;
        for (r = 0; r < 16; r++) {
            int na = group_holding(&a, differ[k], r, ma, 16);
            int nb = group_holding(&b, differ[k], r, mb, 16);
            cr_assert_eq(na, nb);
            if (memcmp(ma, mb, sizeof(int) * (size_t)na) != 0) changed = 1;
        }
        cr_expect(changed, "%s groups should change with the order", mc_group_kind_name(differ[k]));
    }
}

/* ---------------------------------------------------------------------------------------------
   Megatron's docstring example and the interview facts */

Test(rank_grid, megatron_docstring_world16_tp2_pp4) {
    mc_grid g = make_grid(16, 2, 4, 0, 0, 0, NULL);
    static const int dp[] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    static const int pp[] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    cr_assert_eq(g.dp, 2);
    expect_groups(&g, MC_GROUP_DP, dp, 8, 2);
    expect_groups(&g, MC_GROUP_TP, tp, 8, 2);
    expect_groups(&g, MC_GROUP_PP, pp, 4, 4);
}

/* EP is not an extra world factor: 16 GPUs, TP2 PP2 CP2 -> DP 2; EP2 with ETP2 -> EDP 2,
   with ETP1 -> EDP 4. */
Test(rank_grid, ep_does_not_multiply_the_world) {
    mc_grid a = make_grid(16, 2, 2, 2, 2, 2, NULL);
    mc_grid b = make_grid(16, 2, 2, 2, 2, 1, NULL);
    static const int edp_b[] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    cr_expect_eq(a.dp, 2);
    cr_expect_eq(a.edp, 2);
    cr_expect_eq(b.dp, 2);
    cr_expect_eq(b.edp, 4);
    cr_expect_eq(mc_grid_group_size(&a, MC_GROUP_DP_CP), 4, "dense grads reduce over DP x CP");
    cr_expect_eq(mc_grid_group_size(&a, MC_GROUP_EXPERT_DP), 2);
    cr_expect_eq(mc_grid_group_size(&b, MC_GROUP_EXPERT_DP), 4);
    cr_expect_eq(mc_grid_group_size(&a, MC_GROUP_EP), 2);
    cr_expect_eq(mc_grid_group_size(&b, MC_GROUP_TP_EP_PP), 4);
    /* ETP 1: rank = ep + 2 edp + 8 pp */
    expect_groups(&b, MC_GROUP_EXPERT_DP, edp_b, 4, 4);
}

/* lab03 follow-up F1: world 16, TP2 CP2 PP2, default order */
Test(rank_grid, followup_f1_context_parallel) {
    mc_grid g = make_grid(16, 2, 2, 2, 0, 0, NULL);
    static const int cp[] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    static const int dp[] = {0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15};
    static const int dp_cp[] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15};
    static const int pp[] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};
    cr_assert_eq(g.dp, 2, "DP = 16 / (2 x 2 x 2)");
    expect_groups(&g, MC_GROUP_CP, cp, 8, 2);
    expect_groups(&g, MC_GROUP_DP, dp, 8, 2);
    expect_groups(&g, MC_GROUP_DP_CP, dp_cp, 4, 4);
    expect_groups(&g, MC_GROUP_PP, pp, 8, 2);
}

/* F2: order "tp-pp-dp" is accepted (EDP == DP), and the picotron-like layout is right here. */
Test(rank_grid, followup_f2_order_accepted_and_when_the_assert_fires) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, "tp-pp-dp");
    static const int pp[] = {0, 2, 1, 3, 4, 6, 5, 7};
    static const int dp[] = {0, 4, 1, 5, 2, 6, 3, 7};
    static const char *const pp_last[] = {"pp-last", "tp-pp-dp", "4", "2"};
    expect_groups(&g, MC_GROUP_PP, pp, 4, 2);
    expect_groups(&g, MC_GROUP_DP, dp, 4, 2);
    /* ETP 1 makes EDP 4 != DP 2 with pp not last: Megatron's assert fires. */
    expect_init_error(grid_desc(8, 2, 2, 0, 0, 1, "tp-pp-dp"), pp_last, 4);
}

/* F3: world 8, TP4 PP2 -> DP 1: singleton dp groups (no gradient all-reduce). */
Test(rank_grid, followup_f3_dp_of_one) {
    mc_grid g = make_grid(8, 4, 2, 0, 0, 0, NULL);
    static const int singles[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const int tp[] = {0, 1, 2, 3, 4, 5, 6, 7};
    cr_assert_eq(g.dp, 1);
    expect_groups(&g, MC_GROUP_DP, singles, 8, 1);
    expect_groups(&g, MC_GROUP_TP, tp, 2, 4);
}

/* ---------------------------------------------------------------------------------------------
   validation: Megatron's RuntimeError cases and our own rules */

Test(rank_grid, megatron_unit_test_errors_name_the_numbers) {
    static const char *const tp2w[] = {"world_size (8)", "tensor_model_parallel_size (16)",
                                       "not divisible"};
    static const char *const pp2w[] = {"world_size (8)", "pipeline_model_parallel_size (16)"};
    static const char *const tppw[] = {"tensor_model_parallel_size (8)",
                                       "pipeline_model_parallel_size (8)", "= 64"};
    static const char *const vpp[] = {"greater than 1 with interleaved schedule", "vpp = 2",
                                      "pp = 1"};
    mc_grid_desc d = grid_desc(8, 1, 1, 0, 0, 0, NULL);
    expect_init_error(grid_desc(8, 16, 1, 0, 0, 0, NULL), tp2w, 3);
    expect_init_error(grid_desc(8, 1, 16, 0, 0, 0, NULL), pp2w, 2);
    expect_init_error(grid_desc(8, 8, 8, 0, 0, 0, NULL), tppw, 3);
    d.vpp = 2;
    expect_init_error(d, vpp, 3);
}

Test(rank_grid, expert_divisibility_and_sizes) {
    static const char *const expert[] = {"world_size (8)", "expert_tensor_model_pipeline_parallel",
                                         "2 x 3 x 2 = 12"};
    static const char *const neg[] = {"mc_grid_desc.tp (-1)", ">= 1"};
    static const char *const zero_world[] = {"mc_grid_desc.world (0)", ">= 1"};
    static const char *const huge[] = {"MC_MAX_RANKS", "2097152"};
    static const char *const neg_vpp[] = {"mc_grid_desc.vpp (-1)"};
    mc_grid_desc d = grid_desc(8, 2, 2, 0, 0, 0, NULL);
    expect_init_error(grid_desc(8, 2, 2, 0, 3, 0, NULL), expert, 3);
    expect_init_error(grid_desc(8, -1, 1, 0, 0, 0, NULL), neg, 2);
    expect_init_error(grid_desc(0, 1, 1, 0, 0, 0, NULL), zero_world, 2);
    expect_init_error(grid_desc(2 * MC_MAX_RANKS, 1, 1, 0, 0, 0, NULL), huge, 2);
    d.vpp = -1;
    expect_init_error(d, neg_vpp, 1);
}

Test(rank_grid, order_string_errors) {
    static const char *const missing[] = {"The size of (pp) is (2), but you haven't specified the "
                                          "order", "tp-dp"};
    static const char *const missing_ep[] = {"The size of (ep) is (2)", "expert"};
    static const char *const unknown[] = {"unknown token \"xx\"", "tp-xx-pp"};
    static const char *const twice[] = {"\"tp\" appears twice"};
    static const char *const empty[] = {"empty token"};
    static const char *const pp_same[] = {"Pipeline parallel groups", "[0,2]", "[0,1]"};
    expect_init_error(grid_desc(8, 2, 2, 0, 0, 0, "tp-dp"), missing, 2);
    expect_init_error(grid_desc(8, 2, 2, 0, 2, 0, "tp-cp-dp-pp"), missing_ep, 2);
    expect_init_error(grid_desc(8, 2, 2, 0, 0, 0, "tp-xx-pp"), unknown, 2);
    expect_init_error(grid_desc(8, 2, 2, 0, 0, 0, "tp-dp-tp-pp"), twice, 1);
    expect_init_error(grid_desc(8, 2, 2, 0, 0, 0, "tp--pp"), empty, 1);
    /* EDP == DP, pp not last, but the pp stride differs between the dense (TP 2) and the expert
       (ETP 1) grid: the two grids would disagree on the pp groups. */
    expect_init_error(grid_desc(8, 2, 2, 0, 2, 1, "tp-pp-ep-dp"), pp_same, 3);
}

/* Every validation failure goes to the logger (level 1, the status as item) with the same text
   as mc_last_error. */
static int log_calls;
static uint32_t log_level;
static int log_item;
static char log_text[1024];

static void capture_log(const char *tag, uint32_t level, int item, const char *message,
                        uint32_t line, const char *file, void *user_data) {
    (void)tag;
    (void)line;
    (void)file;
    (void)user_data;
    log_calls++;
    log_level = level;
    log_item = item;
    snprintf(log_text, sizeof log_text, "%s", message);
}

Test(rank_grid, errors_reach_the_logger) {
    mc_desc setup;
    mc_grid g;
    mc_grid_desc d = grid_desc(10, 2, 4, 0, 0, 0, NULL);
    memset(&setup, 0, sizeof setup);
    setup.logger.func = capture_log;
    cr_assert_eq(mc_setup(&setup), MC_OK);
    cr_assert_eq(mc_grid_init(&g, &d), MC_ERR_INVALID_DESC);
    cr_expect_eq(log_calls, 1);
    cr_expect_eq(log_level, 1u);
    cr_expect_eq(log_item, MC_ERR_INVALID_DESC);
    cr_expect_str_eq(log_text, mc_last_error());
    cr_expect(mc_test_contains(log_text, "world_size (10)"));
    cr_expect(mc_test_contains(log_text, "= 8"));
    mc_setup(NULL);
}

static void plain_free(void *ptr, void *user_data) {
    (void)user_data;
    free(ptr);
}

Test(rank_grid, setup_rejects_half_an_allocator) {
    mc_desc setup;
    memset(&setup, 0, sizeof setup);
    setup.allocator.free_fn = plain_free;
    cr_expect_eq(mc_setup(&setup), MC_ERR_INVALID_DESC);
    cr_expect(mc_test_contains(mc_last_error(), "alloc_fn (NULL)"));
    cr_expect(mc_test_contains(mc_last_error(), "free_fn (set)"));
    cr_expect_str_eq(mc_err_name(MC_ERR_PLAN_MISMATCH), "MC_ERR_PLAN_MISMATCH");
    cr_expect_str_eq(mc_err_name(12345), "MC_ERR_UNKNOWN");
    cr_expect(mc_test_contains(mc_strerror(MC_ERR_TIMEOUT), "timed out"));
    cr_expect_str_eq(mc_version_string(), "0.1.0");
}

/* ---------------------------------------------------------------------------------------------
   embedding groups and pipeline helpers */

Test(rank_grid, embedding_groups_pp1_pp2_pp4) {
    mc_grid g1 = make_grid(4, 2, 1, 0, 0, 0, NULL);
    mc_grid g2 = make_grid(8, 2, 2, 0, 0, 0, NULL);
    mc_grid g4 = make_grid(8, 2, 4, 0, 0, 0, NULL);
    static const int singles[] = {0, 1, 2, 3};
    static const int emb4[] = {0, 6, 1, 7};
    static const int pos4[] = {0, 1};
    static const int pp2[] = {0, 4, 1, 5, 2, 6, 3, 7};
    int index = 7, pos = 7, r;
    /* PP = 1: every rank is its own (single-rank) embedding group */
    expect_groups(&g1, MC_GROUP_EMBEDDING, singles, 4, 1);
    expect_groups(&g1, MC_GROUP_POSITION_EMBEDDING, singles, 4, 1);
    expect_groups(&g2, MC_GROUP_EMBEDDING, pp2, 4, 2);
    /* PP = 4: pp groups [0,2,4,6] [1,3,5,7]; the middle stages are in no embedding group */
    expect_groups(&g4, MC_GROUP_EMBEDDING, emb4, 2, 2);
    expect_groups(&g4, MC_GROUP_POSITION_EMBEDDING, pos4, 2, 1);
    for (r = 0; r < 8; r++) {
        mc_rank_coords c;
        int rc;
        mc_grid_coords(&g4, r, &c);
        rc = mc_grid_group_of(&g4, MC_GROUP_EMBEDDING, r, &index, &pos);
        if (c.pp == 1 || c.pp == 2) {
            cr_expect_eq(rc, MC_ERR_NOT_MEMBER, "rank %d (stage %d) in an embedding group", r,
                         c.pp);
            cr_expect_eq(index, -1);
            cr_expect_eq(pos, -1);
        } else {
            cr_expect_eq(rc, MC_OK, "rank %d (stage %d)", r, c.pp);
            cr_expect_eq(pos, c.pp == 0 ? 0 : 1);
        }
        rc = mc_grid_group_of(&g4, MC_GROUP_POSITION_EMBEDDING, r, &index, &pos);
        cr_expect_eq(rc, c.pp == 0 ? MC_OK : MC_ERR_NOT_MEMBER, "rank %d position embedding", r);
    }
}

Test(rank_grid, pipeline_next_prev_are_cyclic) {
    mc_grid g = make_grid(8, 2, 4, 0, 0, 0, NULL);   /* pp groups [0,2,4,6] [1,3,5,7] */
    int first, last, next, prev;
    cr_assert_eq(mc_grid_pipeline_ranks(&g, 6, &first, &last, &next, &prev), MC_OK);
    cr_expect_eq(first, 0);
    cr_expect_eq(last, 6);
    cr_expect_eq(next, 0, "the last stage's next wraps to the first");
    cr_expect_eq(prev, 4);
    cr_assert_eq(mc_grid_pipeline_ranks(&g, 1, &first, &last, &next, &prev), MC_OK);
    cr_expect_eq(first, 1);
    cr_expect_eq(last, 7);
    cr_expect_eq(next, 3);
    cr_expect_eq(prev, 7, "the first stage's prev wraps to the last");
    cr_expect_eq(mc_grid_pipeline_ranks(&g, 3, NULL, NULL, &next, NULL), MC_OK);
    cr_expect_eq(next, 5);
    cr_expect_eq(mc_grid_pipeline_ranks(&g, 8, &first, NULL, NULL, NULL), MC_ERR_INVALID_ARG);
}

/* ---------------------------------------------------------------------------------------------
   argument checks and names */

Test(rank_grid, member_queries_check_their_arguments) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, NULL);
    int out[8];
    cr_expect_eq(mc_grid_group_members(&g, MC_GROUP_MP, 0, NULL, 0), 4, "NULL out counts");
    cr_expect_eq(mc_grid_group_members(&g, MC_GROUP_MP, 0, out, 3), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "cap (3)"));
    cr_expect_eq(mc_grid_group_members(&g, MC_GROUP_MP, 2, out, 8), MC_ERR_INVALID_ARG);
    cr_expect(mc_test_contains(mc_last_error(), "index (2)"));
    cr_expect_eq(mc_grid_group_members(&g, (mc_group_kind)99, 0, out, 8), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_grid_coords(&g, -1, NULL), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_grid_group_of(&g, MC_GROUP_TP, 8, NULL, NULL), MC_ERR_INVALID_ARG);
    cr_expect_eq(mc_grid_init(NULL, NULL), MC_ERR_INVALID_ARG);
}

Test(rank_grid, kind_names_round_trip) {
    int k;
    for (k = 0; k < MC_GROUP_COUNT; k++)
        cr_expect_eq(mc_group_kind_from_name(mc_group_kind_name((mc_group_kind)k)), k, "kind %d",
                     k);
    cr_expect_str_eq(mc_group_kind_name(MC_GROUP_DP_CP), "dp_cp");
    cr_expect_eq(mc_group_kind_from_name("dp-cp"), MC_GROUP_DP_CP);
    cr_expect_eq(mc_group_kind_from_name("tp_ep_pp"), MC_GROUP_TP_EP_PP);
    cr_expect_eq(mc_group_kind_from_name("dp_c"), -1);
    cr_expect_eq(mc_group_kind_from_name(NULL), -1);
}

/* ---------------------------------------------------------------------------------------------
   creation plan and fingerprint */

/* The plan order of the header comment: dp_cp, dp, cp, mp, tp, (pp, embedding,
   position_embedding) per pp group, tp_dp_cp, tp_dp, tp_cp, ep, expert_tp, tp_ep, tp_ep_pp,
   expert_dp; each kind's groups by increasing index. */
static void expect_plan_order(const mc_grid *g) {
    static const mc_group_kind before[] = {MC_GROUP_DP_CP, MC_GROUP_DP, MC_GROUP_CP, MC_GROUP_MP,
                                           MC_GROUP_TP};
    static const mc_group_kind after[] = {MC_GROUP_TP_DP_CP, MC_GROUP_TP_DP, MC_GROUP_TP_CP,
                                          MC_GROUP_EP, MC_GROUP_EXPERT_TP, MC_GROUP_TP_EP,
                                          MC_GROUP_TP_EP_PP, MC_GROUP_EXPERT_DP};
    int n = mc_grid_creation_plan(g, NULL, 0), pos = 0, total = 0;
    mc_plan_entry *plan = malloc(sizeof(mc_plan_entry) * (size_t)n);
    size_t k;
    int i;
    cr_assert_not_null(plan);
    cr_assert_eq(mc_grid_creation_plan(g, plan, n), n);
    for (k = 0; k < MC_GROUP_COUNT; k++) total += mc_grid_num_groups(g, (mc_group_kind)k);
    cr_assert_eq(n, total, "plan length %d vs the sum of group counts %d", n, total);
    for (k = 0; k < sizeof before / sizeof before[0]; k++)
        for (i = 0; i < mc_grid_num_groups(g, before[k]); i++, pos++) {
            cr_assert_eq(plan[pos].kind, before[k], "entry %d kind", pos);
            cr_assert_eq(plan[pos].index, i, "entry %d index", pos);
        }
    for (i = 0; i < mc_grid_num_groups(g, MC_GROUP_PP); i++) {
        static const mc_group_kind triple[] = {MC_GROUP_PP, MC_GROUP_EMBEDDING,
                                               MC_GROUP_POSITION_EMBEDDING};
        int t;
        for (t = 0; t < 3; t++, pos++) {
            cr_assert_eq(plan[pos].kind, triple[t], "entry %d kind", pos);
            cr_assert_eq(plan[pos].index, i, "entry %d index", pos);
        }
    }
    for (k = 0; k < sizeof after / sizeof after[0]; k++)
        for (i = 0; i < mc_grid_num_groups(g, after[k]); i++, pos++) {
            cr_assert_eq(plan[pos].kind, after[k], "entry %d kind", pos);
            cr_assert_eq(plan[pos].index, i, "entry %d index", pos);
        }
    cr_assert_eq(pos, n);
    free(plan);
}

Test(rank_grid, creation_plan_example_a) {
    mc_grid g = make_grid(8, 2, 2, 0, 0, 0, NULL);
    mc_plan_entry plan[80];
    /* 4 dp_cp + 4 dp + 8 cp + 2 mp + 4 tp + 4 x 3 pp triples + 2 + 2 + 4 + 8 ep + 4 + 4 + 2 + 4 */
    cr_assert_eq(mc_grid_creation_plan(&g, plan, 80), 64);
    cr_expect_eq(plan[0].kind, MC_GROUP_DP_CP);
    cr_expect_eq(plan[22].kind, MC_GROUP_PP);
    cr_expect_eq(plan[23].kind, MC_GROUP_EMBEDDING);
    cr_expect_eq(plan[24].kind, MC_GROUP_POSITION_EMBEDDING);
    cr_expect_eq(plan[25].kind, MC_GROUP_PP);
    cr_expect_eq(plan[25].index, 1);
    cr_expect_eq(plan[63].kind, MC_GROUP_EXPERT_DP);
    cr_expect_eq(mc_grid_creation_plan(&g, plan, 3), 64, "a short cap still counts everything");
    expect_plan_order(&g);
}

Test(rank_grid, fingerprint_tracks_order_sizes_and_salt) {
    mc_grid base = make_grid(8, 2, 2, 0, 0, 0, NULL);
    mc_grid same = make_grid(8, 2, 2, 0, 0, 0, "tp-cp-ep-dp-pp");
    mc_grid order = make_grid(8, 2, 2, 0, 0, 0, "tp-pp-dp");
    mc_grid sizes = make_grid(8, 4, 2, 0, 0, 0, NULL);
    mc_grid etp = make_grid(8, 2, 2, 0, 0, 1, NULL);
    mc_grid vpp;
    mc_grid_desc d = grid_desc(8, 2, 2, 0, 0, 0, NULL);
    uint64_t fp = mc_grid_plan_fingerprint(&base, 0);
    d.vpp = 2;
    cr_assert_eq(mc_grid_init(&vpp, &d), MC_OK);
    cr_expect_neq(fp, 0u);
    cr_expect_eq(fp, mc_grid_plan_fingerprint(&same, 0), "default order spelled out");
    cr_expect_eq(fp, mc_grid_plan_fingerprint(&base, 0), "deterministic");
    cr_expect_neq(fp, mc_grid_plan_fingerprint(&order, 0), "order");
    cr_expect_neq(fp, mc_grid_plan_fingerprint(&sizes, 0), "tp");
    cr_expect_neq(fp, mc_grid_plan_fingerprint(&etp, 0), "etp");
    cr_expect_neq(fp, mc_grid_plan_fingerprint(&vpp, 0), "vpp");
    cr_expect_neq(fp, mc_grid_plan_fingerprint(&base, 1), "salt");
}

/* ---------------------------------------------------------------------------------------------
   properties over many layouts (world up to 1024) */

/* Strides of the resolved order, recomputed here from the order string alone. */
static void strides_from_order(const mc_grid *g, int expert, int stride[5]) {
    const char *names[5] = {"tp", "cp", "ep", "dp", "pp"};
    int size[5];
    int s = 1;
    const char *p = g->order;
    size[0] = expert ? g->desc.etp : g->desc.tp;
    size[1] = expert ? 1 : g->desc.cp;
    size[2] = expert ? g->desc.ep : 1;
    size[3] = expert ? g->edp : g->dp;
    size[4] = g->desc.pp;
    while (*p) {
        int a;
        for (a = 0; a < 5; a++)
            if (strncmp(p, names[a], 2) == 0) break;
        cr_assert_lt(a, 5, "resolved order %s", g->order);
        stride[a] = s;
        s *= size[a];
        p += p[2] == '-' ? 3 : 2;
    }
    cr_assert_eq(s, g->desc.world, "the axes of %s multiply to the world", g->order);
}

/* Coordinates of a rank as (tp, cp, ep, dp, pp) in one grid. */
static void coord_vector(const mc_rank_coords *c, int expert, int v[5]) {
    v[0] = expert ? c->etp : c->tp;
    v[1] = expert ? 0 : c->cp;
    v[2] = expert ? c->ep : 0;
    v[3] = expert ? c->edp : c->dp;
    v[4] = c->pp;
}

/* Which coordinates a kind varies, and the size its groups must have. */
static unsigned kind_axes(mc_group_kind k, int *expert) {
    *expert = k >= MC_GROUP_EP;
    switch (k) {
        case MC_GROUP_TP: case MC_GROUP_EXPERT_TP: return 1u << 0;
        case MC_GROUP_PP: return 1u << 4;
        case MC_GROUP_DP: case MC_GROUP_EXPERT_DP: return 1u << 3;
        case MC_GROUP_DP_CP: return (1u << 3) | (1u << 1);
        case MC_GROUP_CP: return 1u << 1;
        case MC_GROUP_MP: return (1u << 0) | (1u << 4);
        case MC_GROUP_TP_DP: return (1u << 0) | (1u << 3);
        case MC_GROUP_TP_DP_CP: return (1u << 0) | (1u << 3) | (1u << 1);
        case MC_GROUP_TP_CP: return (1u << 0) | (1u << 1);
        case MC_GROUP_EP: return 1u << 2;
        case MC_GROUP_TP_EP: return (1u << 0) | (1u << 2);
        case MC_GROUP_TP_EP_PP: return (1u << 0) | (1u << 2) | (1u << 4);
        default: return 0;
    }
}

static int expected_size(const mc_grid *g, unsigned axes, int expert) {
    int size[5], n = 1, a;
    size[0] = expert ? g->desc.etp : g->desc.tp;
    size[1] = expert ? 1 : g->desc.cp;
    size[2] = expert ? g->desc.ep : 1;
    size[3] = expert ? g->edp : g->dp;
    size[4] = g->desc.pp;
    for (a = 0; a < 5; a++)
        if (axes & (1u << a)) n *= size[a];
    return n;
}

static void check_layout(const mc_grid *g, mc_rank_coords *coords, int *members, int *seen) {
    int world = g->desc.world, r, k;
    int stride[2][5];
    strides_from_order(g, 0, stride[0]);
    strides_from_order(g, 1, stride[1]);
    for (r = 0; r < world; r++) {
        int e;
        cr_assert_eq(mc_grid_coords(g, r, &coords[r]), MC_OK);
        for (e = 0; e < 2; e++) {
            int v[5], sum = 0, a;
            coord_vector(&coords[r], e, v);
            for (a = 0; a < 5; a++) sum += v[a] * stride[e][a];
            cr_assert_eq(sum, r, "%s grid: rank %d does not round-trip through its coordinates "
                         "(order %s)", e ? "expert" : "dense", r, g->order);
        }
    }
    for (k = 0; k < MC_GROUP_COUNT; k++) {
        int expert, n_groups, size, gi, j;
        unsigned axes = kind_axes((mc_group_kind)k, &expert);
        if (k == MC_GROUP_EMBEDDING || k == MC_GROUP_POSITION_EMBEDDING) continue;
        n_groups = mc_grid_num_groups(g, (mc_group_kind)k);
        size = mc_grid_group_size(g, (mc_group_kind)k);
        cr_assert_eq(size, expected_size(g, axes, expert), "%s size", mc_group_kind_name(k));
        cr_assert_eq(n_groups * size, world, "%s: groups x size", mc_group_kind_name(k));
        memset(seen, 0, sizeof(int) * (size_t)world);
        for (gi = 0; gi < n_groups; gi++) {
            int n = mc_grid_group_members(g, (mc_group_kind)k, gi, members, world);
            int v0[5];
            cr_assert_eq(n, size);
            coord_vector(&coords[members[0]], expert, v0);
            for (j = 0; j < n; j++) {
                int v[5], a, index = -1, pos = -1;
                seen[members[j]]++;
                if (j) cr_assert_gt(members[j], members[j - 1], "%s[%d] ascending",
                                    mc_group_kind_name(k), gi);
                coord_vector(&coords[members[j]], expert, v);
                for (a = 0; a < 5; a++)
                    if (!(axes & (1u << a)))
                        cr_assert_eq(v[a], v0[a], "%s[%d]: members differ outside the group's "
                                     "axes (order %s)", mc_group_kind_name(k), gi, g->order);
                cr_assert_eq(mc_grid_group_of(g, (mc_group_kind)k, members[j], &index, &pos),
                             MC_OK);
                cr_assert_eq(index, gi);
                cr_assert_eq(pos, j);
            }
        }
        for (r = 0; r < world; r++)
            cr_assert_eq(seen[r], 1, "rank %d is in %d %s groups (world %d, order %s)", r, seen[r],
                         mc_group_kind_name(k), world, g->order);
    }
    /* The dense pp groups are also the expert grid's pp groups: the members of a pp group share
       their expert coordinates (etp, ep, edp). */
    {
        int gi, j, n_groups = mc_grid_num_groups(g, MC_GROUP_PP);
        for (gi = 0; gi < n_groups; gi++) {
            int n = mc_grid_group_members(g, MC_GROUP_PP, gi, members, world);
            for (j = 0; j < n; j++) {
                const mc_rank_coords *a = &coords[members[0]], *b = &coords[members[j]];
                cr_assert(a->etp == b->etp && a->ep == b->ep && a->edp == b->edp,
                          "pp[%d] is not an expert pp group (order %s)", gi, g->order);
                cr_assert_eq(b->pp, j);
            }
        }
    }
    expect_plan_order(g);
}

Test(rank_grid, properties_over_many_layouts, .timeout = 240) {
    static const int worlds[] = {1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 1024};
    static const int sizes[] = {1, 2, 3, 4, 8};
    static const char *const orders[] = {NULL, "tp-pp-dp", "tp-cp-ep-pp-dp", "cp-tp-ep-dp-pp",
                                         "tp-ep-cp-dp-pp", "dp-tp-cp-ep-pp", "pp-tp-cp-ep-dp"};
    mc_rank_coords *coords = malloc(sizeof(mc_rank_coords) * 1024);
    int *members = malloc(sizeof(int) * 1024), *seen = malloc(sizeof(int) * 1024);
    int checked = 0, rejected = 0;
    size_t w, t, p, c, e, x, o;
    cr_assert(coords && members && seen);
    for (w = 0; w < sizeof worlds / sizeof worlds[0]; w++)
        for (t = 0; t < 5; t++)
            for (p = 0; p < 5; p++)
                for (c = 0; c < 3; c++)
                    for (e = 0; e < 3; e++)
                        for (x = 0; x < 3; x++)
                            for (o = 0; o < sizeof orders / sizeof orders[0]; o++) {
                                int world = worlds[w], etp = x == 0 ? 0 : sizes[x - 1];
                                mc_grid g;
                                mc_grid_desc d = grid_desc(world, sizes[t], sizes[p], sizes[c],
                                                           sizes[e], etp, orders[o]);
                                /* big worlds: a few layouts are enough */
                                if (world >= 256 && (c > 1 || e > 1 || o > 2)) continue;
                                if (mc_grid_init(&g, &d) != MC_OK) {
                                    cr_assert_neq(mc_last_error()[0], '\0');
                                    rejected++;
                                    continue;
                                }
                                check_layout(&g, coords, members, seen);
                                checked++;
                            }
    cr_log_info("rank grid properties: %d layouts checked, %d rejected", checked, rejected);
    cr_expect_gt(checked, 1000, "only %d layouts were valid", checked);
    cr_expect_gt(rejected, 100, "the loop should also meet invalid layouts");
    free(coords);
    free(members);
    free(seen);
}
