/* tests/test_lab03_calibration.c - calibration of the lab03 rubric (AMATI-style).

   Every labelled sheet of tests/fixtures/lab03/ (and the two reference answers) is graded
   against the frozen results tests/fixtures/lab03/results.json (world 8, TP=2, PP=2; Exp. B
   wrong_membership, Exp. C ok, plan check error; follow-up F2). expected.tsv gives each sheet a
   score band, the misconceptions that must (not) fire and the points that must (not) be
   earned. The summary counts checks that matched, missed positives (expected but not given)
   and missed negatives (given but not expected), then prints "N passed, N failed".

   The frozen results are also checked against the library's rank grid, so that the fixture
   cannot drift from what ./lab03 would measure. */
#include <criterion/criterion.h>

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "labs/grader.h"
#include "megatron_c.h"
#include "tests/test_util.h"


static const char *repo_root(void) { return mc_test_repo_root(); }

static void path_of(const char *rel, char *out, size_t cap) {
    snprintf(out, cap, "%s/%s", repo_root(), rel);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static cJSON *load_json(const char *rel) {
    char p[PATH_MAX + 64];
    path_of(rel, p, sizeof p);
    char *text = slurp(p);
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(j, "%s is not valid JSON", rel);
    return j;
}

/* ---------------------------------------------------------------------------------------------
   expected.tsv */

typedef struct row {
    char sheet[320]; /* path from the repository root */
    double lo, hi;
    char fire[512], no_fire[512], award[1024], no_award[1024];
} row;

static int load_rows(row *rows, int cap) {
    char p[PATH_MAX + 64];
    path_of("tests/fixtures/lab03/expected.tsv", p, sizeof p);
    char *text = slurp(p);
    int n = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL && n < cap;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || line[0] == '\0') continue;
        row *r = &rows[n];
        memset(r, 0, sizeof *r);
        char sheet[256];
        int got =
            sscanf(line, "%255[^\t]\t%lf\t%lf\t%511[^\t]\t%511[^\t]\t%1023[^\t]\t%1023[^\t\n]",
                   sheet, &r->lo, &r->hi, r->fire, r->no_fire, r->award, r->no_award);
        cr_assert_eq(got, 7, "expected.tsv: malformed line: %s", line);
        if (sheet[0] == '@')
            snprintf(r->sheet, sizeof r->sheet, "%s", sheet + 1);
        else
            snprintf(r->sheet, sizeof r->sheet, "tests/fixtures/lab03/%s", sheet);
        n++;
    }
    free(text);
    return n;
}

/* "A,B,C" contains id; "*" contains every id; "-" none. */
static int list_has(const char *list, const char *id) {
    if (strcmp(list, "*") == 0) return 1;
    size_t n = strlen(id);
    for (const char *p = list; (p = strstr(p, id)) != NULL; p += n)
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0')) return 1;
    return 0;
}

static int grade_quiet(const char *sheet_rel, gr_report *rep) {
    char sheet[PATH_MAX + 64], rub[PATH_MAX + 64], res[PATH_MAX + 64];
    path_of(sheet_rel, sheet, sizeof sheet);
    path_of("labs/rubric/lab03.json", rub, sizeof rub);
    path_of("tests/fixtures/lab03/results.json", res, sizeof res);
    return gr_grade(
        &(gr_grade_desc){
            .rubric_path = rub, .answers_path = sheet, .results_path = res, .quiet = 1},
        rep);
}

typedef struct tally {
    int matched, missed_pos, missed_neg;
} tally;

/* Checks one sheet against its row; returns the number of failed checks (and reports them). */
static int check_row(const row *r, const gr_report *rep, tally *t) {
    int failed = 0;
    if (rep->total < r->lo - 1e-9 || rep->total > r->hi + 1e-9) {
        cr_expect(0, "%s: total %.2f outside the band [%g, %g]", r->sheet, rep->total, r->lo,
                  r->hi);
        failed++;
    }
    for (int i = 0; i < rep->n_items; i++) {
        const gr_item *it = &rep->items[i];
        int is_misc = strcmp(it->kind, "misc") == 0;
        int is_point = strcmp(it->kind, "expl") == 0 || strcmp(it->kind, "evid") == 0;
        if (!is_misc && !is_point) continue;
        int want_pos = list_has(is_misc ? r->fire : r->award, it->id);
        int want_neg = list_has(is_misc ? r->no_fire : r->no_award, it->id);
        if (!want_pos && !want_neg) continue;
        int got_pos = is_misc ? it->fired : it->score >= it->max_score - 1e-9;
        int got_any = is_misc ? it->fired : it->score > 1e-9;
        if (want_pos && !got_pos) {
            t->missed_pos++;
            failed++;
            cr_expect(0, "%s: %s expected %s, got %.2f: %s", r->sheet, it->id,
                      is_misc ? "to fire" : "in full", it->score, it->output);
        } else if (want_neg && got_any) {
            t->missed_neg++;
            failed++;
            cr_expect(0, "%s: %s not expected, got %.2f: %s", r->sheet, it->id, it->score,
                      it->output);
        } else {
            t->matched++;
        }
    }
    return failed;
}

TestSuite(calibration, .timeout = 60);

Test(calibration, every_sheet_scores_inside_its_band) {
    row rows[32];
    int n = load_rows(rows, 32);
    cr_assert_geq(n, 8, "expected.tsv lists the six fixtures and the two reference answers");
    tally total = {0, 0, 0};
    int passed = 0, failed = 0;
    printf("\nlab03 calibration (rubric labs/rubric/lab03.json, results "
           "tests/fixtures/lab03/results.json)\n");
    printf("%-34s %7s %9s %8s %8s %8s  %s\n", "sheet", "total", "band", "matched", "missed+",
           "missed-", "verdict");
    for (int i = 0; i < n; i++) {
        gr_report rep;
        int rc = grade_quiet(rows[i].sheet, &rep);
        cr_assert_eq(rc, 0, "grading %s failed with %d", rows[i].sheet, rc);
        tally t = {0, 0, 0};
        int bad = check_row(&rows[i], &rep, &t);
        char band[32];
        snprintf(band, sizeof band, "[%g,%g]", rows[i].lo, rows[i].hi);
        const char *name =
            strrchr(rows[i].sheet, '/') ? strrchr(rows[i].sheet, '/') + 1 : rows[i].sheet;
        printf("%-34s %7.2f %9s %8d %8d %8d  %s\n",
               strncmp(rows[i].sheet, "answers/", 8) == 0 ? rows[i].sheet : name, rep.total, band,
               t.matched, t.missed_pos, t.missed_neg, bad ? "FAIL" : "ok");
        total.matched += t.matched;
        total.missed_pos += t.missed_pos;
        total.missed_neg += t.missed_neg;
        if (bad)
            failed++;
        else
            passed++;
        gr_report_free(&rep);
    }
    printf("confusion: %d matched, %d missed positive, %d missed negative\n", total.matched,
           total.missed_pos, total.missed_neg);
    printf("%d passed, %d failed\n", passed, failed);
    fflush(stdout);
    cr_expect_eq(failed, 0);
}

Test(calibration, the_misconception_sheet_fires_at_least_three_named_penalties) {
    gr_report rep;
    cr_assert_eq(grade_quiet("tests/fixtures/lab03/misconception.md", &rep), 0);
    int fired = 0;
    for (int i = 0; i < rep.n_items; i++)
        if (strcmp(rep.items[i].kind, "misc") == 0 && rep.items[i].fired) {
            fired++;
            cr_expect(mc_test_contains(rep.items[i].output, "see "), "%s cites its source: %s",
                      rep.items[i].id, rep.items[i].output);
            cr_expect(mc_test_contains(rep.items[i].output, "measured: "),
                      "%s names the refuting fact: %s", rep.items[i].id, rep.items[i].output);
        }
    cr_expect_geq(fired, 3);
    cr_expect_float_eq(rep.penalty_total, 3.0, 1e-9, "penalties are capped at 3.0");
    gr_report_free(&rep);
}

Test(calibration, good_sheets_are_locked_and_the_others_are_not) {
    const char *locked[] = {"tests/fixtures/lab03/gold_en.md", "tests/fixtures/lab03/gold_zh.md",
                            "answers/reference/lab03.md", "answers/reference/lab03.zh.md"};
    for (size_t i = 0; i < 4; i++) {
        gr_report rep;
        cr_assert_eq(grade_quiet(locked[i], &rep), 0);
        cr_expect(rep.locked, "%s: its pred blocks hash to the value the frozen run recorded",
                  locked[i]);
        gr_report_free(&rep);
    }
    gr_report rep;
    cr_assert_eq(grade_quiet("tests/fixtures/lab03/stuffed.md", &rep), 0);
    cr_expect_not(rep.locked);
    gr_report_free(&rep);
}

Test(calibration, sheets_carry_the_header_of_the_frozen_run) {
    cJSON *res = load_json("tests/fixtures/lab03/results.json");
    const char *nonce = cJSON_GetObjectItem(res, "nonce")->valuestring;
    int probe = cJSON_GetObjectItem(res, "probe_rank")->valueint;
    const char *variant = cJSON_GetObjectItem(res, "followup_variant")->valuestring;
    const char *sheets[] = {"gold_en.md",
                            "gold_zh.md",
                            "stuffed.md",
                            "misconception.md",
                            "copy_of_prompt.md",
                            "empty.md",
                            "@answers/reference/lab03.md",
                            "@answers/reference/lab03.zh.md"};
    for (size_t i = 0; i < sizeof sheets / sizeof sheets[0]; i++) {
        char rel[256], p[PATH_MAX + 300];
        if (sheets[i][0] == '@')
            snprintf(rel, sizeof rel, "%s", sheets[i] + 1);
        else
            snprintf(rel, sizeof rel, "tests/fixtures/lab03/%s", sheets[i]);
        path_of(rel, p, sizeof p);
        char n[17], v[8];
        int pr = -1;
        cr_assert_eq(gr_read_header(p, n, &pr, v), 0, "%s has no header", rel);
        cr_expect_str_eq(n, nonce, "%s", rel);
        cr_expect_eq(pr, probe, "%s", rel);
        cr_expect_str_eq(v, variant, "%s", rel);
    }
    cJSON_Delete(res);
}

Test(calibration, reference_answers_say_runs_differ_and_cover_the_other_variants) {
    const char *refs[] = {"answers/reference/lab03.md", "answers/reference/lab03.zh.md"};
    for (size_t i = 0; i < 2; i++) {
        char p[PATH_MAX + 64];
        path_of(refs[i], p, sizeof p);
        char *text = slurp(p);
        char *pred = strstr(text, "## Predictions");
        cr_assert_not_null(pred);
        *pred = '\0'; /* the preamble before the first section */
        cr_expect(mc_test_contains(text, "probe") && mc_test_contains(text, "nonce"),
                  "%s: the first paragraph explains that a learner's probe rank and variant differ",
                  refs[i]);
        *pred = '#';
        char *notes = strstr(text, "## Notes");
        cr_assert_not_null(notes, "%s has a Notes appendix", refs[i]);
        cr_expect(mc_test_contains(notes, "F1") && mc_test_contains(notes, "F3"),
                  "%s: Notes cover F1 and F3", refs[i]);
        free(text);
    }
}

/* ---------------------------------------------------------------------------------------------
   the frozen results against the library's rank grid */

static char *grid_groups_canon(const mc_grid *g, mc_group_kind kind) {
    int ng = mc_grid_num_groups(g, kind);
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < ng; i++) {
        int m[64];
        int nm = mc_grid_group_members(g, kind, i, m, 64);
        cr_assert_geq(nm, 0);
        cJSON_AddItemToArray(arr, cJSON_CreateIntArray(m, nm));
    }
    char *s = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    return s;
}

/* Groups as written in the results, re-printed so that spacing does not matter. */
static char *json_canon(const cJSON *j) { return cJSON_PrintUnformatted(j); }

static void expect_groups_match(const mc_grid *g, const cJSON *groups, const char *where) {
    const cJSON *e;
    int checked = 0;
    cJSON_ArrayForEach(e, groups) {
        int kind = mc_group_kind_from_name(e->string);
        cr_expect_geq(kind, 0, "%s.%s is not a group kind of the library", where, e->string);
        if (kind < 0) continue;
        char *want = grid_groups_canon(g, (mc_group_kind)kind);
        char *got = json_canon(e);
        cr_expect_str_eq(got, want, "%s.%s: fixture %s, rank grid %s", where, e->string, got, want);
        free(want);
        free(got);
        checked++;
    }
    cr_expect_geq(checked, 7, "%s: at least the groups the rubric reads", where);
}

Test(calibration, the_frozen_results_match_the_rank_grid) {
    cJSON *res = load_json("tests/fixtures/lab03/results.json");
    const cJSON *cfg = cJSON_GetObjectItem(res, "config");
    const cJSON *facts = cJSON_GetObjectItem(res, "facts");
    cr_expect_eq(cJSON_GetObjectItem(cfg, "world")->valueint, 8);
    cr_expect_eq(cJSON_GetObjectItem(cfg, "tp")->valueint, 2);
    cr_expect_eq(cJSON_GetObjectItem(cfg, "pp")->valueint, 2);
    cr_expect_str_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(facts, "exp_b"), "outcome")->valuestring,
        "wrong_membership");
    cr_expect_str_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(facts, "exp_c"), "outcome")->valuestring, "ok");
    cr_expect_str_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(facts, "plan_check"), "outcome")->valuestring,
        "error");

    mc_grid g;
    cr_assert_eq(mc_grid_init(&g, &(mc_grid_desc){.world = 8, .tp = 2, .pp = 2, .etp = 2}), MC_OK);
    cr_expect_eq(cJSON_GetObjectItem(facts, "dp_size")->valueint, g.dp);
    expect_groups_match(&g, cJSON_GetObjectItem(facts, "groups"), "facts.groups");

    /* The probe rank's coordinates and groups. */
    const cJSON *probe = cJSON_GetObjectItem(facts, "probe");
    int rank = cJSON_GetObjectItem(probe, "rank")->valueint;
    mc_rank_coords rc;
    cr_assert_eq(mc_grid_coords(&g, rank, &rc), MC_OK);
    cr_expect_eq(cJSON_GetObjectItem(probe, "tp_rank")->valueint, rc.tp);
    cr_expect_eq(cJSON_GetObjectItem(probe, "dp_rank")->valueint, rc.dp);
    cr_expect_eq(cJSON_GetObjectItem(probe, "pp_rank")->valueint, rc.pp);
    cr_expect_eq(cJSON_IsTrue(cJSON_GetObjectItem(probe, "is_last_stage")), rc.pp == g.desc.pp - 1);
    static const struct {
        const char *field;
        mc_group_kind kind;
    } mine[] = {{"tp_group", MC_GROUP_TP},
                {"dp_group", MC_GROUP_DP},
                {"pp_group", MC_GROUP_PP},
                {"mp_group", MC_GROUP_MP},
                {"embedding_group", MC_GROUP_EMBEDDING}};
    for (size_t i = 0; i < sizeof mine / sizeof mine[0]; i++) {
        int gi = -1, m[64];
        cr_assert_eq(mc_grid_group_of(&g, mine[i].kind, rank, &gi, NULL), MC_OK);
        int nm = mc_grid_group_members(&g, mine[i].kind, gi, m, 64);
        cJSON *want = cJSON_CreateIntArray(m, nm);
        char *w = cJSON_PrintUnformatted(want),
             *got = cJSON_PrintUnformatted(cJSON_GetObjectItem(probe, mine[i].field));
        cr_expect_str_eq(got, w, "probe.%s", mine[i].field);
        free(w);
        free(got);
        cJSON_Delete(want);
    }

    /* Experiment B broke the creation call that makes embedding[0]. */
    mc_plan_entry plan[256];
    int np = mc_grid_creation_plan(&g, plan, 256);
    cr_expect_eq(cJSON_GetObjectItem(facts, "groups_created")->valueint, np);
    int call = cJSON_GetObjectItem(cJSON_GetObjectItem(facts, "exp_b"), "call_index")->valueint;
    cr_assert(call >= 0 && call < np);
    char name[64];
    snprintf(name, sizeof name, "%s[%d]", mc_group_kind_name(plan[call].kind), plan[call].index);
    cr_expect_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(facts, "exp_b"), "group")->valuestring,
                     name);

    /* Follow-up F2: the same world with order tp-pp-dp. */
    const cJSON *fu = cJSON_GetObjectItem(facts, "followup");
    cr_expect_str_eq(cJSON_GetObjectItem(fu, "variant")->valuestring, "F2");
    mc_grid f;
    cr_assert_eq(
        mc_grid_init(&f, &(mc_grid_desc){.world = 8, .tp = 2, .pp = 2, .order = "tp-pp-dp"}),
        MC_OK);
    expect_groups_match(&f, cJSON_GetObjectItem(fu, "groups"), "facts.followup.groups");
    cr_assert_eq(mc_grid_coords(&f, cJSON_GetObjectItem(fu, "probe_rank")->valueint, &rc), MC_OK);
    const cJSON *fp = cJSON_GetObjectItem(fu, "probe");
    cr_expect_eq(cJSON_GetObjectItem(fp, "tp_rank")->valueint, rc.tp);
    cr_expect_eq(cJSON_GetObjectItem(fp, "dp_rank")->valueint, rc.dp);
    cr_expect_eq(cJSON_GetObjectItem(fp, "pp_rank")->valueint, rc.pp);
    cJSON_Delete(res);
}
