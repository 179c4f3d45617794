/* tests/grade/grade.c - `make grade`: self-grading with Criterion, one test per rubric item.

   The items are read from the rubric files at run time (gr_rubric_items), so a new lab needs
   no C here: every lab that has labs/rubric/<lab>.json and an answer sheet answers/<lab>.md
   is graded, or only the lab named by GR_LAB (make grade LAB=lab03).

   Per lab there is one test "<lab> score_table", which prints the whole table (as
   ./<lab> --grade-only does) and writes results/<lab>.grade.json, and one test per item:
   "<lab> <item>" passes when the item earned all its points (a misconception passes when it
   did not fire) and otherwise fails with what is missing. When the sheet or the results are
   missing, score_table fails and says what to run, and the item tests are skipped.

   Paths default to answers/<lab>.md, results/<lab>.json, results/<lab>.ledger.json and
   labs/rubric/<lab>.json under the repository root; GR_GRADE_ANSWERS, GR_GRADE_RESULTS,
   GR_GRADE_LEDGER and GR_GRADE_RUBRIC override them (with GR_LAB set to one lab). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "labs/grader.h"
#include "tests/test_util.h"

/* One test: an item of one lab, or that lab's score table (is_table). Lives in Criterion's
   shared memory, so only plain arrays. */
typedef struct grade_case {
    char lab[32];
    char id[48];
    char title[128];
    char part[12];
    double max_score;
    int is_penalty;
    int is_table;
} grade_case;

static void path_for(const char *lab, int which, char *out, size_t cap) {
    static const char *const env[] = {"GR_GRADE_ANSWERS", "GR_GRADE_RESULTS", "GR_GRADE_RUBRIC",
                                      "GR_GRADE_LEDGER"};
    static const char *const fmt[] = {"%s/answers/%s.md", "%s/results/%s.json",
                                      "%s/labs/rubric/%s.json", "%s/results/%s.ledger.json"};
    const char *e = getenv(env[which]);
    const char *one = getenv("GR_LAB");
    if (e != NULL && e[0] != '\0' && one != NULL && one[0] != '\0')
        snprintf(out, cap, "%s", e);
    else
        snprintf(out, cap, fmt[which], mc_test_repo_root(), lab);
}
enum { ANSWERS, RESULTS, RUBRIC, LEDGER };

/* The labs to grade: GR_LAB, or every rubric with an answer sheet beside it. */
static int list_labs(char labs[][32], int cap) {
    const char *one = getenv("GR_LAB");
    if (one != NULL && one[0] != '\0') {
        snprintf(labs[0], 32, "%s", one);
        return 1;
    }
    char dir[PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/labs/rubric", mc_test_repo_root());
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < cap) {
        size_t len = strlen(e->d_name);
        if (len < 6 || len > 30 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
        char lab[32];
        snprintf(lab, sizeof lab, "%.*s", (int)(len - 5), e->d_name);
        char answers[PATH_MAX + 64];
        path_for(lab, ANSWERS, answers, sizeof answers);
        if (access(answers, R_OK) != 0) continue;
        snprintf(labs[n++], 32, "%s", lab);
    }
    closedir(d);
    /* readdir order is arbitrary: sort for a stable listing */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(labs[j - 1], labs[j]) > 0; j--) {
            char t[32];
            memcpy(t, labs[j], 32);
            memcpy(labs[j], labs[j - 1], 32);
            memcpy(labs[j - 1], t, 32);
        }
    return n;
}

static void free_cases(struct criterion_test_params *p) { cr_free(p->params); }

ParameterizedTestParameters(grade, item) {
    static char labs[64][32];
    int nlabs = list_labs(labs, 64);
    int cap = 0, n = 0;
    gr_rubric_item *per[64] = {0};
    int count[64] = {0};
    for (int l = 0; l < nlabs; l++) {
        char rubric[PATH_MAX + 64];
        path_for(labs[l], RUBRIC, rubric, sizeof rubric);
        count[l] = gr_rubric_items(rubric, &per[l]);
        cap += 1 + (count[l] > 0 ? count[l] : 0);
    }
    grade_case *cases = cr_calloc((size_t)(cap > 0 ? cap : 1), sizeof *cases);
    for (int l = 0; l < nlabs; l++) {
        grade_case *t = &cases[n++];
        snprintf(t->lab, sizeof t->lab, "%.31s", labs[l]);
        snprintf(t->id, sizeof t->id, "score_table");
        t->is_table = 1;
        if (count[l] < 0) snprintf(t->title, sizeof t->title, "(the rubric cannot be used)");
        for (int i = 0; i < count[l]; i++) {
            grade_case *c = &cases[n++];
            snprintf(c->lab, sizeof c->lab, "%.31s", labs[l]);
            snprintf(c->id, sizeof c->id, "%s", per[l][i].id);
            snprintf(c->title, sizeof c->title, "%s", per[l][i].title);
            snprintf(c->part, sizeof c->part, "%s", per[l][i].part);
            c->max_score = per[l][i].max_score;
            c->is_penalty = per[l][i].is_penalty;
        }
        free(per[l]);
    }
    if (n == 0) { /* nothing to grade: one table test that says so */
        snprintf(cases[0].lab, sizeof cases[0].lab, "%s", "(none)");
        snprintf(cases[0].id, sizeof cases[0].id, "score_table");
        cases[0].is_table = 1;
        n = 1;
    }
    return cr_make_param_array(grade_case, cases, (size_t)n, free_cases);
}

static void grade_lab(const grade_case *t, FILE *out, gr_report *rep, int *rc) {
    char answers[PATH_MAX + 64], results[PATH_MAX + 64], rubric[PATH_MAX + 64],
        ledger[PATH_MAX + 64], grade_json[PATH_MAX + 64];
    path_for(t->lab, ANSWERS, answers, sizeof answers);
    path_for(t->lab, RESULTS, results, sizeof results);
    path_for(t->lab, RUBRIC, rubric, sizeof rubric);
    path_for(t->lab, LEDGER, ledger, sizeof ledger);
    snprintf(grade_json, sizeof grade_json, "%.*s.grade.json", (int)(strlen(results) - 5),
             results);
    *rc = gr_grade(&(gr_grade_desc){.rubric_path = rubric,
                                    .answers_path = answers,
                                    .results_path = results,
                                    .ledger_path = ledger,
                                    .grade_out_path = out != NULL ? grade_json : NULL,
                                    .out = out,
                                    .quiet = out == NULL},
                   rep);
}

static int inputs_ready(const grade_case *t, char *why, size_t cap) {
    char answers[PATH_MAX + 64], results[PATH_MAX + 64];
    path_for(t->lab, ANSWERS, answers, sizeof answers);
    path_for(t->lab, RESULTS, results, sizeof results);
    if (strcmp(t->lab, "(none)") == 0) {
        snprintf(why, cap, "no lab to grade: no labs/rubric/<lab>.json has an answers/<lab>.md "
                           "(run ./lab03 --init, or make grade LAB=lab03)");
        return 0;
    }
    if (access(answers, R_OK) != 0) {
        snprintf(why, cap, "%s not found: run ./%s --init to get your sheet, fill its pred blocks, "
                           "then run the lab (mpirun --oversubscribe -np 8 ./%s)",
                 answers, t->lab, t->lab);
        return 0;
    }
    if (access(results, R_OK) != 0) {
        snprintf(why, cap, "%s not found: run mpirun --oversubscribe -np 8 ./%s (after filling "
                           "the pred blocks) to measure the facts your answers are graded against",
                 results, t->lab);
        return 0;
    }
    return 1;
}

/* The rows of one test: a misconception is its own row; an item's total is the row of kind
   "item", and its parts (predictions, claims, evidence) carry the item in gr_item.item. */
static int row_total(const gr_item *it, const grade_case *t) {
    if (t->is_penalty) return strcmp(it->kind, "misc") == 0 && strcmp(it->id, t->id) == 0;
    return strcmp(it->kind, "item") == 0 && strcmp(it->id, t->id) == 0;
}
static int row_part(const gr_item *it, const grade_case *t) {
    return !t->is_penalty && strcmp(it->kind, "item") != 0 && strcmp(it->item, t->id) == 0;
}

static void append_row(char *msg, size_t cap, size_t *used, const gr_item *it) {
    if (*used + 64 >= cap) return;
    *used += (size_t)snprintf(msg + *used, cap - *used, "\n  %s (%.2f/%.2f): ", it->id, it->score,
                              it->max_score);
    for (const char *p = it->output; *p != '\0' && *used + 8 < cap; p++) {
        msg[(*used)++] = *p;
        if (*p == '\n') *used += (size_t)snprintf(msg + *used, cap - *used, "    ");
    }
    msg[*used] = '\0';
}

static void check_item(const grade_case *t) {
    char why[3 * PATH_MAX];
    if (!inputs_ready(t, why, sizeof why)) cr_skip_test("inputs missing (see score_table)");
    gr_report rep;
    int rc = 0;
    grade_lab(t, NULL, &rep, &rc);
    cr_assert_eq(rc, 0, "the grader could not use its inputs (status %d): run ./%s --grade-only "
                        "to see why", rc, t->lab);
    double got = 0, max = 0;
    int found = 0, fired = 0;
    char msg[8192] = "";
    size_t used = 0;
    for (int i = 0; i < rep.n_items; i++) {
        const gr_item *it = &rep.items[i];
        if (row_total(it, t)) {
            found++;
            got += it->score;
            max += it->max_score;
            fired |= it->fired;
            if (t->is_penalty && it->fired) append_row(msg, sizeof msg, &used, it);
        } else if (row_part(it, t) && it->score < it->max_score - 1e-9) {
            append_row(msg, sizeof msg, &used, it);
        }
    }
    gr_report_free(&rep);
    if (t->is_penalty) {
        cr_expect_not(fired, "%s %s (%s) fired:%s", t->lab, t->id, t->title, msg);
        return;
    }
    if (found == 0) cr_skip_test("%s %s is not graded for this follow-up variant", t->lab, t->id);
    cr_expect(got >= max - 1e-9, "%s %s (%s): %.2f/%.2f earned%s", t->lab, t->id, t->title, got,
              max, msg);
}

static void print_table(const grade_case *t) {
    char why[3 * PATH_MAX];
    cr_assert(inputs_ready(t, why, sizeof why), "%s", why);
    gr_report rep;
    int rc = 0;
    fflush(stdout);
    grade_lab(t, stdout, &rep, &rc);
    fflush(stdout);
    cr_assert_eq(rc, 0, "the grader could not use its inputs (status %d)", rc);
    gr_report_free(&rep);
}

ParameterizedTest(grade_case *t, grade, item, .timeout = 60) {
    cr_log_info("%s %s %s", t->lab, t->id, t->title);
    if (t->is_table)
        print_table(t);
    else
        check_item(t);
}
