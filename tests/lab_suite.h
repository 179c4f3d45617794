/* tests/lab_suite.h - the fixture the lab suites share (tests/test_lab*.c, test_lab_driver.c).

   Every lab suite runs its lab as a program from the repository root, keeps its files in a
   scratch directory of its own and captures the program's output into one large buffer; it
   then reads the results file as JSON and judges values by their dotted paths. These helpers
   are those steps, written once. Only Criterion suites include it: the helpers stop a test
   through cr_assert. It includes Criterion, cJSON and tests/test_util.h itself; the grading
   helpers need labs/grader.h included before it.

     - LS_LAB_SUITE: a lab suite's fixture (ls_enter_found_root, ls_open, ls_close);
     - ls_read_file, ls_write_file, ls_copy_reference, ls_write_edited: whole files;
     - ls_fast_libs: the link flags for a lab a test builds itself;
     - ls_load_json, ls_get and its typed forms: results files and their values;
     - ls_total_score, ls_total_score_strict: the score a grading table ends with;
     - ls_grade, ls_points_of, ls_fired: grading in-process (include labs/grader.h first).

   Header-only and static inline, like test_util.h, so a suite pays nothing for the helpers it
   does not call. */
#ifndef MC_LAB_SUITE_H_INCLUDED
#define MC_LAB_SUITE_H_INCLUDED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <criterion/criterion.h>

#include "tests/test_util.h"

/* ---------------------------------------------------------------------------------------------
   setup and teardown */

/* The labs read their rubrics, templates and fixtures by relative paths, so every test runs
   from the repository root, wherever the binary was started from. */
static inline void ls_enter_root(void) {
    const char *root = mc_test_repo_root();
    cr_assert_eq(chdir(root), 0, "cannot chdir to %s", root);
}

/* As ls_enter_root, and first a check that the root was really found: a binary copied away
   from build/tests would otherwise run from "." and fail later with less clear messages. */
static inline void ls_enter_found_root(void) {
    const char *root = mc_test_repo_root();
    cr_assert(strcmp(root, ".") != 0 || access("megatron_c.h", R_OK) == 0,
              "cannot find the repository root from /proc/self/exe");
    cr_assert_eq(chdir(root), 0, "cannot chdir to %s", root);
}

/* A fresh scratch directory /tmp/mc_test_<name>_XXXXXX in dir (a test's runs must not see
   another test's files) and a zeroed output buffer of out_cap bytes, returned. */
static inline char *ls_open(char *dir, size_t dir_cap, const char *name, size_t out_cap) {
    cr_assert_eq(mc_test_make_tmpdir(dir, dir_cap, name), 0, "no temp dir for %s", name);
    char *out = (char *)calloc(1, out_cap);
    cr_assert_not_null(out);
    return out;
}

/* Undoes ls_open. */
static inline void ls_close(const char *dir, char *out) {
    mc_test_remove_dir(dir);
    free(out);
}

/* A lab suite's fixture, defined once: every test runs from the repository root with ./<lab>
   built, in a fresh scratch directory tmp_dir, with a zeroed output buffer out of out_cap
   bytes; timeout_s is Criterion's per-test limit (0: none). */
#define LS_LAB_SUITE(lab, out_cap, timeout_s)                                                       \
    static char tmp_dir[64];                                                                       \
    static char *out;                                                                              \
    static void setup(void) {                                                                      \
        ls_enter_found_root();                                                                     \
        cr_assert_eq(access(#lab, X_OK), 0, "./" #lab " is missing: run make " #lab " first");     \
        out = ls_open(tmp_dir, sizeof tmp_dir, #lab, out_cap);                                     \
    }                                                                                              \
    static void teardown(void) { ls_close(tmp_dir, out); }                                         \
    TestSuite(lab, .init = setup, .fini = teardown, .timeout = timeout_s)

/* ---------------------------------------------------------------------------------------------
   files */

/* The whole file, NUL-terminated (the caller frees it), or NULL when it cannot be read: the
   caller decides whether a missing file is a failure. */
static inline char *ls_read_file(const char *path) { return mc_test_read_file(path, NULL); }

static inline void ls_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

/* Copies answers/reference/<name> to <dir>/<name>, its path in dst: a sheet's ledger lives
   beside it, and a test needs one that starts empty. */
static inline void ls_copy_reference(const char *dir, const char *name, char *dst, size_t cap) {
    char src[128];
    snprintf(src, sizeof src, "answers/reference/%s", name);
    char *text = ls_read_file(src);
    cr_assert_not_null(text, "missing %s", src);
    snprintf(dst, cap, "%s/%s", dir, name);
    FILE *f = fopen(dst, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    free(text);
}

/* Writes src_path to dst with its first `from` replaced by `to`: a learner's edit of a lab
   source, which the test then builds. The test stops when `from` is gone, so that a change to
   the lab's source shows up here rather than as an edit that silently did nothing. */
static inline void ls_write_edited(const char *src_path, const char *from, const char *to,
                                   const char *dst) {
    char *src = ls_read_file(src_path);
    cr_assert_not_null(src);
    char *at = strstr(src, from);
    cr_assert_not_null(at, "%s no longer holds the line this test edits", src_path);
    FILE *f = fopen(dst, "w");
    cr_assert_not_null(f);
    fprintf(f, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
    fclose(f);
    free(src);
}

/* The link flags of the library object (OpenMP, the BLAS), for a test that links an edited
   lab itself: the Makefile exports them as MC_FAST_LIBS. */
static inline const char *ls_fast_libs(void) {
    const char *fast_libs = getenv("MC_FAST_LIBS");
    return fast_libs ? fast_libs : "-fopenmp $(pkg-config --libs openblas 2>/dev/null)";
}

/* ---------------------------------------------------------------------------------------------
   results files */

/* A results file, parsed (the caller deletes it); the test stops when it is missing or not
   JSON, and says which: a run that wrote nothing and a writer that broke the file are
   different faults. */
static inline cJSON *ls_load_json(const char *path) {
    char *text = ls_read_file(path);
    cr_assert_not_null(text, "missing %s", path);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(doc, "%s is not valid JSON", path);
    return doc;
}

/* The value at a dotted path ("facts.probe.rank"); the test stops at the first key that is
   missing and names it, so a renamed level is found at once. */
static inline cJSON *ls_get(const cJSON *obj, const char *dotted) {
    char path[256];
    snprintf(path, sizeof path, "%s", dotted);
    const cJSON *cur = obj;
    char *save = NULL;
    for (char *key = strtok_r(path, ".", &save); key != NULL; key = strtok_r(NULL, ".", &save)) {
        cur = cJSON_GetObjectItemCaseSensitive(cur, key);
        cr_assert_not_null(cur, "results lack the key %s (at %s)", dotted, key);
    }
    return (cJSON *)cur;
}

static inline int ls_geti(const cJSON *obj, const char *dotted) {
    return ls_get(obj, dotted)->valueint;
}

static inline double ls_getd(const cJSON *obj, const char *dotted) {
    return ls_get(obj, dotted)->valuedouble;
}

/* True only for JSON true; anything else (false, or a value of another type) reads as 0. */
static inline int ls_getb(const cJSON *obj, const char *dotted) {
    return cJSON_IsTrue(ls_get(obj, dotted));
}

/* As ls_getb, but the value must be a boolean: a flag written as 1 or "true" is a fault. */
static inline int ls_truth(const cJSON *obj, const char *dotted) {
    const cJSON *v = ls_get(obj, dotted);
    cr_assert(cJSON_IsBool(v), "%s is not a boolean", dotted);
    return cJSON_IsTrue(v);
}

static inline const char *ls_gets(const cJSON *obj, const char *dotted) {
    const cJSON *v = ls_get(obj, dotted);
    cr_assert(cJSON_IsString(v), "%s is not a string", dotted);
    return v->valuestring;
}

/* ---------------------------------------------------------------------------------------------
   grading */

/* "Total 12.50/15" -> 12.5, from the last such line of the output; -1 when there is none. */
static inline double ls_total_score(const char *text) {
    const char *p = NULL, *q = text;
    while ((q = strstr(q, "Total ")) != NULL) p = q++;
    double v = -1.0;
    if (p == NULL || sscanf(p, "Total %lf/15", &v) != 1) return -1.0;
    return v;
}

/* As ls_total_score, but the line must name its maximum too ("Total x/y"): a table cut off
   after the score reads as -1. */
static inline double ls_total_score_strict(const char *text) {
    const char *t = NULL, *p = text;
    while ((p = strstr(p, "Total ")) != NULL) t = p++;
    double score = -1, max = 0;
    if (t == NULL || sscanf(t, "Total %lf/%lf", &score, &max) != 2) return -1;
    return score;
}

/* Grading a sheet in-process against a frozen results file (labs/grader.h included first):
   the grade then depends on the sheet alone, not on a run made on a loaded machine. */
#ifdef GR_GRADER_H_INCLUDED
static inline void ls_grade(const char *rubric, const char *results, const char *sheet,
                            gr_report *rep) {
    cr_assert_eq(gr_grade(&(gr_grade_desc){.rubric_path = rubric,
                                           .answers_path = sheet,
                                           .results_path = results,
                                           .quiet = 1},
                          rep),
                 0, "grading %s failed", sheet);
}

/* The points of the items of two kinds ("expl" and "evid", say): what a sheet's text earned,
   with the predictions and the penalties left out. */
static inline double ls_points_of(const gr_report *rep, const char *kind_a, const char *kind_b) {
    double s = 0.0;
    for (int i = 0; i < rep->n_items; i++)
        if (!strcmp(rep->items[i].kind, kind_a) || !strcmp(rep->items[i].kind, kind_b))
            s += rep->items[i].score;
    return s;
}

/* Whether the item fired; an id the report lacks is a failure of its own (a renamed item
   would otherwise read as "did not fire"). */
static inline int ls_fired(const gr_report *rep, const char *id) {
    for (int i = 0; i < rep->n_items; i++)
        if (!strcmp(rep->items[i].id, id)) return rep->items[i].fired;
    cr_expect(0, "no item %s", id);
    return 0;
}
#endif /* GR_GRADER_H_INCLUDED */

#endif /* MC_LAB_SUITE_H_INCLUDED */
