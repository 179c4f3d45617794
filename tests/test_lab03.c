/* tests/test_lab03.c - lab03 and the lab harness (labs/lab_common.c).

   The harness functions are linked in and tested directly (argument parsing, nonce derivation,
   the atomic JSON writer). lab03 itself runs as a program: --init and --grade-only as a single
   process, the experiment under mpirun through mc_test_mpirun (never under Criterion's own
   process). The expected groups are Megatron's world-8 TP=2 PP=2 layout from
   reference/grading_design.md D.1: rank = tp + 2 dp + 4 pp. The driver itself (envelope, exit
   codes, refusals) is tested in test_lab_driver.c. */
#include <criterion/criterion.h>

#include <limits.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "labs/lab_common.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)

LS_LAB_SUITE(lab03, OUT_CAP, 0);

/* ---------------------------------------------------------------------------------------------
   helpers */

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

/* The last non-empty line of the output, without its newline. */
static void last_line(const char *text, char *line, size_t cap) {
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) n--;
    size_t start = n;
    while (start > 0 && text[start - 1] != '\n') start--;
    snprintf(line, cap, "%.*s", (int)(n - start), text + start);
}

/* Compares a JSON list of lists with the expected groups, written as "[[0,1],[2,3]]". */
static void assert_groups(const cJSON *doc, const char *key, const char *expected) {
    cJSON *want = cJSON_Parse(expected);
    cr_assert_not_null(want);
    char *have = cJSON_PrintUnformatted(ls_get(doc, key));
    char *w = cJSON_PrintUnformatted(want);
    cr_expect_str_eq(have, w, "%s: measured %s, expected %s", key, have, w);
    free(have);
    free(w);
    cJSON_Delete(want);
}

static int is_outcome(const char *s) {
    return s != NULL && (strcmp(s, "ok") == 0 || strcmp(s, "hang") == 0 ||
                         strcmp(s, "wrong_membership") == 0 || strcmp(s, "error") == 0);
}

/* Reads the header of an answer sheet written by --init. */
static int read_header(const char *path, char nonce[8], int *probe, char variant[8]) {
    char *text = ls_read_file(path);
    if (text == NULL) return -1;
    const char *h = strstr(text, "<!-- nonce: ");
    int got = h != NULL && sscanf(h, "<!-- nonce: %6[0-9a-f] ; probe_rank: %d ; followup: %7s",
                                  nonce, probe, variant) == 3;
    free(text);
    return got ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------
   harness: arguments */

Test(lab03, parse_args_reads_sizes_paths_and_switches) {
    char *argv[] = {"lab03", "--tp", "4", "--pp=2", "--cp", "2", "--order", "tp-pp-dp",
                    "--answers", "a.md", "--timeout", "2.5", "--no-timing", "--json", NULL};
    lab_args a;
    char err[256];
    cr_assert_eq(lab_parse_args(14, argv, "lab03", &a, err, sizeof err), 0, "%s", err);
    cr_expect_eq(a.tp, 4);
    cr_expect_eq(a.pp, 2);
    cr_expect_eq(a.cp, 2);
    cr_expect_eq(a.ep, 0, "unset sizes stay 0 (the lab's default)");
    cr_expect_str_eq(a.order, "tp-pp-dp");
    cr_expect_str_eq(a.answers_path, "a.md");
    cr_expect_str_eq(a.results_path, "results/lab03.json");
    cr_expect_str_eq(a.rubric_path, "labs/rubric/lab03.json");
    cr_expect_float_eq(a.timeout_s, 2.5, 1e-12);
    cr_expect_eq(a.timing, 0);
    cr_expect_eq(a.json, 1);
    cr_expect_eq(a.init, 0);
}

Test(lab03, parse_args_rejects_bad_input_with_a_reason) {
    struct {
        int argc;
        char *argv[4];
        const char *reason;
    } cases[] = {
        {2, {"lab03", "--tpp", NULL}, "unknown flag '--tpp'"},
        {3, {"lab03", "--tp", "0", NULL}, "--tp needs a positive integer, got '0'"},
        {3, {"lab03", "--pp", "x", NULL}, "--pp needs a positive integer, got 'x'"},
        {2, {"lab03", "--answers", NULL}, "--answers needs a value"},
        {3, {"lab03", "--timeout", "-1", NULL}, "--timeout needs seconds > 0"},
        {3, {"lab03", "--backend", "gloo", NULL}, "--backend must be"},
        {3, {"lab03", "--init", "--grade-only", NULL}, "cannot be combined"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lab_args a;
        char err[256];
        int rc = lab_parse_args(cases[i].argc, cases[i].argv, "lab03", &a, err, sizeof err);
        cr_expect_eq(rc, LAB_EXIT_USAGE, "case %zu accepted", i);
        cr_expect(strstr(err, cases[i].reason) != NULL, "case %zu: got '%s', want '%s'", i, err,
                  cases[i].reason);
    }
}

Test(lab03, grade_path_sits_next_to_the_results) {
    char p[256];
    lab_grade_path_from_results("results/lab03.json", p, sizeof p);
    cr_expect_str_eq(p, "results/lab03.grade.json");
    lab_grade_path_from_results("/tmp/x/out", p, sizeof p);
    cr_expect_str_eq(p, "/tmp/x/out.grade.json");
}

/* ---------------------------------------------------------------------------------------------
   harness: nonce */

Test(lab03, nonce_hash_is_fnv1a) {
    /* Published FNV-1a 32-bit test vectors. */
    cr_expect_eq(lab_nonce_hash(""), 0x811c9dc5u);
    cr_expect_eq(lab_nonce_hash("a"), 0xe40c292cu);
    cr_expect_eq(lab_nonce_hash("foobar"), 0xbf9cf968u);
    cr_expect_eq(lab_nonce_hash("7F3A91"), lab_nonce_hash("7f3a91"), "hex case must not matter");
}

Test(lab03, nonce_derivation_covers_every_probe_and_variant) {
    int probe_seen[8] = {0}, variant_seen[4] = {0};
    for (int i = 0; i < 4096; i++) {
        char nonce[8];
        snprintf(nonce, sizeof nonce, "%06x", (unsigned)(i * 2654435761u) & 0xffffffu);
        cr_assert(lab_nonce_valid(nonce));
        int p = lab_nonce_probe_rank(nonce, 8), v = lab_nonce_variant(nonce, 3);
        cr_assert(p >= 0 && p < 8 && v >= 1 && v <= 3, "nonce %s -> probe %d variant %d", nonce,
                  p, v);
        cr_assert_eq(p, (int)(lab_nonce_hash(nonce) % 8u));
        cr_assert_eq(lab_probe_in_world(p, 4), p % 4);
        cr_assert_eq(lab_probe_in_world(p, 16), p, "a larger world keeps the probe");
        probe_seen[p]++;
        variant_seen[v]++;
    }
    for (int p = 0; p < 8; p++) cr_expect(probe_seen[p] > 256, "probe %d rarely drawn", p);
    for (int v = 1; v <= 3; v++) cr_expect(variant_seen[v] > 800, "F%d rarely drawn", v);
    cr_expect_not(lab_nonce_valid("7f3a9"));
    cr_expect_not(lab_nonce_valid("7f3a9g"));
}

Test(lab03, fresh_nonces_differ) {
    char a[8], b[8];
    cr_assert_eq(lab_nonce_new(a), 0);
    cr_assert_eq(lab_nonce_new(b), 0);
    cr_expect(lab_nonce_valid(a) && lab_nonce_valid(b));
    /* 1 in 16.7 million to collide by chance */
    cr_expect_str_neq(a, b);
}

/* ---------------------------------------------------------------------------------------------
   harness: results writer */

Test(lab03, json_writer_creates_the_directory_and_leaves_no_temp_file) {
    char path[256];
    tmp_path(path, sizeof path, "deep/er/r.json");
    cJSON *doc = lab_results_new("lab03", "M003", "lab03-v1");
    int groups[] = {0, 1, 2, 3}, offsets[] = {0, 2}, sizes[] = {2, 2};
    cJSON_AddItemToObject(doc, "g", lab_json_groups(groups, offsets, sizes, 2));
    cr_assert_eq(lab_json_write_atomic(doc, path), 0);
    cJSON_Delete(doc);
    cJSON *back = ls_load_json(path);
    cr_expect_str_eq(ls_get(back, "lab")->valuestring, "lab03");
    cr_expect_str_eq(ls_get(back, "megatron_c_version")->valuestring, mc_version_string());
    assert_groups(back, "g", "[[0,1],[2,3]]");
    cJSON_Delete(back);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ls '%s/deep/er' | grep -c tmp", tmp_dir);
    cr_expect_neq(mc_test_run(cmd, 10, out, OUT_CAP), 0, "a temp file was left: %s", out);
}

/* ---------------------------------------------------------------------------------------------
   ./lab03 as a single process */

Test(lab03, help_and_unknown_flags, .timeout = 30) {
    cr_expect_eq(mc_test_run("./lab03 --help", 20, out, OUT_CAP), 0, "%s", out);
    cr_expect(mc_test_contains(out, "--grade-only"), "%s", out);
    cr_expect_eq(mc_test_run("./lab03 --tpp 2", 20, out, OUT_CAP), LAB_EXIT_USAGE, "%s", out);
    cr_expect(mc_test_contains(out, "unknown flag '--tpp'"), "%s", out);
    cr_expect(mc_test_contains(out, "usage:"), "%s", out);
}

Test(lab03, init_writes_the_template_and_refuses_to_overwrite_answers, .timeout = 60) {
    char sheet[256], cmd[1024];
    tmp_path(sheet, sizeof sheet, "answers/lab03.md");
    snprintf(cmd, sizeof cmd, "./lab03 --init --answers '%s'", sheet);
    cr_assert_eq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "%s", out);

    char *text = ls_read_file(sheet);
    cr_assert_not_null(text, "--init wrote nothing: %s", out);
    const char *title = "# lab03 — M003 initialize_model_parallel\n";
    cr_expect(strncmp(text, title, strlen(title)) == 0, "first line: %.60s", text);
    cr_expect(mc_test_contains(text, "## Predictions (main)"));
    cr_expect(mc_test_contains(text, "```pred"));
    char nonce[8], variant[8];
    int probe = -1;
    cr_assert_eq(read_header(sheet, nonce, &probe, variant), 0, "no header in:\n%s", text);
    cr_expect_eq(probe, lab_nonce_probe_rank(nonce, 8), "header probe must follow the nonce");
    char want_variant[8];
    snprintf(want_variant, sizeof want_variant, "F%d", lab_nonce_variant(nonce, 3));
    cr_expect_str_eq(variant, want_variant);
    cr_expect(mc_test_contains(out, nonce), "the nonce is announced: %s", out);

    /* Fill in one prediction (the whole dp_size line becomes "dp_size: 2"): the sheet now
       holds answers and --init must leave it alone. */
    char *dp = strstr(text, "dp_size:");
    cr_assert_not_null(dp, "template has no dp_size line");
    size_t head = (size_t)(dp - text);
    char *filled = calloc(1, strlen(text) + 16);
    memcpy(filled, text, head);
    strcat(filled, "dp_size: 2");
    strcat(filled, dp + strcspn(dp, "\n"));
    ls_write_file(sheet, filled);
    cr_expect_neq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "--init overwrote answers: %s", out);
    cr_expect(mc_test_contains(out, "--force"), "the refusal says how to override: %s", out);
    char *after = ls_read_file(sheet);
    cr_expect_str_eq(after, filled, "the sheet changed although --init refused");

    snprintf(cmd, sizeof cmd, "./lab03 --init --force --answers '%s'", sheet);
    cr_expect_eq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "%s", out);
    char *forced = ls_read_file(sheet);
    cr_expect(forced != NULL && strstr(forced, "dp_size: 2") == NULL,
              "--force should write a fresh template");
    free(text);
    free(filled);
    free(after);
    free(forced);
}

Test(lab03, grade_only_without_results_says_what_to_run, .timeout = 30) {
    char sheet[256], res[256], cmd[1024];
    tmp_path(sheet, sizeof sheet, "a.md");
    tmp_path(res, sizeof res, "none.json");
    snprintf(cmd, sizeof cmd, "./lab03 --init --answers '%s' && ./lab03 --grade-only "
             "--answers '%s' --results '%s'", sheet, sheet, res);
    cr_expect_neq(mc_test_run(cmd, 20, out, OUT_CAP), 0, "%s", out);
    cr_expect(mc_test_contains(out, "none.json"), "the message names the missing file: %s", out);
}

/* ---------------------------------------------------------------------------------------------
   the facts of the getters, the model, destroy and Experiment D (world 8, TP=2, PP=2) */

static int member_sum(const cJSON *list) {
    int sum = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, list) sum += m->valueint;
    return sum;
}

/* The probe's group of kind "tp", "dp" or "pp" as "[a,b]" (rank = tp + 2 dp + 4 pp). */
static void group_of(const char *kind, int p, char *out, size_t cap) {
    int a = strcmp(kind, "tp") == 0 ? p - p % 2 : strcmp(kind, "dp") == 0 ? p % 2 + 4 * (p / 4)
                                                                           : p % 4;
    int stride = strcmp(kind, "tp") == 0 ? 1 : strcmp(kind, "dp") == 0 ? 2 : 4;
    snprintf(out, cap, "[%d,%d]", a, a + stride);
}

static void expect_list(const cJSON *doc, const char *key, const char *want) {
    char *have = cJSON_PrintUnformatted(ls_get(doc, key));
    cr_expect_str_eq(have, want, "%s: %s, expected %s", key, have, want);
    free(have);
}

static void check_getters(const cJSON *doc, int p) {
    char want[32];
    cr_expect_eq(ls_get(doc, "facts.getters.rank")->valueint, p);
    cr_expect_eq(ls_get(doc, "facts.getters.group_rank.tp")->valueint, p % 2);
    cr_expect_eq(ls_get(doc, "facts.getters.group_rank.dp")->valueint, (p / 2) % 2);
    cr_expect_eq(ls_get(doc, "facts.getters.group_rank.pp")->valueint, p / 4);
    cr_expect_eq(ls_get(doc, "facts.getters.group_size.mp")->valueint, 4);
    cr_expect_eq(ls_get(doc, "facts.getters.src_rank.tp")->valueint, p - p % 2);
    cr_expect_eq(ls_get(doc, "facts.getters.src_rank.pp")->valueint, p % 4);
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.getters.is_last_stage")), p >= 4);
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.getters.is_first_stage")), p < 4);
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.getters.in_embedding_group")));
    group_of("pp", p, want, sizeof want);
    expect_list(doc, "facts.getters.embedding_group", want);
    snprintf(want, sizeof want, "[%d,%d,%d,%d]", (p / 2 % 2) * 2, (p / 2 % 2) * 2 + 1,
             (p / 2 % 2) * 2 + 4, (p / 2 % 2) * 2 + 5);
    expect_list(doc, "facts.getters.mp_group", want);
    /* the position embedding lives on the first stage only */
    cJSON *pos = ls_get(doc, "facts.getters.position_embedding_group");
    cr_expect_eq(cJSON_IsNull(pos), p >= 4, "position_embedding_group of rank %d", p);
}

static void check_model_shards(const cJSON *doc, int p) {
    cr_assert(cJSON_IsTrue(ls_get(doc, "facts.model_shards.built")));
    cr_expect_eq(ls_get(doc, "facts.model_shards.config.num_layers")->valueint, 2);
    char want[16];
    snprintf(want, sizeof want, "[%d]", p / 4);   /* one layer per pipeline stage */
    expect_list(doc, "facts.model_shards.probe.layers", want);
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.model_shards.probe.pre_process")), p < 4);
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.model_shards.probe.post_process")), p >= 4);
    expect_list(doc, "facts.model_shards.layer_holders", "[4,4]");
    cJSON *params = ls_get(doc, "facts.model_shards.probe.params");
    cr_expect(cJSON_GetArraySize(params) >= 4, "too few shapes");
    const cJSON *e;
    int split = 0;
    cJSON_ArrayForEach(e, params) {
        const cJSON *dim = ls_get(e, "partition_dim");
        const cJSON *g = ls_get(e, "global_shape"), *l = ls_get(e, "local_shape");
        for (int d = 0; d < 2; d++) {
            int gd = cJSON_GetArrayItem(g, d)->valueint, ld = cJSON_GetArrayItem(l, d)->valueint;
            int is_split = cJSON_IsNumber(dim) && dim->valueint == d;
            cr_expect_eq(ld * (is_split ? 2 : 1), gd, "%s dim %d: local %d global %d",
                         ls_get(e, "name")->valuestring, d, ld, gd);
            split += is_split;
        }
    }
    cr_expect(split >= 3, "the layer's weights are split over TP");
    cr_expect(cJSON_IsFalse(ls_get(doc, "facts.model_shards.parallel_state_allocates_params")));
    double ps = ls_get(doc, "facts.model_shards.parallel_state_heap_bytes")->valuedouble;
    double params_bytes =
        ls_get(doc, "facts.model_shards.param_bytes_after_model_init")->valuedouble;
    cr_expect(ps > 0 && ps < params_bytes, "parallel state %g bytes, parameters %g", ps,
              params_bytes);
    cr_expect_eq(ls_get(doc, "facts.model_shards.param_bytes_before_model_init")->valueint, 0);
}

static void check_destroy(const cJSON *doc, int p) {
    cr_expect_eq(ls_get(doc, "facts.destroy.rank")->valueint, p);
    int held = ls_get(doc, "facts.destroy.groups_held")->valueint;
    cr_expect_eq(ls_get(doc, "facts.destroy.groups_destroyed")->valueint, held);
    cr_expect_eq(held, p < 4 ? 16 : 15, "rank %d: position_embedding only on the first stage", p);
    cJSON *order = ls_get(doc, "facts.destroy.order");
    cr_assert_eq(cJSON_GetArraySize(order), held);
    cr_expect_str_eq(cJSON_GetArrayItem(order, 0)->valuestring, "expert_dp");
    cr_expect_str_eq(cJSON_GetArrayItem(order, held - 1)->valuestring, "dp_cp");
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.destroy.reverse_of_creation")));
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.destroy.all_handles_released")));
    cr_expect(ls_get(doc, "facts.destroy.heap_bytes_released")->valuedouble ==
              ls_get(doc, "facts.model_shards.parallel_state_heap_bytes")->valuedouble);
}

/* Experiment D for one variant: the kinds it swaps on the probe rank, and the outcomes. */
static void check_exp_d(const cJSON *doc, const char *variant, int p) {
    static const char *const kinds[3][2] = {{"tp", "dp"}, {"dp", "pp"}, {"tp", "pp"}};
    const char *const *k = kinds[variant[1] - '1'];
    cr_expect_str_eq(ls_get(doc, "facts.exp_d.variant")->valuestring, variant);
    cr_expect_eq(ls_get(doc, "facts.exp_d.swap_rank")->valueint, p);
    cJSON *ks = ls_get(doc, "facts.exp_d.kinds");
    cr_expect_str_eq(cJSON_GetArrayItem(ks, 0)->valuestring, k[0]);
    cr_expect_str_eq(cJSON_GetArrayItem(ks, 1)->valuestring, k[1]);
    char lists[2][32];
    for (int i = 0; i < 2; i++) {
        group_of(k[i], p, lists[i], sizeof lists[i]);
        char key[64];
        snprintf(key, sizeof key, "facts.exp_d.groups.%d", i);
        char *have =
            cJSON_PrintUnformatted(cJSON_GetArrayItem(ls_get(doc, "facts.exp_d.groups"), i));
        cr_expect_str_eq(have, lists[i], "%s", key);
        free(have);
    }
    cJSON *calls = ls_get(doc, "facts.exp_d.swapped_calls");
    int c0 = cJSON_GetArrayItem(calls, 0)->valueint, c1 = cJSON_GetArrayItem(calls, 1)->valueint;
    cr_expect(c0 >= 0 && c1 >= 0 && c0 != c1, "swapped calls %d %d", c0, c1);

    /* paired by position: every call succeeds and the probe's two sums are swapped */
    cr_expect_str_eq(ls_get(doc, "facts.exp_d.unverified.outcome")->valuestring,
                     "silent_wrong_result");
    cr_expect(cJSON_IsFalse(ls_get(doc, "facts.exp_d.unverified.any_call_failed")));
    cJSON *wrong = ls_get(doc, "facts.exp_d.unverified.wrong");
    cr_assert_eq(cJSON_GetArraySize(wrong), 2, "%s",
                 ls_get(doc, "facts.exp_d.unverified.detail")->valuestring);
    cJSON *groups = ls_get(doc, "facts.exp_d.groups");
    int sums[2] = {member_sum(cJSON_GetArrayItem(groups, 0)),
                   member_sum(cJSON_GetArrayItem(groups, 1))};
    const cJSON *w;
    int seen = 0;
    cJSON_ArrayForEach(w, wrong) {
        cr_expect_eq(ls_get(w, "rank")->valueint, p, "only the swapping rank sums wrong");
        int which = strcmp(ls_get(w, "kind")->valuestring, k[0]) == 0 ? 0 : 1;
        cr_expect_str_eq(ls_get(w, "kind")->valuestring, k[which]);
        cr_expect_eq(ls_get(w, "expected")->valueint, sums[which]);
        cr_expect_eq(ls_get(w, "got")->valueint, sums[1 - which], "%s got the other group's sum",
                     k[which]);
        seen |= 1 << which;
    }
    cr_expect_eq(seen, 3, "both kinds are listed");

    /* with the member-list check: an error at the first swapped call, naming both lists */
    cr_expect_str_eq(ls_get(doc, "facts.exp_d.verified.outcome")->valuestring, "error");
    cr_expect_str_eq(ls_get(doc, "facts.exp_d.verified.status")->valuestring,
                     "MC_ERR_PLAN_MISMATCH");
    cr_expect_eq(ls_get(doc, "facts.exp_d.verified.call_index")->valueint, c0 < c1 ? c0 : c1);
    const char *msg = ls_get(doc, "facts.exp_d.verified.message")->valuestring;
    cr_expect(mc_test_contains(msg, lists[0]) && mc_test_contains(msg, lists[1]),
              "the message names %s and %s: %s", lists[0], lists[1], msg);
    cr_expect(ls_get(doc, "facts.exp_d.verified.seconds")->valuedouble < 5.0);
}

/* ---------------------------------------------------------------------------------------------
   ./lab03 under mpirun */

Test(lab03, world8_default_run_records_the_contract, .timeout = 150) {
    char sheet[256], res[256], cmd[1024];
    tmp_path(sheet, sizeof sheet, "answers/lab03.md");   /* missing: the run writes it */
    tmp_path(res, sizeof res, "results/lab03.json");
    snprintf(cmd, sizeof cmd, "./lab03 --answers '%s' --results '%s'", sheet, res);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(8, cmd, 120, out, OUT_CAP);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "lab03 -np 8 exited %d:\n%s", rc, out);
    cr_log_info("lab03 -np 8 took %.1f s", secs);

    /* printed: the sections, the group table, the probe and the score table at the end */
    const char *sections[] = {"== A.", "== M.", "== B.", "== C.", "== Plan check",
                              "== Follow-up", "== D.", "== Destroy", "== Grading"};
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        cr_expect(mc_test_contains(out, sections[i]), "no section %s in:\n%s", sections[i], out);
    cr_expect(mc_test_contains(out, "[0,1] [2,3] [4,5] [6,7]"), "TP groups not printed:\n%s", out);
    cr_expect(mc_test_contains(out, "[0,4] [1,5] [2,6] [3,7]"), "PP groups not printed:\n%s", out);
    cr_expect(mc_test_contains(out, "does not exist: writing the template"), "%s", out);
    char line[256];
    last_line(out, line, sizeof line);
    cr_expect_str_eq(line, "Total 0.00/15", "the last line is the grader's total:\n%s", out);

    cJSON *doc = ls_load_json(res);
    cJSON *rubric = ls_load_json("labs/rubric/lab03.json");
    cr_expect_eq(ls_get(doc, "format")->valueint, 2);
    cr_expect_str_eq(ls_get(doc, "lab")->valuestring, "lab03");
    cr_expect_str_eq(ls_get(doc, "question")->valuestring, "M003");
    cr_expect_str_eq(ls_get(doc, "rubric_version")->valuestring,
                     ls_get(rubric, "rubric_version")->valuestring);
    cJSON_Delete(rubric);
    cr_expect_eq(ls_get(doc, "config.world")->valueint, 8);
    cr_expect_eq(ls_get(doc, "config.tp")->valueint, 2);
    cr_expect_eq(ls_get(doc, "config.pp")->valueint, 2);
    cr_expect_eq(ls_get(doc, "config.etp")->valueint, 2);
    cr_expect_str_eq(ls_get(doc, "config.order")->valuestring, "tp-cp-ep-dp-pp");
    cr_expect_str_eq(ls_get(doc, "config.backend")->valuestring, "mpi");
    cr_expect(strlen(ls_get(doc, "config.backend_reason")->valuestring) > 0);
    cr_expect(mc_test_contains(ls_get(doc, "config.mpi_library")->valuestring, "MPI"));

    /* nonce, probe and variant follow the sheet the run wrote */
    char nonce[8], variant[8];
    int header_probe = -1;
    cr_assert_eq(read_header(sheet, nonce, &header_probe, variant), 0);
    cr_expect_str_eq(ls_get(doc, "nonce")->valuestring, nonce);
    cr_expect_eq(ls_get(doc, "probe_rank")->valueint, header_probe);
    cr_expect_str_eq(ls_get(doc, "followup_variant")->valuestring, variant);
    cr_expect(cJSON_IsFalse(ls_get(doc, "predictions.present_at_run")), "empty template counted");
    cr_expect_eq(strlen(ls_get(doc, "predictions.hash")->valuestring), 16);
    cr_expect(strlen(ls_get(doc, "predictions.time")->valuestring) == 20);

    /* the measured layout (grading_design.md D.1) */
    cr_expect_eq(ls_get(doc, "facts.dp_size")->valueint, 2);
    assert_groups(doc, "facts.tp_groups", "[[0,1],[2,3],[4,5],[6,7]]");
    assert_groups(doc, "facts.dp_groups", "[[0,2],[1,3],[4,6],[5,7]]");
    assert_groups(doc, "facts.pp_groups", "[[0,4],[1,5],[2,6],[3,7]]");
    assert_groups(doc, "facts.mp_groups", "[[0,1,4,5],[2,3,6,7]]");
    assert_groups(doc, "facts.embedding_groups", "[[0,4],[1,5],[2,6],[3,7]]");
    assert_groups(doc, "facts.position_embedding_groups", "[[0],[1],[2],[3]]");
    assert_groups(doc, "facts.groups.tp_dp", "[[0,1,2,3],[4,5,6,7]]");
    assert_groups(doc, "facts.groups.cp", "[[0],[1],[2],[3],[4],[5],[6],[7]]");
    assert_groups(doc, "facts.groups.expert_dp", "[[0,2],[1,3],[4,6],[5,7]]");
    const char *kinds[] = {"tp", "pp", "dp", "dp_cp", "cp", "mp", "tp_dp", "tp_dp_cp", "tp_cp",
                           "embedding", "position_embedding", "ep", "expert_tp", "tp_ep",
                           "tp_ep_pp", "expert_dp"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char key[64];
        snprintf(key, sizeof key, "facts.groups.%s", kinds[i]);
        cr_expect(cJSON_IsArray(ls_get(doc, key)), "%s is not a list", key);
    }
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.membership_verified")));
    cr_expect_eq(ls_get(doc, "facts.groups_created")->valueint, 64);
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.creation_sequence_identical")));
    cJSON *seq = ls_get(doc, "facts.creation_sequence");
    cr_expect_str_eq(cJSON_GetArrayItem(seq, 0)->valuestring, "dp_cp");
    cr_expect_str_eq(cJSON_GetArrayItem(seq, 5)->valuestring, "pp");
    cr_expect_str_eq(cJSON_GetArrayItem(seq, 6)->valuestring, "embedding");

    /* the probe's coordinates agree with the rank formula tp + 2 dp + 4 pp */
    int probe = ls_get(doc, "facts.probe.rank")->valueint;
    cr_expect_eq(probe, header_probe);
    cr_expect_eq(ls_get(doc, "facts.probe.tp_rank")->valueint, probe % 2);
    cr_expect_eq(ls_get(doc, "facts.probe.dp_rank")->valueint, (probe / 2) % 2);
    cr_expect_eq(ls_get(doc, "facts.probe.pp_rank")->valueint, probe / 4);
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.probe.is_last_stage")), probe >= 4);
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.probe.in_embedding_group")));
    cJSON *emb = ls_get(doc, "facts.probe.embedding_group");
    cr_expect_eq(cJSON_GetArrayItem(emb, 0)->valueint, probe % 4);
    cr_expect_eq(cJSON_GetArrayItem(emb, 1)->valueint, probe % 4 + 4);

    /* B shows the bug, C does not, the plan check refuses */
    const char *b = ls_get(doc, "facts.exp_b.outcome")->valuestring;
    cr_expect(is_outcome(b), "exp_b.outcome '%s'", b);
    cr_expect_str_neq(b, "ok", "the only-members bug went unnoticed");
    cr_expect(cJSON_IsNumber(ls_get(doc, "facts.exp_b.call_index")));
    cr_expect(strlen(ls_get(doc, "facts.exp_b.detail")->valuestring) > 20);
    cr_expect_float_eq(ls_get(doc, "facts.exp_b.timeout_seconds")->valuedouble, 5.0, 1e-9);
    cr_expect_str_eq(ls_get(doc, "facts.exp_c.outcome")->valuestring, "ok");
    cr_expect_str_eq(ls_get(doc, "facts.plan_check.outcome")->valuestring, "error");
    cr_expect(mc_test_contains(ls_get(doc, "facts.plan_check.message")->valuestring, "differ"),
              "plan-check message: %s", ls_get(doc, "facts.plan_check.message")->valuestring);

    /* follow-up: the variant named in the header, built here when it is a world-8 variant */
    cr_expect_str_eq(ls_get(doc, "facts.followup.variant")->valuestring, variant);
    int fworld = ls_get(doc, "facts.followup.world")->valueint;
    cr_expect_eq(ls_get(doc, "facts.followup.probe_rank")->valueint, header_probe % fworld);
    cr_expect_eq(cJSON_IsTrue(ls_get(doc, "facts.followup.verified_on_communicators")),
                 fworld == 8);
    cr_expect(cJSON_IsBool(ls_get(doc, "facts.followup.order_accepted")));
    cr_expect(cJSON_IsArray(ls_get(doc, "facts.followup.groups.dp_cp")));
    cr_expect(cJSON_IsNumber(ls_get(doc, "facts.followup.probe.pp_rank")));
    check_exp_d(doc, variant, header_probe);

    cr_expect_eq(ls_get(doc, "facts.timing.allreduce_bytes")->valueint, 4 << 20);
    cr_expect(ls_get(doc, "facts.timing.tp_ms")->valuedouble > 0.0);
    check_getters(doc, probe);
    check_model_shards(doc, probe);
    check_destroy(doc, probe);
    cr_expect(cJSON_IsTrue(ls_get(doc, "run.all_checks_held")));
    cJSON_Delete(doc);

    /* --grade-only grades the same results again without mpirun */
    snprintf(cmd, sizeof cmd, "./lab03 --grade-only --answers '%s' --results '%s'", sheet, res);
    cr_expect_eq(mc_test_run(cmd, 30, out, OUT_CAP), 0, "%s", out);
    last_line(out, line, sizeof line);
    cr_expect_str_eq(line, "Total 0.00/15", "%s", out);
}

Test(lab03, world6_default_sizes_exit_2_with_a_clear_message, .timeout = 60) {
    char res[256], cmd[1024];
    tmp_path(res, sizeof res, "r.json");
    snprintf(cmd, sizeof cmd, "./lab03 --answers '%s/a.md' --results '%s'", tmp_dir, res);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(6, cmd, 45, out, OUT_CAP);
    cr_expect_neq(rc, 0, "6 ranks cannot hold tp=2 pp=2 groups:\n%s", out);
    cr_expect_neq(rc, -1, "lab03 hung with 6 ranks:\n%s", out);
    cr_expect(mc_test_contains(out, "lab03 needs world % (tp*pp*cp) == 0: got 6 ranks for tp=2 "
                                    "pp=2"), "%s", out);
    cr_expect(mc_test_contains(out, "try mpirun -np 8"), "%s", out);
    cr_expect(mc_test_now() - t0 < 40.0);
    cr_expect_neq(access(res, F_OK), 0, "no results may be written for a refused layout");
}

Test(lab03, world4_tp2_pp2_runs_with_dp1, .timeout = 120) {
    char res[256], cmd[1024];
    tmp_path(res, sizeof res, "r4.json");
    snprintf(cmd, sizeof cmd, "./lab03 --tp 2 --pp 2 --answers '%s/a.md' --results '%s'",
             tmp_dir, res);
    int rc = mc_test_mpirun(4, cmd, 100, out, OUT_CAP);
    cr_assert_eq(rc, 0, "lab03 -np 4 exited %d:\n%s", rc, out);
    cJSON *doc = ls_load_json(res);
    cr_expect_eq(ls_get(doc, "config.world")->valueint, 4);
    cr_expect_eq(ls_get(doc, "facts.dp_size")->valueint, 1);
    assert_groups(doc, "facts.tp_groups", "[[0,1],[2,3]]");
    assert_groups(doc, "facts.dp_groups", "[[0],[1],[2],[3]]");
    assert_groups(doc, "facts.pp_groups", "[[0,2],[1,3]]");
    assert_groups(doc, "facts.mp_groups", "[[0,1,2,3]]");
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.membership_verified")));
    cr_expect_str_eq(ls_get(doc, "facts.exp_c.outcome")->valuestring, "ok");
    cr_expect(is_outcome(ls_get(doc, "facts.exp_b.outcome")->valuestring));
    /* every follow-up variant has 8 or 16 ranks: grid only on 4 */
    cr_expect(cJSON_IsFalse(ls_get(doc, "facts.followup.verified_on_communicators")));
    cr_expect_eq(ls_get(doc, "probe_rank")->valueint,
                 lab_nonce_probe_rank(ls_get(doc, "nonce")->valuestring, 8) % 4);
    cJSON_Delete(doc);
}

/* PP=4 leaves the middle stages out of every embedding group: they make fewer creation calls
   than the first and last stages, so the last call of those never matches. The watchdog must
   turn that into a recorded hang, and the lab must still finish. */
Test(lab03, world8_pp4_hang_is_caught_by_the_watchdog, .timeout = 120) {
    char res[256], cmd[1024];
    tmp_path(res, sizeof res, "pp4.json");
    snprintf(cmd, sizeof cmd,
             "./lab03 --pp 4 --tp 2 --timeout 1 --no-timing --answers '%s/a.md' --results '%s'",
             tmp_dir, res);
    double t0 = mc_test_now();
    int rc = mc_test_mpirun(8, cmd, 100, out, OUT_CAP);
    cr_assert_eq(rc, 0, "lab03 --pp 4 exited %d:\n%s", rc, out);
    cr_expect(mc_test_now() - t0 < 60.0, "the watchdog did not bound the run");
    cJSON *doc = ls_load_json(res);
    cr_expect_eq(ls_get(doc, "facts.dp_size")->valueint, 1);
    assert_groups(doc, "facts.embedding_groups", "[[0,6],[1,7]]");
    cr_expect_str_eq(ls_get(doc, "facts.exp_b.outcome")->valuestring, "hang", "%s", out);
    double waited = ls_get(doc, "facts.exp_b.seconds")->valuedouble;
    cr_expect(waited >= 0.9 && waited < 3.0, "waited %.2f s with a 1 s timeout", waited);
    cr_expect_float_eq(ls_get(doc, "facts.exp_b.timeout_seconds")->valuedouble, 1.0, 1e-9);
    /* the middle stages (ranks 2..5) skipped both embedding creations */
    cJSON *skipped = ls_get(doc, "facts.exp_b.rank_skipped");
    for (int r = 0; r < 8; r++)
        cr_expect_eq(cJSON_GetArrayItem(skipped, r)->valueint, (r >= 2 && r <= 5) ? 2 : 1,
                     "rank %d", r);
    cr_expect_str_eq(ls_get(doc, "facts.exp_c.outcome")->valuestring, "ok");
    cr_expect(cJSON_IsNull(ls_get(doc, "facts.timing")), "--no-timing still timed");
    cJSON_Delete(doc);
}

/* Experiment D for each follow-up variant, with a fixed nonce (abc123 -> F1 probe 5,
   c0ffee -> F2 probe 0, d00d01 -> F3 probe 2). */
static void run_variant(const char *nonce, const char *variant) {
    char res[256], cmd[1024];
    tmp_path(res, sizeof res, "d.json");
    snprintf(cmd, sizeof cmd, "./lab03 --nonce %s --no-timing --answers '%s/a.md' --results '%s'",
             nonce, tmp_dir, res);
    int rc = mc_test_mpirun(8, cmd, 100, out, OUT_CAP);
    cr_assert_eq(rc, 0, "lab03 --nonce %s exited %d:\n%s", nonce, rc, out);
    cJSON *doc = ls_load_json(res);
    cr_expect_str_eq(ls_get(doc, "nonce")->valuestring, nonce);
    cr_expect_str_eq(ls_get(doc, "followup_variant")->valuestring, variant);
    int probe = ls_get(doc, "probe_rank")->valueint;
    cr_expect_eq(probe, lab_nonce_probe_rank(nonce, 8));
    check_exp_d(doc, variant, probe);
    check_getters(doc, probe);
    check_model_shards(doc, probe);
    check_destroy(doc, probe);
    cr_expect(cJSON_IsNull(ls_get(doc, "facts.timing")));
    cJSON_Delete(doc);
}

Test(lab03, exp_d_variant_f1_swaps_tp_and_dp, .timeout = 120) { run_variant("abc123", "F1"); }
Test(lab03, exp_d_variant_f2_swaps_dp_and_pp, .timeout = 120) { run_variant("c0ffee", "F2"); }
Test(lab03, exp_d_variant_f3_swaps_tp_and_pp, .timeout = 120) { run_variant("d00d01", "F3"); }

/* 16 ranks with the F1 variant (world 16: the follow-up's groups are built on this run's
   communicators with a second mc_parallel_state). That path passed an uninitialised state
   to mc_parallel_init and aborted; it must finish, every check holding. */
Test(lab03, world16_builds_the_world16_variant_on_its_communicators, .timeout = 150) {
    char res[256], cmd[1024];
    tmp_path(res, sizeof res, "w16.json");
    snprintf(cmd, sizeof cmd, "./lab03 --nonce 7f3a91 --no-timing --answers '%s/a.md' "
             "--results '%s'", tmp_dir, res);
    int rc = mc_test_mpirun(16, cmd, 120, out, OUT_CAP);
    cr_assert_eq(rc, 0, "lab03 -np 16 exited %d:\n%s", rc, out);
    cr_expect(!mc_test_contains(out, "already initialized"), "%s", out);
    cJSON *doc = ls_load_json(res);
    cr_expect_eq(ls_get(doc, "facts.followup.world")->valueint, 16);
    cr_expect(cJSON_IsTrue(ls_get(doc, "facts.followup.verified_on_communicators")));
    cr_expect_eq(ls_get(doc, "facts.dp_size")->valueint, 4);
    /* DP groups of 4: the swap is visible without a collective (wrong sizes) */
    cr_expect_str_eq(ls_get(doc, "facts.exp_d.unverified.outcome")->valuestring,
                     "wrong_membership");
    cr_expect_str_eq(ls_get(doc, "facts.exp_d.verified.outcome")->valuestring, "error");
    cr_expect(cJSON_IsTrue(ls_get(doc, "run.all_checks_held")));
    cJSON_Delete(doc);
}
