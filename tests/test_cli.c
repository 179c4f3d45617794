/* tests/test_cli.c - the `megatron_c` command-line calculator, run as a program.

   Each test runs the repo-root binary ./megatron_c (the Makefile builds it before the tests),
   parses its --json output with cJSON and checks it against Megatron's own examples
   (the initialize_model_parallel docstring, lab03's table, the order example) and against
   invariants that must hold for any world size. The SVG and the error paths are checked on
   the files and exit codes the program produces.

   make megatron_c build/tests/test_cli && ./build/tests/test_cli */
#include <criterion/criterion.h>
#include <cjson/cJSON.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/test_util.h"

#define CLI_OUT_CAP (8u << 20)   /* world 1024 prints about 0.3 MB of JSON */
#define CLI_TIMEOUT_S 20.0

TestSuite(cli, .timeout = 60);

/* ---------------------------------------------------------------------------------------------
   Running the program. */

static const char *cli_binary(void) {
    static char path[4096 + 16];
    if (path[0]) return path;
    snprintf(path, sizeof path, "%s/megatron_c", mc_test_repo_root());
    cr_assert(access(path, X_OK) == 0, "%s not found: build it with `make megatron_c`", path);
    return path;
}

/* Runs `megatron_c <args>` keeping only stdout (stderr dropped) or only stderr (stdout
   dropped). Returns the exit status; *out is a heap buffer the caller frees. */
static int cli_run_stream(const char *args, int want_stderr, char **out) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, want_stderr ? "'%s' %s 2>&1 >/dev/null" : "'%s' %s 2>/dev/null",
             cli_binary(), args);
    *out = malloc(CLI_OUT_CAP);
    cr_assert_not_null(*out);
    return mc_test_run(cmd, CLI_TIMEOUT_S, *out, CLI_OUT_CAP);
}

static int cli_run_stdout(const char *args, char **out) { return cli_run_stream(args, 0, out); }
static int cli_run_stderr(const char *args, char **err) { return cli_run_stream(args, 1, err); }

/* Runs `megatron_c layout <args> --json`, asserts success, returns the parsed object. */
static cJSON *cli_layout_json(const char *args) {
    char full[1024], *out = NULL;
    snprintf(full, sizeof full, "layout %s --json", args);
    int rc = cli_run_stdout(full, &out);
    cr_assert_eq(rc, 0, "megatron_c %s exited %d:\n%.2000s", full, rc, out);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "megatron_c %s printed invalid JSON near: %.200s", full,
                       cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?");
    cr_assert(cJSON_IsObject(root), "megatron_c %s: the JSON is not an object", full);
    free(out);
    return root;
}

static int json_int(const cJSON *obj, const char *key) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, key);
    cr_assert(cJSON_IsNumber(item), "key '%s' missing or not a number", key);
    return item->valueint;
}

/* Compares root[kind] with `want` written as JSON text, e.g. "[[0,1],[2,3]]". */
static void expect_groups(const cJSON *root, const char *kind, const char *want_text) {
    const cJSON *got = cJSON_GetObjectItemCaseSensitive(root, kind);
    cr_assert(cJSON_IsArray(got), "key '%s' missing or not a list", kind);
    cJSON *want = cJSON_Parse(want_text);
    cr_assert_not_null(want, "bad expected JSON for %s", kind);
    if (!cJSON_Compare(got, want, 1)) {
        char *got_text = cJSON_PrintUnformatted(got);
        cr_expect_fail("%s groups: got %s, want %s", kind, got_text, want_text);
        free(got_text);
    }
    cJSON_Delete(want);
}

static int count_occurrences(const char *haystack, const char *needle) {
    int n = 0;
    for (const char *p = strstr(haystack, needle); p; p = strstr(p + strlen(needle), needle)) ++n;
    return n;
}

/* ---------------------------------------------------------------------------------------------
   Invariants of any layout: every kind is present, coordinates form a bijection onto the dense
   and the expert grid, each partitioning kind covers every rank exactly once with groups of
   the right size whose members differ only along the kind's own axes, and the embedding groups
   are the first and last rank of each pipeline group. */

typedef struct kind_axes {
    const char *kind;
    int expert;               /* 1: coordinates of the expert grid (etp, ep, edp, pp) */
    const char *varying[4];   /* the axes a group spans; all other axes are fixed in a group */
} kind_axes;

static const kind_axes partition_kinds[] = {
    {"tp", 0, {"tp"}},
    {"pp", 0, {"pp"}},
    {"dp", 0, {"dp"}},
    {"dp_cp", 0, {"dp", "cp"}},
    {"cp", 0, {"cp"}},
    {"mp", 0, {"tp", "pp"}},
    {"tp_dp", 0, {"tp", "dp"}},
    {"tp_dp_cp", 0, {"tp", "dp", "cp"}},
    {"tp_cp", 0, {"tp", "cp"}},
    {"ep", 1, {"ep"}},
    {"expert_tp", 1, {"etp"}},
    {"tp_ep", 1, {"etp", "ep"}},
    {"tp_ep_pp", 1, {"etp", "ep", "pp"}},
    {"expert_dp", 1, {"edp"}},
};
static const char *const dense_axes[] = {"tp", "cp", "dp", "pp"};
static const char *const expert_axes[] = {"etp", "ep", "edp", "pp"};
static const char *const all_kinds[] = {
    "tp", "pp", "dp", "dp_cp", "cp", "mp", "tp_dp", "tp_dp_cp", "tp_cp", "embedding",
    "position_embedding", "ep", "expert_tp", "tp_ep", "tp_ep_pp", "expert_dp"};

static int axis_varies(const kind_axes *k, const char *axis) {
    for (int i = 0; i < 4 && k->varying[i]; ++i)
        if (strcmp(k->varying[i], axis) == 0) return 1;
    return 0;
}

static void check_coords(const cJSON *root, int world) {
    const cJSON *coords = cJSON_GetObjectItemCaseSensitive(root, "coords");
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(root, "sizes");
    cr_assert_eq(cJSON_GetArraySize(coords), world, "coords has %d entries, want %d",
                 cJSON_GetArraySize(coords), world);
    char *seen_dense = calloc((size_t)world, 1), *seen_expert = calloc((size_t)world, 1);
    for (int r = 0; r < world; ++r) {
        const cJSON *c = cJSON_GetArrayItem(coords, r);
        cr_assert_eq(json_int(c, "rank"), r, "coords[%d].rank = %d", r, json_int(c, "rank"));
        /* Mixed radix over (tp, cp, dp, pp) and (etp, ep, edp, pp): a bijection onto 0..W-1. */
        int dense = 0, expert = 0;
        for (int a = 3; a >= 0; --a) {
            int dv = json_int(c, dense_axes[a]), ds = json_int(sizes, dense_axes[a]);
            int ev = json_int(c, expert_axes[a]), es = json_int(sizes, expert_axes[a]);
            cr_assert(dv >= 0 && dv < ds, "rank %d: %s = %d outside 0..%d", r, dense_axes[a],
                      dv, ds - 1);
            cr_assert(ev >= 0 && ev < es, "rank %d: %s = %d outside 0..%d", r, expert_axes[a],
                      ev, es - 1);
            dense = dense * ds + dv;
            expert = expert * es + ev;
        }
        cr_assert(!seen_dense[dense], "rank %d repeats another rank's dense coordinates", r);
        cr_assert(!seen_expert[expert], "rank %d repeats another rank's expert coordinates", r);
        seen_dense[dense] = seen_expert[expert] = 1;
    }
    free(seen_dense);
    free(seen_expert);
}

static void check_partition_kind(const cJSON *root, const kind_axes *k, int world) {
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(root, k->kind);
    const cJSON *coords = cJSON_GetObjectItemCaseSensitive(root, "coords");
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(root, "sizes");
    const char *const *axes = k->expert ? expert_axes : dense_axes;
    int want_size = 1;
    for (int a = 0; a < 4; ++a)
        if (axis_varies(k, axes[a])) want_size *= json_int(sizes, axes[a]);
    cr_assert_eq(cJSON_GetArraySize(groups), world / want_size, "%s: %d groups, want %d",
                 k->kind, cJSON_GetArraySize(groups), world / want_size);
    int *hits = calloc((size_t)world, sizeof *hits);
    const cJSON *group;
    int g = 0;
    cJSON_ArrayForEach(group, groups) {
        cr_assert_eq(cJSON_GetArraySize(group), want_size, "%s[%d] has %d ranks, want %d",
                     k->kind, g, cJSON_GetArraySize(group), want_size);
        const cJSON *first = cJSON_GetArrayItem(coords, cJSON_GetArrayItem(group, 0)->valueint);
        const cJSON *member;
        cJSON_ArrayForEach(member, group) {
            int r = member->valueint;
            cr_assert(r >= 0 && r < world, "%s[%d] holds rank %d", k->kind, g, r);
            hits[r]++;
            const cJSON *c = cJSON_GetArrayItem(coords, r);
            for (int a = 0; a < 4; ++a)
                if (!axis_varies(k, axes[a]))
                    cr_assert_eq(json_int(c, axes[a]), json_int(first, axes[a]),
                                 "%s[%d]: rank %d has %s %d but the group's first rank has %d",
                                 k->kind, g, r, axes[a], json_int(c, axes[a]),
                                 json_int(first, axes[a]));
        }
        ++g;
    }
    for (int r = 0; r < world; ++r)
        cr_assert_eq(hits[r], 1, "%s: rank %d is in %d groups, want exactly 1", k->kind, r,
                     hits[r]);
    free(hits);
}

static void check_embedding_kinds(const cJSON *root) {
    const cJSON *pp = cJSON_GetObjectItemCaseSensitive(root, "pp");
    const cJSON *emb = cJSON_GetObjectItemCaseSensitive(root, "embedding");
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(root, "position_embedding");
    int n = cJSON_GetArraySize(pp);
    cr_assert_eq(cJSON_GetArraySize(emb), n, "one embedding group per pp group");
    cr_assert_eq(cJSON_GetArraySize(pos), n, "one position-embedding group per pp group");
    for (int i = 0; i < n; ++i) {
        const cJSON *stages = cJSON_GetArrayItem(pp, i);
        int first = cJSON_GetArrayItem(stages, 0)->valueint;
        int last = cJSON_GetArrayItem(stages, cJSON_GetArraySize(stages) - 1)->valueint;
        const cJSON *e = cJSON_GetArrayItem(emb, i), *p = cJSON_GetArrayItem(pos, i);
        int want_n = first == last ? 1 : 2;
        cr_assert_eq(cJSON_GetArraySize(e), want_n, "embedding[%d] size", i);
        cr_assert_eq(cJSON_GetArrayItem(e, 0)->valueint, first, "embedding[%d][0]", i);
        cr_assert_eq(cJSON_GetArrayItem(e, want_n - 1)->valueint, last, "embedding[%d] last", i);
        cr_assert_eq(cJSON_GetArraySize(p), 1, "position_embedding[%d] size", i);
        cr_assert_eq(cJSON_GetArrayItem(p, 0)->valueint, first, "position_embedding[%d]", i);
    }
}

static void check_layout_invariants(const char *args) {
    cJSON *root = cli_layout_json(args);
    int world = json_int(root, "world");
    for (size_t i = 0; i < sizeof all_kinds / sizeof all_kinds[0]; ++i)
        cr_assert(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, all_kinds[i])),
                  "layout %s: kind '%s' missing", args, all_kinds[i]);
    /* world, sizes, coords and the 16 kinds, nothing else without --rank. */
    cr_assert_eq(cJSON_GetArraySize(root), 3 + 16, "layout %s: %d top-level keys, want 19", args,
                 cJSON_GetArraySize(root));
    check_coords(root, world);
    for (size_t i = 0; i < sizeof partition_kinds / sizeof partition_kinds[0]; ++i)
        check_partition_kind(root, &partition_kinds[i], world);
    check_embedding_kinds(root);
    cJSON_Delete(root);
}

/* ---------------------------------------------------------------------------------------------
   Megatron's examples. */

/* The initialize_model_parallel docstring: 16 GPUs, TP 2, PP 4. */
Test(cli, docstring_example_world16_tp2_pp4) {
    cJSON *root = cli_layout_json("--world 16 --tp 2 --pp 4");
    cr_expect_eq(json_int(root, "world"), 16);
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(root, "sizes");
    cr_expect_eq(json_int(sizes, "dp"), 2, "dp = 16 / (2*4)");
    cr_expect_str_eq(cJSON_GetObjectItemCaseSensitive(sizes, "order")->valuestring,
                     "tp-cp-ep-dp-pp");
    expect_groups(root, "tp", "[[0,1],[2,3],[4,5],[6,7],[8,9],[10,11],[12,13],[14,15]]");
    expect_groups(root, "dp", "[[0,2],[1,3],[4,6],[5,7],[8,10],[9,11],[12,14],[13,15]]");
    expect_groups(root, "pp", "[[0,4,8,12],[1,5,9,13],[2,6,10,14],[3,7,11,15]]");
    expect_groups(root, "embedding", "[[0,12],[1,13],[2,14],[3,15]]");
    expect_groups(root, "position_embedding", "[[0],[1],[2],[3]]");
    expect_groups(root, "mp", "[[0,1,4,5,8,9,12,13],[2,3,6,7,10,11,14,15]]");
    expect_groups(root, "tp_dp", "[[0,1,2,3],[4,5,6,7],[8,9,10,11],[12,13,14,15]]");
    cJSON_Delete(root);
}

/* lab03's table (grading_design D.1): world 8, TP 2, PP 2, default order. */
Test(cli, lab03_table_world8_tp2_pp2) {
    cJSON *root = cli_layout_json("--world 8 --tp 2 --pp 2");
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(root, "sizes");
    cr_expect_eq(json_int(sizes, "dp"), 2);
    cr_expect_eq(json_int(sizes, "edp"), 2);
    cr_expect_eq(json_int(sizes, "etp"), 2, "etp defaults to tp");
    expect_groups(root, "tp", "[[0,1],[2,3],[4,5],[6,7]]");
    expect_groups(root, "dp", "[[0,2],[1,3],[4,6],[5,7]]");
    expect_groups(root, "dp_cp", "[[0,2],[1,3],[4,6],[5,7]]");
    expect_groups(root, "pp", "[[0,4],[1,5],[2,6],[3,7]]");
    expect_groups(root, "mp", "[[0,1,4,5],[2,3,6,7]]");
    expect_groups(root, "tp_dp", "[[0,1,2,3],[4,5,6,7]]");
    expect_groups(root, "tp_dp_cp", "[[0,1,2,3],[4,5,6,7]]");
    expect_groups(root, "tp_cp", "[[0,1],[2,3],[4,5],[6,7]]");
    expect_groups(root, "cp", "[[0],[1],[2],[3],[4],[5],[6],[7]]");
    expect_groups(root, "embedding", "[[0,4],[1,5],[2,6],[3,7]]");
    expect_groups(root, "position_embedding", "[[0],[1],[2],[3]]");
    expect_groups(root, "ep", "[[0],[1],[2],[3],[4],[5],[6],[7]]");
    expect_groups(root, "expert_tp", "[[0,1],[2,3],[4,5],[6,7]]");
    expect_groups(root, "tp_ep_pp", "[[0,1,4,5],[2,3,6,7]]");
    expect_groups(root, "expert_dp", "[[0,2],[1,3],[4,6],[5,7]]");
    /* Rank r: tp = r mod 2, dp = r/2 mod 2, pp = r/4. */
    const cJSON *coords = cJSON_GetObjectItemCaseSensitive(root, "coords");
    const cJSON *c5 = cJSON_GetArrayItem(coords, 5);
    cr_expect_eq(json_int(c5, "tp"), 1);
    cr_expect_eq(json_int(c5, "dp"), 0);
    cr_expect_eq(json_int(c5, "pp"), 1);
    cJSON_Delete(root);
}

/* Semantics example A': the same sizes with order tp-pp-dp move dp, pp, mp and tp-dp but
   leave tp (and cp) alone. */
Test(cli, order_tp_pp_dp_moves_dp_and_pp) {
    cJSON *root = cli_layout_json("--world 8 --tp 2 --pp 2 --order tp-pp-dp");
    const cJSON *order = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(root, "sizes"), "order");
    cr_assert(cJSON_IsString(order));
    cr_expect(strncmp(order->valuestring, "tp-pp-dp", 8) == 0, "resolved order '%s'",
              order->valuestring);
    expect_groups(root, "pp", "[[0,2],[1,3],[4,6],[5,7]]");
    expect_groups(root, "dp", "[[0,4],[1,5],[2,6],[3,7]]");
    expect_groups(root, "tp", "[[0,1],[2,3],[4,5],[6,7]]");
    expect_groups(root, "cp", "[[0],[1],[2],[3],[4],[5],[6],[7]]");
    expect_groups(root, "embedding", "[[0,2],[1,3],[4,6],[5,7]]");
    expect_groups(root, "position_embedding", "[[0],[1],[4],[5]]");
    expect_groups(root, "mp", "[[0,1,2,3],[4,5,6,7]]");
    expect_groups(root, "tp_dp", "[[0,1,4,5],[2,3,6,7]]");
    /* Rank = tp + 2*pp + 4*dp. */
    const cJSON *c6 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "coords"), 6);
    cr_expect_eq(json_int(c6, "tp"), 0);
    cr_expect_eq(json_int(c6, "pp"), 1);
    cr_expect_eq(json_int(c6, "dp"), 1);
    cJSON_Delete(root);
}

/* ---------------------------------------------------------------------------------------------
   Invariants at several sizes, 1024 ranks included. */

Test(cli, world1024_tp8_pp8_is_valid_and_complete, .timeout = 120) {
    check_layout_invariants("--world 1024 --tp 8 --pp 8");
    /* Default order: rank = tp + 8*dp + 128*pp (cp = 1; pp's stride is tp*dp), dp = 1024/64. */
    cJSON *root = cli_layout_json("--world 1024 --tp 8 --pp 8");
    cr_expect_eq(json_int(cJSON_GetObjectItemCaseSensitive(root, "sizes"), "dp"), 16);
    const cJSON *c;
    int r = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(root, "coords")) {
        int want = json_int(c, "tp") + 8 * json_int(c, "dp") + 128 * json_int(c, "pp");
        cr_assert_eq(want, r, "rank %d has coords giving %d", r, want);
        ++r;
    }
    cJSON_Delete(root);
}

Test(cli, invariants_with_cp_ep_and_expert_tp) {
    check_layout_invariants("--world 64 --tp 2 --pp 2 --cp 2 --ep 4 --etp 1");
    check_layout_invariants("--world 32 --tp 4 --cp 2 --ep 2");
    check_layout_invariants("--world 48 --tp 2 --pp 3 --order tp-pp-dp");
    check_layout_invariants("--world 1");
}

Test(cli, vpp_and_expert_sizes_are_reported) {
    cJSON *root = cli_layout_json("--world 64 --tp 2 --pp 4 --vpp 3 --ep 4 --etp 1");
    const cJSON *sizes = cJSON_GetObjectItemCaseSensitive(root, "sizes");
    cr_expect_eq(json_int(sizes, "vpp"), 3);
    cr_expect_eq(json_int(sizes, "dp"), 8, "dp = 64 / (2*4*1)");
    cr_expect_eq(json_int(sizes, "edp"), 4, "edp = 64 / (1*4*4)");
    cr_expect_eq(json_int(sizes, "ep"), 4);
    cr_expect_eq(json_int(sizes, "etp"), 1);
    cJSON_Delete(root);
}

/* ---------------------------------------------------------------------------------------------
   --rank */

static const cJSON *rank_group(const cJSON *rank_obj, const char *kind) {
    const cJSON *groups = cJSON_GetObjectItemCaseSensitive(rank_obj, "groups");
    cr_assert(cJSON_IsObject(groups), "rank.groups missing");
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(groups, kind);
    cr_assert_not_null(g, "rank.groups.%s missing", kind);
    return g;
}

static void expect_rank_members(const cJSON *rank_obj, const char *kind, const char *want_text) {
    const cJSON *g = rank_group(rank_obj, kind);
    cr_assert(cJSON_IsObject(g), "rank.groups.%s is not an object", kind);
    cJSON *want = cJSON_Parse(want_text);
    const cJSON *got = cJSON_GetObjectItemCaseSensitive(g, "members");
    if (!cJSON_Compare(got, want, 1)) {
        char *got_text = cJSON_PrintUnformatted(got);
        cr_expect_fail("rank's %s group: got %s, want %s", kind, got_text, want_text);
        free(got_text);
    }
    cJSON_Delete(want);
}

Test(cli, rank_json_middle_stage_has_no_embedding_group) {
    cJSON *root = cli_layout_json("--world 16 --tp 2 --pp 4 --rank 5");
    cr_expect(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(root, "tp")),
              "the full object stays with --rank");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rank");
    cr_assert(cJSON_IsObject(r), "'rank' key missing");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(r, "coords");
    cr_expect_eq(json_int(c, "tp"), 1);
    cr_expect_eq(json_int(c, "dp"), 0);
    cr_expect_eq(json_int(c, "pp"), 1);
    cr_expect(cJSON_IsNull(rank_group(r, "embedding")), "stage 1 of 4 is in no embedding group");
    cr_expect(cJSON_IsNull(rank_group(r, "position_embedding")));
    expect_rank_members(r, "tp", "[4,5]");
    expect_rank_members(r, "dp", "[5,7]");
    expect_rank_members(r, "pp", "[1,5,9,13]");
    cr_expect_eq(json_int(rank_group(r, "tp"), "position"), 1, "rank 5 is tp rank 1");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "pipeline");
    cr_expect_eq(json_int(p, "first"), 1);
    cr_expect_eq(json_int(p, "last"), 13);
    cr_expect_eq(json_int(p, "next"), 9);
    cr_expect_eq(json_int(p, "prev"), 1);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r, "is_first_stage")));
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r, "is_last_stage")));
    cJSON_Delete(root);
}

Test(cli, rank_json_last_stage_wraps_to_first) {
    cJSON *root = cli_layout_json("--world 16 --tp 2 --pp 4 --rank 12");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "rank");
    cr_assert(cJSON_IsObject(r));
    expect_rank_members(r, "embedding", "[0,12]");
    cr_expect(cJSON_IsNull(rank_group(r, "position_embedding")), "only stage 0 holds it");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "pipeline");
    cr_expect_eq(json_int(p, "next"), 0, "next is cyclic: the last stage sends to the first");
    cr_expect_eq(json_int(p, "prev"), 8);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r, "is_last_stage")));
    cJSON_Delete(root);
}

/* The lab03 probe rank: tp 1, dp 0, pp 1, last stage, embedding group [1,5]. */
Test(cli, rank_text_lab03_probe) {
    char *out = NULL;
    int rc = cli_run_stdout("layout --world 8 --tp 2 --pp 2 --rank 5", &out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "tp 1  cp 0  dp 0  pp 1"), "coords line:\n%s", out);
    cr_expect(mc_test_contains(out, "last stage yes"), "%s", out);
    cr_expect(mc_test_contains(out, "[1,5]"), "%s", out);
    cr_expect(mc_test_contains(out, "next 1  prev 1"), "%s", out);
    free(out);

    rc = cli_run_stdout("layout --world 16 --tp 2 --pp 4 --rank 6", &out);
    cr_assert_eq(rc, 0);
    const char *line = strstr(out, "\n  embedding ");
    cr_assert_not_null(line, "no embedding line:\n%s", out);
    char kind[32] = "", group[32] = "";
    cr_assert_eq(sscanf(line, "%31s %31s", kind, group), 2);
    cr_expect_str_eq(group, "none", "a middle stage is in no embedding group:\n%.120s", line + 1);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   Text output agrees with the JSON. */

Test(cli, text_table_matches_json) {
    const char *args = "--world 32 --tp 2 --pp 2 --cp 2 --ep 2";
    char full[256], *out = NULL;
    snprintf(full, sizeof full, "layout %s", args);
    int rc = cli_run_stdout(full, &out);
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cJSON *root = cli_layout_json(args);
    const cJSON *coords = cJSON_GetObjectItemCaseSensitive(root, "coords");
    int rows = 0;
    for (const char *line = out; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        int v[8];
        if (sscanf(line, "%d %d %d %d %d %d %d %d", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]) != 8)
            continue;
        const cJSON *c = cJSON_GetArrayItem(coords, v[0]);
        cr_assert_not_null(c, "table row for rank %d", v[0]);
        static const char *const keys[] = {"tp", "cp", "dp", "pp", "etp", "ep", "edp"};
        for (int k = 0; k < 7; ++k)
            cr_expect_eq(v[k + 1], json_int(c, keys[k]), "rank %d %s: table %d, json %d", v[0],
                         keys[k], v[k + 1], json_int(c, keys[k]));
        ++rows;
    }
    cr_expect_eq(rows, 32, "%d table rows, want one per rank", rows);
    cr_expect(mc_test_contains(out, "embedding"), "groups section:\n%s", out);
    cJSON_Delete(root);
    free(out);
}

Test(cli, text_groups_docstring_example) {
    char *out = NULL;
    int rc = cli_run_stdout("layout --world 16 --tp 2 --pp 4", &out);
    cr_assert_eq(rc, 0);
    cr_expect(mc_test_contains(out, "[0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]"), "%s", out);
    cr_expect(mc_test_contains(out, "[0,12] [1,13] [2,14] [3,15]"), "%s", out);
    cr_expect(mc_test_contains(out, "dp 2"), "header names the derived dp:\n%.300s", out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   --svg */

/* Tags nest and close: every <x> has its </x>, self-closing tags aside. Text in the file must
   not contain a raw '<' (it would be escaped). Returns 1 when balanced. */
static int svg_tags_balanced(const char *svg, char *why, size_t why_cap) {
    char stack[64][32];
    int depth = 0;
    for (const char *p = strchr(svg, '<'); p; p = strchr(p + 1, '<')) {
        const char *end = strchr(p, '>');
        if (!end) return snprintf(why, why_cap, "unterminated tag"), 0;
        if (p[1] == '?' || p[1] == '!') continue;
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t len = strcspn(name, " \t\n/>");
        if (len == 0 || len >= 32) return snprintf(why, why_cap, "bad tag near %.20s", p), 0;
        if (closing) {
            if (depth == 0 || strncmp(stack[depth - 1], name, len) != 0 ||
                stack[depth - 1][len] != '\0')
                return snprintf(why, why_cap, "</%.*s> does not close <%s>", (int)len, name,
                                depth ? stack[depth - 1] : "(nothing)"), 0;
            --depth;
        } else if (end[-1] != '/') {
            if (depth == 64) return snprintf(why, why_cap, "nesting too deep"), 0;
            memcpy(stack[depth], name, len);
            stack[depth++][len] = '\0';
        }
    }
    if (depth != 0) return snprintf(why, why_cap, "<%s> never closed", stack[depth - 1]), 0;
    return 1;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s was not written", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Writes the SVG of `args` into a fresh temporary directory and returns its text. */
static char *svg_of(const char *args) {
    char dir[] = "/tmp/mc_test_cli_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], full[512], *out = NULL;
    snprintf(path, sizeof path, "%s/grid.svg", dir);
    snprintf(full, sizeof full, "layout %s --svg %s", args, path);
    int rc = cli_run_stdout(full, &out);
    cr_assert_eq(rc, 0, "megatron_c %s exited %d:\n%.500s", full, rc, out);
    free(out);
    char *svg = read_file(path);
    unlink(path);
    rmdir(dir);
    return svg;
}

static void expect_svg_shape(const char *svg, int world) {
    cr_expect(strncmp(svg, "<svg", 4) == 0, "starts with: %.40s", svg);
    cr_expect(mc_test_contains(svg, "xmlns=\"http://www.w3.org/2000/svg\""));
    size_t n = strlen(svg);
    cr_expect(n > 7 && strcmp(svg + n - 7, "</svg>\n") == 0, "ends with </svg>");
    cr_expect_eq(count_occurrences(svg, "<rect class=\"rank\""), world,
                 "one rank cell per rank: %d, want %d",
                 count_occurrences(svg, "<rect class=\"rank\""), world);
    char why[128] = "";
    cr_expect(svg_tags_balanced(svg, why, sizeof why), "SVG tags: %s", why);
}

Test(cli, svg_small_world_has_a_cell_per_rank) {
    char *svg = svg_of("--world 16 --tp 2 --pp 4");
    expect_svg_shape(svg, 16);
    for (int r = 0; r < 16; ++r) {
        char title[32];
        snprintf(title, sizeof title, "<title>rank %d:", r);
        cr_expect(mc_test_contains(svg, title), "no cell titled rank %d", r);
    }
    cr_expect(mc_test_contains(svg, "tp 2 x cp 1 x dp 2 x pp 4"), "title names the sizes");
    free(svg);
}

/* Colouring by embedding: the 8 middle-stage ranks (pp 1 and 2) are in no group and drawn
   dashed; colouring by pp gives 4 colours, one per pipeline group. */
Test(cli, svg_color_by_kind) {
    char *svg = svg_of("--world 16 --tp 2 --pp 4 --color-by embedding");
    expect_svg_shape(svg, 16);
    cr_expect_eq(count_occurrences(svg, "stroke-dasharray"), 8, "dashed (non-member) cells: %d",
                 count_occurrences(svg, "stroke-dasharray"));
    cr_expect(mc_test_contains(svg, "embedding #0 [0,12]"), "legend lists the groups");
    free(svg);

    svg = svg_of("--world 16 --tp 2 --pp 4 --color-by pp");
    cr_expect_eq(count_occurrences(svg, "stroke-dasharray"), 0);
    cr_expect(mc_test_contains(svg, "pp #3 [3,7,11,15]"), "legend lists the pp groups");
    free(svg);
}

Test(cli, svg_world1024_stays_valid, .timeout = 120) {
    char *svg = svg_of("--world 1024 --tp 8 --pp 8 --color-by dp");
    expect_svg_shape(svg, 1024);
    cr_expect(mc_test_contains(svg, "<title>rank 1023:"));
    free(svg);
}

Test(cli, svg_unwritable_path_fails) {
    char *err = NULL;
    int rc = cli_run_stderr("layout --world 4 --svg /nonexistent-dir/x.svg", &err);
    cr_expect_eq(rc, 1, "exit %d", rc);
    cr_expect(mc_test_contains(err, "/nonexistent-dir/x.svg"), "%s", err);
    free(err);
}

/* ---------------------------------------------------------------------------------------------
   Invalid combinations: exit 2, stdout empty, stderr names the values and Megatron's rule. */

static char *expect_invalid(const char *args) {
    char *out = NULL, *err = NULL;
    int rc = cli_run_stdout(args, &out);
    cr_expect_eq(rc, 2, "megatron_c %s: exit %d, want 2", args, rc);
    cr_expect_eq(out[0], '\0', "megatron_c %s printed to stdout: %.200s", args, out);
    free(out);
    rc = cli_run_stderr(args, &err);
    cr_expect_eq(rc, 2);
    return err;
}

Test(cli, invalid_world_not_divisible) {
    char *err = expect_invalid("layout --world 10 --tp 4");
    cr_expect(mc_test_contains(err, "10") && mc_test_contains(err, "4"), "values: %s", err);
    cr_expect(mc_test_contains(err, "divisible"), "rule: %s", err);
    cr_expect(!mc_test_contains(err, "usage:"), "a rule error is not a usage error: %s", err);
    free(err);
}

Test(cli, invalid_vpp_needs_pp_above_1) {
    char *err = expect_invalid("layout --world 8 --vpp 2");
    cr_expect(mc_test_contains(err, "interleaved"), "rule: %s", err);
    cr_expect(mc_test_contains(err, "1"), "names pp = 1: %s", err);
    free(err);
}

Test(cli, invalid_order_missing_pp) {
    char *err = expect_invalid("layout --world 8 --tp 2 --pp 2 --order tp-dp");
    cr_expect(mc_test_contains(err, "pp") && mc_test_contains(err, "order"), "rule: %s", err);
    cr_expect(mc_test_contains(err, "2"), "names the size: %s", err);
    free(err);
}

Test(cli, invalid_rank_out_of_range) {
    char *err = expect_invalid("layout --world 8 --tp 2 --rank 8");
    cr_expect(mc_test_contains(err, "--rank 8"), "%s", err);
    free(err);
}

/* ---------------------------------------------------------------------------------------------
   Usage */

Test(cli, usage_errors_exit_2_with_usage) {
    static const char *const bad[] = {
        "layout --world 8 --bogus 1",  /* unknown flag */
        "layout --world 8 --tp",       /* missing value */
        "layout --world 8 --tp two",   /* not a number */
        "layout --world 8 --tp 0",     /* below 1 */
        "layout --tp 2",               /* --world missing */
        "layout --world 8 --color-by nothing",
        "layout --world 8 extra",
        "frobnicate",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char *err = NULL;
        int rc = cli_run_stderr(bad[i], &err);
        cr_expect_eq(rc, 2, "megatron_c %s: exit %d, want 2", bad[i], rc);
        cr_expect(mc_test_contains(err, "usage:"), "megatron_c %s: no usage on stderr:\n%s",
                  bad[i], err);
        free(err);
    }
}

Test(cli, help_exits_0) {
    static const char *const asks[] = {"--help", "help", "layout --help", "help layout"};
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; ++i) {
        char *out = NULL;
        int rc = cli_run_stdout(asks[i], &out);
        cr_expect_eq(rc, 0, "megatron_c %s: exit %d", asks[i], rc);
        cr_expect(mc_test_contains(out, "usage:"), "megatron_c %s:\n%s", asks[i], out);
        cr_expect(mc_test_contains(out, "layout"), "megatron_c %s names layout", asks[i]);
        free(out);
    }
    char *out = NULL;
    cr_expect_eq(cli_run_stdout("help layout", &out), 0);
    cr_expect(mc_test_contains(out, "--world") && mc_test_contains(out, "--color-by"), "%s", out);
    free(out);
}

Test(cli, equals_form_matches_space_form) {
    char *a = NULL, *b = NULL;
    cr_assert_eq(cli_run_stdout("layout --world=16 --tp=2 --pp=4 --json", &a), 0);
    cr_assert_eq(cli_run_stdout("layout --world 16 --tp 2 --pp 4 --json", &b), 0);
    cr_expect_str_eq(a, b);
    free(a);
    free(b);
}

/* ---------------------------------------------------------------------------------------------
   schedule: per-stage op order as JSON (checked against op lists written out by hand from
   megatron_semantics.md section 8), the text table, the SVG timeline and Megatron's
   interleaving rules as exit-2 errors. */

/* Runs `megatron_c <args>` (which must print JSON), asserts success, returns the parsed value. */
static cJSON *cli_json(const char *args) {
    char *out = NULL;
    int rc = cli_run_stdout(args, &out);
    cr_assert_eq(rc, 0, "megatron_c %s exited %d:\n%.2000s", args, rc, out);
    cJSON *root = cJSON_Parse(out);
    cr_assert_not_null(root, "megatron_c %s printed invalid JSON: %.300s", args, out);
    free(out);
    return root;
}

/* root must be exactly {"stages": want}, want given as JSON text. */
static void expect_stages(const char *args, const char *want_text) {
    cJSON *root = cli_json(args);
    cr_assert(cJSON_IsObject(root), "megatron_c %s: not an object", args);
    cr_expect_eq(cJSON_GetArraySize(root), 1, "megatron_c %s: only the \"stages\" key", args);
    const cJSON *got = cJSON_GetObjectItemCaseSensitive(root, "stages");
    cr_assert(cJSON_IsArray(got), "megatron_c %s: \"stages\" missing or not a list", args);
    cJSON *want = cJSON_Parse(want_text);
    cr_assert_not_null(want, "bad expected JSON");
    if (!cJSON_Compare(got, want, 1)) {
        char *got_text = cJSON_PrintUnformatted(got);
        cr_expect_fail("megatron_c %s:\n got  %s\n want %s", args, got_text, want_text);
        free(got_text);
    }
    cJSON_Delete(want);
    cJSON_Delete(root);
}

Test(cli, schedule_json_1f1b_pp4_m8) {
    expect_stages("schedule --pp 4 --microbatches 8 --json",
                  "[[\"F0\",\"F1\",\"F2\",\"F3\",\"B0\",\"F4\",\"B1\",\"F5\",\"B2\",\"F6\",\"B3\","
                  "\"F7\",\"B4\",\"B5\",\"B6\",\"B7\"],"
                  "[\"F0\",\"F1\",\"F2\",\"B0\",\"F3\",\"B1\",\"F4\",\"B2\",\"F5\",\"B3\",\"F6\","
                  "\"B4\",\"F7\",\"B5\",\"B6\",\"B7\"],"
                  "[\"F0\",\"F1\",\"B0\",\"F2\",\"B1\",\"F3\",\"B2\",\"F4\",\"B3\",\"F5\",\"B4\","
                  "\"F6\",\"B5\",\"F7\",\"B6\",\"B7\"],"
                  "[\"F0\",\"B0\",\"F1\",\"B1\",\"F2\",\"B2\",\"F3\",\"B3\",\"F4\",\"B4\",\"F5\","
                  "\"B5\",\"F6\",\"B6\",\"F7\",\"B7\"]]");
}

/* PP2 N3 M5 VP2: forwards follow the table 0 1 2 0 1 2 3 4 3 4 / chunks 0 0 0 1 1 1 0 0 1 1;
   warmup 5 on stage 0 and 3 on stage 1; backward k runs chunk 1 - table[k].chunk. */
Test(cli, schedule_json_interleaved_example) {
    expect_stages("schedule --pp 2 --microbatches 5 --vpp 2 --group-size 3 --json",
                  "[[\"F0.0\",\"F1.0\",\"F2.0\",\"F0.1\",\"F1.1\",\"F2.1\",\"B0.1\",\"F3.0\","
                  "\"B1.1\",\"F4.0\",\"B2.1\",\"F3.1\",\"B0.0\",\"F4.1\",\"B1.0\",\"B2.0\","
                  "\"B3.1\",\"B4.1\",\"B3.0\",\"B4.0\"],"
                  "[\"F0.0\",\"F1.0\",\"F2.0\",\"F0.1\",\"B0.1\",\"F1.1\",\"B1.1\",\"F2.1\","
                  "\"B2.1\",\"F3.0\",\"B0.0\",\"F4.0\",\"B1.0\",\"F3.1\",\"B2.0\",\"F4.1\","
                  "\"B3.1\",\"B4.1\",\"B3.0\",\"B4.0\"]]");
}

Test(cli, schedule_json_forward_only_and_no_pipelining) {
    expect_stages("schedule --pp 2 --microbatches 3 --forward-only --json",
                  "[[\"F0\",\"F1\",\"F2\"],[\"F0\",\"F1\",\"F2\"]]");
    expect_stages("schedule --pp 1 --microbatches 3 --json",
                  "[[\"F0\",\"B0\",\"F1\",\"B1\",\"F2\",\"B2\"]]");
}

Test(cli, schedule_text_warmup_and_bubble) {
    char *out = NULL;
    int rc = cli_run_stdout("schedule --pp 4 --microbatches 8", &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "without_interleaving"), "%s", out);
    cr_expect(mc_test_contains(out, "stage 0  warmup  3 | F0 F1 F2 F3 B0 F4"), "%s", out);
    cr_expect(mc_test_contains(out, "stage 3  warmup  0 | F0 B0 F1 B1"), "%s", out);
    /* (p - 1) / m = 3 / 8, from the simulation and from the paper's formula */
    cr_expect_eq(count_occurrences(out, "0.3750"), 2, "%s", out);
    free(out);
    rc = cli_run_stdout("schedule --pp 4 --microbatches 8 --vpp 2", &out);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "with_interleaving"), "%s", out);
    cr_expect(mc_test_contains(out, "stage 0  warmup 10 | F0.0 F1.0"), "%s", out);
    cr_expect_eq(count_occurrences(out, "0.1875"), 2, "3 / (2 x 8): %s", out);
    free(out);
}

Test(cli, schedule_svg_has_a_box_per_op) {
    char dir[] = "/tmp/mc_test_cli_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256], args[512], *out = NULL;
    snprintf(path, sizeof path, "%s/timeline.svg", dir);
    snprintf(args, sizeof args, "schedule --pp 4 --microbatches 8 --vpp 2 --svg %s", path);
    int rc = cli_run_stdout(args, &out);
    cr_assert_eq(rc, 0, "%s", out);
    free(out);
    char *svg = read_file(path);
    unlink(path);
    rmdir(dir);
    cr_expect(strncmp(svg, "<svg", 4) == 0, "starts with: %.40s", svg);
    cr_expect_eq(count_occurrences(svg, "<rect class=\"op\""), 4 * 32, "4 stages x 32 ops: %d",
                 count_occurrences(svg, "<rect class=\"op\""));
    cr_expect_eq(count_occurrences(svg, "class=\"stage\">stage "), 4);
    char why[128] = "";
    cr_expect(svg_tags_balanced(svg, why, sizeof why), "SVG tags: %s", why);
    free(svg);
    char *err = NULL;
    rc = cli_run_stderr("schedule --pp 2 --microbatches 2 --svg /nonexistent-dir/x.svg", &err);
    cr_expect_eq(rc, 1, "an unwritable --svg is an output failure");
    cr_expect(mc_test_contains(err, "/nonexistent-dir/x.svg"), "%s", err);
    free(err);
}

Test(cli, schedule_invalid_interleaved_m_exits_2_with_the_rule) {
    char *err = expect_invalid("schedule --pp 4 --microbatches 6 --vpp 2");
    cr_expect(mc_test_contains(err, "num_microbatches 6") && mc_test_contains(err, "4"),
              "values: %s", err);
    cr_expect(mc_test_contains(err, "multiple of PP"), "rule: %s", err);
    free(err);
    err = expect_invalid("schedule --pp 4 --microbatches 8 --vpp 2 --group-size 2");
    cr_expect(mc_test_contains(err, "should range in [PP = 4, M = 8]"), "rule: %s", err);
    free(err);
    err = expect_invalid("schedule --pp 1 --microbatches 8 --vpp 2");
    cr_expect(mc_test_contains(err, "greater than 1"), "rule: %s", err);
    free(err);
}

/* ---------------------------------------------------------------------------------------------
   microbatches */

/* root must be a list of {"consumed", "global_batch", "num_microbatches"} rows equal to want. */
static void expect_microbatch_rows(const char *args, const long long (*want)[3], int n) {
    cJSON *root = cli_json(args);
    cr_assert(cJSON_IsArray(root), "megatron_c %s: not a list", args);
    cr_assert_eq(cJSON_GetArraySize(root), n, "megatron_c %s: %d rows, want %d", args,
                 cJSON_GetArraySize(root), n);
    for (int i = 0; i < n; ++i) {
        const cJSON *row = cJSON_GetArrayItem(root, i);
        cr_assert(cJSON_IsObject(row));
        cr_expect_eq(cJSON_GetArraySize(row), 3, "row %d has exactly three keys", i);
        cr_expect_eq((long long)cJSON_GetObjectItemCaseSensitive(row, "consumed")->valuedouble,
                     want[i][0], "row %d consumed", i);
        cr_expect_eq(json_int(row, "global_batch"), want[i][1], "row %d global_batch", i);
        cr_expect_eq(json_int(row, "num_microbatches"), want[i][2], "row %d num_microbatches",
                     i);
    }
    cJSON_Delete(root);
}

/* Ramp-up from 16 by 16 over 300 samples to 64 with mbs 2 x dp 4: a step every 100 samples. */
Test(cli, microbatches_json_rampup) {
    static const long long change_points[][3] = {{0, 16, 2}, {100, 32, 4}, {200, 48, 6},
                                                 {300, 64, 8}};
    static const long long picked[][3] = {{0, 16, 2}, {99, 16, 2}, {150, 32, 4}, {301, 64, 8},
                                          {5000, 64, 8}};
    expect_microbatch_rows("microbatches --gbs 64 --mbs 2 --dp 4 --rampup 16,16,300 --json",
                           change_points, 4);
    expect_microbatch_rows(
        "microbatches --gbs 64 --mbs 2 --dp 4 --rampup 16,16,300 --consumed 0,99,150,301,5000 "
        "--json",
        picked, 5);
}

Test(cli, microbatches_json_constant_and_step) {
    static const long long constant[][3] = {{0, 512, 8}};
    static const long long step[][3] = {{0, 32, 4}, {1000, 64, 8}, {2500, 128, 16}};
    expect_microbatch_rows("microbatches --gbs 512 --mbs 4 --dp 16 --json", constant, 1);
    expect_microbatch_rows("microbatches --mbs 4 --dp 2 --step-schedule '0:32 1K:64 2.5K:128' --json",
                           step, 3);
}

Test(cli, microbatches_errors_exit_2_with_the_rule) {
    char *err = expect_invalid("microbatches --gbs 500 --mbs 4 --dp 16");
    cr_expect(mc_test_contains(err, "(500)") && mc_test_contains(err, "divisible"), "%s", err);
    free(err);
    /* 4 increments over 200 samples: at 50 the batch is 32 + 8 = 40, not a multiple of 16 */
    err = expect_invalid("microbatches --gbs 64 --mbs 8 --dp 2 --rampup 32,8,200 --consumed 0,50");
    cr_expect(mc_test_contains(err, "at 50 consumed samples") && mc_test_contains(err, "(40)"),
              "%s", err);
    free(err);
    err = expect_invalid("microbatches --gbs 64 --mbs 2 --dp 4 --rampup 16,10,300");
    cr_expect(mc_test_contains(err, "increment (10)"), "%s", err);
    free(err);
    err = expect_invalid("microbatches --gbs 64 --mbs 2 --dp 4 --step-schedule 0:64");
    cr_expect(mc_test_contains(err, "cannot specify both"), "%s", err);
    free(err);
}

Test(cli, schedule_and_microbatches_usage) {
    static const char *const bad[] = {
        "schedule --microbatches 8",                 /* --pp missing */
        "schedule --pp 4",                           /* --microbatches missing */
        "schedule --pp 4 --microbatches 0",          /* below 1 */
        "microbatches --gbs 64 --dp 4",              /* --mbs missing */
        "microbatches --gbs 64 --mbs 2 --dp 4 --rampup 16,16",
        "microbatches --gbs 64 --mbs 2 --dp 4 --consumed 1,x",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; ++i) {
        char *err = NULL;
        int rc = cli_run_stderr(bad[i], &err);
        cr_expect_eq(rc, 2, "megatron_c %s: exit %d, want 2", bad[i], rc);
        cr_expect(mc_test_contains(err, "usage:"), "megatron_c %s: no usage:\n%s", bad[i], err);
        free(err);
    }
    char *out = NULL;
    cr_expect_eq(cli_run_stdout("--help", &out), 0);
    cr_expect(mc_test_contains(out, "schedule") && mc_test_contains(out, "microbatches"), "%s",
              out);
    free(out);
    cr_expect_eq(cli_run_stdout("help schedule", &out), 0);
    cr_expect(mc_test_contains(out, "--group-size"), "%s", out);
    free(out);
}

/* ---------------------------------------------------------------------------------------------
   Bad input and the README's own examples. */

/* Every `./megatron_c ...` line of the README's code blocks runs and exits 0 (in a scratch
   folder, since one writes an SVG). */
Test(cli, readme_examples_run) {
    char path[4200];
    snprintf(path, sizeof path, "%s/README.md", mc_test_repo_root());
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot read %s", path);
    char dir[] = "/tmp/mc_readme_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char line[4096];
    int in_code = 0, ran = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "```", 3) == 0) {
            in_code = !in_code;
            continue;
        }
        if (!in_code || strncmp(line, "./megatron_c ", 13) != 0) continue;
        line[strcspn(line, "\n")] = '\0';
        size_t len;   /* a command continued with a backslash takes the next lines too */
        while ((len = strlen(line)) > 0 && line[len - 1] == '\\' &&
               fgets(line + len - 1, (int)(sizeof line - len + 1), f))
            line[strcspn(line, "\n")] = '\0';
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char cmd[8400], *out = malloc(CLI_OUT_CAP);
        cr_assert_not_null(out);
        snprintf(cmd, sizeof cmd, "cd %s && '%s' %s >/dev/null", dir, cli_binary(), line + 13);
        int rc = mc_test_run(cmd, CLI_TIMEOUT_S, out, CLI_OUT_CAP);
        cr_expect_eq(rc, 0, "README example `%s` exited %d:\n%.2000s", line, rc, out);
        free(out);
        ran++;
    }
    fclose(f);
    cr_expect_geq(ran, 6, "found only %d ./megatron_c examples in the README", ran);
    char rm[128];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm) != 0) cr_log_warn("could not remove %s", dir);
}

/* An integer that does not fit is called out of range, not "expects an integer". */
Test(cli, out_of_range_integer_is_named) {
    char *err = NULL;
    int rc = cli_run_stderr("layout --world 99999999999", &err);
    cr_expect_eq(rc, 2);
    cr_expect(mc_test_contains(err, "--world value 99999999999 is out of range"), "%s", err);
    free(err);
    rc = cli_run_stderr("schedule --pp 4 --microbatches -99999999999", &err);
    cr_expect_eq(rc, 2);
    cr_expect(mc_test_contains(err, "--microbatches value -99999999999 is out of range"), "%s",
              err);
    free(err);
    rc = cli_run_stderr("layout --world 12x", &err);
    cr_expect(mc_test_contains(err, "--world expects an integer, got '12x'"), "%s", err);
    free(err);
}

/* A repeated option is refused instead of keeping the last value. */
Test(cli, repeated_option_is_refused) {
    char *err = NULL;
    int rc = cli_run_stderr("layout --world 8 --tp 2 --world 16", &err);
    cr_expect_eq(rc, 2);
    cr_expect(mc_test_contains(err, "--world is given more than once"), "%s", err);
    free(err);
    rc = cli_run_stderr("schedule --pp 2 --microbatches 4 --json --json", &err);
    cr_expect_eq(rc, 2);
    cr_expect(mc_test_contains(err, "--json is given more than once"), "%s", err);
    free(err);
    rc = cli_run_stderr("layout --world=8 --world=8", &err);
    cr_expect_eq(rc, 2, "the same value twice is still a repeat:\n%s", err);
    free(err);
}

/* schedule is linear in pp: a million stages with one micro-batch print in well under the
   test's limit (it took minutes, pp^2), and a table too big to print is refused up front. */
Test(cli, schedule_is_bounded_in_pp) {
    char *out = NULL;
    double t0 = mc_test_now();
    int rc = cli_run_stdout("schedule --pp 1048576 --microbatches 1", &out);
    cr_expect_eq(rc, 0, "exit %d", rc);
    cr_expect(mc_test_contains(out, "stage 1048575  warmup  0 | F0 B0"), "the last stage is "
              "missing:\n%.500s", out + (strlen(out) > 500 ? strlen(out) - 500 : 0));
    cr_expect_lt(mc_test_now() - t0, CLI_TIMEOUT_S, "took %.1f s", mc_test_now() - t0);
    free(out);
    char *err = NULL;
    rc = cli_run_stderr("schedule --pp 1048576 --microbatches 1000", &err);
    cr_expect_eq(rc, 2);
    cr_expect(mc_test_contains(err, "ops is more than this command prints"), "%s", err);
    free(err);
}
