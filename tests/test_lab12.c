/* tests/test_lab12.c - lab12 (M012: stating a version boundary), launched as a program under
   mpirun (never Criterion under mpirun).

   The facts of fixed-nonce runs are checked against what this test finds out by itself, not
   through the library: the commit from `git rev-parse HEAD` (and the Makefile's "unknown"
   outside a checkout), the compiler from `mpicc -dumpfullversion`, the MPI version from
   `mpirun --version`, the processors from /proc/cpuinfo, each smoke run's largest relative
   loss difference recomputed from the losses it reports beside the single-rank run's, full
   and selective recompute bit for bit against the same layout without recompute, the CP and
   EP grids from DP = world / (TP x CP) and expert DP = world / (ETP x EP), the matrix's
   consistency (what is absent is never exercised, what is measured has a time), and the
   follow-up's features against the rubric's variant text. Also: worlds and flags the lab
   refuses, the empty sheet's score, the reference answers' scores, and a sheet that claims
   FP8 ran here. */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define RUN_LIMIT_S 120.0
#define REF_NONCE "5e1202" /* the reference answers' nonce: follow-up F1 */

LS_LAB_SUITE(lab12, OUT_CAP, 300);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* Runs ./lab12 on np ranks with the sheet and results in the temp dir. */
static int run_lab(int np, const char *sheet, const char *extra, cJSON **doc) {
    char cmd[1024], res[256];
    snprintf(res, sizeof res, "%s/results/lab12.json", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab12 --answers '%s' --results '%s' %s", sheet, res,
             extra ? extra : "");
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    if (doc != NULL) *doc = mc_test_json_load(res);
    return rc;
}

/* The first line a shell command prints, without its newline ("" when it failed). */
static void shell_line(const char *cmd, char *buf, size_t cap) {
    buf[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (p == NULL) return;
    if (fgets(buf, (int)cap, p) == NULL) buf[0] = '\0';
    pclose(p);
    buf[strcspn(buf, "\r\n")] = '\0';
}

/* max_i |loss_i - ref_i| / |ref_i| over the steps the run has. */
static double max_rel_diff(const cJSON *loss, const cJSON *ref) {
    double worst = 0.0;
    int n = cJSON_GetArraySize(loss);
    cr_assert_leq(n, cJSON_GetArraySize(ref), "a run with more steps than the reference");
    for (int i = 0; i < n; i++) {
        double a = cJSON_GetArrayItem(loss, i)->valuedouble;
        double b = cJSON_GetArrayItem(ref, i)->valuedouble;
        double d = fabs(a - b) / fabs(b);
        if (d > worst) worst = d;
    }
    return worst;
}

static int same_losses(const cJSON *a, const cJSON *b) {
    if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b)) return 0;
    for (int i = 0; i < cJSON_GetArraySize(a); i++)
        if (cJSON_GetArrayItem(a, i)->valuedouble != cJSON_GetArrayItem(b, i)->valuedouble)
            return 0;
    return 1;
}

/* The features the rubric's text of variant `v` names: "feature_1 = pp_interleaved, ...". */
static void rubric_variant_features(const char *v, char feats[3][32]) {
    char *text = ls_read_file("labs/rubric/lab12.json");
    cr_assert_not_null(text);
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    const char *q = ls_gets(cJSON_GetObjectItemCaseSensitive(ls_get(r, "variants"), v), "question");
    for (int k = 0; k < 3; k++) {
        char key[32];
        snprintf(key, sizeof key, "feature_%d = ", k + 1);
        const char *at = strstr(q, key);
        cr_assert_not_null(at, "variant %s does not name %s", v, key);
        at += strlen(key);
        size_t n = strcspn(at, ",. ");
        snprintf(feats[k], 32, "%.*s", (int)n, at);
    }
    cJSON_Delete(r);
}

/* ---------------------------------------------------------------------------------------------
   the default run */

Test(lab12, default_run_probes_this_build_and_checks_every_smoke_run) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/answers/lab12.md", tmp_dir);   /* missing: written */
    cJSON *doc = NULL;
    double t0 = mc_test_now();
    int rc = run_lab(4, sheet, "--nonce " REF_NONCE, &doc);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "lab12 exited %d\n%s", rc, out);
    cr_assert_not_null(doc, "no results\n%s", out);
    cr_expect(secs < 120.0, "the default run took %.1f s", secs);
    cr_expect(mc_test_contains(out, "== D. The matrix"), "%s", out);

    /* A. the probe against what this test finds out itself */
    const char *commit = ls_gets(doc, "facts.probe.build.commit");
    size_t clen = strlen(commit);
    cr_expect(strcmp(commit, "unknown") == 0 ||
                  (clen == 40 && strspn(commit, "0123456789abcdef") == 40),
              "commit %s is neither 40 hex digits nor unknown", commit);
    char head[128];
    shell_line("git rev-parse HEAD 2>/dev/null", head, sizeof head);
    if (head[0] != '\0' && strcmp(commit, "unknown") != 0) {
        cr_expect_eq(ls_getb(doc, "facts.probe.build.matches_checkout"), strcmp(head, commit) == 0,
                     "checkout %s, binary %s", head, commit);
        cr_expect(strncmp(ls_gets(doc, "facts.probe.build.commit_short"), commit, 7) == 0);
    }
    cr_expect_str_eq(ls_gets(doc, "build.commit"), commit, "the envelope and the probe differ");
    char cc[64];
    shell_line("mpicc -dumpfullversion 2>/dev/null", cc, sizeof cc);
    if (cc[0] != '\0')
        cr_expect_str_eq(ls_gets(doc, "facts.probe.compiler.version"), cc);
    char mpi[256];
    shell_line("mpirun --version 2>/dev/null", mpi, sizeof mpi);   /* "mpirun (Open MPI) 4.1.4" */
    const char *sp = strrchr(mpi, ' ');
    if (strstr(mpi, "Open MPI") != NULL && sp != NULL) {
        cr_expect_str_eq(ls_gets(doc, "facts.probe.mpi.library_version"), sp + 1);
        cr_expect(mc_test_contains(ls_gets(doc, "facts.probe.mpi.library"), sp + 1));
    }
    cr_expect(ls_getb(doc, "facts.probe.mpi.header_matches_library"));
    int cpus = 0;
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci != NULL) {
        char line[512];
        while (fgets(line, sizeof line, ci) != NULL)
            cpus += strncmp(line, "processor", 9) == 0;
        fclose(ci);
        cr_expect_eq(ls_geti(doc, "facts.probe.hardware.cpu_count"), cpus);
    }
    cr_expect_eq(ls_geti(doc, "facts.probe.hardware.world_size"), 4);
    cr_expect(ls_getb(doc, "facts.probe.ranks_agree"));
    if (!ls_getb(doc, "facts.probe.cuda.built")) {   /* an ordinary build: no GPU can be in use */
        cr_expect_eq(ls_geti(doc, "facts.probe.hardware.gpus_used"), 0);
        cr_expect_str_eq(ls_gets(doc, "facts.probe.hardware.backend"), "mpi");
        cr_expect_str_eq(ls_gets(doc, "facts.levels.cuda_ops"), "not_built");
        cr_expect_str_eq(ls_gets(doc, "facts.levels.gpu_throughput"), "not_built");
    }

    /* B. every smoke run against the single-rank run, recomputed from the losses */
    const cJSON *ref = ls_get(doc, "facts.smoke.reference.loss");
    double rtol = ls_getd(doc, "facts.smoke.model.rtol"),
           btol = ls_getd(doc, "facts.smoke.model.bf16_rtol");
    cr_expect_leq(rtol, 1e-5);
    const cJSON *run;
    int nruns = 0;
    cJSON_ArrayForEach(run, ls_get(doc, "facts.smoke.runs")) {
        nruns++;
        const cJSON *loss = cJSON_GetObjectItemCaseSensitive(run, "loss");
        cr_assert_geq(cJSON_GetArraySize(loss), 3, "%s: fewer than 3 steps", run->string);
        double want = max_rel_diff(loss, ref);
        double got = cJSON_GetObjectItemCaseSensitive(run, "max_rel_diff")->valuedouble;
        cr_expect(fabs(got - want) <= 1e-9 * want + 1e-15, "%s: reports %.3g, losses give %.3g",
                  run->string, got, want);
        int bf16 = strcmp(run->string, "bf16") == 0;
        cr_expect_leq(want, bf16 ? btol : rtol, "%s: |rel diff| %.3g", run->string, want);
        cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(run, "ok")), "%s", run->string);
        if (bf16) cr_expect_gt(want, 1e-7, "bf16 storage rounded nothing: %.3g", want);
    }
    cr_expect_geq(nruns, 11, "only %d smoke runs", nruns);
    const cJSON *tp_pp = ls_get(doc, "facts.smoke.runs.tp_pp.loss");
    cr_expect(same_losses(ls_get(doc, "facts.smoke.runs.recompute_full.loss"), tp_pp),
              "full recompute differs from the same layout without it");
    cr_expect(same_losses(ls_get(doc, "facts.smoke.runs.recompute_selective.loss"), tp_pp),
              "selective recompute differs from the same layout without it");
    cr_expect(ls_getb(doc, "facts.smoke.recompute_full_bitwise"));
    cr_expect_eq(cJSON_GetArraySize(ls_get(doc, "facts.smoke.runs.ckpt_reshard.loss")),
                 cJSON_GetArraySize(ref), "the resharded run does not continue to the last step");
    cr_expect(ls_getb(doc, "facts.smoke.checkpoint.resharded"));

    /* the grids against DP = world / (TP x CP), expert DP = world / (ETP x EP), order tp-cp-.. */
    int W = 4;
    cr_expect_eq(
        ls_geti(doc, "facts.smoke.cp_grid.dp"),
        W / (ls_geti(doc, "facts.smoke.cp_grid.tp") * ls_geti(doc, "facts.smoke.cp_grid.cp")));
    cr_expect_eq(ls_geti(doc, "facts.smoke.ep_grid.dp"),
                 W / ls_geti(doc, "facts.smoke.ep_grid.tp"));
    cr_expect_eq(
        ls_geti(doc, "facts.smoke.ep_grid.expert_dp"),
        W / (ls_geti(doc, "facts.smoke.ep_grid.tp") * ls_geti(doc, "facts.smoke.ep_grid.ep")));
    cr_expect_str_eq(ls_gets(doc, "facts.smoke.cp_grid.rank0_first_group"), "[0,1]");   /* TP 1 */
    cr_expect_str_eq(ls_gets(doc, "facts.smoke.ep_grid.rank0_first_group"), "[0,1]");

    /* D. the matrix: absent is never exercised, measured has a time, the lists agree */
    const cJSON *f;
    int nexercised = 0;
    cJSON_ArrayForEach(f, ls_get(doc, "facts.features")) {
        const char *impl = cJSON_GetObjectItemCaseSensitive(f, "implemented")->valuestring;
        int ex = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "exercised"));
        int me = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "measured"));
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(f, "ms");
        nexercised += ex;
        if (strcmp(impl, "yes") != 0) cr_expect(!ex, "%s: %s but exercised", f->string, impl);
        if (me) cr_expect(ex && cJSON_IsNumber(ms) && ms->valuedouble > 0, "%s", f->string);
        if (!ex) {
            const char *why = cJSON_GetObjectItemCaseSensitive(f, "reason")->valuestring;
            cr_expect(strlen(why) > 10, "%s: not exercised, without a reason", f->string);
        }
    }
    cr_expect_eq(cJSON_GetArraySize(ls_get(doc, "facts.exercised")), nexercised);
    cr_expect_str_eq(ls_gets(doc, "facts.levels.fp8"), "absent");
    cr_expect_str_eq(ls_gets(doc, "facts.levels.moe"), "absent");

    /* the follow-up's three features: the rubric's text of the variant the nonce drew */
    char feats[3][32];
    rubric_variant_features(ls_gets(doc, "followup_variant"), feats);
    const cJSON *fl = ls_get(doc, "facts.followup.features");
    for (int k = 0; k < 3; k++)
        cr_expect_str_eq(cJSON_GetArrayItem(fl, k)->valuestring, feats[k]);
    cr_expect_str_eq(ls_gets(doc, "followup_variant"), "F1");
    cJSON_Delete(doc);
}

/* Outside a git checkout (a tarball) the Makefile embeds "unknown". */
Test(lab12, a_build_outside_a_checkout_embeds_unknown) {
    int rc = mc_test_run("GIT_DIR=/nonexistent make -n build/lab_common.o 2>&1 | "
                         "grep -c \"LAB_BUILD_COMMIT='\\\"unknown\\\"'\"",
                         60, out, OUT_CAP);
    cr_expect_eq(rc, 0, "make outside a checkout does not embed unknown:\n%s", out);
    rc = mc_test_run("make -n build/lab_common.o 2>&1 | grep -c \"LAB_BUILD_COMMIT='\\\"unknown\"",
                     60, out, OUT_CAP);
    /* a checkout embeds its commit only where git runs (a bare root may have none) */
    if (access(".git", F_OK) == 0 && system("git rev-parse HEAD >/dev/null 2>&1") == 0)
        cr_expect_neq(rc, 0, "make in a checkout embeds unknown:\n%s", out);
}

/* The other variants ask about other features; 8 ranks double every DP. */
Test(lab12, eight_ranks_and_another_variant) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/answers/lab12.md", tmp_dir);
    cJSON *doc = NULL;
    int rc = run_lab(8, sheet, "--nonce 000001", &doc);   /* 000001: follow-up F3 */
    cr_assert_eq(rc, 0, "lab12 -np 8 exited %d\n%s", rc, out);
    cr_assert_not_null(doc);
    cr_expect_eq(ls_geti(doc, "facts.probe.hardware.world_size"), 8);
    cr_expect_eq(ls_geti(doc, "facts.smoke.runs.dp.dp"), 8);
    cr_expect_eq(ls_geti(doc, "facts.smoke.runs.tp.dp"), 4);
    cr_expect_eq(
        ls_geti(doc, "facts.smoke.cp_grid.dp"),
        8 / (ls_geti(doc, "facts.smoke.cp_grid.tp") * ls_geti(doc, "facts.smoke.cp_grid.cp")));
    const char *v = ls_gets(doc, "followup_variant");
    cr_expect_str_eq(v, "F3");
    char feats[3][32];
    rubric_variant_features(v, feats);
    const cJSON *fl = ls_get(doc, "facts.followup.features");
    for (int k = 0; k < 3; k++)
        cr_expect_str_eq(cJSON_GetArrayItem(fl, k)->valuestring, feats[k]);
    cJSON_Delete(doc);
}

Test(lab12, worlds_and_flags_it_cannot_use_exit_2_with_the_rule) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/x.md", tmp_dir);
    int rc = run_lab(6, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 6 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs 4 or 8 ranks (got 6)"), "%s", out);
    rc = run_lab(2, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 2 exited %d\n%s", rc, out);
    rc = run_lab(4, sheet, "--tp 2", NULL);
    cr_expect_eq(rc, 2, "--tp 2 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "no layout flags"), "%s", out);
}

/* ---------------------------------------------------------------------------------------------
   grading */

Test(lab12, the_empty_sheet_scores_near_zero_and_says_what_to_do) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/empty.md", tmp_dir);
    int rc = run_lab(4, sheet, "--nonce " REF_NONCE, NULL);
    cr_assert_eq(rc, 0, "%s", out);
    double total = ls_total_score(out);
    cr_expect(total >= 0 && total <= 0.5, "the empty sheet scored %.2f\n%s", total, out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);
}

static void expect_reference_scores(const char *ref) {
    char sheet[256], cmd[512];
    snprintf(sheet, sizeof sheet, "%s/ref.md", tmp_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/results'", tmp_dir);
    cr_assert_eq(system(cmd), 0);
    char *text = ls_read_file(ref);
    cr_assert_not_null(text, "missing %s", ref);
    ls_write_file(sheet, text);   /* the run reads the nonce from its header and locks its preds */
    free(text);
    int rc = run_lab(4, sheet, NULL, NULL);
    cr_assert_eq(rc, 0, "lab12 on %s exited %d\n%s", ref, rc, out);
    double total = ls_total_score(out);
    cr_expect_geq(total, 14.0, "%s scored %.2f/15\n%s", ref, total, out);
    cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions not locked\n%s", ref, out);
    cr_expect(mc_test_contains(out, "no misconception fired"), "%s\n%s", ref, out);
}

Test(lab12, reference_answers_score_at_least_14) {
    expect_reference_scores("answers/reference/lab12.md");
    expect_reference_scores("answers/reference/lab12.zh.md");
}

/* Claims of what did not run here cost points; a wrong commit earns nothing and says so. */
Test(lab12, claims_beyond_the_measured_scope_cost_points) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/claims.md", tmp_dir);
    int rc = run_lab(4, sheet, "--nonce " REF_NONCE, NULL);   /* writes the template */
    cr_assert_eq(rc, 0, "%s", out);
    char *text = ls_read_file(sheet);
    cr_assert_not_null(text);
    const char *box = strstr(text, "### M3");
    cr_assert_not_null(box, "the template has no M3 box:\n%s", text);
    const char *eol = strchr(box, '\n');
    cr_assert_not_null(eol);
    size_t cap = strlen(text) + 1024;
    char *edited = malloc(cap);
    snprintf(edited, cap, "%.*s\nI built it at commit 1234abc. FP8 ran here and was measured at "
             "full speed on this machine.\n%s", (int)(eol - text), text, eol + 1);
    ls_write_file(sheet, edited);
    free(edited);
    free(text);
    rc = run_lab(4, sheet, "--grade-only", NULL);
    cr_assert_eq(rc, 0, "%s", out);
    cr_expect(mc_test_contains(out, "MC_FP8_RAN"), "the FP8 claim did not fire\n%s", out);
    cr_expect_lt(ls_total_score(out), 0.5, "%s", out);
}
