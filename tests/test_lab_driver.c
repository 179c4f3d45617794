/* tests/test_lab_driver.c - the lab driver (labs/lab_driver.c), its argument parser
   (labs/lab_common.c) and the SVG writer (labs/lab_svg.c).

   The parser and the SVG writer are linked in and called directly. The driver itself runs as
   a program: build/tests/driver_lab is a small lab written on it (tests/mpi_cases/
   driver_lab.c, "lab99": tp = 2, at most 8 ranks, not 6), started under mpirun through
   mc_test_mpirun, or alone for --init / --grade-only / --help. Its rubric is the grader's
   unit rubric, its template tests/fixtures/driver/template.md. */
#include <criterion/criterion.h>

#include <limits.h>
#include <math.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "labs/lab_driver.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 17)

static char tmp_dir[64];
static char prog[4096];
static char *out;

static void setup(void) {
    ls_enter_root();
    out = ls_open(tmp_dir, sizeof tmp_dir, "driver", OUT_CAP);
    mc_test_sibling("driver_lab", prog, sizeof prog);
}

static void teardown(void) { ls_close(tmp_dir, out); }

TestSuite(lab_driver, .init = setup, .fini = teardown, .timeout = 120);

/* ---------------------------------------------------------------------------------------------
   helpers */

static void tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", tmp_dir, name);
}

/* The flags that keep every file of a run inside the test's directory. */
static void files_flags(char *buf, size_t cap) {
    snprintf(buf, cap,
             "--answers '%s/a.md' --results '%s/r.json' --rubric "
             "tests/fixtures/lab03/unit_rubric.json --template tests/fixtures/driver/template.md",
             tmp_dir, tmp_dir);
}

/* Runs driver_lab with `extra` on np ranks (np 0: a plain process). Returns the exit code. */
static int run_lab(int np, const char *extra) {
    char files[1024], cmd[4096 + 2048];
    files_flags(files, sizeof files);
    snprintf(cmd, sizeof cmd, "%s %s %s", prog, files, extra);
    return np > 0 ? mc_test_mpirun(np, cmd, 90, out, OUT_CAP) : mc_test_run(cmd, 30, out, OUT_CAP);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* ---------------------------------------------------------------------------------------------
   argument parsing */

static const lab_flag test_flags[] = {{"--probe", 1}, {"--broken", 0}};

static int parse(int argc, char **argv, lab_args *a, char *err) {
    return lab_parse_args_ex(argc, argv, "lab99", test_flags, 2, a, err, 256);
}

Test(lab_driver, parse_reads_the_new_generic_flags_and_the_labs_own) {
    char *argv[] = {"lab99", "--nonce", "C0FFEE", "--quick", "--distributed-timeout-minutes",
                    "0.5", "--probe", "mlp", "--broken", "--timeout=2", NULL};
    lab_args a;
    char err[256];
    cr_assert_eq(parse(10, argv, &a, err), 0, "%s", err);
    cr_expect_str_eq(a.nonce, "C0FFEE");
    cr_expect_eq(a.quick, 1);
    cr_expect_float_eq(a.world_timeout_min, 0.5, 1e-12);
    cr_expect_float_eq(a.timeout_s, 2.0, 1e-12);
    cr_expect_str_eq(a.flag_values[0], "mlp");
    cr_expect_str_eq(a.flag_values[1], "1", "a lab switch reads \"1\" when given");
    cr_expect_str_eq(a.template_path, "labs/templates/lab99.md");
    cr_expect_str_eq(a.answers_path, "answers/lab99.md");

    char *none[] = {"lab99", NULL};
    cr_assert_eq(parse(1, none, &a, err), 0, "%s", err);
    cr_expect_null(a.flag_values[0], "a lab flag that was not given is NULL");
    cr_expect_null(a.nonce);
    cr_expect_eq(a.world_timeout_min, 0.0);
}

Test(lab_driver, parse_refuses_repeats_conflicts_and_bad_values_with_a_reason) {
    struct {
        int argc;
        char *argv[5];
        const char *reason;
    } cases[] = {
        {5, {"lab99", "--tp", "2", "--tp", "4"}, "--tp given twice"},
        {3, {"lab99", "--timing", "--no-timing", NULL}, "--timing and --no-timing cannot be"},
        {5, {"lab99", "--probe", "a", "--probe", "b"}, "--probe given twice"},
        {3, {"lab99", "--nonce", "xyz", NULL}, "--nonce needs 6 hex digits, got 'xyz'"},
        {3, {"lab99", "--nonce", "abc12", NULL}, "--nonce needs 6 hex digits"},
        {3, {"lab99", "--distributed-timeout-minutes", "0", NULL},
         "--distributed-timeout-minutes needs minutes > 0"},
        {3, {"lab99", "--distributed-timeout-minutes", "99999", NULL}, "at most 10080"},
        {2, {"lab99", "--broken=1", NULL}, "--broken takes no value"},
        {2, {"lab99", "--probe", NULL}, "--probe needs a value"},
        {2, {"lab99", "--quik", NULL}, "unknown flag '--quik'"},
        {2, {"lab99", "stray", NULL}, "unknown argument 'stray'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lab_args a;
        char err[256];
        int rc = parse(cases[i].argc, cases[i].argv, &a, err);
        cr_expect_eq(rc, LAB_EXIT_USAGE, "case %zu accepted", i);
        cr_expect(strstr(err, cases[i].reason) != NULL, "case %zu: got '%s', want '%s'", i, err,
                  cases[i].reason);
    }
}

Test(lab_driver, parse_refuses_a_lab_with_too_many_flags) {
    lab_flag many[LAB_MAX_FLAGS + 1];
    for (int i = 0; i <= LAB_MAX_FLAGS; i++) many[i] = (lab_flag){"--x", 0};
    char *argv[] = {"lab99", NULL};
    lab_args a;
    char err[256];
    cr_expect_eq(lab_parse_args_ex(1, argv, "lab99", many, LAB_MAX_FLAGS + 1, &a, err, sizeof err),
                 LAB_EXIT_USAGE);
    cr_expect(mc_test_contains(err, "at most 16"), "%s", err);
}

Test(lab_driver, path_beside_results) {
    char p[256];
    lab_path_beside_results("results/lab03.json", "ledger", "json", p, sizeof p);
    cr_expect_str_eq(p, "results/lab03.ledger.json");
    lab_path_beside_results("/tmp/r", "timeline", "svg", p, sizeof p);
    cr_expect_str_eq(p, "/tmp/r.timeline.svg");
}

/* ---------------------------------------------------------------------------------------------
   the SVG writer: output that an XML parser accepts */

/* A small well-formedness check: every tag closes in order, attribute values are quoted,
   text holds no raw '<' and every '&' starts one of the five entities. Returns NULL when the
   document is well-formed, else what is wrong. */
static const char *xml_problem(const char *doc) {
    static char why[128];
    char stack[64][32];
    int depth = 0, roots = 0;
    const char *p = doc;
    if (strncmp(p, "<?xml", 5) == 0) p = strstr(p, "?>") + 2;
    while (*p != '\0') {
        if (*p == '&') {
            static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            int ok = 0;
            for (int i = 0; i < 5; i++) ok |= strncmp(p, ents[i], strlen(ents[i])) == 0;
            if (!ok) return "a bare '&'";
            p++;
            continue;
        }
        if (*p != '<') {
            if (*p == '>') return "a bare '>' in text";
            p++;
            continue;
        }
        int closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t n = strcspn(name, " \t\n/>");
        if (n == 0 || n >= 32) return "a tag without a name";
        const char *q = name + n;
        int quoted = 0;
        while (*q != '\0' && (quoted || *q != '>')) {
            if (*q == '"') quoted = !quoted;
            if (!quoted && *q == '<') return "a '<' inside a tag";
            q++;
        }
        if (*q != '>') return "a tag that never ends";
        int self_closing = q[-1] == '/';
        if (closing) {
            if (depth == 0 || strncmp(stack[depth - 1], name, n) != 0 ||
                stack[depth - 1][n] != '\0') {
                snprintf(why, sizeof why, "</%.*s> closes the wrong element", (int)n, name);
                return why;
            }
            depth--;
        } else if (!self_closing) {
            if (depth == 0) roots++;
            if (depth == 64) return "nested too deep";
            snprintf(stack[depth++], 32, "%.*s", (int)n, name);
        } else if (depth == 0) {
            roots++;
        }
        p = q + 1;
    }
    if (depth != 0) return "an element is never closed";
    if (roots != 1) return "not exactly one root element";
    return NULL;
}

Test(lab_driver, xml_checker_catches_broken_documents) {
    cr_expect_null(xml_problem("<svg><a x=\"1\"/><t>ok &amp; fine</t></svg>"));
    cr_expect_not_null(xml_problem("<svg><t>a < b</t></svg>"));
    cr_expect_not_null(xml_problem("<svg><t>a & b</t></svg>"));
    cr_expect_not_null(xml_problem("<svg><t>x</svg></t>"));
    cr_expect_not_null(xml_problem("<svg><t>x</t>"));
    cr_expect_not_null(xml_problem("<svg/><svg/>"));
}

Test(lab_driver, svg_is_well_formed_with_hostile_text_and_numbers) {
    lab_svg *s = lab_svg_new(300, 120);
    cr_assert_not_null(s);
    lab_svg_axes ax = {.x = 40, .y = 10, .w = 250, .h = 80, .x_min = 0, .x_max = 10,
                       .y_min = 0, .y_max = 4, .x_ticks = 5, .y_ticks = 2,
                       .x_label = "time <ms> & \"more\"", .y_label = "rank's"};
    lab_svg_axes_draw(s, &ax);
    lab_svg_rect(s, lab_svg_x(&ax, 2), lab_svg_y(&ax, 3), lab_svg_dx(&ax, 1.5), lab_svg_dy(&ax, 1),
                 "#1f77b4", "F0 <on> rank 2 & 3");
    lab_svg_rect(s, NAN, INFINITY, -5, 3, "\"onload=x", NULL);
    lab_svg_line(s, 0, 0, NAN, 10, NULL, 0);
    lab_svg_text(s, 10, 10, LAB_SVG_END, 9, "a\x01b</text><script>");
    const char *doc = lab_svg_text_of(s);
    cr_assert_not_null(doc);
    const char *problem = xml_problem(doc);
    cr_expect_null(problem, "%s in:\n%s", problem, doc);
    cr_expect(mc_test_contains(doc, "xmlns=\"http://www.w3.org/2000/svg\""));
    cr_expect(mc_test_contains(doc, "&lt;on&gt; rank 2 &amp; 3</title>"), "%s", doc);
    cr_expect(mc_test_contains(doc, "fill=\"&quot;onload=x\""), "attribute escaped: %s", doc);
    cr_expect(!mc_test_contains(doc, "nan") && !mc_test_contains(doc, "inf"), "%s", doc);
    cr_expect(!mc_test_contains(doc, "\x01"), "control characters are dropped");
    cr_expect(mc_test_contains(doc, ">10</text>"), "the last x tick is labelled: %s", doc);
    cr_expect(mc_test_contains(doc, "rotate(-90"), "the y label is vertical");
    /* data -> pixels: x_min at the left edge, y_max at the top */
    cr_expect_float_eq(lab_svg_x(&ax, 0), 40.0, 1e-9);
    cr_expect_float_eq(lab_svg_x(&ax, 10), 290.0, 1e-9);
    cr_expect_float_eq(lab_svg_y(&ax, 4), 10.0, 1e-9);
    cr_expect_float_eq(lab_svg_y(&ax, 0), 90.0, 1e-9);
    cr_expect_float_eq(lab_svg_dy(&ax, 1), 20.0, 1e-9);
    cr_expect_str_eq(lab_svg_color(0), lab_svg_color(10), "the palette cycles");
    cr_expect_str_eq(lab_svg_color(-1), lab_svg_color(9));

    char path[256];
    tmp_path(path, sizeof path, "fig/a.svg");
    cr_expect_eq(lab_svg_write(s, path), 0);
    char *back = lab_read_text(path, NULL);
    cr_expect(back != NULL && strcmp(back, doc) == 0, "the file is the document");
    free(back);
    lab_svg_rect(s, 1, 1, 1, 1, NULL, NULL);   /* after the end: ignored */
    cr_expect_null(xml_problem(lab_svg_text_of(s)));
    lab_svg_free(s);
}

/* ---------------------------------------------------------------------------------------------
   a lab run: the envelope, the checks, the figure, exit 0 */

Test(lab_driver, run_writes_the_versioned_envelope_and_exits_0) {
    int rc = run_lab(4, "--nonce abc123 --label 'ranks <4>'");
    cr_assert_eq(rc, 0, "driver_lab -np 4 exited %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "does not exist: writing the template"), "%s", out);
    cr_expect(mc_test_contains(out, "lab99 / M099 the sum of the ranks: world 4, tp 2, pp 1"),
              "%s", out);
    cr_expect(mc_test_contains(out, "== A. all-reduce of the world ranks =="), "%s", out);
    cr_expect(!mc_test_contains(out, "check failed"), "%s", out);

    char res[256];
    tmp_path(res, sizeof res, "r.json");
    cJSON *doc = ls_load_json(res);
    cr_expect_eq(ls_get(doc, "format")->valueint, 2);
    /* every key of the format-1 envelope is still there */
    const char *v1_keys[] = {"lab", "question", "rubric_version", "megatron_c_version", "config",
                             "nonce", "probe_rank", "followup_variant", "predictions", "run",
                             "facts", "run.started", "run.seconds", "config.world", "config.tp",
                             "config.pp", "config.cp", "config.ep", "config.etp", "config.vpp",
                             "config.order", "config.backend", "config.backend_reason",
                             "config.mpi_library", "config.nccl_version", "config.gpus",
                             "config.timeout_seconds", "predictions.present_at_run",
                             "predictions.hash", "predictions.time", "predictions.filled_blocks",
                             "predictions.answers_path", "predictions.template_written_by_run"};
    for (size_t i = 0; i < sizeof v1_keys / sizeof v1_keys[0]; i++) ls_get(doc, v1_keys[i]);
    cr_expect_str_eq(ls_get(doc, "lab")->valuestring, "lab99");
    cr_expect_str_eq(ls_get(doc, "question")->valuestring, "M099");
    cr_expect_str_eq(ls_get(doc, "rubric_version")->valuestring, "unit-v1",
                     "the rubric's own version");
    cr_expect_str_eq(ls_get(doc, "title")->valuestring, "the sum of the ranks");
    cr_expect_str_eq(ls_get(doc, "nonce")->valuestring, "abc123");
    cr_expect_eq(ls_get(doc, "probe_rank")->valueint, lab_nonce_probe_rank("abc123", 4));
    char variant[8];
    snprintf(variant, sizeof variant, "F%d", lab_nonce_variant("abc123", 2));
    cr_expect_str_eq(ls_get(doc, "followup_variant")->valuestring, variant);
    cr_expect_eq(ls_get(doc, "config.world")->valueint, 4);
    cr_expect_eq(ls_get(doc, "config.tp")->valueint, 2);
    cr_expect_float_eq(ls_get(doc, "config.timeout_seconds")->valuedouble, 30.0, 1e-9);
    cr_expect_str_eq(ls_get(doc, "backend.backend")->valuestring, "mpi");
    cr_expect_str_eq(ls_get(doc, "backend.device_kind")->valuestring, "cpu");
    cr_expect(ls_get(doc, "backend.cpu_count")->valueint >= 1);
    cr_expect(mc_test_contains(ls_get(doc, "backend.mpi_library")->valuestring, "MPI"));
    cr_expect(cJSON_IsTrue(ls_get(doc, "ledger.ok")), "%s",
              ls_get(doc, "ledger.message")->valuestring);
    cr_expect(cJSON_IsTrue(ls_get(doc, "ledger.locked_now")), "the first run locks");
    cr_expect_eq(ls_get(doc, "results_format")->valueint, 2);
    cr_expect(mc_test_contains(out, "ledger: predictions locked for nonce abc123"), "%s", out);
    cr_expect(mc_test_contains(out, "./lab99 --init --force draws a fresh nonce"), "%s", out);
    cr_expect(cJSON_IsTrue(ls_get(doc, "predictions.template_written_by_run")));

    /* per-experiment timing and the checks */
    cJSON *exps = ls_get(doc, "run.experiments");
    cr_assert_eq(cJSON_GetArraySize(exps), 2);
    cr_expect_str_eq(ls_get(cJSON_GetArrayItem(exps, 0), "name")->valuestring, "A");
    cr_expect_str_eq(ls_get(cJSON_GetArrayItem(exps, 0), "status")->valuestring, "ran");
    cr_expect(ls_get(cJSON_GetArrayItem(exps, 0), "seconds")->valuedouble >= 0.0);
    cr_expect_str_eq(ls_get(cJSON_GetArrayItem(exps, 1), "status")->valuestring, "ran");
    cJSON *checks = ls_get(doc, "run.checks");
    cr_assert_eq(cJSON_GetArraySize(checks), 1);
    cr_expect(mc_test_contains(ls_get(cJSON_GetArrayItem(checks, 0), "what")->valuestring,
                               "the ranks sum to 6 (got 6)"));
    cr_expect(cJSON_IsTrue(ls_get(cJSON_GetArrayItem(checks, 0), "ok")));
    cr_expect(cJSON_IsTrue(ls_get(doc, "run.all_checks_held")));

    /* the lab's facts, the probe rank's JSON and the allocator's view */
    cr_expect_eq(ls_get(doc, "facts.rank_sum")->valueint, 6);
    cr_expect_eq(ls_get(doc, "facts.probe.rank")->valueint, ls_get(doc, "probe_rank")->valueint);
    cr_expect_eq(ls_get(doc, "facts.probe.tp_rank")->valueint,
                 ls_get(doc, "probe_rank")->valueint % 2);
    cr_expect(ls_get(doc, "facts.group_heap_bytes")->valueint > 0,
              "creating a communicator allocated nothing through mc_malloc?");

    /* the figure: listed, on disk, well-formed, with the label escaped */
    cJSON *figs = ls_get(doc, "figures");
    cr_assert_eq(cJSON_GetArraySize(figs), 1);
    const char *fig = cJSON_GetArrayItem(figs, 0)->valuestring;
    cr_expect(mc_test_contains(fig, "r.bars.svg"), "%s", fig);
    char *svg = lab_read_text(fig, NULL);
    cr_assert_not_null(svg, "missing figure %s", fig);
    const char *problem = xml_problem(svg);
    cr_expect_null(problem, "%s", problem);
    cr_expect(mc_test_contains(svg, "ranks &lt;4&gt;"), "the --label text, escaped");
    free(svg);
    cJSON_Delete(doc);

    /* the score table comes last, and the grade file beside the results */
    cr_expect(mc_test_contains(out, "Total 0.00/15"), "%s", out);
    tmp_path(res, sizeof res, "r.grade.json");
    cr_expect(file_exists(res), "no %s", res);
}

Test(lab_driver, a_failed_check_exits_1_on_every_rank_and_is_recorded) {
    int rc = run_lab(4, "--fail --no-figure");
    cr_expect_eq(rc, 1, "driver_lab --fail exited %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "check failed: the ranks sum to 6 (got 10)"), "%s", out);
    cr_expect(!mc_test_contains(out, "MPI_ABORT"), "%s", out);
    char res[256];
    tmp_path(res, sizeof res, "r.json");
    cJSON *doc = ls_load_json(res);
    cr_expect(cJSON_IsFalse(ls_get(doc, "run.all_checks_held")));
    cr_expect(cJSON_IsFalse(ls_get(cJSON_GetArrayItem(ls_get(doc, "run.checks"), 0), "ok")));
    cr_expect_str_eq(
        ls_get(cJSON_GetArrayItem(ls_get(doc, "run.experiments"), 1), "status")->valuestring,
        "skipped");
    cr_expect_eq(cJSON_GetArraySize(ls_get(doc, "figures")), 0);
    cJSON_Delete(doc);
}

Test(lab_driver, the_world_timeout_follows_the_flags) {
    cr_assert_eq(run_lab(2, "--distributed-timeout-minutes 0.75 --no-figure"), 0, "%s", out);
    char res[256];
    tmp_path(res, sizeof res, "r.json");
    cJSON *doc = ls_load_json(res);
    cr_expect_float_eq(ls_get(doc, "config.timeout_seconds")->valuedouble, 45.0, 1e-9);
    cJSON_Delete(doc);
    cr_assert_eq(run_lab(2, "--timeout 20 --no-figure"), 0, "%s", out);
    doc = ls_load_json(res);
    cr_expect_float_eq(ls_get(doc, "config.timeout_seconds")->valuedouble, 60.0, 1e-9,
                       "the world outwaits three calls of the lab's own watchdog");
    cr_expect_float_eq(ls_get(doc, "config.call_timeout_seconds")->valuedouble, 20.0, 1e-9);
    cJSON_Delete(doc);
}

/* ---------------------------------------------------------------------------------------------
   worlds the lab cannot use: one message naming the value and the rule, exit 2, no results */

static void expect_refusal(int np, const char *message) {
    char res[256];
    tmp_path(res, sizeof res, "r.json");
    double t0 = mc_test_now();
    int rc = run_lab(np, "");
    cr_expect_eq(rc, 2, "-np %d exited %d:\n%s", np, rc, out);
    cr_expect(mc_test_contains(out, message), "-np %d: want '%s' in:\n%s", np, message, out);
    const char *first = strstr(out, "lab99");
    cr_expect(first != NULL && strstr(first + 1, message) == NULL,
              "the message is printed once (rank 0):\n%s", out);
    cr_expect(!mc_test_contains(out, "MPI_ABORT") && !mc_test_contains(out, "failed at"),
              "an abort trace:\n%s", out);
    cr_expect(!file_exists(res), "results written for a refused world");
    cr_expect(mc_test_now() - t0 < 30.0);
}

Test(lab_driver, a_world_that_does_not_divide_exits_2) {
    expect_refusal(3, "lab99 needs world % (tp*pp*cp) == 0: got 3 ranks for tp=2 pp=1; try "
                      "mpirun -np 4");
}

Test(lab_driver, too_many_ranks_exits_2) {
    expect_refusal(10, "lab99 needs 1 to 8 ranks: got 10; try mpirun -np 4");
}

Test(lab_driver, the_labs_own_world_rule_exits_2) {
    expect_refusal(6, "lab99 cannot use this world: needs a world that is a power of two: got 6 "
                      "ranks; try mpirun -np 4");
}

Test(lab_driver, one_process_without_mpirun_is_refused_too) {
    int rc = run_lab(0, "");
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(mc_test_contains(out, "got 1 rank for tp=2"), "%s", out);
}

Test(lab_driver, a_backend_this_build_lacks_exits_2_with_the_reason) {
#if defined(MC_ENABLE_CUDA)
    cr_skip_test("built with CUDA: nccl exists");
#endif
    int rc = run_lab(0, "--backend nccl");
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(mc_test_contains(out, "lab99 cannot start its world: MC_ERR_UNSUPPORTED"), "%s",
              out);
}

/* --device cuda in a build without the CUDA table: exit 2 naming the build to make, before
   any world starts; a device name it does not know is a usage error naming the choices. */
Test(lab_driver, a_device_this_build_lacks_exits_2_with_the_reason) {
#if defined(MC_ENABLE_CUDA)
    cr_skip_test("built with CUDA: the CUDA table exists");
#endif
    int rc = run_lab(0, "--device cuda");
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(mc_test_contains(out, "--device cuda: this build has no CUDA op table (build with "
                                    "make cuda)"), "%s", out);
    cr_expect_eq(run_lab(0, "--device gpu"), 2, "%s", out);
    cr_expect(mc_test_contains(out, "--device must be cpu or cuda, got 'gpu'"), "%s", out);
    cr_expect_eq(run_lab(0, "--device cpu --device cpu"), 2, "%s", out);
    cr_expect(mc_test_contains(out, "--device given twice"), "%s", out);
}

/* ---------------------------------------------------------------------------------------------
   flags and modes without mpirun */

Test(lab_driver, usage_errors_exit_2_and_help_shows_the_labs_flags) {
    cr_expect_eq(run_lab(0, "--frobnicate"), 2, "%s", out);
    cr_expect(mc_test_contains(out, "lab99: unknown flag '--frobnicate'"), "%s", out);
    cr_expect(mc_test_contains(out, "usage:"), "%s", out);
    cr_expect_eq(run_lab(0, "--tp 2 --tp 2"), 2, "%s", out);
    cr_expect(mc_test_contains(out, "--tp given twice"), "%s", out);
    cr_expect_eq(run_lab(0, "--help"), 0, "%s", out);
    cr_expect(mc_test_contains(out, "--fail breaks the check"), "the lab's usage: %s", out);
    cr_expect(mc_test_contains(out, "--distributed-timeout-minutes"), "%s", out);
    cr_expect(mc_test_contains(out, "exit status: 0 every check held"), "%s", out);
}

/* A copy of the unit rubric whose F1 question names {probe_rank}, in the test directory. */
static void rubric_with_probe_question(char *path, size_t cap) {
    cJSON *r = ls_load_json("tests/fixtures/lab03/unit_rubric.json");
    cJSON *f1 = ls_get(r, "variants.F1");
    cJSON_ReplaceItemInObject(f1, "question",
                              cJSON_CreateString("Rank {probe_rank} swaps two calls: why?"));
    tmp_path(path, cap, "rubric.json");
    cr_assert_eq(lab_json_write_atomic(r, path), 0);
    cJSON_Delete(r);
}

Test(lab_driver, init_fills_the_template_from_the_nonce_and_the_rubric) {
    char rubric[256], cmd[4096 + 1024], sheet[256];
    rubric_with_probe_question(rubric, sizeof rubric);
    tmp_path(sheet, sizeof sheet, "a.md");
    /* abc123 draws F1 of 2 variants and probe 1 of 4 */
    cr_assert_eq(lab_nonce_variant("abc123", 2), 1);
    snprintf(cmd, sizeof cmd,
             "%s --init --nonce abc123 --answers '%s' --rubric '%s' --template "
             "tests/fixtures/driver/template.md",
             prog, sheet, rubric);
    cr_assert_eq(mc_test_run(cmd, 30, out, OUT_CAP), 0, "%s", out);
    cr_expect(mc_test_contains(out, "nonce abc123, probe rank 1, follow-up F1"), "%s", out);
    char *text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    cr_expect(mc_test_contains(text, "<!-- nonce: abc123 ; probe_rank: 1 ; followup: F1 "),
              "%s", text);
    cr_expect(mc_test_contains(text, "rank 1 is your probe"), "%s", text);
    cr_expect(mc_test_contains(text, "## Follow-up (M099-F1)"), "%s", text);
    cr_expect(mc_test_contains(text, "<!-- Rank 1 swaps two calls: why? -->"),
              "the variant question, its own placeholder filled: %s", text);
    cr_expect(!mc_test_contains(text, "{"), "a placeholder is left: %s", text);
    free(text);

    /* an untouched sheet may be replaced (another nonce), a filled one may not */
    snprintf(cmd, sizeof cmd,
             "%s --init --nonce c0ffee --answers '%s' --rubric '%s' --template "
             "tests/fixtures/driver/template.md",
             prog, sheet, rubric);
    cr_expect_eq(mc_test_run(cmd, 30, out, OUT_CAP), 0, "an empty sheet was kept: %s", out);
    text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    char *q = strstr(text, "rank_sum: ?");
    cr_assert_not_null(q);
    memcpy(q, "rank_sum: 6", 11);
    cr_assert_eq(lab_write_text_atomic(text, sheet), 0);
    cr_expect_eq(mc_test_run(cmd, 30, out, OUT_CAP), 1, "a filled sheet was overwritten: %s",
                 out);
    cr_expect(mc_test_contains(out, "already holds answers; not overwritten"), "%s", out);
    cr_expect(mc_test_contains(out, "--force"), "%s", out);
    char *after = lab_read_text(sheet, NULL);
    cr_expect(after != NULL && strcmp(after, text) == 0, "the sheet changed");
    free(after);
    free(text);

    /* a comment edited is not an answer */
    text = lab_read_text(sheet, NULL);
    q = strstr(text, "rank_sum: 6");
    memcpy(q, "rank_sum: ?", 11);
    char *c = strstr(text, "Why do the ranks");
    cr_assert_not_null(c);
    memcpy(c, "WHY", 3);
    cr_assert_eq(lab_write_text_atomic(text, sheet), 0);
    free(text);
    cr_expect_eq(mc_test_run(cmd, 30, out, OUT_CAP), 0, "a comment counted as an answer: %s", out);
}

Test(lab_driver, grade_only_refuses_missing_invalid_and_foreign_results) {
    char res[256], cmd[4096 + 1024];
    tmp_path(res, sizeof res, "r.json");
    cr_expect_eq(run_lab(0, "--init --nonce abc123"), 0, "%s", out);

    cr_expect_eq(run_lab(0, "--grade-only"), 1, "missing results: %s", out);
    cr_expect(mc_test_contains(out, "r.json") && mc_test_contains(out, "run `mpirun"), "%s", out);

    cr_assert_eq(lab_write_text_atomic("{ not json", res), 0);
    cr_expect_eq(run_lab(0, "--grade-only"), 1, "invalid results: %s", out);
    cr_expect(mc_test_contains(out, "is not valid JSON"), "%s", out);

    cr_assert_eq(lab_write_text_atomic("{\"lab\": \"lab03\", \"facts\": {}}", res), 0);
    cr_expect_eq(run_lab(0, "--grade-only"), 1, "another lab's results: %s", out);
    cr_expect(mc_test_contains(out, "holds the results of lab03, not of lab99"), "%s", out);

    cr_assert_eq(lab_write_text_atomic("{\"lab\": \"lab99\"}", res), 0);
    cr_expect_eq(run_lab(0, "--grade-only"), 1, "results without facts: %s", out);
    cr_expect(mc_test_contains(out, "has no \"facts\" object"), "%s", out);

    snprintf(cmd, sizeof cmd, "mkdir -p '%s/dir.json'", tmp_dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd,
             "%s --grade-only --answers '%s/a.md' --results '%s/dir.json' --rubric "
             "tests/fixtures/lab03/unit_rubric.json",
             prog, tmp_dir, tmp_dir);
    cr_expect_eq(mc_test_run(cmd, 30, out, OUT_CAP), 1, "a directory as results: %s", out);

    /* a real run's results grade */
    cr_assert_eq(run_lab(2, "--no-figure"), 0, "%s", out);
    cr_expect_eq(run_lab(0, "--grade-only"), 0, "%s", out);
    cr_expect(mc_test_contains(out, "Total 0.00/15"), "%s", out);
}

Test(lab_driver, nonce_flag_overrides_the_sheet_and_says_so) {
    cr_assert_eq(run_lab(0, "--init --nonce abc123"), 0, "%s", out);
    cr_assert_eq(run_lab(2, "--nonce c0ffee --no-figure"), 0, "%s", out);
    cr_expect(mc_test_contains(out, "note: --nonce c0ffee overrides the nonce abc123"), "%s", out);
    char res[256];
    tmp_path(res, sizeof res, "r.json");
    cJSON *doc = ls_load_json(res);
    cr_expect_str_eq(ls_get(doc, "nonce")->valuestring, "c0ffee");
    cr_expect_eq(ls_get(doc, "probe_rank")->valueint, lab_nonce_probe_rank("c0ffee", 4) % 2);
    cJSON_Delete(doc);
}

/* The first measured run per nonce locks the predictions; a later run never re-locks and
   says how many keys changed since. */
Test(lab_driver, the_ledger_locks_once_per_nonce) {
    char sheet[256], ledger[256], res[256];
    tmp_path(sheet, sizeof sheet, "a.md");
    tmp_path(ledger, sizeof ledger, "r.ledger.json");
    tmp_path(res, sizeof res, "r.json");
    cr_assert_eq(run_lab(0, "--init --nonce abc123"), 0, "%s", out);
    char *text = lab_read_text(sheet, NULL);
    cr_assert_not_null(text);
    char *q = strstr(text, "rank_sum: ?");
    cr_assert_not_null(q);
    memcpy(q, "rank_sum: 6", 11);
    cr_assert_eq(lab_write_text_atomic(text, sheet), 0);
    cr_assert_eq(run_lab(2, "--no-figure"), 0, "%s", out);
    cr_expect(file_exists(ledger), "no ledger at %s", ledger);
    cJSON *doc = ls_load_json(res);
    cr_expect(cJSON_IsTrue(ls_get(doc, "ledger.locked_now")));
    cr_expect_eq(ls_get(doc, "ledger.keys")->valueint, 1, "%s",
                 ls_get(doc, "ledger.message")->valuestring);
    cJSON_Delete(doc);

    memcpy(q, "rank_sum: 7", 11);   /* changed after the first run */
    cr_assert_eq(lab_write_text_atomic(text, sheet), 0);
    free(text);
    cr_assert_eq(run_lab(2, "--no-figure"), 0, "%s", out);
    doc = ls_load_json(res);
    cr_expect(cJSON_IsFalse(ls_get(doc, "ledger.locked_now")), "a later run re-locked");
    cr_expect_eq(ls_get(doc, "ledger.changed_since_lock")->valueint, 1);
    cJSON_Delete(doc);
}
