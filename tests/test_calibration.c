/* tests/test_calibration.c - every lab's rubric against its calibration corpus.

   tests/calibration/<lab>/ holds each lab's corpus, a development and a test half: answer sheets
   written by authors who never saw the rubric, each marked from the seed's score points by a
   separate rater before any grader saw it (see tests/calibration/calibrate.h). Each test grades
   one lab's sheets against the runs frozen beside them (results/<id>.json, checked to have the
   shape ./<lab> writes now) and holds the development half
   to the bar of grading_design.md A0.7 (|grader - label| <= 2 on 90% of the sheets, every sheet
   labelled >= 13 graded >= 13, every sheet labelled <= 3 graded <= 4), so that a change to the
   engine or a rubric that breaks agreement with the markers fails here. The test halves
   (split "test", sheets no rubric or engine change has read) are graded here too, so a sheet
   that no longer grades fails, but only `make calibrate` holds them to the bar: the grader
   misses it on them today (docs/grading.md), and a suite that fails on every run tests nothing.
   What both halves measure is kept in labs/rubric/agreement.json, which every grade report
   quotes; a test fails when it no longer matches (make agreement remakes it).
   lab03's corpus and its whole-sheet behaviour are tested in test_lab03_calibration.c. */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "labs/grader.h"
#include "tests/calibration/calibrate.h"
#include "tests/test_util.h"

static cal_corpus g_corpus;

static void expect_dev_bar(const char *lab) {
    char dir[PATH_MAX + 64], err[2048];
    static char msg[1 << 16];
    snprintf(dir, sizeof dir, "%.3000s/tests/calibration/%s", mc_test_repo_root(), lab);
    cr_assert_eq(cal_run_corpus(&g_corpus, lab, dir, mc_test_repo_root(), 1, err, sizeof err), 0,
                 "%s", err);
    cr_assert_gt(cal_check(&g_corpus, "dev").n, 0, "%s: no development sheets in %s", lab, dir);
    cr_expect(cal_meets_bar(&g_corpus, "dev", msg, sizeof msg), "%s", msg);
    cr_expect(cal_agreement_current(&g_corpus, mc_test_repo_root(), msg, sizeof msg), "%s", msg);
}

TestSuite(calibration, .timeout = 300);

#define CAL_TEST(lab)                                                                              \
    Test(calibration, lab##_development_half_meets_the_bar) { expect_dev_bar(#lab); }

CAL_TEST(lab01)
CAL_TEST(lab02)
CAL_TEST(lab04)
CAL_TEST(lab05)
CAL_TEST(lab06)
CAL_TEST(lab07)
CAL_TEST(lab08)
CAL_TEST(lab09)
CAL_TEST(lab10)
CAL_TEST(lab11)
CAL_TEST(lab12)

/* The frozen runs are checked against the shape a fresh run writes, so a lab that gains,
   loses or retypes a field fails here instead of grading against stale results. */
static int same_shape(const char *frozen, const char *fresh, int exact, char *why, size_t cap) {
    cJSON *a = cJSON_Parse(frozen), *b = cJSON_Parse(fresh);
    cr_assert(a != NULL && b != NULL);
    char path[PATH_MAX] = "results";
    int same = cal_same_shape(a, b, exact, path, 7, why, cap);
    cJSON_Delete(a);
    cJSON_Delete(b);
    return same;
}

Test(calibration, frozen_results_of_another_shape_are_stale) {
    char why[1024] = "";
    const char *fresh = "{\"facts\":{\"bubble\":{\"timed\":0.31,\"formula\":0.27},\"ranks\":[{\"ms\":1.5}]}}";
    cr_expect(same_shape("{\"facts\":{\"bubble\":{\"timed\":0.4,\"formula\":0.27},\"ranks\":[{\"ms\":2}]}}",
                         fresh, 1, why, sizeof why), "%s", why);
    cr_expect(!same_shape("{\"facts\":{\"bubble\":{\"timed\":0.4},\"ranks\":[{\"ms\":2}]}}", fresh, 1,
                          why, sizeof why));
    cr_expect(strstr(why, "results.facts.bubble.formula") != NULL, "%s", why);
    cr_expect(!same_shape("{\"facts\":{\"bubble\":{\"timed\":0.4,\"formula\":0.27},\"ranks\":[{\"s\":2}]}}",
                          fresh, 1, why, sizeof why));
    cr_expect(strstr(why, "results.facts.ranks[0].ms") != NULL, "%s", why);
    cr_expect(!same_shape("{\"facts\":{\"bubble\":{\"timed\":\"0.4\",\"formula\":0.27},\"ranks\":[]}}",
                          fresh, 1, why, sizeof why));
    cr_expect(strstr(why, "a string in the frozen results and a number") != NULL, "%s", why);
    const char *more = "{\"facts\":{\"bubble\":{\"timed\":null,\"formula\":0.27,\"fault\":\"x\"},\"ranks\":[]}}";
    cr_expect(!same_shape(more, fresh, 1, why, sizeof why), "an extra key is stale when exact");
    cr_expect(strstr(why, "results.facts.bubble.fault") != NULL, "%s", why);
    cr_expect(same_shape(more, fresh, 0, why, sizeof why), "revealed keys are allowed: %s", why);
}

Test(calibration, a_stale_or_missing_frozen_run_is_refused) {
    char work[] = "/tmp/gr_calibration_stale_XXXXXX", cmd[4 * PATH_MAX], err[2048] = "";
    cr_assert_not_null(mkdtemp(work));
    const char *root = mc_test_repo_root();
    snprintf(cmd, sizeof cmd,
             "set -e; src='%s/tests/calibration/lab01'; cd '%s'; mkdir sheets results;"
             " head -n 1 \"$src/labels.tsv\" > labels.tsv; grep '^lab01-a01\t' \"$src/labels.tsv\" >> labels.tsv;"
             " cp \"$src/sheets/lab01-a01.md\" sheets/;"
             " sed 's/\"facts\"/\"facts_renamed\"/' \"$src/results/lab01-a01.json\" > results/lab01-a01.json",
             root, work);
    cr_assert_eq(system(cmd), 0);
    cr_expect_eq(cal_run_corpus(&g_corpus, "lab01", work, root, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "is stale") != NULL && strstr(err, "make calibration-results") != NULL,
              "%s", err);
    snprintf(cmd, sizeof cmd, "rm '%s/results/lab01-a01.json'", work);
    cr_assert_eq(system(cmd), 0);
    cr_expect_eq(cal_run_corpus(&g_corpus, "lab01", work, root, 1, err, sizeof err), -1);
    cr_expect(strstr(err, "has no frozen run") != NULL, "%s", err);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    cr_expect_eq(system(cmd), 0);
}
