/* tests/test_calibration.c - every lab's rubric against its calibration corpus.

   tests/calibration/<lab>/ holds the development half of each lab's corpus: answer sheets
   written by authors who never saw the rubric, each marked from the seed's score points by a
   separate rater before any grader saw it (see tests/calibration/calibrate.h). Each test grades
   one lab's sheets against fresh runs of ./<lab> for their nonces and holds the development half
   to the bar of grading_design.md A0.7 (|grader - label| <= 2 on 90% of the sheets, every sheet
   labelled >= 13 graded >= 13, every sheet labelled <= 3 graded <= 4), so that a change to the
   engine or a rubric that breaks agreement with the markers fails here. The held-out test
   halves are kept out of the repository and measured with `make calibrate` (docs/grading.md).
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
    const char *root = mc_test_repo_root();
    char dir[PATH_MAX + 64], err[1024], work[] = "/tmp/gr_calibration_XXXXXX";
    snprintf(dir, sizeof dir, "%.3000s/tests/calibration/%s", root, lab);
    cr_assert_eq(cal_load(&g_corpus, lab, dir, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(mkdtemp(work));
    int rc = cal_grade_all(&g_corpus, root, work, err, sizeof err);
    char cmd[PATH_MAX];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    cr_expect_eq(system(cmd), 0);
    cr_assert_eq(rc, 0, "%s: %s", lab, err);
    for (int i = 0; i < g_corpus.n; i++)
        cr_expect(g_corpus.sheet[i].graded, "%s: %s", g_corpus.sheet[i].id,
                  g_corpus.sheet[i].error);
    char *table = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&table, &len);
    cal_print(&g_corpus, f);
    fclose(f);
    cal_bar b = cal_check(&g_corpus, "dev");
    cr_assert_gt(b.n, 0, "%s: no development sheets in %s", lab, dir);
    cr_expect(b.within * 10 >= b.n * 9, "%s dev: |grader-label| <= 2 on %d/%d sheets (need 90%%)\n%s",
              lab, b.within, b.n, table);
    cr_expect_eq(b.high_ok, b.high_n, "%s dev: %d/%d sheets labelled >= 13 graded >= 13\n%s", lab,
                 b.high_ok, b.high_n, table);
    cr_expect_eq(b.low_ok, b.low_n, "%s dev: %d/%d sheets labelled <= 3 graded <= 4\n%s", lab,
                 b.low_ok, b.low_n, table);
    free(table);
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
