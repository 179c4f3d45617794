/* tests/test_lab_util.h - helpers for the suites that run a lab and read its results.

   Include <criterion/criterion.h>, <cjson/cJSON.h> and "labs/lab_common.h" first: the helpers
   report through cr_assert, so a missing file or key fails the test with its name.

       char dir[64];
       mc_lab_test_enter_root_and_tmpdir(dir, sizeof dir, "lab05");   // in .init
       cJSON *doc = mc_lab_test_load_json("results/lab05.json");
       int k1 = mc_lab_test_get(doc, "facts.training.k1")->valueint;
       cJSON_Delete(doc);
       mc_lab_test_remove_tmpdir(dir);                                  // in .fini */
#ifndef MC_TEST_LAB_UTIL_H_INCLUDED
#define MC_TEST_LAB_UTIL_H_INCLUDED

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/test_util.h"

/* chdir to the repository root and make a fresh /tmp/mc_test_<name>_XXXXXX in dir. */
static inline void mc_lab_test_enter_root_and_tmpdir(char *dir, size_t cap, const char *name) {
    cr_assert_eq(chdir(mc_test_repo_root()), 0, "cannot chdir to the repository root");
    cr_assert_eq(access("megatron_c.h", R_OK), 0, "%s is not the repository root",
                 mc_test_repo_root());
    snprintf(dir, cap, "/tmp/mc_test_%s_XXXXXX", name);
    cr_assert_not_null(mkdtemp(dir), "cannot make %s", dir);
}

static inline void mc_lab_test_remove_tmpdir(const char *dir) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

/* The parsed JSON file (the caller deletes it). */
static inline cJSON *mc_lab_test_load_json(const char *path) {
    char *text = lab_read_text(path, NULL);
    cr_assert_not_null(text, "missing %s", path);
    cJSON *doc = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(doc, "%s is not valid JSON", path);
    return doc;
}

/* The value at a dotted path ("facts.reload.layout.outcome"); a missing key fails the test. */
static inline cJSON *mc_lab_test_get(const cJSON *obj, const char *dotted) {
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

#endif /* MC_TEST_LAB_UTIL_H_INCLUDED */
