/* tests/test_grader.c - one test per grading rule of labs/grader.c.

   Every test grades a small sheet against a small rubric (tests/fixtures/lab03/unit_rubric.json,
   which includes the shared labs/rubric/common/language.json; rules overridden per test) and
   small results (unit_results.json), in a private temporary directory, and checks the items of
   the report. The tests of the lab03 rubric on whole sheets are in test_lab03_calibration.c. */
#include <criterion/criterion.h>

#include <cjson/cJSON.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "labs/grader.h"
#include "tests/test_util.h"
#include "tests/test_util.h"

static char g_dir[PATH_MAX];

static const char *repo_root(void) { return mc_test_repo_root(); }

static const char *in_dir(const char *name) {
    static char bufs[8][PATH_MAX + 64];
    static int next = 0;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", g_dir, name);
    return b;
}

static const char *fixture(const char *name) {
    static char buf[PATH_MAX + 64];
    snprintf(buf, sizeof buf, "%s/tests/fixtures/lab03/%s", repo_root(), name);
    return buf;
}

static char *slurp(const char *path) {
    char *text = mc_test_read_file(path, NULL);
    cr_assert_not_null(text, "cannot read %s", path);
    return text;
}

static void spit(const char *path, const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    fwrite(text, 1, len, f);
    fclose(f);
}

static void write_json(const char *path, cJSON *j) {
    char *text = cJSON_PrintUnformatted(j);
    spit(path, text, strlen(text));
    free(text);
    cJSON_Delete(j);
}

/* rubric.json in the test directory: the unit rubric with its "rules" replaced, its include
   and template pointing into the repository. */
static void make_rubric(const char *rules_json) {
    char *text = slurp(fixture("unit_rubric.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    char lang[PATH_MAX + 64];
    snprintf(lang, sizeof lang, "%s/labs/rubric/common/language.json", repo_root());
    cJSON *inc = cJSON_CreateArray();
    cJSON_AddItemToArray(inc, cJSON_CreateString(lang));
    cJSON_ReplaceItemInObjectCaseSensitive(r, "include", inc);
    cJSON_ReplaceItemInObjectCaseSensitive(r, "template",
                                           cJSON_CreateString(fixture("unit_template.md")));
    if (rules_json != NULL) {
        cJSON *rules = cJSON_Parse(rules_json);
        cr_assert_not_null(rules, "bad rules JSON in the test: %s", rules_json);
        cJSON_ReplaceItemInObjectCaseSensitive(r, "rules", rules);
    }
    write_json(in_dir("rubric.json"), r);
}

/* rubric.json as make_rubric(NULL) writes it, with one more lexicon concept. */
static void make_rubric_with_concept(const char *id, const char *phrases_json) {
    make_rubric(NULL);
    char *text = slurp(in_dir("rubric.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    cJSON *lex = cJSON_GetObjectItemCaseSensitive(r, "lexicon");
    cr_assert_not_null(lex, "the unit rubric has no lexicon");
    cJSON *phrases = cJSON_Parse(phrases_json);
    cr_assert_not_null(phrases, "bad phrases JSON in the test: %s", phrases_json);
    cJSON_AddItemToObject(lex, id, phrases);
    write_json(in_dir("rubric.json"), r);
}

/* results.json in the test directory, with the recorded prediction hash and variant. */
static void make_results(const char *hash, int present, const char *variant) {
    char *text = slurp(fixture("unit_results.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    cJSON *p = cJSON_GetObjectItemCaseSensitive(r, "predictions");
    cJSON_ReplaceItemInObjectCaseSensitive(p, "hash", cJSON_CreateString(hash != NULL ? hash : ""));
    cJSON_ReplaceItemInObjectCaseSensitive(p, "present_at_run", cJSON_CreateBool(present));
    if (variant != NULL)
        cJSON_ReplaceItemInObjectCaseSensitive(r, "followup_variant", cJSON_CreateString(variant));
    write_json(in_dir("results.json"), r);
}

/* results.json as the ledger-era lab writes it: "results_format": 2 and no hash. */
static void make_results_v2(const char *variant) {
    char *text = slurp(fixture("unit_results.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    cJSON_DeleteItemFromObjectCaseSensitive(r, "predictions");
    cJSON_AddNumberToObject(r, "results_format", GR_RESULTS_FORMAT);
    if (variant != NULL)
        cJSON_ReplaceItemInObjectCaseSensitive(r, "followup_variant", cJSON_CreateString(variant));
    write_json(in_dir("results.json"), r);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/mc_grader_test_XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    make_rubric(NULL);
    make_results("0000000000000000", 1, NULL);
}

static void teardown(void) { nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

TestSuite(grader, .init = setup, .fini = teardown, .timeout = 30);

/* A whole sheet with the unit rubric's headings; NULL parts are left empty. */
static char *sheet(const char *pred_main, const char *s1, const char *s2, const char *ev,
                   const char *pred_fu, const char *fx) {
    size_t cap = 8192 + (s1 ? strlen(s1) : 0) + (s2 ? strlen(s2) : 0) + (ev ? strlen(ev) : 0) +
                 (fx ? strlen(fx) : 0) + (pred_main ? strlen(pred_main) : 0);
    char *s = malloc(cap);
    snprintf(s, cap,
             "# labT — MT grader unit tests\n"
             "<!-- nonce: abc123 ; probe_rank: 3 ; followup: F2 (generated by ./labT --init, do "
             "not edit) -->\n\n"
             "## Predictions (main)\n```pred\n%s\n```\n\n"
             "## Main answer\n### S1 Layout\n%s\n\n### S2 Creation\n%s\n\n### EV Evidence\n%s\n\n"
             "## Follow-up (MT-F2)\n```pred\n%s\n```\n\n### FX Variant\n%s\n",
             pred_main ? pred_main : "", s1 ? s1 : "", s2 ? s2 : "", ev ? ev : "",
             pred_fu ? pred_fu : "", fx ? fx : "");
    return s;
}

typedef struct graded {
    int rc;
    gr_report rep;
    char *out; /* the printed table */
    size_t len;
} graded;

static graded grade_text(const char *text) {
    graded g;
    memset(&g, 0, sizeof g);
    if (text != NULL) spit(in_dir("answers.md"), text, strlen(text));
    FILE *f = open_memstream(&g.out, &g.len);
    cr_assert_not_null(f);
    g.rc = gr_grade(&(gr_grade_desc){.rubric_path = in_dir("rubric.json"),
                                     .answers_path = in_dir("answers.md"),
                                     .results_path = in_dir("results.json"),
                                     .grade_out_path = in_dir("grade.json"),
                                     .out = f},
                    &g.rep);
    fclose(f);
    return g;
}

static graded grade_sheet(char *text) {
    graded g = grade_text(text);
    free(text);
    return g;
}

static void release(graded *g) {
    gr_report_free(&g->rep);
    free(g->out);
}

static const gr_item *item(const graded *g, const char *id) {
    for (int i = 0; i < g->rep.n_items; i++)
        if (strcmp(g->rep.items[i].id, id) == 0) return &g->rep.items[i];
    cr_assert_fail("no item %s in the report; table:\n%s", id, g->out);
    return NULL;
}

static double score(const graded *g, const char *id) { return item(g, id)->score; }

static const char *last_line(const char *text) {
    static char buf[256];
    size_t n = strlen(text);
    while (n > 0 && text[n - 1] == '\n')
        n--;
    size_t start = n;
    while (start > 0 && text[start - 1] != '\n')
        start--;
    snprintf(buf, sizeof buf, "%.*s", (int)(n - start), text + start);
    return buf;
}

#define EXPECT_SCORE(g, id, want)                                                                  \
    cr_expect_float_eq(score(&(g), id), (want), 1e-9, "%s: got %.3f, want %.3f\n%s", id,           \
                       score(&(g), id), (double)(want), (g).out)

/* Grades one sheet, expects one item's score and frees the grading: most rule tests are a
   sentence and what it must earn. */
#define EXPECT_GRADE(sheet_text, id, want)                                                         \
    do {                                                                                           \
        graded g_ = grade_sheet(sheet_text);                                                       \
        EXPECT_SCORE(g_, id, want);                                                                \
        release(&g_);                                                                              \
    } while (0)

/* ---------------------------------------------------------------------------------------------
   relations: concepts with their relation in one sentence */

#define S1(text) sheet(NULL, text, NULL, NULL, NULL, NULL)
#define FX(text) sheet(NULL, NULL, NULL, NULL, NULL, text)
#define S2(text) sheet(NULL, NULL, text, NULL, NULL, NULL)
#define EV(text) sheet(NULL, NULL, NULL, text, NULL, NULL)

static const char *why(const graded *g, const char *id) { return item(g, id)->output; }

Test(grader, a_relation_in_one_sentence_earns_the_claim_and_says_why) {
    graded g = grade_sheet(S1("The TP ranks are adjacent to each other in this layout."));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    cr_expect_eq(item(&g, "S.tp_adj")->line, 11, "the matched line is reported: %d",
                 item(&g, "S.tp_adj")->line);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "adjacent"), "%s", why(&g, "S.tp_adj"));
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "rule: TP + ADJ"), "%s", why(&g, "S.tp_adj"));
    release(&g);
}

Test(grader, one_concept_alone_earns_nothing) {
    graded g = grade_sheet(S1("The ranks are adjacent to each other in this layout."));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "need: TP with adjacent ranks"), "%s",
              why(&g, "S.tp_adj"));
    release(&g);
}

Test(grader, the_window_limits_the_distance_between_concepts) {
    graded g = grade_sheet(
        S1("TP ranks in this layout, as the long table further below shows, are adjacent."));
    EXPECT_SCORE(g, "S.tp_adj", 0.0); /* 10 words apart, window 8 */
    release(&g);
}

Test(grader, an_ordinary_long_sentence_keeps_its_relation) {
    /* 30 words: the default window of relations (30) tolerates normal sentence length */
    graded g = grade_sheet(S2("Because the group creation call is collective over the whole world and "
                              "nobody may skip it, every rank in this job of eight processes has to "
                              "create each of the sixty-four groups."));
    EXPECT_SCORE(g, "S.every_create", 1.0);
    release(&g);
}

Test(grader, nfkc_stemming_and_chinese_match) {
    graded g = grade_sheet(sheet(NULL, "ＴＰ ranks are ＡＤＪＡＣＥＮＴ in this layout of the grid.",
                                 "All ranks created every group.", NULL, NULL, NULL));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    EXPECT_SCORE(g, "S.every_create", 1.0); /* created ~ create */
    release(&g);
    EXPECT_GRADE(S1("张量并行的两个rank是相邻的，它们在同一台机器上。"), "S.tp_adj", 1.0);
}

Test(grader, regular_expression_concepts_match_formulas) {
    EXPECT_GRADE(S2("The DP size follows from 8 / 4 = 2 in this run of the lab."),
                 "S.formula", 0.5);
}

Test(grader, a_back_reference_joins_two_sentences) {
    graded g = grade_sheet(S1("Consider the TP groups. Their members are neighbouring ranks."));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "\"Consider the TP groups.\""), "%s",
              why(&g, "S.tp_adj"));
    release(&g);
    /* two long sentences without a word that refers back do not combine */
    graded h = grade_sheet(S1("TP is the first axis of the grid in the default order string. "
                              "The members of every group in this table are adjacent ranks here."));
    EXPECT_SCORE(h, "S.tp_adj", 0.0);
    release(&h);
}

/* ---------------------------------------------------------------------------------------------
   polarity: negation, denial frames, conditionals */

Test(grader, a_negated_relation_earns_nothing_and_says_so) {
    graded g = grade_sheet(S1("The TP ranks are not adjacent to each other in this layout."));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "stated only as denied"), "%s",
              why(&g, "S.tp_adj"));
    release(&g);
    /* the negated verb negates its subject too: "does not" before the relation's words */
    EXPECT_GRADE(FX("NCCL does not pair the calls by their sequence at all."), "F.seq", 0.0);
}

Test(grader, english_denial_frames_deny_what_they_frame) {
    const char *framed[] = {
        "It is not true that the TP ranks are adjacent in this layout.",
        "A common myth is that the TP ranks are adjacent in this layout.",
        "The claim that the TP ranks are adjacent in this layout is false.",
        "Some people think that the TP ranks are adjacent in this layout.",
        "Some people wrongly believe that the TP ranks are adjacent in this layout.",
        "Beginners mistakenly assume that the TP ranks are adjacent in this layout.",
        "The TP ranks are adjacent in this layout. This is wrong.",
    };
    for (size_t i = 0; i < sizeof framed / sizeof framed[0]; i++) {
        graded g = grade_sheet(S1(framed[i]));
        cr_expect_float_eq(score(&g, "S.tp_adj"), 0.0, 1e-9, "earned by \"%s\":\n%s", framed[i],
                           g.out);
        release(&g);
    }
}

Test(grader, chinese_denial_frames_deny_what_they_frame) {
    const char *framed[] = {
        "并非张量并行的rank是相邻的。",
        "张量并行的rank不是相邻的。",
        "错误地认为张量并行的rank是相邻的。",
        "很多人误以为张量并行的rank是相邻的。",
        "有人认为张量并行的rank是相邻的，其实不然。",
    };
    for (size_t i = 0; i < sizeof framed / sizeof framed[0]; i++) {
        graded g = grade_sheet(S1(framed[i]));
        cr_expect_float_eq(score(&g, "S.tp_adj"), 0.0, 1e-9, "earned by \"%s\":\n%s", framed[i],
                           g.out);
        release(&g);
    }
}

/* A conditional marker inside a longer word is not one (the language rule's not_inside):
   主要是 ("mainly") holds 要是 ("if"), 若干 ("several") holds 若 ("if"). */
Test(grader, a_conditional_marker_inside_a_longer_word_is_not_a_condition) {
    EXPECT_GRADE(S1("张量并行的rank是相邻的。"), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("要是张量并行的rank是相邻的，通信就快。"), "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("主要是因为张量并行的rank是相邻的。"), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("张量并行的若干rank是相邻的。"), "S.tp_adj", 1.0);
}

Test(grader, a_contrast_ends_the_frame) {
    graded g = grade_sheet(S2("Some people think the order is irrelevant, but in fact every rank "
                              "creates every group."));
    cr_expect_not(item(&g, "MX_FREE")->fired, "a reported belief is not stated:\n%s", g.out);
    EXPECT_SCORE(g, "S.every_create", 1.0);
    release(&g);
}

/* A learner who predicted wrong and then explains the run writes what they had believed before
   it ("I had expected that ..."): a belief reported, not stated, so it neither earns nor costs;
   a confirmation ("as I had expected, ...") and what follows the contrast still state. */
Test(grader, a_belief_held_before_the_run_is_reported_not_stated) {
    graded plain = grade_sheet(FX("The creation order does not matter at all here."));
    cr_expect(item(&plain, "MX_FREE")->fired, "the control states it:\n%s", plain.out);
    release(&plain);
    const char *before[] = {
        "Before the run I expected that the creation order does not matter at all here.",
        "I had predicted that the creation order does not matter at all here.",
        "My guess was that the creation order does not matter at all here.",
        "At first I thought the creation order does not matter at all here.",
        "我原本认为组的创建顺序无关紧要。",
    };
    for (size_t i = 0; i < sizeof before / sizeof before[0]; i++) {
        graded g = grade_sheet(FX(before[i]));
        cr_expect_not(item(&g, "MX_FREE")->fired, "stated by \"%s\":\n%s", before[i], g.out);
        release(&g);
    }
    graded g = grade_sheet(S2("I had expected that the order is irrelevant, but in the run every "
                              "rank creates every group."));
    cr_expect_not(item(&g, "MX_FREE")->fired, "%s", g.out);
    EXPECT_SCORE(g, "S.every_create", 1.0);
    release(&g);
    EXPECT_GRADE(S1("I had predicted that the TP ranks are adjacent in this layout."), "S.tp_adj",
                 0.0);
    EXPECT_GRADE(S1("As I had expected, the TP ranks are adjacent in this layout."), "S.tp_adj",
                 1.0);
    EXPECT_GRADE(S1("我预测对了：张量并行的rank是相邻的。"), "S.tp_adj", 1.0);
}

Test(grader, negator_exceptions_do_not_negate) {
    graded g = grade_sheet(sheet(NULL, "Not only are the TP ranks adjacent here, they share a node.",
                                 NULL, NULL, NULL, "数据并行在不同的节点上，但是数据并行的rank相邻。"));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    EXPECT_SCORE(g, "F.dp_adj", 1.0);
    release(&g);
    /* 不变 ("unchanged") is a word of its own, like 不同, not 不 negating the clause */
    EXPECT_GRADE(S1("换了布局，张量并行的rank相邻不变。"), "S.tp_adj", 1.0);
}

Test(grader, a_phrase_that_ends_with_its_negator_leaves_it_its_scope) {
    /* a concept phrase that is the negator alone, or ends with it, does not swallow it */
    make_rubric_with_concept("ELSEWHERE", "{\"en\": [\"never\", \"elsewhere\"]}");
    EXPECT_GRADE(S1("The TP ranks never sit adjacent in this layout."), "S.tp_adj", 0.0);
    make_rubric_with_concept("NO_NEED", "{\"en\": [\"need not\"]}");
    EXPECT_GRADE(S1("The TP ranks need not be adjacent in this layout."), "S.tp_adj", 0.0);
    /* a phrase that goes on after its negator still carries it: "does not matter" */
    make_rubric(NULL);
    graded k = grade_sheet(FX("The creation order does not matter at all here."));
    cr_expect(item(&k, "MX_FREE")->fired, "\"does not matter\" states the order is free:\n%s",
              k.out);
    release(&k);
}

Test(grader, a_contrast_adverb_between_subject_and_verb_keeps_one_clause) {
    const char *said[] = {"The creation order in fact is irrelevant here.",
                          "组的顺序其实是无关的。"};
    for (int i = 0; i < 2; i++) {
        graded g = grade_sheet(FX(said[i]));
        cr_expect(item(&g, "MX_FREE")->fired, "not read as one clause: \"%s\"\n%s", said[i],
                  g.out);
        release(&g);
    }
    /* a contrast after a verb still opens a clause */
    graded h = grade_sheet(FX("The order is kept, but in fact irrelevant things may differ."));
    cr_expect_not(item(&h, "MX_FREE")->fired, "%s", h.out);
    release(&h);
}

Test(grader, a_negator_before_a_clause_word_denies_that_clause) {
    /* "not which ...": the negator's scope runs into the clause it introduces */
    EXPECT_GRADE(S1("TP is first, not which ranks are adjacent here."), "S.tp_adj", 0.0);
}

Test(grader, an_unless_concept_keeps_only_its_own_semicolon_part_from_matching) {
    /* MX_FREE with "unless": ["EXPB"]: a statement about experiment B quotes a state on
       purpose, but a second statement after a semicolon is the writer's own */
    make_rubric(NULL);
    char *text = slurp(in_dir("rubric.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(r, "misconceptions")) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(m, "id")->valuestring, "MX_FREE") != 0) continue;
        cJSON *rel = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m, "relations"), 0);
        cJSON *unless = cJSON_CreateArray();
        cJSON_AddItemToArray(unless, cJSON_CreateString("EXPB"));
        cJSON_AddItemToObject(rel, "unless", unless);
    }
    write_json(in_dir("rubric.json"), r);
    graded g = grade_sheet(FX("In experiment B the creation order was irrelevant to the result."));
    cr_expect_not(item(&g, "MX_FREE")->fired, "%s", g.out);
    release(&g);
    graded h = grade_sheet(FX("Experiment B hung for a while; the creation order is irrelevant."));
    cr_expect(item(&h, "MX_FREE")->fired, "%s", h.out);
    release(&h);
}

Test(grader, no_problem_judges_what_it_follows_and_negates_nothing) {
    /* "没问题" / "no problem" says the statement before it is fine: it is still stated */
    const char *fine[] = {"只有成员创建这个组没问题。", "Only the members create the group, no problem."};
    for (int i = 0; i < 2; i++) {
        graded g = grade_sheet(S2(fine[i]));
        cr_expect(item(&g, "MX_ONLY")->fired, "\"%s\" states the misconception:\n%s", fine[i], g.out);
        EXPECT_SCORE(g, "S.every_create", 0.0);
        release(&g);
    }
}

Test(grader, empty_parentheses_of_a_call_do_not_end_a_clause) {
    graded g = grade_sheet(FX("The order of the get_rank() calls is irrelevant here."));
    cr_expect(item(&g, "MX_FREE")->fired, "%s", g.out);
    release(&g);
    graded h = grade_sheet(FX("The order (of the calls) and what is irrelevant here differ."));
    cr_expect_not(item(&h, "MX_FREE")->fired, "a real parenthesis still ends a clause:\n%s", h.out);
    release(&h);
}

Test(grader, a_double_negation_states_the_relation) {
    EXPECT_GRADE(S1("It is not true that the TP ranks are not adjacent in this layout."),
                 "S.tp_adj", 1.0);
}

Test(grader, a_condition_or_question_states_no_misconception) {
    graded g = grade_sheet(FX("If the creation order were irrelevant, nothing would hang. Is the "
                              "order irrelevant?"));
    cr_expect_not(item(&g, "MX_FREE")->fired, "%s", g.out);
    release(&g);
}

/* ---------------------------------------------------------------------------------------------
   misconceptions */

Test(grader, a_misconception_costs_its_penalty_and_voids_its_sentence) {
    graded g = grade_sheet(
        S2("Only the members create the new group, and the TP ranks are adjacent anyway."));
    const gr_item *m = item(&g, "MX_ONLY");
    cr_expect(m->fired);
    cr_expect_float_eq(m->score, -2.0, 1e-9);
    cr_expect(mc_test_contains(m->output, "Every rank creates every group."), "%s", m->output);
    cr_expect(mc_test_contains(m->output, "see unit test"), "%s", m->output);
    cr_expect(mc_test_contains(m->output, "rule: ONLY + CREATE"), "%s", m->output);
    EXPECT_SCORE(g, "S.tp_adj", 0.0); /* right keywords in a wrong sentence earn nothing */
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "states a misconception"), "%s",
              why(&g, "S.tp_adj"));
    release(&g);
}

Test(grader, a_misconception_is_a_proposition_in_other_words) {
    graded g = grade_sheet(S2("Not every rank needs to create that group."));
    cr_expect(item(&g, "MX_ONLY")->fired, "%s", g.out);
    release(&g);
    graded h = grade_sheet(FX("NCCL pairs the calls by the name of the buffer."));
    cr_expect(item(&h, "MX_NAME")->fired, "%s", h.out);
    release(&h);
}

Test(grader, denying_a_misconception_states_the_claim) {
    graded g = grade_sheet(S2("It is not true that only the members create a group."));
    cr_expect_not(item(&g, "MX_ONLY")->fired, "%s", g.out);
    EXPECT_SCORE(g, "S.every_create", 1.0);
    cr_expect(mc_test_contains(why(&g, "S.every_create"), "denies MX_ONLY"), "%s",
              why(&g, "S.every_create"));
    release(&g);
}

Test(grader, a_misconception_voids_the_claims_it_contradicts_and_fires_once) {
    graded g = grade_sheet(sheet(NULL, "The TP ranks are adjacent to each other here.", NULL, NULL,
                                 NULL, "The TP groups are strided. TP groups are strided again."));
    cr_expect_not(item(&g, "MX_STRIDE")->fired, "MX_STRIDE cannot fire in FX:\n%s", g.out);
    release(&g);
    graded h = grade_sheet(S1("The TP ranks are adjacent to each other here. Then again the TP "
                              "groups are strided. The TP groups are strided indeed."));
    cr_expect(item(&h, "MX_STRIDE")->fired, "%s", h.out);
    EXPECT_SCORE(h, "S.tp_adj", 0.0);
    cr_expect(mc_test_contains(why(&h, "S.tp_adj"), "also states MX_STRIDE"), "%s",
              why(&h, "S.tp_adj"));
    int n = 0;
    for (int i = 0; i < h.rep.n_items; i++)
        n += strcmp(h.rep.items[i].id, "MX_STRIDE") == 0;
    cr_expect_eq(n, 1);
    cr_expect_float_eq(h.rep.penalty_total, 1.0, 1e-9, "%s", h.out);
    release(&h);
}

Test(grader, penalties_are_capped_in_total) {
    graded g = grade_sheet(sheet(NULL, "TP groups are strided in this layout of ranks.",
                                 "Only the members create the group.", NULL, NULL,
                                 "The order is irrelevant here."));
    cr_expect(item(&g, "MX_STRIDE")->fired && item(&g, "MX_ONLY")->fired &&
                  item(&g, "MX_FREE")->fired,
              "%s", g.out);
    cr_expect_float_eq(g.rep.penalty_total, 3.0, 1e-9, "1.0 + 2.0 + 1.5 capped at 3.0:\n%s", g.out);
    cr_expect_float_eq(g.rep.main_score, 0.0, 1e-9, "the score is floored at 0");
    release(&g);
}

Test(grader, a_group_list_attributed_to_the_wrong_kind_fires) {
    graded g = grade_sheet(S1("In this run the DP group of rank 0 is [0,1] as far as I can see."));
    cr_expect(item(&g, "MX_STRIDE")->fired, "%s", g.out);
    cr_expect(mc_test_contains(why(&g, "MX_STRIDE"), "[0,1] was not measured as DP"), "%s",
              why(&g, "MX_STRIDE"));
    release(&g);
    graded h = grade_sheet(S1("In this run the DP group of rank 0 is [0,2], tp[1] is the second "
                              "TP group and the communicator [0,1] is a TP one."));
    cr_expect_not(item(&h, "MX_STRIDE")->fired,
                  "right lists, indices and lists after a neutral word do not fire:\n%s", h.out);
    release(&h);
}

Test(grader, a_group_list_belongs_to_the_kind_named_nearest_it) {
    /* each list beside its own kind; "TP rank 1" is a coordinate, not the world's rank 1 */
    graded g = grade_sheet(S1("Rank 3 sits at TP rank 1 in [2,3], DP rank 1 in [1,3] of this grid."));
    cr_expect_not(item(&g, "MX_STRIDE")->fired, "%s", g.out);
    release(&g);
    /* a list after another noun is that noun's, even with a kind named after it */
    graded h = grade_sheet(S1("Rank 3 built layers [0] plus the TP shard of this model."));
    cr_expect_not(item(&h, "MX_STRIDE")->fired, "%s", h.out);
    release(&h);
    /* a list with a number above every rank of the grid is a shape, not a group, in any
       language ("切成" is no English noun the list could follow) */
    graded m = grade_sheet(S1("它不切模型，TP 组的 rank 0 持有 word_embeddings 切成 [128,64] 的分片。"));
    cr_expect_not(item(&m, "MX_STRIDE")->fired, "%s", m.out);
    release(&m);
    /* and the nearest kind still judges: [1,3] is no TP group */
    graded k = grade_sheet(S1("Rank 3 sits at DP rank 1 in [2,3], TP rank 1 in [1,3] of this grid."));
    cr_expect(item(&k, "MX_STRIDE")->fired, "%s", k.out);
    release(&k);
}

/* ---------------------------------------------------------------------------------------------
   no gaming by form */

Test(grader, predicate_less_bullets_earn_nothing) {
    graded g = grade_sheet(S1("- TP ranks: adjacent, contiguous\n- TP traffic: NVLink, same node\n"));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    EXPECT_SCORE(g, "S.tp_link", 0.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "has no verb"), "%s", why(&g, "S.tp_adj"));
    release(&g);
    EXPECT_GRADE(S1("- the TP ranks are adjacent to each other\n"),
                 "S.tp_adj", 1.0); /* a bullet that states something counts */
}

Test(grader, a_chinese_verb_makes_a_line_of_mixed_terms_a_statement) {
    /* English terms dense in concepts, a Chinese verb (创建, "creates"): a statement, as a
       line of Chinese prose with its verb is, not a keyword list */
    EXPECT_GRADE(S1("- TP DP adjacent nvlink order 创建\n"), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("- TP group 创建 adjacent, nvlink, same node, order, DP\n"), "S.tp_adj", 1.0);
    /* the same terms without a verb are still a keyword list */
    EXPECT_GRADE(S1("- TP DP adjacent nvlink order\n"), "S.tp_adj", 0.0);
}

Test(grader, a_list_item_opening_with_an_ambiguous_verb_is_read_safely) {
    /* "Split ..." / "Order ..." as a bullet's first word: no token before it to inspect */
    EXPECT_GRADE(S1("- split: TP ranks adjacent\n- order of creation\n- match by sequence\n"),
                 "S.tp_adj", 0.0);
}

Test(grader, a_keyword_list_is_not_a_statement) {
    graded g = grade_sheet(S1("TP adjacent contiguous NVLink same node every rank create strided "
                              "order irrelevant sequence match."));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "a list of terms"), "%s", why(&g, "S.tp_adj"));
    cr_expect_not(item(&g, "MX_FREE")->fired, "a list states no misconception either");
    release(&g);
}

Test(grader, a_terse_answer_with_a_finite_verb_is_a_statement_not_a_keyword_list) {
    /* an expert's one-liner is dense in terms and light in articles; "creates" makes it a
       clause, so its relations count */
    const char *terse = "TP keeps adjacent contiguous ranks, NVLink same node; DP strided; every "
                        "rank creates groups, order sequence match.";
    graded g = grade_sheet(S1(terse));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    cr_expect_not(mc_test_contains(g.out, "a list of terms"), "%s", g.out);
    release(&g);
    /* the same terms without the finite verb are a row of keywords */
    graded h = grade_sheet(S1("TP keep adjacent contiguous ranks, NVLink same node; DP strided; every "
                              "rank create groups, order sequence match."));
    EXPECT_SCORE(h, "S.tp_adj", 0.0);
    release(&h);
    /* Chinese prose keeps its particles (的, 是, 都) even where spaces stand between words */
    EXPECT_GRADE(S1("张量并行 的 rank 是 相邻 的，数据并行 是 跨步 的，所有进程 都 创建 同样 顺序 的 组。"), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("张量并行 相邻 NVLink 数据并行 跨步 所有进程 创建 顺序 匹配"), "S.tp_adj", 0.0);
}

Test(grader, a_contracted_denial_frame_denies) {
    /* "it's a myth that" is "it is a myth that" */
    EXPECT_GRADE(S1("It's a myth that the TP ranks are adjacent in this layout."), "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("It\xE2\x80\x99s a myth that the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 0.0);
}

Test(grader, nor_inside_a_denial_frame_denies_the_next_statement_too) {
    /* "nor" goes on with the frame's denial; it is not a second negation that undoes it */
    graded g = grade_sheet(S1("It is not true that the DP ranks are strided here, nor that the TP "
                              "ranks are adjacent."));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    release(&g);
    EXPECT_GRADE(S1("并不是说数据并行的进程是跨步的，也不是张量并行的进程相邻。"), "S.tp_adj", 0.0);
}

Test(grader, a_negated_statement_added_inside_a_frame_stays_denied) {
    /* "It is not the case that X, and Y is not Z": the second clause denies Z on its own; the
       frame does not make a double negation of it */
    graded g = grade_sheet(S1("It is not the case that the DP ranks are strided here, and the TP "
                              "ranks are not adjacent."));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    release(&g);
    /* inside the frame's own clause a negation still counts twice */
    EXPECT_GRADE(S1("It is a myth that the TP ranks are not adjacent in this layout."),
                 "S.tp_adj", 1.0);
}

Test(grader, once_is_a_condition_only_where_it_opens_a_clause) {
    /* "created once": an adverb, the rest of the sentence is stated */
    graded g = grade_sheet(S1("The groups are created once and the TP ranks are adjacent in this "
                              "layout."));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    release(&g);
    /* "Once the TP ranks are adjacent, ...": a condition, not a statement */
    EXPECT_GRADE(S1("Once the TP ranks are adjacent, the layout is fast."), "S.tp_adj", 0.0);
}

Test(grader, a_negated_second_verb_leaves_the_first_one_stated) {
    /* "are adjacent and do not cross nodes": the negation is the second verb's */
    EXPECT_GRADE(S1("The TP ranks are adjacent and do not cross nodes."), "S.tp_adj", 1.0);
    /* "the groups they do not leave": the pronoun is the negated verb's own subject */
    EXPECT_GRADE(S1("The TP ranks are adjacent in the groups they do not leave."), "S.tp_adj", 1.0);
    /* one verb, negated: its subject is denied with it */
    EXPECT_GRADE(S1("The TP ranks are not adjacent in this layout."), "S.tp_adj", 0.0);
}

Test(grader, a_semicolon_ends_a_denial_frame) {
    /* "It is a myth that X; Y": the writer asserts Y */
    graded g = grade_sheet(S1("It is a myth that the DP ranks are adjacent; the TP ranks are "
                              "adjacent in this layout."));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    release(&g);
}

Test(grader, a_negated_answer_after_a_frame_and_a_colon_is_the_writers_own) {
    /* "It is a myth that X: Y is not so": the negated Y answers X in the writer's voice, it is
       no double negation under the frame */
    EXPECT_GRADE(S1("It is a myth that the TP ranks are spread out: they are not strided, the TP "
                    "ranks are adjacent."),
                 "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("It is a myth that SP changes anything: the TP ranks are not adjacent."),
                 "S.tp_adj", 0.0);
    /* a plain statement after the colon details what the frame denies, and a colon right after
       the frame opens it */
    EXPECT_GRADE(S1("It is not true that the layout is fixed: the TP ranks are adjacent."),
                 "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("It is a myth: the TP ranks are adjacent in this layout."), "S.tp_adj", 0.0);
}

Test(grader, an_abbreviation_does_not_end_a_sentence) {
    /* "e.g." and "vs." stand inside a sentence: a misconception stated at its start voids the
       whole of it, the clause after the abbreviation too */
    const char *texts[] = {"Only the members create the group, e.g. ranks 0 and 1, and the TP "
                           "ranks are adjacent to each other.",
                           "Only the members create the group (vs. all ranks), and the TP ranks "
                           "are adjacent to each other."};
    for (int i = 0; i < 2; i++) {
        graded g = grade_sheet(S1(texts[i]));
        cr_expect(item(&g, "MX_ONLY")->fired, "%s", g.out);
        EXPECT_SCORE(g, "S.tp_adj", 0.0);
        release(&g);
    }
}

Test(grader, talk_about_the_task_states_nothing) {
    /* restating what the answer should say is not saying it */
    EXPECT_GRADE(S1("Here we must explain why the TP ranks are adjacent."), "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("The question is whether the TP ranks are adjacent."), "S.tp_adj", 0.0);
    /* "must" about the system is a statement */
    EXPECT_GRADE(S1("The TP ranks must be adjacent to each other."), "S.tp_adj", 1.0);
}

Test(grader, an_object_negator_after_a_verb_negates_the_clause) {
    /* "every rank creates no group": nobody creates it, so "every rank creates" is not said */
    EXPECT_GRADE(S1("In this scheme every rank creates no group at all."), "S.every_create", 0.0);
    EXPECT_GRADE(S1("In this scheme every rank creates the group, members or not."),
                 "S.every_create", 1.0);
}

Test(grader, contrary_to_popular_belief_asserts_what_follows) {
    /* the phrase rejects the belief; the writer states the clause after it */
    EXPECT_GRADE(S1("Contrary to popular belief, the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("Contrary to popular belief, the TP ranks are not adjacent in this layout."),
                 "S.tp_adj", 0.0);
    /* "the belief that X" is still the belief denied */
    EXPECT_GRADE(S1("Contrary to the belief that the TP ranks are adjacent, they are spread."),
                 "S.tp_adj", 0.0);
}

Test(grader, more_denial_frames_deny_their_statement) {
    EXPECT_GRADE(S1("It would be a mistake to think that the TP ranks are adjacent here."),
                 "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("Nobody should believe that the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("It is a common misconception that the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("It is also not true that the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("The claim that the TP ranks are adjacent in this layout is unfounded."),
                 "S.tp_adj", 0.0);
}

/* A rubric that adds phrases to a shared language rule keeps the shared phrases of that rule:
   its own list extends the included one instead of replacing it. */
Test(grader, a_rubric_language_rule_extends_the_shared_one) {
    char *text = slurp(in_dir("rubric.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    cJSON *lang = cJSON_GetObjectItemCaseSensitive(r, "language");
    if (lang == NULL) lang = cJSON_AddObjectToObject(r, "language");
    cJSON_AddItemToObject(lang, "report_frames",
                          cJSON_Parse("{\"en\": [\"my hunch was that\"], \"zh\": []}"));
    write_json(in_dir("rubric.json"), r); /* frees r */
    EXPECT_GRADE(S1("My hunch was that the TP ranks are adjacent in this layout."), "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("Some people think that the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("The TP ranks are adjacent in this layout."), "S.tp_adj", 1.0);
}

Test(grader, an_article_or_a_hyphen_makes_a_verb_form_a_noun_phrase_in_bullets) {
    /* "the sorted", "output-layer": no verb, so these bullets state nothing */
    graded g = grade_sheet(S1("- TP ranks adjacent in the sorted order\n"
                              "- TP groups on output-layer NVLink same node\n"));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    EXPECT_SCORE(g, "S.tp_link", 0.0);
    release(&g);
    EXPECT_GRADE(S1("- TP ranks are adjacent in the sorted order\n"), "S.tp_adj", 1.0);
}

Test(grader, a_line_of_bare_nouns_and_verbs_is_a_keyword_list_however_short) {
    /* nine words, no function word, no inflected verb: terms in a row, not a clause */
    graded g = grade_sheet(S1("sequence keep DP ordering TP ranks adjacent via NVLink"));
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "a list of terms"), "%s", why(&g, "S.tp_adj"));
    release(&g);
    /* the same words around a finite verb ("keeps") form a clause and keep their relation */
    EXPECT_GRADE(S1("sequence keeps DP ordering TP ranks adjacent via NVLink"), "S.tp_adj", 1.0);
}

Test(grader, a_bullet_opening_with_a_noun_verb_is_read_safely) {
    /* "hang", "match", "order" head these bullets: there is no word before them to be a
       subject (this read before the sentence's first token) */
    graded g = grade_sheet(S1("- hang forever\n- match by name\n- order irrelevant\n"));
    cr_expect_eq(g.rc, 0);
    EXPECT_SCORE(g, "S", 0.0);
    cr_expect_not(item(&g, "MX_NAME")->fired, "a bullet without a verb states nothing:\n%s", g.out);
    release(&g);
}

Test(grader, near_identical_sentences_count_once) {
    graded g = grade_sheet(S2("Every rank creates every group here. Every rank creates every group "
                              "here! Every rank creates each group here."));
    EXPECT_SCORE(g, "S.every_create", 1.0);
    release(&g);
    graded h = grade_sheet(sheet(NULL, NULL, "Every rank creates every group here.", NULL, NULL,
                                 "Every rank creates every group here."));
    int dup = mc_test_contains(h.out, "repeats an earlier sentence") ||
              mc_test_contains(h.out, "line 14");
    cr_expect(dup, "%s", h.out);
    release(&h);
}

Test(grader, sentences_that_restate_the_prompt_are_ignored) {
    graded g = grade_sheet(sheet(NULL, NULL, NULL, NULL, NULL, NULL));
    release(&g);
    /* the prompt of box OLD is "Explain why tensor parallel partners share one box in this
       particular layout." */
    const char *text = "# labT\n### A1 Layout rule\nTensor parallel partners share one box on "
                       "NVLink in this particular layout.\n";
    graded h = grade_text(text);
    EXPECT_SCORE(h, "S.tp_link", 0.0);
    cr_expect(mc_test_contains(why(&h, "S.tp_link"), "copies the prompt"), "%s",
              why(&h, "S.tp_link"));
    /* the same words in another box answer a different question: they count */
    graded k = grade_text("# labT\n### S2 Creation\nTensor parallel partners share one box on "
                          "NVLink in this particular layout.\n");
    EXPECT_SCORE(k, "S.tp_link", 1.0);
    release(&k);
    release(&h);
}

Test(grader, a_hedged_claim_earns_half) {
    graded g = grade_sheet(S1("I think the TP ranks are probably adjacent in this layout."));
    EXPECT_SCORE(g, "S.tp_adj", 0.5);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "hedged"), "%s", why(&g, "S.tp_adj"));
    release(&g);
}

Test(grader, a_trailing_hedge_with_a_statement_of_its_own_hedges_only_that) {
    EXPECT_GRADE(S1("The TP ranks are adjacent, and maybe the DP ranks are strided as well."),
                 "S.tp_adj", 1.0);
    /* a bare comment after the statement still hedges it */
    EXPECT_GRADE(S1("The TP ranks are adjacent to each other, I think."), "S.tp_adj", 0.5);
}

/* A hedge qualifies its own stretch of the sentence: a colon, a semicolon or a contrast ends
   its reach, in either direction. */
Test(grader, a_hedge_stops_at_a_contrast_or_a_colon) {
    EXPECT_GRADE(S1("I think this is a common confusion, but the TP ranks are adjacent in this layout."),
                 "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("Roughly, I guess: the TP ranks are adjacent in this layout."), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("The TP ranks are adjacent in this layout, but why that is I am not sure."),
                 "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("I think that in this layout the TP ranks are adjacent."), "S.tp_adj", 0.5);
}

/* An idea stated plainly anywhere on the sheet earns in full, even when its own box states it
   only with a hedge. */
Test(grader, a_plain_statement_elsewhere_beats_a_hedged_one_in_the_box) {
    char *text = sheet(NULL, "I think the TP ranks are adjacent in this layout.", NULL, NULL, NULL,
                       "In this layout the TP ranks are adjacent to each other.");
    EXPECT_GRADE(text, "S.tp_adj", 1.0);
}

/* The rubric's needs are public, so a sentence that copies them earns nothing; but a short
   answer that shares one run of words with a need is the answer the need asks for. */
Test(grader, a_short_answer_that_shares_words_with_a_need_is_no_copy) {
    EXPECT_GRADE(S1("TP with adjacent ranks is faster."), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("TP with adjacent ranks and TP on the fast link."), "S.tp_adj", 0.0);
}

/* Two CJK characters make about one word there too: "TP with adjacent ranks 可行" is a short
   answer of five words, not of six; six English words that restate the need are a copy. */
Test(grader, a_short_chinese_answer_is_measured_in_words_not_characters) {
    make_rubric("{\"need_copy_words\": 6}");
    EXPECT_GRADE(S1("TP with adjacent ranks 可行。"), "S.tp_adj", 1.0);
    EXPECT_GRADE(S1("TP with adjacent ranks works well."), "S.tp_adj", 0.0);
}

/* ---------------------------------------------------------------------------------------------
   items: wherever the idea stands, once */

Test(grader, an_idea_in_another_box_counts_for_its_item) {
    graded g = grade_sheet(FX("The TP ranks are adjacent to each other in this layout."));
    EXPECT_SCORE(g, "S.tp_adj", 1.0);
    cr_expect(mc_test_contains(why(&g, "S.tp_adj"), "written under FX, counted for S"), "%s",
              why(&g, "S.tp_adj"));
    release(&g);
    /* an older template's heading ("A1 Layout rule") still opens its box */
    graded h = grade_text("# labT\n### A1 Layout rule\nThe TP ranks are adjacent to each other.\n");
    EXPECT_SCORE(h, "S.tp_adj", 1.0);
    release(&h);
}

Test(grader, the_same_idea_counts_once_where_it_stands) {
    graded g = grade_sheet(FX("TP traffic stays on NVLink inside the node."));
    EXPECT_SCORE(g, "F.tp_link", 1.0);
    EXPECT_SCORE(g, "S.tp_link", 0.0);
    release(&g);
    graded h = grade_sheet(S1("TP traffic stays on NVLink inside the node."));
    EXPECT_SCORE(h, "S.tp_link", 1.0);
    EXPECT_SCORE(h, "F.tp_link", 0.0);
    release(&h);
}

Test(grader, an_ungraded_box_earns_and_costs_nothing) {
    char *s = sheet(NULL, NULL, NULL, NULL, NULL, NULL);
    size_t n = strlen(s);
    s = realloc(s, n + 256);
    strcat(s, "\n## Notes\nThe TP ranks are adjacent. Only the members create the group.\n");
    graded g = grade_sheet(s);
    EXPECT_SCORE(g, "S.tp_adj", 0.0);
    cr_expect_not(item(&g, "MX_ONLY")->fired, "%s", g.out);
    release(&g);
}

Test(grader, items_are_capped_at_their_points) {
    /* F: 5 points; here the claims alone would give 2 + 1 + 1 (+ the prediction) */
    graded g = grade_sheet(FX("Communicators pair the calls by their sequence. TP traffic stays on "
                              "NVLink. The DP ranks are adjacent here."));
    EXPECT_SCORE(g, "F", 4.0);
    release(&g);
}

/* ---------------------------------------------------------------------------------------------
   evidence: a value bound to its quantity, in a sentence that says what it shows */

Test(grader, evidence_binds_a_group_to_its_kind_and_rank) {
    graded g = grade_sheet(EV("In this run the TP group of rank 3 was [2,3]."));
    EXPECT_SCORE(g, "E.probe_group", 0.5);
    cr_expect(mc_test_contains(why(&g, "E.probe_group"), "verified: TP = [2,3]"), "%s",
              why(&g, "E.probe_group"));
    release(&g);
    /* a measured TP group, but not rank 3's: no evidence, and a wrong layout claim */
    graded h = grade_sheet(EV("In this run the TP group of rank 3 was [4,5]."));
    EXPECT_SCORE(h, "E.probe_group", 0.0);
    cr_expect(item(&h, "MX_STRIDE")->fired, "%s", h.out);
    release(&h);
    /* the probe's group in a sentence that names no rank, or another kind's list */
    EXPECT_GRADE(EV("My probe rank sits in the TP group [2,3] in this run."), "E.probe_group", 0.5);
    EXPECT_GRADE(EV("The PP group of my probe was [2,3] in this run."),
                 "E.probe_group", 0.0); /* [2,3] is the TP group, said of PP */
}

Test(grader, a_denied_value_is_not_evidence) {
    /* the right list, said not to be the group, or framed as a myth */
    EXPECT_GRADE(EV("In this run the TP group of rank 3 was not [2,3]."), "E.probe_group", 0.0);
    EXPECT_GRADE(EV("It is a myth that the TP group of rank 3 was [2,3] in this run."),
                 "E.probe_group", 0.0);
    /* the same list, stated */
    EXPECT_GRADE(EV("It is true that the TP group of rank 3 was [2,3] in this run."),
                 "E.probe_group", 0.5);
}

Test(grader, a_dump_of_values_earns_nothing) {
    graded g = grade_sheet(EV("[2,3] [0,2] [1,3] 0.75 6 hang\n\n- TP [2,3], 0.75 s, hang\n"));
    EXPECT_SCORE(g, "E.probe_group", 0.0);
    EXPECT_SCORE(g, "E.outcome", 0.0);
    EXPECT_SCORE(g, "E.seconds", 0.0);
    release(&g);
}

Test(grader, evidence_needs_its_context_and_the_measured_value) {
    graded g = grade_sheet(EV("Experiment B hung after 0.75 s in this run."));
    EXPECT_SCORE(g, "E.outcome", 0.25);
    EXPECT_SCORE(g, "E.seconds", 0.25);
    release(&g);
    graded h = grade_sheet(EV("Something hung after 0.75 s in this run."));
    EXPECT_SCORE(h, "E.outcome", 0.0); /* which experiment? */
    EXPECT_SCORE(h, "E.seconds", 0.0);
    release(&h);
    graded k = grade_sheet(EV("Experiment B was fine and ended after 0.9 s in this run."));
    EXPECT_SCORE(k, "E.outcome", 0.0);
    EXPECT_SCORE(k, "E.seconds", 0.0);
    cr_expect(mc_test_contains(why(&k, "E.outcome"), "says ok, measured hang"), "%s",
              why(&k, "E.outcome"));
    release(&k);
}

/* ---------------------------------------------------------------------------------------------
   predictions */

static const char *k_all_right =
    "n: 6\noutcome: hang\nflag: true\ngroups: [[0,1],[2,3],[4,5],[6,7]]\n"
    "probe: {a: 1, b: 0, c: yes, d: [3,1]}\nt: 10.3\niv: [8, 12]\ns: [1,3]\nex: \"ABC\"\ngone: 3";

/* A measured run of the current format: results without the old hash, and the ledger lock
   of the sheet holding these predictions (the first run for the nonce). */
static gr_lock_info lock_to(const char *pred_main, const char *pred_fu) {
    char *s = sheet(pred_main, NULL, NULL, NULL, pred_fu, NULL);
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    make_results_v2(NULL);
    remove(in_dir("results.ledger.json")); /* a first run: no earlier lock */
    gr_lock_info info;
    int rc = gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                            in_dir("answers.md"), "abc123", &info);
    cr_assert_eq(rc, 0, "lock failed: %s", info.message);
    return info;
}

Test(grader, every_prediction_type_scores_a_right_answer) {
    lock_to(k_all_right, "fk: 7");
    graded g = grade_sheet(sheet(k_all_right, NULL, NULL, NULL, "fk: 7", NULL));
    cr_expect(g.rep.locked, "%s", g.out);
    EXPECT_SCORE(g, "P.n", 0.5);
    EXPECT_SCORE(g, "P.outcome", 0.5);
    EXPECT_SCORE(g, "P.flag", 0.5);
    EXPECT_SCORE(g, "P.groups", 1.0);
    EXPECT_SCORE(g, "P.probe", 1.0);
    EXPECT_SCORE(g, "P.t", 0.5);    /* 10.3 within 5% of 10.0 */
    EXPECT_SCORE(g, "P.iv", 1.0);   /* [8, 12] contains 10, 12/8 <= 2 */
    EXPECT_SCORE(g, "P.s", 0.5);    /* sets ignore order */
    EXPECT_SCORE(g, "P.ex", 0.5);   /* strings ignore case */
    EXPECT_SCORE(g, "P.gone", 0.0); /* not measured in this run (worth 0 points here) */
    cr_expect(mc_test_contains(item(&g, "P.gone")->output, "not measured"));
    EXPECT_SCORE(g, "F.fk", 1.0); /* variant F2 reads facts.followup.k2 */
    EXPECT_SCORE(g, "P", 5.5); /* 6 points of predictions, the item is worth 5.5 */
    release(&g);
}

Test(grader, a_number_written_with_its_plus_sign_is_read) {
    /* "+6" (a shift forward, say) is the number 6, though JSON has no unary plus */
    const char *signed_n =
        "n: +6\noutcome: hang\nflag: true\ngroups: [[0,1],[2,3],[4,5],[6,7]]\n"
        "probe: {a: 1, b: 0, c: yes, d: [3,1]}\nt: +10.3\niv: [+8, 12]\ns: [1,3]\nex: \"+ABC\"\ngone: 3";
    lock_to(signed_n, "fk: 7");
    graded g = grade_sheet(sheet(signed_n, NULL, NULL, NULL, "fk: 7", NULL));
    EXPECT_SCORE(g, "P.n", 0.5);
    EXPECT_SCORE(g, "P.t", 0.5);
    EXPECT_SCORE(g, "P.iv", 1.0);
    EXPECT_SCORE(g, "P.ex", 0.0); /* inside a string the sign stays: "+abc" is not "abc" */
    release(&g);
}

Test(grader, wrong_predictions_score_zero) {
    const char *wrong =
        "n: 5\noutcome: ok\nflag: false\ngroups: [[0,2],[1,3],[4,6],[5,7]]\n"
        "probe: {a: 0, b: 1, c: false, d: [1]}\nt: 11\niv: [11, 12]\ns: [1,2]\nex: abd";
    lock_to(wrong, "fk: 4");
    graded g = grade_sheet(sheet(wrong, NULL, NULL, NULL, "fk: 4", NULL));
    const char *ids[] = {"P.n", "P.outcome", "P.flag", "P.groups", "P.probe",
                         "P.t", "P.iv",      "P.s",    "P.ex",     "F.fk"};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
        EXPECT_SCORE(g, ids[i], 0.0);
    release(&g);
}

/* Locks pred and grades a sheet holding it. */
static graded grade_locked(const char *pred) {
    lock_to(pred, NULL);
    return grade_sheet(sheet(pred, NULL, NULL, NULL, NULL, NULL));
}

Test(grader, group_predictions_earn_half_for_half_the_groups) {
    graded g = grade_locked("groups: [[0,1],[3,2],[4,6],[5,7]]");
    EXPECT_SCORE(g, "P.groups", 0.5); /* 2/4 exact -> half */
    release(&g);
    /* A repeated group matches one measured group only. */
    graded h = grade_locked("groups: [[0,1],[0,1],[2,3],[2,3]]");
    EXPECT_SCORE(h, "P.groups", 0.5);
    release(&h);
    graded k = grade_locked("groups: [[0,1],[2,5],[3,6],[4,7]]");
    EXPECT_SCORE(k, "P.groups", 0.0); /* 1/4 */
    release(&k);
    /* Listing extra groups does not buy credit: 4 right out of 8 listed is half. */
    graded x = grade_locked("groups: [[0,1],[2,3],[4,5],[6,7],[0,2],[1,3],[4,6],[5,7]]");
    EXPECT_SCORE(x, "P.groups", 0.5);
    release(&x);
}

Test(grader, field_predictions_earn_half_for_three_of_four) {
    graded g = grade_locked("probe: {a: 1, b: 0, c: true, d: [2]}");
    EXPECT_SCORE(g, "P.probe", 0.5);
    cr_expect(mc_test_contains(item(&g, "P.probe")->output, "d: you [2], measured [1,3]"), "%s",
              item(&g, "P.probe")->output);
    release(&g);
    graded h = grade_locked("probe: {a: 1, b: 1, c: true, d: [2]}");
    EXPECT_SCORE(h, "P.probe", 0.0);
    release(&h);
}

Test(grader, interval_width_decides_the_credit) {
    lock_to("iv: [6, 20]", NULL);
    EXPECT_GRADE(sheet("iv: [6, 20]", NULL, NULL, NULL, NULL, NULL),
                 "P.iv", 0.5); /* contains 10, 20/6 is between 2 and 4 */
    lock_to("iv: [1, 100]", NULL);
    graded h = grade_sheet(sheet("iv: [1, 100]", NULL, NULL, NULL, NULL, NULL));
    EXPECT_SCORE(h, "P.iv", 0.0); /* a wide interval cannot buy credit */
    cr_expect(mc_test_contains(item(&h, "P.iv")->output, "too wide"));
    release(&h);
}

Test(grader, numeric_tolerance_is_relative) {
    lock_to("t: 10.6", NULL);
    EXPECT_GRADE(sheet("t: 10.6", NULL, NULL, NULL, NULL, NULL),
                 "P.t", 0.0); /* 6% off, tolerance 5% */
}

Test(grader, enum_values_outside_the_list_are_reported) {
    graded g = grade_locked("outcome: crashed");
    EXPECT_SCORE(g, "P.outcome", 0.0);
    cr_expect(mc_test_contains(item(&g, "P.outcome")->output, "not a listed outcome"), "%s",
              item(&g, "P.outcome")->output);
    release(&g);
}

Test(grader, template_placeholders_and_garbage_values_are_not_predictions) {
    graded g = grade_locked("n: ?\noutcome: ok|hang\ngroups: [[..]]\nt: {{{");
    cr_expect_eq(g.rep.predictions_filled, 1, "the block has one non-template line (t)");
    cr_expect(mc_test_contains(item(&g, "P.n")->output, "not filled in"));
    cr_expect(mc_test_contains(item(&g, "P.t")->output, "could not read"), "%s",
              item(&g, "P.t")->output);
    cr_expect(mc_test_contains(item(&g, "P.flag")->output, "no prediction"), "%s",
              item(&g, "P.flag")->output);
    release(&g);
}

Test(grader, multi_line_values_continue_the_previous_key) {
    lock_to("groups: [[0,1],[2,3],\n         [4,5],[6,7]]   # two lines", NULL);
    graded g = grade_sheet(sheet("groups: [[0,1],[2,3],\n         [4,5],[6,7]]   # two lines", NULL,
                                 NULL, NULL, NULL, NULL));
    EXPECT_SCORE(g, "P.groups", 1.0);
    release(&g);
}

/* ---------------------------------------------------------------------------------------------
   locking */

Test(grader, predictions_changed_after_the_first_run_earn_zero_with_the_reason) {
    gr_lock_info info = lock_to("n: 5\ngroups: [[0,1],[2,3],[4,5],[6,7]]", NULL);
    cr_expect(info.locked_now);
    cr_expect_eq(info.n_keys, 2, "%s", info.message);
    graded g = grade_sheet(
        sheet("n: 6\ngroups: [[0,1],[2,3],[4,5],[6,7]]", NULL, NULL, NULL, NULL, NULL));
    cr_expect_not(g.rep.locked);
    cr_expect_eq(g.rep.n_pred_unlocked, 1);
    EXPECT_SCORE(g, "P.n", 0.0); /* right now, but not what was locked: 0, not half */
    EXPECT_SCORE(g, "P.groups", 1.0);
    char want[128];
    snprintf(want, sizeof want, "changed since the first run at %s (locked: 5)", info.locked_at);
    cr_expect(mc_test_contains(item(&g, "P.n")->output, want), "%s", item(&g, "P.n")->output);
    cr_expect(mc_test_contains(g.out, "PREDICTIONS NOT LOCKED: 1 prediction earn"), "%s", g.out);
    release(&g);
}

Test(grader, predictions_written_after_the_first_run_earn_zero) {
    /* The first run saw the bare template; the learner then copies the measured values. */
    gr_lock_info first = lock_to("n: ?\noutcome: ok|hang", NULL);
    cr_expect(first.locked_now);
    cr_expect_eq(first.n_keys, 0, "placeholders are absent: %s", first.message);
    graded g = grade_sheet(sheet("n: 6\noutcome: hang", NULL, NULL, NULL, NULL, NULL));
    EXPECT_SCORE(g, "P.n", 0.0);
    EXPECT_SCORE(g, "P.outcome", 0.0);
    cr_expect(mc_test_contains(item(&g, "P.outcome")->output, "not predicted before the first run"),
              "%s", item(&g, "P.outcome")->output);
    release(&g);
}

Test(grader, a_rerun_after_copying_predictions_never_relocks) {
    lock_to("n: ?", NULL);
    /* Copy the measured value in and run again: the second run only reports the change. */
    char *s = sheet("n: 6", NULL, NULL, NULL, NULL, NULL);
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    gr_lock_info again;
    cr_assert_eq(gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                                in_dir("answers.md"), "abc123", &again),
                 0, "%s", again.message);
    cr_expect_not(again.locked_now);
    cr_expect_eq(again.n_keys, 0);
    cr_expect_eq(again.n_changed, 1, "%s", again.message);
    cr_expect(mc_test_contains(again.message, "main/n"), "%s", again.message);
    graded g = grade_text(NULL);
    EXPECT_SCORE(g, "P.n", 0.0);
    cr_expect_not(g.rep.locked);
    cr_expect(mc_test_contains(g.out, "PREDICTIONS NOT LOCKED"), "%s", g.out);
    release(&g);
    /* A new nonce (a fresh --init) locks anew. */
    gr_lock_info other;
    cr_assert_eq(gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                                in_dir("answers.md"), "feed42", &other),
                 0);
    cr_expect(other.locked_now);
    cr_expect_eq(other.n_keys, 1);
}

/* The unit rubric with "lock_when_filled" (findings): follow-up keys a learner fills only after
   looking at runs, locked at the first measured run that sees them filled. */
static void make_rubric_with_findings(const char *findings_json) {
    char *text = slurp(in_dir("rubric.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    cJSON_AddItemToObject(r, "lock_when_filled", cJSON_Parse(findings_json));
    write_json(in_dir("rubric.json"), r);
}

static gr_lock_info relock(const char *pred_main, const char *pred_fu) {
    char *s = sheet(pred_main, NULL, NULL, NULL, pred_fu, NULL);
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    gr_lock_info info;
    cr_assert_eq(gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                                in_dir("answers.md"), "abc123", &info),
                 0, "%s", info.message);
    return info;
}

Test(grader, a_finding_locks_at_the_first_run_that_sees_it_filled_and_never_after) {
    make_rubric_with_findings("[\"followup/fk\"]");
    char value[32];
    /* the first run: the main block filled, the finding still empty */
    gr_lock_info first = lock_to("n: 6", NULL);
    cr_expect(first.locked_now);
    cr_expect_eq(gr_ledger_locked_value(in_dir("results.ledger.json"), "abc123", "followup/fk",
                                        value, sizeof value),
                 0, "an empty finding is not locked");
    graded g = grade_sheet(sheet("n: 6", NULL, NULL, NULL, "fk: 7", NULL));
    EXPECT_SCORE(g, "F.fk", 0.0);
    cr_expect(mc_test_contains(item(&g, "F.fk")->output, "a finding locks at the first run"),
              "%s", item(&g, "F.fk")->output);
    release(&g);
    /* the learner fills the finding and runs again: it locks now, the main block does not */
    gr_lock_info second = relock("n: 6", "fk: 7");
    cr_expect(mc_test_contains(second.message, "locked now (findings): followup/fk"), "%s",
              second.message);
    cr_expect_eq(gr_ledger_locked_value(in_dir("results.ledger.json"), "abc123", "followup/fk",
                                        value, sizeof value),
                 1);
    cr_expect_str_eq(value, "7");
    graded h = grade_text(NULL);
    EXPECT_SCORE(h, "F.fk", 1.0);
    EXPECT_SCORE(h, "P.n", 0.5);
    release(&h);
    /* a changed finding keeps its first value and earns 0; a main key written late never
       locks (it is not a finding) */
    relock("n: 6\noutcome: hang", "fk: 4");
    cr_expect_eq(gr_ledger_locked_value(in_dir("results.ledger.json"), "abc123", "followup/fk",
                                        value, sizeof value),
                 1);
    cr_expect_str_eq(value, "7");
    cr_expect_eq(gr_ledger_locked_value(in_dir("results.ledger.json"), "abc123", "main/outcome",
                                        NULL, 0),
                 0);
    graded k = grade_text(NULL);
    EXPECT_SCORE(k, "F.fk", 0.0);
    EXPECT_SCORE(k, "P.outcome", 0.0);
    release(&k);
    /* no ledger, or another nonce: not locked */
    cr_expect_eq(gr_ledger_locked_value(in_dir("results.ledger.json"), "feed42", "followup/fk",
                                        NULL, 0),
                 0);
    cr_expect_eq(gr_ledger_locked_value(in_dir("none.json"), "abc123", "followup/fk", NULL, 0), 0);
}

Test(grader, a_dotted_bare_word_is_one_value) {
    /* module names such as decoder.layers.2.mlp are written without quotes */
    make_results_v2(NULL);
    char *text = slurp(in_dir("results.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(r, "facts"), "name",
                                           cJSON_CreateString("decoder.layers.2.mlp"));
    write_json(in_dir("results.json"), r);
    const char *pred = "ex: decoder.layers.2.mlp";
    char *s = sheet(pred, NULL, NULL, NULL, NULL, NULL);
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    remove(in_dir("results.ledger.json"));
    gr_lock_info info;
    cr_assert_eq(gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                                in_dir("answers.md"), "abc123", &info),
                 0, "%s", info.message);
    graded g = grade_text(NULL);
    EXPECT_SCORE(g, "P.ex", 0.5);
    cr_expect(mc_test_contains(item(&g, "P.ex")->output, "decoder.layers.2.mlp"), "%s",
              item(&g, "P.ex")->output);
    release(&g);
}

Test(grader, a_corrupt_ledger_is_an_error_and_is_left_alone) {
    lock_to("n: 6", NULL);
    const char *bad = "{\"format\": \"megatron_c-prediction-ledger\", \"version\": 1, \"nonc";
    spit(in_dir("results.ledger.json"), bad, strlen(bad));
    gr_lock_info info;
    int rc = gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                            in_dir("answers.md"), "abc123", &info);
    cr_expect_lt(rc, 0);
    cr_expect(mc_test_contains(info.message, "results.ledger.json is corrupt"), "%s",
              info.message);
    char *after = slurp(in_dir("results.ledger.json"));
    cr_expect_str_eq(after, bad, "the corrupt ledger must not be rewritten");
    free(after);
    graded g = grade_text(NULL);
    cr_expect_lt(g.rc, 0, "grading with a corrupt ledger is an error:\n%s", g.out);
    cr_expect(mc_test_contains(g.out, "is corrupt"), "%s", g.out);
    release(&g);
    spit(in_dir("results.ledger.json"), "{\"format\": \"x\", \"version\": 1, \"nonces\": {}}", 44);
    cr_expect_lt(gr_ledger_lock(in_dir("results.ledger.json"), in_dir("rubric.json"),
                                in_dir("answers.md"), "abc123", &info),
                 0);
    cr_expect(mc_test_contains(info.message, "\"format\""), "%s", info.message);
}

Test(grader, no_ledger_for_current_results_means_no_prediction_counts) {
    make_results_v2(NULL);
    graded g = grade_sheet(sheet("n: 6", NULL, NULL, NULL, NULL, NULL));
    EXPECT_SCORE(g, "P.n", 0.0);
    cr_expect(mc_test_contains(item(&g, "P.n")->output, "no prediction ledger at"), "%s",
              item(&g, "P.n")->output);
    release(&g);
}

Test(grader, old_results_files_still_grade_by_their_hash) {
    /* results_format 1: the run recorded a hash of the pred blocks, no ledger exists. */
    char *s = sheet("n: 6", NULL, NULL, NULL, NULL, NULL);
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    char hex[17];
    int filled = 0;
    cr_assert_eq(gr_prediction_hash(in_dir("answers.md"), hex, &filled), 0);
    make_results(hex, 1, NULL);
    graded g = grade_text(NULL);
    cr_expect(g.rep.locked, "%s", g.out);
    EXPECT_SCORE(g, "P.n", 0.5);
    release(&g);
    graded h = grade_sheet(sheet("n: 5", NULL, NULL, NULL, NULL, NULL));
    EXPECT_SCORE(h, "P.n", 0.0);
    cr_expect(mc_test_contains(item(&h, "P.n")->output, "changed since the run at "
                                                         "2026-11-30T04:00:00Z"),
              "%s", item(&h, "P.n")->output);
    release(&h);
    make_results("", 0, NULL);
    graded k = grade_sheet(sheet("n: 6", NULL, NULL, NULL, NULL, NULL));
    EXPECT_SCORE(k, "P.n", 0.0);
    cr_expect(mc_test_contains(item(&k, "P.n")->output, "not predicted before the run"), "%s",
              item(&k, "P.n")->output);
    release(&k);
}

Test(grader, the_prediction_hash_ignores_whitespace_and_comments_only) {
    char a[17], b[17], c[17];
    int fa = 0, fb = 0, fc = 0;
    char *s = sheet("n: 6   # six\ngroups: [[0,1], [2,3]]", NULL, NULL, NULL, "fk: ?", NULL);
    spit(in_dir("a.md"), s, strlen(s));
    free(s);
    s = sheet("n:6\n\n  groups:[[0,1],[2,3]]", NULL, NULL, NULL, "fk: ?   # later", NULL);
    spit(in_dir("b.md"), s, strlen(s));
    free(s);
    s = sheet("n: 7\ngroups: [[0,1],[2,3]]", NULL, NULL, NULL, "fk: ?", NULL);
    spit(in_dir("c.md"), s, strlen(s));
    free(s);
    cr_assert_eq(gr_prediction_hash(in_dir("a.md"), a, &fa), 0);
    cr_assert_eq(gr_prediction_hash(in_dir("b.md"), b, &fb), 0);
    cr_assert_eq(gr_prediction_hash(in_dir("c.md"), c, &fc), 0);
    cr_expect_eq(strlen(a), 16);
    cr_expect_str_eq(a, b);
    cr_expect_str_neq(a, c);
    cr_expect_eq(fa, 1, "one of the two blocks has content beyond the template");
    cr_expect_lt(gr_prediction_hash(in_dir("missing.md"), a, &fa), 0);
}

/* ---------------------------------------------------------------------------------------------
   follow-up variants and quality */

Test(grader, follow_up_items_follow_the_measured_variant) {
    lock_to(NULL, "fk: 4");
    make_results_v2("F1");
    graded g = grade_sheet(sheet(NULL, NULL, NULL, NULL, "fk: 4",
                                 "The DP ranks are adjacent in this variant of the grid."));
    EXPECT_SCORE(g, "F.fk", 1.0); /* F1 reads facts.followup.k = 4 */
    for (int i = 0; i < g.rep.n_items; i++)
        cr_expect_str_neq(g.rep.items[i].id, "F.dp_adj", "F2-only claims are not graded for F1");
    cr_expect(mc_test_contains(g.out, "follow-up F1: variant one"), "%s", g.out);
    release(&g);
}

Test(grader, a_prediction_in_the_other_block_still_counts) {
    lock_to(NULL, "n: 6");
    graded g = grade_sheet(sheet(NULL, NULL, NULL, NULL, "n: 6", NULL));
    EXPECT_SCORE(g, "P.n", 0.5);
    cr_expect(mc_test_contains(why(&g, "P.n"), "found in the other pred block"), "%s", why(&g, "P.n"));
    release(&g);
}

/* ---------------------------------------------------------------------------------------------
   output, files and robustness */

Test(grader, the_last_line_is_the_total_and_grade_json_is_written) {
    lock_to("n: 6", NULL);
    graded g = grade_sheet(sheet("n: 6", "The TP ranks are adjacent to each other in this layout.",
                                 NULL, NULL, NULL, NULL));
    cr_expect_str_eq(last_line(g.out), "Total 1.50/15", "%s", g.out);
    cr_expect_float_eq(g.rep.total, 1.5, 1e-9); /* n 0.5 + tp_adj 1.0 */
    char *json = slurp(in_dir("grade.json"));
    cJSON *j = cJSON_Parse(json);
    free(json);
    cr_assert_not_null(j);
    cr_expect_float_eq(cJSON_GetObjectItem(j, "score")->valuedouble, 1.5, 1e-9);
    cr_expect_float_eq(cJSON_GetObjectItem(j, "max_score")->valuedouble, 15.0, 1e-9);
    cJSON *tests = cJSON_GetObjectItem(j, "tests");
    cr_expect_eq(cJSON_GetArraySize(tests), g.rep.n_items);
    cJSON *t0 = cJSON_GetArrayItem(tests, 0);
    cr_expect(cJSON_IsString(cJSON_GetObjectItem(t0, "name")) &&
              cJSON_IsNumber(cJSON_GetObjectItem(t0, "score")) &&
              cJSON_IsNumber(cJSON_GetObjectItem(t0, "max_score")) &&
              cJSON_IsString(cJSON_GetObjectItem(t0, "output")));
    cJSON_Delete(j);
    release(&g);
}

Test(grader, an_empty_sheet_says_what_to_do_next) {
    graded g = grade_text("");
    cr_expect_eq(g.rc, 0);
    cr_expect(g.rep.near_empty);
    cr_expect(mc_test_contains(g.out, "What to do next:\n  Fill the pred block first."), "%s",
              g.out);
    cr_expect_str_eq(last_line(g.out), "Total 0.00/15");
    release(&g);
}

Test(grader, a_missing_sheet_is_graded_as_empty) {
    graded g = grade_text(NULL);
    cr_expect_eq(g.rc, 0);
    cr_expect(mc_test_contains(g.out, "run `./labT --init`"), "%s", g.out);
    cr_expect_str_eq(last_line(g.out), "Total 0.00/15");
    release(&g);
}

Test(grader, a_missing_results_file_is_an_error_that_says_what_to_run) {
    remove(in_dir("results.json"));
    graded g = grade_text("# nothing\n");
    cr_expect_lt(g.rc, 0);
    cr_expect(mc_test_contains(g.out, "results.json not found: run `mpirun -np 8 ./labT` first"),
              "%s", g.out);
    release(&g);
}

static void expect_rubric_error(const char *edit_from, const char *edit_to, const char *want) {
    make_rubric(NULL);
    char *text = slurp(in_dir("rubric.json"));
    char *at = strstr(text, edit_from);
    cr_assert_not_null(at, "the unit rubric has no \"%s\"", edit_from);
    size_t n = strlen(text) + strlen(edit_to) + 1;
    char *out = malloc(n);
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, edit_to, at + strlen(edit_from));
    spit(in_dir("rubric.json"), out, strlen(out));
    free(text);
    free(out);
    graded g = grade_text("# nothing\n");
    cr_expect_lt(g.rc, 0, "accepted a rubric with %s", edit_to);
    cr_expect(mc_test_contains(g.out, want), "want \"%s\" in:\n%s", want, g.out);
    release(&g);
}

Test(grader, a_bad_rubric_is_an_error_naming_the_field) {
    expect_rubric_error("\"schema\":2", "\"schema\":3", "\"schema\" must be 2");
    expect_rubric_error("\"ADJ\"],\"window\":8", "\"NOPE\"],\"window\":8",
                        "names unknown concept \"NOPE\"");
    expect_rubric_error("\"EVERY + CREATE\"", "\"EVERY + CREATE + ?\"", "empty concept slot");
    expect_rubric_error("\"points\":3.5", "\"points\":4.5", "add up to 11 (main) + 5");
    expect_rubric_error("\"voids\":[\"S.every_create\"]", "\"voids\":[\"S.nope\"]",
                        "voids unknown claim S.nope");
    expect_rubric_error("\"item\":\"F\",\"penalty\":1.5", "\"item\":\"Z\",\"penalty\":1.5",
                        "\"item\" must name the item");
    spit(in_dir("rubric.json"), "{ not json", 10);
    graded h = grade_text("# nothing\n");
    cr_expect_lt(h.rc, 0);
    cr_expect(mc_test_contains(h.out, "is not valid JSON"), "%s", h.out);
    release(&h);
}

/* agreement.json beside the rubric: what `make agreement` measured of the lab's grades
   against human markers, quoted at the foot of the report and kept in grade.json. */
static void make_agreement(int sheets, int within, double low, double high) {
    char text[512];
    snprintf(text, sizeof text,
             "{\"labT\": {\"test\": {\"sheets\": %d, \"within_2\": %d, \"marked_5_down\": 3, "
             "\"mean_diff_marked_5_down\": %g, \"marked_12_up\": 4, \"mean_diff_marked_12_up\": %g}}}",
             sheets, within, low, high);
    spit(in_dir("agreement.json"), text, strlen(text));
}

Test(grader, the_report_says_how_far_its_grade_agrees_with_human_markers) {
    graded g = grade_sheet(S1("The TP ranks are adjacent to each other in this layout."));
    cr_expect(!mc_test_contains(g.out, "How far to trust"), "no agreement file, yet:\n%s", g.out);
    release(&g);
    make_agreement(10, 7, 2.5, -0.25);
    g = grade_sheet(S1("The TP ranks are adjacent to each other in this layout."));
    cr_assert_eq(g.rc, 0, "%s", g.out);
    cr_expect(mc_test_contains(g.out, "within 2 points of the examiner on 7\n(70%)") ||
                  mc_test_contains(g.out, "within 2 points of the examiner on 7 (70%)"),
              "%s", g.out);
    cr_expect(mc_test_contains(g.out, "2.50 more on average"), "%s", g.out);
    cr_expect(!mc_test_contains(g.out, "12 or more"), "a mean under 0.5 is not worth a clause:\n%s",
              g.out);
    cr_expect(mc_test_contains(g.out, "short of the workbook's bar"), "%s", g.out);
    cr_expect(strncmp(last_line(g.out), "Total ", 6) == 0, "the total stays the last line:\n%s",
              g.out);
    char *json = slurp(in_dir("grade.json"));
    cJSON *doc = cJSON_Parse(json);
    free(json);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(doc, "agreement_held_out");
    cr_expect_eq((int)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(a, "within_2")), 7);
    cJSON_Delete(doc);
    release(&g);
    make_agreement(10, 9, 0.25, -1.5);
    g = grade_sheet(S1("The TP ranks are adjacent to each other in this layout."));
    cr_expect(mc_test_contains(g.out, "On those marked 12 or more it gave 1.50 less on average"), "%s", g.out);
    cr_expect(!mc_test_contains(g.out, "short of the workbook's bar"), "9 of 10 meets it:\n%s",
              g.out);
    release(&g);
}

/* A sheet whose locked predictions are wrong but whose explanations earn: the report asks for
   a check by hand (where the grader errs most) and leaves the grade as it is. */
static graded grade_explained(const char *preds) {
    char *s = sheet(preds, "The TP ranks are adjacent to each other and use the fast NVLink link.",
                    "All ranks created every group.", NULL, NULL,
                    "NCCL pairs the calls by their sequence on the communicator.");
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    char hex[17];
    int filled = 0;
    cr_assert_eq(gr_prediction_hash(in_dir("answers.md"), hex, &filled), 0);
    make_results(hex, 1, NULL);
    return grade_text(NULL);
}

Test(grader, wrong_locked_predictions_under_credited_explanations_ask_for_a_check_by_hand) {
    graded g = grade_explained("n: 5\noutcome: ok\nflag: false\niv: [50, 60]");
    cr_assert(g.rep.locked, "%s", g.out);
    cr_expect(g.rep.check_by_hand, "%s", g.out);
    cr_expect(mc_test_contains(g.out, "Check this grade by hand: your locked predictions earned 0%"),
              "%s", g.out);
    double wrong_total = g.rep.total;
    char *json = slurp(in_dir("grade.json"));
    cr_expect(mc_test_contains(json, "\"check_by_hand\""), "%s", json);
    free(json);
    release(&g);
    graded h = grade_explained("n: 6\noutcome: hang\nflag: true\niv: [5, 20]");
    cr_expect(!h.rep.check_by_hand, "right predictions, yet:\n%s", h.out);
    cr_expect(!mc_test_contains(h.out, "Check this grade by hand"), "%s", h.out);
    release(&h);
    /* the same sheet with its predictions written after the run: they earn 0 as the wrong ones
       did, nothing is judged, no notice, and the same total: the notice moved no point */
    make_results("", 0, NULL);
    graded u = grade_text(NULL);
    cr_expect(!u.rep.check_by_hand, "%s", u.out);
    cr_expect_float_eq(u.rep.total, wrong_total, 1e-9, "%s", u.out);
    release(&u);
    graded k = grade_explained("n: 5");
    cr_expect(!k.rep.check_by_hand, "one wrong 0.5-point prediction is too little to judge:\n%s",
              k.out);
    release(&k);
}

Test(grader, a_bad_agreement_file_is_an_error_naming_the_field) {
    const char *bad = "{\"labT\": {\"test\": {\"sheets\": \"ten\"}}}";
    spit(in_dir("agreement.json"), bad, strlen(bad));
    graded g = grade_text("# nothing\n");
    cr_expect_lt(g.rc, 0, "graded with a bad agreement file:\n%s", g.out);
    cr_expect(mc_test_contains(g.out, "labT.test.sheets must be a number"), "%s", g.out);
    release(&g);
}

Test(grader, a_sheet_that_is_not_utf8_text_is_an_error_naming_file_and_line) {
    /* binary bytes (NULs, invalid UTF-8) */
    char bin[4096];
    for (size_t i = 0; i < sizeof bin; i++)
        bin[i] = (char)((i * 2654435761u) >> 13);
    spit(in_dir("answers.md"), bin, sizeof bin);
    graded g = grade_text(NULL);
    cr_expect_lt(g.rc, 0, "binary sheet graded:\n%s", g.out);
    cr_expect(mc_test_contains(g.out, "answers.md, line 1, column"), "%s", g.out);
    release(&g);
    /* Latin-1 text on line 3 */
    const char *latin1 = "# sheet\n\nDie Gr\xF6\xDF" "e der Gruppe.\n";
    spit(in_dir("answers.md"), latin1, strlen(latin1));
    graded h = grade_text(NULL);
    cr_expect_lt(h.rc, 0);
    cr_expect(mc_test_contains(h.out, "answers.md, line 3, column 7: invalid UTF-8"), "%s", h.out);
    release(&h);
    char hex[17];
    cr_expect_lt(gr_prediction_hash(in_dir("answers.md"), hex, NULL), 0);
    gr_lock_info info;
    cr_expect_lt(gr_ledger_lock(in_dir("l.json"), in_dir("rubric.json"), in_dir("answers.md"),
                                "abc123", &info),
                 0);
    cr_expect(mc_test_contains(info.message, "invalid UTF-8"), "%s", info.message);
    /* a byte-order mark is fine */
    const char *bom = "\xEF\xBB\xBF### S1 Layout\nThe TP ranks are adjacent to each other here.\n";
    spit(in_dir("answers.md"), bom, strlen(bom));
    graded k = grade_text(NULL);
    cr_expect_eq(k.rc, 0, "%s", k.out);
    release(&k);
}

Test(grader, a_directory_given_as_the_sheet_is_an_error) {
    graded g = grade_text(NULL);
    release(&g);
    remove(in_dir("answers.md"));
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", in_dir("answers.md"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    graded h = grade_text(NULL);
    cr_expect_lt(h.rc, 0, "a directory was graded:\n%s", h.out);
    cr_expect(mc_test_contains(h.out, "answers.md is a directory"), "%s", h.out);
    release(&h);
    gr_lock_info info;
    cr_expect_lt(gr_ledger_lock(in_dir("l.json"), in_dir("rubric.json"), dir, "abc123", &info), 0);
    cr_expect(mc_test_contains(info.message, "is a directory"), "%s", info.message);
    rmdir(dir);
}

Test(grader, a_prediction_key_given_twice_is_an_error_naming_line_and_key) {
    graded g = grade_sheet(sheet("n: 6\noutcome: hang\n\nn: 5", NULL, NULL, NULL, NULL, NULL));
    cr_expect_lt(g.rc, 0, "%s", g.out);
    /* the main pred block's first line is line 6 of the sheet: n on 6, a blank line 8, n on 9 */
    cr_expect(mc_test_contains(g.out, "answers.md, line 9: the prediction key \"n\" is given "
                                      "twice in one pred block (first on line 6)"),
              "%s", g.out);
    release(&g);
    gr_lock_info info;
    cr_expect_lt(gr_ledger_lock(in_dir("l.json"), in_dir("rubric.json"), in_dir("answers.md"),
                                "abc123", &info),
                 0);
    cr_expect(mc_test_contains(info.message, "given twice"), "%s", info.message);
    /* the same key in the main and the follow-up block is two predictions (older sheets) */
    graded h = grade_sheet(sheet("n: 6", NULL, NULL, NULL, "n: 6", NULL));
    cr_expect_eq(h.rc, 0, "%s", h.out);
    release(&h);
}

Test(grader, rubric_items_are_listed_from_the_rubric) {
    gr_rubric_item *items = NULL;
    int n = gr_rubric_items(in_dir("rubric.json"), &items);
    cr_assert_gt(n, 0);
    cr_expect_eq(n, 4 + 4, "4 items and 4 misconceptions");
    cr_expect_str_eq(items[1].id, "S");
    cr_expect_float_eq(items[1].max_score, 3.5, 1e-9);
    cr_expect_str_eq(items[1].part, "main");
    cr_expect(items[7].is_penalty && strcmp(items[7].id, "MX_NAME") == 0);
    free(items);
    cr_expect_lt(gr_rubric_items(in_dir("nope.json"), &items), 0);
}

Test(grader, garbage_sheets_never_crash) {
    /* one huge line, an unclosed fence, headings only, deep nesting. Each must grade to a
       Total line. */

    size_t n = (size_t)2 << 20;
    char *huge = malloc(n + 64);
    strcpy(huge, "### S1 Layout\n");
    size_t k = strlen(huge);
    while (k + 40 < n)
        k += (size_t)sprintf(huge + k, "TP ranks adjacent [0,1] 0.75 not ");
    huge[k] = '\0';
    graded h = grade_text(huge);
    free(huge);
    cr_expect_eq(h.rc, 0);
    cr_expect(mc_test_contains(last_line(h.out), "Total "));
    release(&h);

    graded u = grade_text(
        "## Predictions (main)\n```pred\nn: 6\n### S1 Layout\nTP ranks are adjacent here.\n");
    cr_expect_eq(u.rc, 0);
    cr_expect(mc_test_contains(last_line(u.out), "Total "));
    release(&u);

    char nest[20000];
    size_t m = 0;
    for (int i = 0; i < 3000; i++)
        m += (size_t)sprintf(nest + m, "> ");
    sprintf(nest + m, "- * TP ranks are **adjacent *nested* deeply** [x](y)\n");
    graded d = grade_text(nest);
    cr_expect_eq(d.rc, 0);
    release(&d);

    graded e = grade_text("### S1\n### S2\n### EV\n### FX\n```pred\n```\n```\n");
    cr_expect_eq(e.rc, 0);
    cr_expect_str_eq(last_line(e.out), "Total 0.00/15");
    release(&e);
}

/* ---------------------------------------------------------------------------------------------
   header and template */

Test(grader, the_header_gives_nonce_probe_and_variant) {
    char *s = sheet(NULL, NULL, NULL, NULL, NULL, NULL);
    spit(in_dir("answers.md"), s, strlen(s));
    free(s);
    char nonce[17], variant[8];
    int probe = -1;
    cr_assert_eq(gr_read_header(in_dir("answers.md"), nonce, &probe, variant), 0);
    cr_expect_str_eq(nonce, "abc123");
    cr_expect_eq(probe, 3);
    cr_expect_str_eq(variant, "F2");
    spit(in_dir("plain.md"), "# no header here\n", 17);
    cr_expect_lt(gr_read_header(in_dir("plain.md"), nonce, &probe, variant), 0);
    cr_expect_lt(gr_read_header(in_dir("missing.md"), nonce, &probe, variant), 0);
}

Test(grader, the_template_is_written_and_never_overwrites_answers) {
    const char *path = in_dir("tmpl.md");
    cr_assert_eq(gr_write_template(in_dir("rubric.json"), path, "feed42", 6, "F1", 0), 0);
    char *t = slurp(path);
    cr_expect(mc_test_contains(t, "<!-- nonce: feed42 ; probe_rank: 6 ; followup: F1"), "%s", t);
    cr_expect(mc_test_contains(t, "## Follow-up (MT-F1)"), "%s", t);
    cr_expect(mc_test_contains(t, "<!-- Question of variant one for rank 6. -->"), "%s", t);
    cr_expect_not(mc_test_contains(t, "{variant_question}"), "%s", t);
    free(t);
    char nonce[17], variant[8];
    int probe = -1;
    cr_expect_eq(gr_read_header(path, nonce, &probe, variant), 0);
    cr_expect_eq(probe, 6);
    /* An untouched template may be rewritten; an answered one only with force. */
    cr_expect_eq(gr_write_template(in_dir("rubric.json"), path, "feed43", 6, "F1", 0), 0);
    FILE *f = fopen(path, "a");
    fputs("\nMy own words about TP.\n", f);
    fclose(f);
    cr_expect_eq(gr_write_template(in_dir("rubric.json"), path, "feed44", 6, "F1", 0), 1);
    t = slurp(path);
    cr_expect(mc_test_contains(t, "My own words"), "refused means untouched");
    free(t);
    cr_expect_eq(gr_write_template(in_dir("rubric.json"), path, "feed44", 6, "F1", 1), 0);
    t = slurp(path);
    cr_expect_not(mc_test_contains(t, "My own words"));
    free(t);
    cr_expect_lt(gr_write_template(in_dir("nope.json"), path, "feed44", 6, "F1", 1), 0);
}

Test(grader, the_lab03_template_round_trips_through_the_grader) {
    /* The real rubric: its template parses back into every section and both pred blocks. */
    char rub[PATH_MAX + 64];
    snprintf(rub, sizeof rub, "%s/labs/rubric/lab03.json", repo_root());
    cr_assert_eq(gr_write_template(rub, in_dir("lab03.md"), "7f3a91", 5, "F2", 0), 0);
    char hex[17];
    int filled = -1;
    cr_assert_eq(gr_prediction_hash(in_dir("lab03.md"), hex, &filled), 0);
    cr_expect_eq(filled, 0, "a fresh template holds no predictions");
    gr_report rep;
    FILE *devnull = fopen("/dev/null", "w");
    int rc = gr_grade(&(gr_grade_desc){.rubric_path = rub,
                                       .answers_path = in_dir("lab03.md"),
                                       .results_path = fixture("results.json"),
                                       .out = devnull},
                      &rep);
    fclose(devnull);
    cr_assert_eq(rc, 0);
    cr_expect_float_eq(rep.total, 0.0, 1e-9, "the template's own text earns nothing");
    cr_expect(rep.near_empty);
    gr_report_free(&rep);
    char *t = slurp(in_dir("lab03.md"));
    const char *boxes[] = {"### M1 ", "### M2 ", "### M3 ", "### M4 ", "### FU1 ", "### FU2 ",
                           "### FU3 ", "### FU4 ", "dp_size: ?", "d_verified_outcome:",
                           "## Follow-up (M003-F2)"};
    for (size_t i = 0; i < sizeof boxes / sizeof boxes[0]; i++)
        cr_expect(mc_test_contains(t, boxes[i]), "the template lacks \"%s\"", boxes[i]);
    cr_expect_not(mc_test_contains(t, "{probe_rank}"), "placeholders left in the template");
    free(t);
}

/* A rubric of schema 1 (no "schema" key: concepts, sections, points, evidence) is read
   through the translation and graded by the same rules: a claim earns where it is stated,
   not where it is denied; a measured value counts when the clause says what it is; a
   misconception voids the claim it pairs with. */
Test(grader, a_schema1_rubric_is_graded_by_the_same_rules) {
    static const char rubric[] =
        "{\"lab\": \"labT\", \"question\": \"MT\", \"rubric_version\": \"t1\","
        " \"max\": {\"main\": 2, \"followup\": 0},"
        " \"seed_items\": {\"S1\": \"layout 1.5\", \"S2\": \"evidence 0.5\"},"
        " \"sections\": [{\"id\": \"S1\", \"part\": \"main\", \"title\": \"Layout\"},"
        "               {\"id\": \"S2\", \"part\": \"main\", \"title\": \"Evidence\"}],"
        " \"concepts\": {\"TP\": {\"en\": [\"tp\", \"tensor parallel*\"]},"
        "               \"ADJ\": {\"en\": [\"adjacent\", \"neighbouring\"]},"
        "               \"NAME\": {\"en\": [\"by name\", \"tensor name*\"]},"
        "               \"MATCH\": {\"en\": [\"match*\", \"pair*\"]},"
        "               \"GROUP\": {\"en\": [\"group*\"]}},"
        " \"predictions\": [],"
        " \"points\": [{\"id\": \"S1.adjacent\", \"section\": \"S1\", \"points\": 1.5,"
        "               \"patterns\": [{\"all\": [\"TP\", \"ADJ\"], \"window\": 10}]}],"
        " \"evidence\": [{\"id\": \"S2.evidence\", \"section\": \"S2\", \"points\": 0.5,"
        "                 \"per_value\": 0.5, \"facts\": \"facts\", \"ignore_numbers\": [0, 1]}],"
        " \"misconceptions\": [{\"id\": \"MC_NAME\", \"title\": \"matched by name\","
        "   \"penalty\": 0.5, \"sections\": [\"S1\", \"S2\"], \"pairs_with\": [\"S1.adjacent\"],"
        "   \"patterns\": [{\"all\": [\"MATCH\", \"NAME\"], \"window\": 8}]}]}";
    spit(in_dir("rubric.json"), rubric, sizeof rubric - 1);
    make_results_v2(NULL);
    const char *head = "# labT\n<!-- nonce: abc123 ; probe_rank: 3 ; followup: F2 -->\n";
    char text[2048];

    snprintf(text, sizeof text, "%s### S1 Layout\nTP ranks are adjacent in the default order.\n"
             "### S2 Evidence\nThe TP group of rank 3 was [2,3] in this run.\n", head);
    graded g = grade_text(text);
    cr_assert_eq(g.rc, 0, "%s", g.out);
    cr_expect_float_eq(score(&g, "S1.adjacent"), 1.5, 1e-9, "%s", g.out);
    cr_expect_float_eq(score(&g, "S2.evidence"), 0.5, 1e-9, "%s", g.out);
    release(&g);

    snprintf(text, sizeof text, "%s### S1 Layout\nIt is not true that TP ranks are adjacent.\n"
             "### S2 Evidence\n[2,3] [0,1] 7 6\n", head);
    g = grade_text(text);
    cr_assert_eq(g.rc, 0, "%s", g.out);
    cr_expect_float_eq(score(&g, "S1.adjacent"), 0.0, 1e-9, "a denied claim: %s", g.out);
    cr_expect_float_eq(score(&g, "S2.evidence"), 0.0, 1e-9, "a dump of values: %s", g.out);
    release(&g);

    /* a measured value inside a denied statement is not evidence; stated, it is */
    snprintf(text, sizeof text, "%s### S2 Evidence\nIt is a myth that changing the TP group from "
             "0.75 to 10.0 keeps every shape.\n", head);
    g = grade_text(text);
    cr_assert_eq(g.rc, 0, "%s", g.out);
    cr_expect_float_eq(score(&g, "S2.evidence"), 0.0, 1e-9, "a denied value: %s", g.out);
    release(&g);
    snprintf(text, sizeof text, "%s### S2 Evidence\nThe TP group of rank 3 hung after 0.75 s in this "
             "run.\n", head);
    g = grade_text(text);
    cr_expect_float_eq(score(&g, "S2.evidence"), 0.5, 1e-9, "a stated value: %s", g.out);
    release(&g);

    snprintf(text, sizeof text, "%s### S1 Layout\nTP ranks are adjacent. Calls are matched by "
             "the tensor name, not by their order.\n", head);
    g = grade_text(text);
    cr_assert_eq(g.rc, 0, "%s", g.out);
    cr_expect(item(&g, "MC_NAME")->fired, "%s", g.out);
    cr_expect_float_eq(score(&g, "S1.adjacent"), 0.0, 1e-9, "voided by MC_NAME: %s", g.out);
    release(&g);
}

Test(grader, a_double_negation_needs_the_negation_inside_the_frame) {
    /* "it is false that" is a denial frame, not also a negator of what it frames */
    EXPECT_GRADE(S1("It is false that the TP ranks are adjacent in this layout."), "S.tp_adj", 0.0);
    EXPECT_GRADE(S1("It is false that the TP ranks are not adjacent in this layout."),
                 "S.tp_adj", 1.0);
    /* a frame in one sentence and a negation in the next are two denials of two things, not a
       double negation of one */
    graded k = grade_sheet(S1("It is false that we consider the TP groups. Their members are not "
                              "neighbouring ranks."));
    EXPECT_SCORE(k, "S.tp_adj", 0.0);
    release(&k);
    graded m = grade_sheet(S1("Consider the TP groups. It is false that their members are not "
                              "neighbouring ranks."));
    EXPECT_SCORE(m, "S.tp_adj", 1.0);
    release(&m);
}

/* ---------------------------------------------------------------------------------------------
   evidence that quotes a version, a commit, a count or a text of the run, and misconceptions
   that apply only where a measured fact holds ("when") */

/* The unit rubric with four bindings of the new kinds in item E, their quantities, a number
   binding to read scientific notation, and a misconception that applies only where
   facts.fp8 is "absent"; the unit results with the facts they read. */
static void make_version_rubric(const char *fp8_level) {
    char *text = slurp(in_dir("rubric.json"));
    cJSON *r = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(r);
    cJSON *items = cJSON_GetObjectItemCaseSensitive(r, "items"), *it;
    cJSON_ArrayForEach(it, items) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(it, "id")->valuestring, "E") != 0) continue;
        cJSON *ev = cJSON_GetObjectItemCaseSensitive(it, "evidence");
        const char *add[] = {
            "{\"id\":\"mpi\",\"type\":\"version\",\"quantity\":\"QMPI\",\"path\":\"facts.mpi\","
            "\"paths\":[\"facts.mpi_standard\"],\"points\":0.25,\"need\":\"the MPI version\"}",
            "{\"id\":\"commit\",\"type\":\"commit\",\"quantity\":\"QCOMMIT\",\"path\":"
            "\"facts.commit\",\"points\":0.25,\"need\":\"the commit\"}",
            "{\"id\":\"gpus\",\"type\":\"count\",\"quantity\":\"QGPU\",\"path\":\"facts.gpus\","
            "\"points\":0.25,\"need\":\"the GPU count\"}",
            "{\"id\":\"cpu\",\"type\":\"text\",\"quantity\":\"QCPU\",\"path\":\"facts.cpu\","
            "\"points\":0.25,\"need\":\"the CPU model\"}",
            "{\"id\":\"diff\",\"type\":\"number\",\"quantity\":\"QDIFF\",\"path\":\"facts.diff\","
            "\"points\":0.25,\"need\":\"the relative difference\"}"};
        for (size_t i = 0; i < sizeof add / sizeof add[0]; i++)
            cJSON_AddItemToArray(ev, cJSON_Parse(add[i]));
    }
    cJSON *lx = cJSON_GetObjectItemCaseSensitive(r, "lexicon");
    cJSON_AddItemToObject(lx, "QMPI", cJSON_Parse("{\"en\":[\"open mpi\",\"mpi\"],\"zh\":[]}"));
    cJSON_AddItemToObject(lx, "QCOMMIT", cJSON_Parse("{\"en\":[\"commit\"],\"zh\":[\"提交\"]}"));
    cJSON_AddItemToObject(lx, "QGPU", cJSON_Parse("{\"en\":[\"gpu*\"],\"zh\":[]}"));
    cJSON_AddItemToObject(lx, "QCPU", cJSON_Parse("{\"en\":[\"cpu*\"],\"zh\":[]}"));
    cJSON_AddItemToObject(lx, "QDIFF", cJSON_Parse("{\"en\":[\"relative difference\"],\"zh\":[]}"));
    cJSON_AddItemToObject(lx, "FP8W", cJSON_Parse("{\"en\":[\"fp8\"],\"zh\":[]}"));
    cJSON_AddItemToObject(lx, "RANW", cJSON_Parse("{\"en\":[\"ran\"],\"zh\":[]}"));
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(r, "misconceptions"),
                         cJSON_Parse("{\"id\":\"MX_FP8\",\"item\":\"E\",\"penalty\":1.0,"
                                     "\"title\":\"claims FP8 ran\",\"relations\":[{\"all\":"
                                     "[\"FP8W\",\"RANW\"]}],\"when\":{\"path\":\"facts.fp8\","
                                     "\"in\":[\"absent\",\"not_built\"]},\"feedback\":\"FP8 is "
                                     "not in this build.\",\"citation\":\"unit test\"}"));
    write_json(in_dir("rubric.json"), r);

    text = slurp(in_dir("results.json"));
    cJSON *res = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(res);
    cJSON *facts = cJSON_GetObjectItemCaseSensitive(res, "facts");
    cJSON_AddStringToObject(facts, "mpi", "Open MPI v4.1.4, package: Debian OpenMPI");
    cJSON_AddStringToObject(facts, "mpi_standard", "3.1");
    cJSON_AddStringToObject(facts, "commit", "8704574651b82f10b1f5ee5002ef92815220710b");
    cJSON_AddNumberToObject(facts, "gpus", 0);
    cJSON_AddStringToObject(facts, "cpu", "AMD EPYC");
    cJSON_AddNumberToObject(facts, "diff", 3.832433802419795e-09);
    cJSON_AddStringToObject(facts, "fp8", fp8_level);
    write_json(in_dir("results.json"), res);
}

Test(grader, a_version_counts_beside_its_name_and_only_when_measured) {
    make_version_rubric("absent");
    graded g = grade_sheet(EV("This run used Open MPI 4.1.4 on 4 ranks."));
    EXPECT_SCORE(g, "E.mpi", 0.25);
    cr_expect(mc_test_contains(why(&g, "E.mpi"), "verified"), "%s", why(&g, "E.mpi"));
    release(&g);
    graded h = grade_sheet(EV("This run used Open MPI 4.1.5 on 4 ranks."));
    EXPECT_SCORE(h, "E.mpi", 0.0);
    cr_expect(mc_test_contains(why(&h, "E.mpi"), "4.1.5 is not"), "%s", why(&h, "E.mpi"));
    release(&h);
    /* the right number, but not said to be the MPI version; a further path (the standard) */
    EXPECT_GRADE(EV("Version 4.1.4 is what this run printed for the build."), "E.mpi", 0.0);
    EXPECT_GRADE(EV("The MPI standard of this run is MPI 3.1."), "E.mpi", 0.25);
}

Test(grader, a_commit_counts_as_a_prefix_of_the_measured_one) {
    make_version_rubric("absent");
    EXPECT_GRADE(EV("This binary was built from commit 8704574 of the repository."),
                 "E.commit", 0.25);
    graded h = grade_sheet(EV("This binary was built from commit 4e45e84 of the repository."));
    EXPECT_SCORE(h, "E.commit", 0.0);
    cr_expect(mc_test_contains(why(&h, "E.commit"), "4e45e84 is not"), "%s", why(&h, "E.commit"));
    release(&h);
    EXPECT_GRADE(EV("This binary was built from commit unknown of the repository."),
                 "E.commit", 0.0); /* measured a commit, not "unknown" */
}

Test(grader, a_count_reads_no_as_zero_and_a_text_needs_its_name) {
    make_version_rubric("absent");
    graded g = grade_sheet(EV("This run had no GPU at all; the CPU is an AMD EPYC."));
    EXPECT_SCORE(g, "E.gpus", 0.25);
    EXPECT_SCORE(g, "E.cpu", 0.25);
    release(&g);
    graded h = grade_sheet(EV("This run used 2 GPUs; the machine is an AMD EPYC."));
    EXPECT_SCORE(h, "E.gpus", 0.0);   /* measured 0 */
    EXPECT_SCORE(h, "E.cpu", 0.0);    /* the model without the word CPU */
    release(&h);
    EXPECT_GRADE(EV("This run used 0 GPUs."), "E.gpus", 0.25);
    /* denied, the values state nothing */
    graded m = grade_sheet(EV("It is not true that this run had no GPU and an AMD EPYC CPU."));
    EXPECT_SCORE(m, "E.gpus", 0.0);
    EXPECT_SCORE(m, "E.cpu", 0.0);
    release(&m);
}

Test(grader, scientific_notation_is_a_value_with_its_decimals) {
    make_version_rubric("absent");
    EXPECT_GRADE(EV("The relative difference was 3.8e-09 in this run."), "E.diff", 0.25);
    EXPECT_GRADE(EV("The relative difference was 4.8e-09 in this run."), "E.diff", 0.0);
}

Test(grader, a_misconception_with_when_applies_only_where_the_fact_holds) {
    make_version_rubric("absent");
    graded g = grade_sheet(EV("In this run FP8 ran on every rank and was fast."));
    cr_expect(item(&g, "MX_FP8")->fired, "%s", g.out);
    release(&g);
    make_rubric(NULL);
    make_results("0000000000000000", 1, NULL);
    make_version_rubric("measured");
    graded h = grade_sheet(EV("In this run FP8 ran on every rank and was fast."));
    cr_expect(!item(&h, "MX_FP8")->fired, "%s", h.out);
    cr_expect(mc_test_contains(why(&h, "MX_FP8"), "not applicable in this run (facts.fp8"), "%s",
              why(&h, "MX_FP8"));
    release(&h);
}

Test(grader, a_when_without_a_path_or_a_test_is_a_rubric_error) {
    make_version_rubric("absent");
    char *text = slurp(in_dir("rubric.json"));
    char *at = strstr(text, "\"in\":[\"absent\",\"not_built\"]");
    cr_assert_not_null(at, "%s", text);
    memcpy(at, "\"xx\"", 4);   /* "in" -> "xx": no test left */
    spit(in_dir("rubric.json"), text, strlen(text));
    free(text);
    graded g = grade_text(EV("In this run FP8 ran on every rank."));
    cr_expect_neq(g.rc, 0, "%s", g.out);
    release(&g);
}

/* ---------------------------------------------------------------------------------------------
   the shipped rubrics */

/* The copy check reads the template's headings and comments as the prompt a sheet must not
   restate; a rubric without its template would let every restated comment earn claims. */
Test(grader, every_lab_rubric_names_its_answer_template) {
    for (int lab = 1; lab <= 12; lab++) {
        char path[PATH_MAX + 64], tmpl[2 * PATH_MAX + 96];
        snprintf(path, sizeof path, "%s/labs/rubric/lab%02d.json", repo_root(), lab);
        cJSON *r = mc_test_json_load(path);
        cr_assert_not_null(r, "%s cannot be read or parsed", path);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(r, "template");
        cr_expect(cJSON_IsString(t), "%s has no \"template\"", path);
        if (cJSON_IsString(t)) {
            snprintf(tmpl, sizeof tmpl, "%s/labs/rubric/%s", repo_root(), t->valuestring);
            char want[64];
            snprintf(want, sizeof want, "templates/lab%02d.md", lab);
            cr_expect(access(tmpl, R_OK) == 0, "%s: template %s is not readable", path, tmpl);
            cr_expect(mc_test_contains(t->valuestring, want), "%s: template %s is not %s", path,
                      t->valuestring, want);
        }
        cJSON_Delete(r);
    }
}
