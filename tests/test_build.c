/* tests/test_build.c - the Makefile, as a newcomer's first `make` meets it.

   The package step ($(BUILD)/.deps-ok, which runs .ci/deps.sh) must come before every compiler
   call, and an object that is missing must be rebuilt even when the program that links it is
   newer than the sources (make must not treat the objects as disposable intermediates).
   Each test asks make for its plan (`make -n`) in a build folder that does not exist, so
   nothing is compiled and the real build folder is not touched.

   make build/tests/test_build && ./build/tests/test_build */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/test_util.h"

#define BUILD_OUT_CAP (1u << 20)

TestSuite(build, .timeout = 120);

/* A copy of what the Makefile reads, in a fresh folder: `fresh` 1 is a new clone (nothing
   built), 0 has the programs built after the sources (what a second `make` meets). The
   caller removes the folder. */
static void make_tree(char *dir, size_t cap, int fresh) {
    snprintf(dir, cap, "/tmp/mc_build_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char cmd[8192], out[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && cp -r Makefile megatron_c.h megatron_c_cuda.cu labs tests tools "
             "examples bench .ci '%s'/ && cd '%s' && { [ %d = 1 ] || { sleep 0.05; "
             "touch lab03 megatron_c pretrain_gpt; }; }",
             mc_test_repo_root(), dir, dir, fresh);
    int rc = mc_test_run(cmd, 60.0, out, sizeof out);
    cr_assert_eq(rc, 0, "copying the tree failed: %s", out);
}

static void remove_tree(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("could not remove %s", dir);
}

/* `make -n <args>` in such a tree; the parent's make variables (jobserver, -j) are dropped
   so the plan is the one a plain `make` makes. */
static int make_plan(int fresh, const char *args, char **out) {
    char dir[64], cmd[4096];
    make_tree(dir, sizeof dir, fresh);
    snprintf(cmd, sizeof cmd,
             "cd '%s' && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n --no-print-directory "
             "%s", dir, args);
    *out = malloc(BUILD_OUT_CAP);
    cr_assert_not_null(*out);
    int rc = mc_test_run(cmd, 60.0, *out, BUILD_OUT_CAP);
    remove_tree(dir);
    return rc;
}

/* 1-based line number of the first line that runs one of the compilers, or 0. */
static int first_compiler_line(const char *plan, char *which, size_t cap) {
    static const char *const compilers[] = {"mpicc ", "cc ", "gcc ", "g++ ", "c++ ", "clang ",
                                            "nvcc "};
    int line_no = 1;
    for (const char *line = plan; *line; line_no++) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        for (size_t k = 0; k < sizeof compilers / sizeof compilers[0]; k++) {
            size_t n = strlen(compilers[k]);
            if (len >= n && strncmp(line, compilers[k], n) == 0) {
                snprintf(which, cap, "%.*s", (int)(len < 200 ? len : 200), line);
                return line_no;
            }
        }
        if (!end) break;
        line = end + 1;
    }
    return 0;
}

static int line_of(const char *plan, const char *needle) {
    const char *at = strstr(plan, needle);
    if (!at) return 0;
    int line_no = 1;
    for (const char *p = plan; p < at; p++) line_no += *p == '\n';
    return line_no;
}

static void expect_deps_first(int fresh, const char *target) {
    char *plan = NULL, which[256] = "";
    int rc = make_plan(fresh, target, &plan);
    cr_assert_eq(rc, 0, "make -n %s exited %d:\n%.3000s", target, rc, plan);
    int deps = line_of(plan, ".ci/deps.sh");
    int compile = first_compiler_line(plan, which, sizeof which);
    cr_assert(deps > 0, "make -n %s never runs the package step (.ci/deps.sh):\n%.2000s", target,
              plan);
    cr_assert(compile > 0, "make -n %s runs no compiler", target);
    cr_expect(deps < compile,
              "make %s compiles before the package step: line %d \"%s\" comes before "
              ".ci/deps.sh on line %d", target, compile, which, deps);
    free(plan);
}

/* A new clone, and one where the programs are built but build/ is gone. */
Test(build, test_installs_packages_before_any_compiler) {
    expect_deps_first(1, "test");
    expect_deps_first(0, "test");
}
Test(build, check_header_installs_packages_first) { expect_deps_first(1, "check-header"); }
Test(build, every_program_installs_packages_first) {
    const char *const targets[] = {"megatron_c", "pretrain_gpt", "lab03", "bench"};
    for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++)
        expect_deps_first(1, targets[i]);
}

/* lab03 is newer than its sources here, so a make that treats the objects as intermediates
   calls it up to date although build/ holds no object at all. */
Test(build, missing_objects_are_rebuilt_for_an_up_to_date_program) {
    char *plan = NULL;
    int rc = make_plan(0, "lab03", &plan);
    cr_assert_eq(rc, 0, "make -n lab03 exited %d:\n%.3000s", rc, plan);
    cr_expect(mc_test_contains(plan, "-c labs/mc_impl.c"),
              "make lab03 with an empty build folder does not compile labs/mc_impl.c:\n%.2000s",
              plan);
    free(plan);
}
