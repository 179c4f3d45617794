/* tests/test_lab04.c - lab04 (M004): DP from the GPU count, and why EP does not multiply.

   ./lab04 runs as a program under mpirun (mc_test_mpirun), never under Criterion's own
   process. Every measured fact is checked against numbers this file computes itself from
   Megatron's default order tp-cp-ep-dp-pp (megatron_semantics.md 1.2):
       dense   rank = tp + TP*cp + TP*CP*dp + TP*CP*DP*pp
       expert  rank = etp + ETP*ep + ETP*EP*edp + ETP*EP*EDP*pp
   A dense DP x CP group is the ranks that share tp and pp; an expert-DP group the ranks that
   share etp, ep and pp. Also: the worlds the lab refuses, the empty sheet's score, a sheet of
   misconceptions, and the two reference answers graded from real runs. */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "labs/lab_common.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)

LS_LAB_SUITE(lab04, OUT_CAP, 150);

/* ---------------------------------------------------------------------------------------------
   helpers */

static char *read_file(const char *path) { return lab_read_text(path, NULL); }

/* Compares a JSON int list with want[n] as sets. */
static void expect_set(const cJSON *list, const int *want, int n, const char *what) {
    int got[128], m = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, list) if (m < 128) got[m++] = x->valueint;
    int same = m == n;
    for (int i = 0; i < n && same; i++) {
        int found = 0;
        for (int j = 0; j < m; j++) found |= got[j] == want[i];
        same = found;
    }
    char *have = cJSON_PrintUnformatted(list);
    cr_expect(same, "%s: measured %s, expected %d ranks starting at %d", what, have, n,
              n > 0 ? want[0] : -1);
    free(have);
}

/* A small grid of our own (default order, PP outermost): sizes and the two decodings. */
typedef struct grid {
    int world, tp, cp, pp, ep, etp, dp, edp;
} grid;

static grid make_grid(int world, int tp, int cp, int pp, int ep, int etp) {
    grid g = {world, tp, cp, pp, ep, etp, world / (tp * cp * pp), world / (etp * ep * pp)};
    return g;
}

typedef struct coords {
    int tp, cp, dp, pp, etp, ep, edp;
} coords;

static coords decode(const grid *g, int r) {
    coords c;
    c.tp = r % g->tp;
    c.cp = r / g->tp % g->cp;
    c.dp = r / (g->tp * g->cp) % g->dp;
    c.pp = r / (g->tp * g->cp * g->dp);
    c.etp = r % g->etp;
    c.ep = r / g->etp % g->ep;
    c.edp = r / (g->etp * g->ep) % g->edp;
    return c;
}

/* Ranks sharing tp and pp (dense DP x CP), or etp, ep and pp (expert-DP), with r. */
static int dp_cp_group(const grid *g, int r, int *out_ranks) {
    coords a = decode(g, r);
    int n = 0;
    for (int s = 0; s < g->world; s++) {
        coords b = decode(g, s);
        if (b.tp == a.tp && b.pp == a.pp) out_ranks[n++] = s;
    }
    return n;
}

static int expert_dp_group(const grid *g, int r, int *out_ranks) {
    coords a = decode(g, r);
    int n = 0;
    for (int s = 0; s < g->world; s++) {
        coords b = decode(g, s);
        if (b.etp == a.etp && b.ep == a.ep && b.pp == a.pp) out_ranks[n++] = s;
    }
    return n;
}

static void expect_coords(const cJSON *probe, const coords *c, const char *what) {
    cr_expect_eq(ls_geti(probe, "tp_rank"), c->tp, "%s tp", what);
    cr_expect_eq(ls_geti(probe, "cp_rank"), c->cp, "%s cp", what);
    cr_expect_eq(ls_geti(probe, "dp_rank"), c->dp, "%s dp", what);
    cr_expect_eq(ls_geti(probe, "pp_rank"), c->pp, "%s pp", what);
    cr_expect_eq(ls_geti(probe, "etp_rank"), c->etp, "%s etp", what);
    cr_expect_eq(ls_geti(probe, "ep_rank"), c->ep, "%s ep", what);
    cr_expect_eq(ls_geti(probe, "edp_rank"), c->edp, "%s edp", what);
}

/* Every distinct contributor set of one reduction equals the groups our grid defines. */
static void expect_measured_groups(const cJSON *red, const grid *g, int expert, const char *what) {
    const cJSON *groups = ls_get(red, "measured_groups");
    int covered = 0;
    const cJSON *grp;
    cJSON_ArrayForEach(grp, groups) {
        int want[128];
        int first = cJSON_GetArrayItem(grp, 0)->valueint;
        int n = expert ? expert_dp_group(g, first, want) : dp_cp_group(g, first, want);
        expect_set(grp, want, n, what);
        covered += cJSON_GetArraySize(grp);
    }
    cr_expect_eq(covered, g->world, "%s: the measured groups cover every rank once", what);
    cr_expect(cJSON_IsTrue(ls_get(red, "matches_grid")), "%s matches the grid", what);
    cr_expect(cJSON_IsTrue(ls_get(red, "weights_ok")), "%s: every weight 1/(DP x CP)", what);
    cr_expect_float_eq(ls_get(red, "scale")->valuedouble, 1.0 / (g->dp * g->cp), 1e-12, "%s", what);
}

/* One run: ./lab04 with `args` on np ranks into the temp dir; returns the results. */
static cJSON *run_lab(int np, const char *args, const char *answers) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "./lab04 %s --answers '%s' --results '%s/results/lab04.json'", args,
             answers, tmp_dir);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(np, cmd, 120, out, OUT_CAP);
    cr_log_info("lab04 -np %d %s: %.1f s", np, args, mc_test_now() - t0);
    cr_assert_eq(rc, 0, "lab04 -np %d %s exited %d:\n%s", np, args, rc, out);
    char res[256];
    snprintf(res, sizeof res, "%s/results/lab04.json", tmp_dir);
    return ls_load_json(res);
}

/* The run's facts (experiments B and C) against our own grid. */
static void check_run(const cJSON *doc, const grid *g, const grid *c) {
    int probe = ls_geti(doc, "probe_rank"), want[128], n;
    cr_expect_eq(ls_geti(doc, "facts.dp_size"), g->dp);
    cr_expect_eq(ls_geti(doc, "facts.edp_size"), g->edp);
    coords pc = decode(g, probe);
    expect_coords(ls_get(doc, "facts.probe"), &pc, "run probe");
    n = dp_cp_group(g, probe, want);
    expect_set(ls_get(doc, "facts.probe.dense_contributors"), want, n, "dense contributors");
    n = expert_dp_group(g, probe, want);
    expect_set(ls_get(doc, "facts.probe.expert_contributors"), want, n, "expert contributors");
    expect_measured_groups(ls_get(doc, "facts.run.dense"), g, 0, "B dense");
    expect_measured_groups(ls_get(doc, "facts.run.expert"), g, 1, "B expert");
    cr_expect_str_eq(ls_get(doc, "facts.run.reduction_path")->valuestring, "mc_ddp");
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.tp_pp_dp_ep_equals_world")),
                 g->tp * g->pp * g->dp * g->ep == g->world);
    if (c == NULL) return;
    cr_expect_eq(ls_geti(doc, "facts.etp_contrast.edp_size"), c->edp);
    cr_expect_eq(ls_geti(doc, "facts.etp_contrast.dp_size"), g->dp, "DP does not follow ETP");
    expect_measured_groups(ls_get(doc, "facts.etp_contrast.expert"), c, 1, "C expert");
    expect_measured_groups(ls_get(doc, "facts.etp_contrast.dense"), c, 0, "C dense");
    /* the dense group mixes experts iff some DP x CP group holds two (ep, etp) pairs */
    int mixes = 0;
    for (int r = 0; r < c->world && !mixes; r++) {
        n = dp_cp_group(c, r, want);
        coords a = decode(c, want[0]);
        for (int i = 1; i < n; i++) {
            coords b = decode(c, want[i]);
            mixes |= a.ep != b.ep || a.etp != b.etp;
        }
    }
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.etp_contrast.cross_mixes_experts")), mixes);
}

/* The follow-up's 64-GPU layout against our own grid. */
static void check_followup(const cJSON *doc, int ep, int etp) {
    grid g = make_grid(64, 4, 2, 4, ep, etp);
    const cJSON *f = ls_get(doc, "facts.followup");
    int probe = ls_geti(doc, "followup_probe_rank"), want[64], n;
    cr_expect_eq(ls_geti(f, "ep"), ep);
    cr_expect_eq(ls_geti(f, "etp"), etp);
    cr_expect_eq(ls_geti(f, "dp_size"), 2, "DP = 64 / (4 x 4 x 2)");
    cr_expect_eq(ls_geti(f, "dp_size_without_ep"), 2);
    cr_expect_eq(ls_geti(f, "edp_size"), 64 / (etp * ep * 4));
    cr_expect_eq(ls_geti(f, "tp_pp_dp_ep"), 4 * 4 * 2 * ep);
    cr_expect(cJSON_IsFalse(ls_get(f, "tp_pp_dp_ep_equals_world")));
    cr_expect_eq(ls_geti(f, "etp_ep_edp_pp"), 64);
    int default_fits = 64 % (4 * ep * 4) == 0;
    cr_expect_eq(cJSON_IsTrue(ls_get(f, "etp_default_accepted")), default_fits);
    if (!default_fits) {
        const char *msg = ls_get(f, "etp_default.message")->valuestring;
        cr_expect(mc_test_contains(msg, "not divisible") &&
                      mc_test_contains(msg, "4 x 8 x 4 = 128"),
                  "the refusal names the rule: %s", msg);
    }
    coords c = decode(&g, probe);
    expect_coords(ls_get(f, "probe"), &c, "follow-up probe");
    n = dp_cp_group(&g, probe, want);
    expect_set(ls_get(f, "probe.dp_cp_group"), want, n, "follow-up DP x CP group");
    n = expert_dp_group(&g, probe, want);
    expect_set(ls_get(f, "probe.expert_dp_group"), want, n, "follow-up expert-DP group");
    cr_expect_eq(ls_geti(f, "reference_check.mismatches"), 0);
    cr_expect_eq(ls_geti(f, "reference_check.ranks"), 64);
}

/* ---------------------------------------------------------------------------------------------
   the default run */

Test(lab04, default_run_measures_who_is_averaged_with_whom) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/answers/lab04.md", tmp_dir);   /* missing: written */
    cJSON *doc = run_lab(8, "--nonce 7f3a91", sheet);
    const char *sections[] = {"== A. 64 GPUs", "== B. A real run on 8 ranks",
                              "== C. The same world with ETP = 2", "== Measured ==",
                              "== Grading", "refused",
                              "dense gradient of rank 6 came from [0,2,4,6]"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        cr_expect(mc_test_contains(out, sections[i]), "no \"%s\" in:\n%s", sections[i], out);
    cr_expect_float_eq(ls_total_score(out), 0.0, 1e-9, "the empty sheet scores 0:\n%s", out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);

    cr_expect_str_eq(ls_get(doc, "lab")->valuestring, "lab04");
    cr_expect_str_eq(ls_get(doc, "question")->valuestring, "M004");
    cr_expect_eq(ls_geti(doc, "config.world"), 8);
    cr_expect_eq(ls_geti(doc, "config.tp"), 2);
    cr_expect_eq(ls_geti(doc, "config.cp"), 2);
    cr_expect_eq(ls_geti(doc, "config.ep"), 2);
    cr_expect_eq(ls_geti(doc, "config.etp"), 1);
    cr_expect_eq(ls_geti(doc, "probe_rank"), 6);
    cr_expect_str_eq(ls_get(doc, "followup_variant")->valuestring, "F1");
    cr_expect_eq(ls_geti(doc, "followup_probe_rank"), 22);
    cr_expect_eq(ls_geti(doc, "followup_probe_rank") % 8, ls_geti(doc, "probe_rank"),
                 "the 64-GPU probe is the run's probe modulo 8");
    cr_expect(cJSON_IsTrue(ls_get(doc, "run.all_checks_held")));

    grid g = make_grid(8, 2, 2, 1, 2, 1), c = make_grid(8, 2, 2, 1, 2, 2);
    check_run(doc, &g, &c);
    /* at these sizes expert-DP has the members of DP x CP (EP takes TP's place), and only C
       shows the dense group averaging two experts */
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.run.expert_groups_same_members_as_dense")));
    cr_expect(cJSON_IsFalse(ls_get(doc, "facts.run.cross_mixes_experts")));
    cr_expect(cJSON_IsFalse(ls_get(doc, "facts.etp_contrast.expert_groups_same_members_as_dense")));
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.tp_pp_dp_ep_equals_world")), "2*1*2*2 = 8 here");
    check_followup(doc, 8, 1);

    /* the sheet names the follow-up's probe, and the figure was written */
    char *text = read_file(sheet);
    cr_assert_not_null(text);
    cr_expect(mc_test_contains(text, "for rank 22 its dense data-parallel group"), "%s", text);
    cr_expect(mc_test_contains(text, "EP=8 with expert tensor-parallel size ETP=1"), "%s", text);
    free(text);
    char fig[160];
    snprintf(fig, sizeof fig, "%s/results/lab04.groups.svg", tmp_dir);
    char *svg = read_file(fig);
    cr_assert_not_null(svg, "no figure %s", fig);
    cr_expect(mc_test_contains(svg, "rank 22: expert_dp group [22,30]"));
    free(svg);
    cJSON_Delete(doc);
}

/* The other two follow-up variants: EP=8 ETP=2 (EDP 1) and EP=4 ETP=2 (ETP=TP accepted). */
Test(lab04, followup_variants_f2_and_f3) {
    static const struct { const char *nonce, *variant; int ep, etp; } v[] = {
        {"2b8d40", "F2", 8, 2}, {"a04f01", "F3", 4, 2}};
    for (int i = 0; i < 2; i++) {
        char args[64], sheet[128];
        snprintf(args, sizeof args, "--nonce %s", v[i].nonce);
        snprintf(sheet, sizeof sheet, "%s/%s.md", tmp_dir, v[i].nonce);
        cJSON *doc = run_lab(8, args, sheet);
        cr_expect_str_eq(ls_get(doc, "followup_variant")->valuestring, v[i].variant);
        check_followup(doc, v[i].ep, v[i].etp);
        cJSON_Delete(doc);
    }
}

/* Other worlds: PP=2 on 16 ranks (the expert grid keeps the pp groups), and DP=1 on 4. */
Test(lab04, other_worlds_keep_the_rules) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/a.md", tmp_dir);
    cJSON *doc = run_lab(16, "--nonce 91c0de --pp 2", sheet);
    grid g = make_grid(16, 2, 2, 2, 2, 1), c = make_grid(16, 2, 2, 2, 2, 2);
    check_run(doc, &g, &c);
    cr_expect(cJSON_IsTrue(ls_get(doc, "run.all_checks_held")));
    cJSON_Delete(doc);

    snprintf(sheet, sizeof sheet, "%s/b.md", tmp_dir);
    doc = run_lab(4, "--nonce 91c0de", sheet);
    g = make_grid(4, 2, 2, 1, 2, 1);
    c = make_grid(4, 2, 2, 1, 2, 2);
    cr_expect_eq(g.dp, 1);
    check_run(doc, &g, &c);
    cJSON_Delete(doc);
}

/* ---------------------------------------------------------------------------------------------
   refusals */

Test(lab04, worlds_it_cannot_use_exit_2_with_the_rule) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "./lab04 --nonce 7f3a91 --answers '%s/a.md' --results '%s/r.json'",
             tmp_dir, tmp_dir);
    int rc = mc_test_mpirun(6, cmd, 60, out, OUT_CAP);
    cr_expect_eq(rc, 2, "-np 6 exited %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs world % (tp*pp*cp) == 0: got 6 ranks for tp=2 pp=1 "
                                    "cp=2"),
              "%s", out);
    cr_expect(mc_test_contains(out, "try mpirun -np 8"), "%s", out);

    /* the expert grid: ETP x EP x PP = 16 does not divide 8 */
    snprintf(cmd, sizeof cmd, "./lab04 --nonce 7f3a91 --ep 8 --etp 2 --answers '%s/a.md' "
             "--results '%s/r.json'", tmp_dir, tmp_dir);
    rc = mc_test_mpirun(8, cmd, 60, out, OUT_CAP);
    cr_expect_eq(rc, 2, "--ep 8 --etp 2 exited %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "ETP x EP x PP = 2 x 8 x 1 = 16"), "%s", out);
    char res[160];
    snprintf(res, sizeof res, "%s/r.json", tmp_dir);
    cr_expect_neq(access(res, F_OK), 0, "a refused world writes no results");
}

/* ---------------------------------------------------------------------------------------------
   grading */

static const char misconceptions_sheet[] =
    "# lab04\n"
    "<!-- nonce: 7f3a91 ; probe_rank: 6 ; followup: F1 (generated by ./lab04 --init, do not "
    "edit) -->\n"
    "## Main question\n"
    "### M1 The dense formula and DP\n"
    "The world size is world = TP × PP × DP × EP, so adding EP means more GPUs. DP and TP are "
    "both free knobs that you set independently.\n"
    "### M3 Why EP is not one more orthogonal factor\n"
    "EP must divide DP, so EP is at most the data parallel size.\n"
    "### M4 Dense and expert sync domains\n"
    "All gradients are averaged over the data parallel group, and the expert gradients use the "
    "same group as the dense DP.\n";

Test(lab04, misconceptions_cost_points) {
    char sheet[128];
    snprintf(sheet, sizeof sheet, "%s/wrong.md", tmp_dir);
    FILE *f = fopen(sheet, "w");
    cr_assert_not_null(f);
    fputs(misconceptions_sheet, f);
    fclose(f);
    cJSON *doc = run_lab(8, "--nonce 7f3a91", sheet);
    cJSON_Delete(doc);
    const char *fired[] = {"MC_EP_MULTIPLY", "MC_EP_DIVIDES", "MC_FREE_KNOBS", "MC_SAME_GROUP"};
    for (size_t i = 0; i < sizeof fired / sizeof fired[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "[MISC] %s ", fired[i]);
        cr_expect(mc_test_contains(out, want), "%s did not fire:\n%s", fired[i], out);
    }
    cr_expect(ls_total_score(out) >= 0 && ls_total_score(out) < 1.0, "score %.2f",
              ls_total_score(out));
}

/* Each reference answer, graded from a real run of its own nonce (the run locks its
   predictions), scores at least 14 of 15 and fires no misconception. */
Test(lab04, reference_answers_score_at_least_14) {
    static const struct { const char *path, *nonce; } refs[] = {
        {"answers/reference/lab04.md", "7f3a91"}, {"answers/reference/lab04.zh.md", "2b8d40"}};
    for (int i = 0; i < 2; i++) {
        char *text = read_file(refs[i].path);
        cr_assert_not_null(text, "missing %s", refs[i].path);
        char header[64];
        snprintf(header, sizeof header, "<!-- nonce: %s ;", refs[i].nonce);
        cr_expect(mc_test_contains(text, header), "%s is written for nonce %s", refs[i].path,
                  refs[i].nonce);
        free(text);
        char args[64];
        snprintf(args, sizeof args, "--nonce %s", refs[i].nonce);
        char results_dir[160];
        snprintf(results_dir, sizeof results_dir, "rm -rf '%s/results'", tmp_dir);
        cr_assert_eq(system(results_dir), 0);
        cJSON *doc = run_lab(8, args, refs[i].path);
        cJSON_Delete(doc);
        double score = ls_total_score(out);
        cr_expect_geq(score, 14.0, "%s scored %.2f:\n%s", refs[i].path, score, out);
        cr_expect(mc_test_contains(out, "no misconception fired"), "%s:\n%s", refs[i].path, out);
        cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions locked:\n%s", refs[i].path,
                  out);
    }
}
