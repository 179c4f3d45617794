/* tests/grade/grade_lab03.c - `make grade`: self-grading of answers/lab03.md, one Criterion
   test per rubric point (P1-P5, A1-A4, MC1-MC5, FP1, FP2, FE1, FE2, FQ).

   A point not earned is a failing test whose message says what is missing. The test
   `score_table` prints the whole table (as ./lab03 --grade-only does) and writes
   results/lab03.grade.json. When the sheet or the results are missing, that one test fails
   and says what to run; every other test is skipped.

   Paths default to answers/lab03.md, results/lab03.json and labs/rubric/lab03.json under the
   repository root; MC_GRADE_ANSWERS, MC_GRADE_RESULTS and MC_GRADE_RUBRIC override them. */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "labs/grader.h"
#include "tests/test_util.h"

static char g_paths[3][PATH_MAX + 64];

static const char *repo_root(void) { return mc_test_repo_root(); }

static const char *input(int which) {
    static const char *const env[3] = {"MC_GRADE_ANSWERS", "MC_GRADE_RESULTS", "MC_GRADE_RUBRIC"};
    static const char *const rel[3] = {"answers/lab03.md", "results/lab03.json",
                                       "labs/rubric/lab03.json"};
    const char *e = getenv(env[which]);
    if (e != NULL && e[0] != '\0')
        snprintf(g_paths[which], sizeof g_paths[which], "%s", e);
    else
        snprintf(g_paths[which], sizeof g_paths[which], "%s/%s", repo_root(), rel[which]);
    return g_paths[which];
}

enum { ANSWERS, RESULTS, RUBRIC };

static int inputs_ready(void) {
    return access(input(ANSWERS), R_OK) == 0 && access(input(RESULTS), R_OK) == 0;
}

static void skip_without_inputs(void) {
    if (!inputs_ready()) cr_skip_test("inputs missing (see score_table)");
}

static void grade_quietly(mc_grade_report *rep) {
    int rc = mc_grade(&(mc_grade_desc){.rubric_path = input(RUBRIC),
                                       .answers_path = input(ANSWERS),
                                       .results_path = input(RESULTS),
                                       .quiet = 1},
                      rep);
    cr_assert_eq(
        rc, 0,
        "the grader could not use its inputs (status %d): run ./lab03 --grade-only to see why", rc);
}

static int id_matches(const char *item_id, const char *point) {
    size_t n = strlen(point);
    return strncmp(item_id, point, n) == 0 && (item_id[n] == '\0' || item_id[n] == '.');
}

/* Sums the items of one rubric point and fails with what is missing. */
static void expect_point(const char *point) {
    skip_without_inputs();
    mc_grade_report rep;
    grade_quietly(&rep);
    double got = 0, max = 0;
    int found = 0;
    char why[8192] = "";
    size_t used = 0;
    for (int i = 0; i < rep.n_items; i++) {
        const mc_grade_item *it = &rep.items[i];
        if (!id_matches(it->id, point)) continue;
        found++;
        got += it->score;
        max += it->max_score;
        if (it->score < it->max_score - 1e-9 && used + 64 < sizeof why) {
            used += (size_t)snprintf(why + used, sizeof why - used, "\n  %s (%.2f/%.2f): ", it->id,
                                     it->score, it->max_score);
            for (const char *p = it->output; *p != '\0' && used + 8 < sizeof why; p++) {
                why[used++] = *p;
                if (*p == '\n') used += (size_t)snprintf(why + used, sizeof why - used, "    ");
            }
            why[used] = '\0';
        }
    }
    int is_prediction = point[0] == 'P' || strncmp(point, "FP", 2) == 0;
    cr_assert_gt(found, 0, "the rubric has no items for %s in this variant", point);
    cr_expect(got >= max - 1e-9, "%s: %.2f/%.2f earned%s%s", point, got, max, why,
              !is_prediction || rep.locked || rep.predictions_filled == 0
                  ? ""
                  : "\n  (predictions not locked before the run: halved)");
    mc_grade_report_free(&rep);
}

static void expect_no_misconception(const char *id) {
    skip_without_inputs();
    mc_grade_report rep;
    grade_quietly(&rep);
    for (int i = 0; i < rep.n_items; i++) {
        const mc_grade_item *it = &rep.items[i];
        if (strcmp(it->id, id) == 0)
            cr_expect_not(it->fired, "%s fired (%.2f): %s", id, it->score, it->output);
    }
    mc_grade_report_free(&rep);
}

TestSuite(grade_lab03, .timeout = 60);

Test(grade_lab03, score_table) {
    const char *answers = input(ANSWERS), *results = input(RESULTS);
    cr_assert(access(answers, R_OK) == 0,
              "%s not found: run ./lab03 --init to get your sheet, fill its pred blocks, then run "
              "mpirun -np 8 ./lab03",
              answers);
    cr_assert(access(results, R_OK) == 0,
              "%s not found: run mpirun -np 8 ./lab03 (after filling the pred blocks) to measure "
              "the facts your "
              "answers are graded against",
              results);
    char grade_json[PATH_MAX + 64];
    snprintf(grade_json, sizeof grade_json, "%s", results);
    char *dot = strrchr(grade_json, '.');
    if (dot != NULL && strcmp(dot, ".json") == 0)
        strcpy(dot, ".grade.json");
    else
        strcat(grade_json, ".grade.json");
    mc_grade_report rep;
    fflush(stdout);
    int rc = mc_grade(&(mc_grade_desc){.rubric_path = input(RUBRIC),
                                       .answers_path = answers,
                                       .results_path = results,
                                       .grade_out_path = grade_json,
                                       .out = stdout},
                      &rep);
    fflush(stdout);
    cr_assert_eq(rc, 0, "the grader could not use its inputs (status %d)", rc);
    mc_grade_report_free(&rep);
}

Test(grade_lab03, P1) { expect_point("P1"); }
Test(grade_lab03, P2) { expect_point("P2"); }
Test(grade_lab03, P3) { expect_point("P3"); }
Test(grade_lab03, P4) { expect_point("P4"); }
Test(grade_lab03, P5) { expect_point("P5"); }
Test(grade_lab03, A1) { expect_point("A1"); }
Test(grade_lab03, A2) { expect_point("A2"); }
Test(grade_lab03, A3) { expect_point("A3"); }
Test(grade_lab03, A4) { expect_point("A4"); }
Test(grade_lab03, MC1) { expect_no_misconception("MC1"); }
Test(grade_lab03, MC2) { expect_no_misconception("MC2"); }
Test(grade_lab03, MC3) { expect_no_misconception("MC3"); }
Test(grade_lab03, MC4) { expect_no_misconception("MC4"); }
Test(grade_lab03, MC5) { expect_no_misconception("MC5"); }
Test(grade_lab03, FP1) { expect_point("FP1"); }
Test(grade_lab03, FP2) { expect_point("FP2"); }
Test(grade_lab03, FE1) { expect_point("FE1"); }
Test(grade_lab03, FE2) { expect_point("FE2"); }
Test(grade_lab03, FQ) { expect_point("FQ"); }
