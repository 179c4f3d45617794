/* tests/test_lab02.c - lab02 (M002: the package map, and localising a loss anomaly), launched
   as a program under mpirun (never Criterion under mpirun).

   Expectations are computed here, not read from the lab: the stage of each module from the
   layer split (L / PP per stage), the collectives of each module from the rules the header
   documents for sequence parallelism (a column-parallel layer all-gathers its input, a
   row-parallel one reduce-scatters its output, the vocab-parallel cross entropy makes three
   all-reduces, ...), the hidden fault of a nonce from the documented derivation (re-implemented
   below), the phase and the symptom each kind of fault must show, and a bisection written
   here that must find every kind of fault in at most 4 probes from the probes' tables alone.
   Also: worlds the lab refuses, the fault hooks missing from ordinary library builds, the
   findings that lock when first filled (and the fault hidden until then), the empty sheet,
   the reference answers. */
#include <criterion/criterion.h>

#include <limits.h>
#include <stdint.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "labs/grader.h"
#include "tests/test_util.h"
#include "tests/lab_suite.h"

#define OUT_CAP (1 << 18)
#define RUN_LIMIT_S 120.0
#define LAYERS 4
#define STEPS 3
#define M 2          /* micro-batches per step */

LS_LAB_SUITE(lab02, OUT_CAP, 600);

/* ---------------------------------------------------------------------------------------------
   helpers */

/* Runs ./lab02 on np ranks with the sheet and the results in `dir`. */
static int run_lab_in(const char *dir, int np, const char *sheet, const char *extra, cJSON **doc) {
    char cmd[1024], res[256];
    snprintf(res, sizeof res, "%s/results/lab02.json", dir);
    snprintf(cmd, sizeof cmd, "./lab02 --answers '%s' --results '%s' %s", sheet, res,
             extra ? extra : "");
    int rc = mc_test_mpirun(np, cmd, RUN_LIMIT_S, out, OUT_CAP);
    if (doc != NULL) *doc = mc_test_json_load(res);
    return rc;
}

/* The sheet for `nonce` from the template (as --init writes it), with `edits` applied: pairs
   of (placeholder line prefix, replacement line), NULL-terminated. */
static void make_sheet(const char *path, const char *nonce, const char *const *edits) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "./lab02 --init --force --nonce %s --answers '%s'", nonce, path);
    cr_assert_eq(mc_test_run(cmd, 30, out, OUT_CAP), 0, "%s", out);
    char *text = ls_read_file(path);
    cr_assert_not_null(text);
    for (int i = 0; edits != NULL && edits[i] != NULL; i += 2) {
        char *at = strstr(text, edits[i]);
        cr_assert_not_null(at, "the template lost the line starting %s", edits[i]);
        char *eol = strchr(at, '\n');
        size_t head = (size_t)(at - text), tail = strlen(eol);
        char *next = malloc(head + strlen(edits[i + 1]) + tail + 1);
        memcpy(next, text, head);
        strcpy(next + head, edits[i + 1]);
        strcat(next, eol);
        free(text);
        text = next;
    }
    ls_write_file(path, text);
    free(text);
}

/* ---------------------------------------------------------------------------------------------
   the nonce -> fault derivation, re-implemented from lab02.c's comment */

enum { F_QKV, F_SOFTMAX, F_ROW, F_COLUMN, F_CE, F_EMBEDDING, F_SP_NORM, F_OPTIMIZER, N_FAULTS };
static const char *const fault_id[N_FAULTS] = {
    "qkv_shard", "softmax_scale", "row_no_reduce", "column_no_dgrad_reduce", "ce_sum_exp_max",
    "no_embedding_grad_sync", "no_sp_norm_grad_sync", "optimizer_skips_param"};
static const char *const fault_phase[N_FAULTS] = {
    "forward", "forward", "forward", "backward_communication", "loss", "grad_finalize",
    "grad_finalize", "optimizer"};
static const char *const fault_collective[N_FAULTS] = {
    "none", "none", "row_parallel_output", "column_parallel_input_grad", "cross_entropy",
    "embedding_group", "sequence_parallel_grads", "none"};

static uint32_t fnv1a32(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static uint64_t splitmix_final(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The kind of fault of a nonce and the module a right diagnosis names. */
static int expected_fault(const char *nonce, char *module, size_t cap) {
    uint64_t x = splitmix_final((uint64_t)fnv1a32(nonce) ^ 0x6c61623032ull);
    int kind = (int)(x % N_FAULTS);
    x /= N_FAULTS;
    int layer = (int)(x % LAYERS);
    x /= LAYERS;
    int sub = (int)(x % 2);
    x /= 2;
    x /= 2;   /* tp rank */
    int norm = (int)(x % (2 * LAYERS + 1));
    x /= 2 * LAYERS + 1;
    int weight = (int)(x % 2);
    const char *part = sub ? "mlp" : "self_attention";
    const char *first = sub ? "linear_fc1" : "linear_qkv";
    const char *second = sub ? "linear_fc2" : "linear_proj";
    switch (kind) {
    case F_QKV: snprintf(module, cap, "decoder.layers.%d.self_attention.linear_qkv", layer); break;
    case F_SOFTMAX:
        snprintf(module, cap, "decoder.layers.%d.self_attention.core_attention", layer);
        break;
    case F_ROW: snprintf(module, cap, "decoder.layers.%d.%s.%s", layer, part, second); break;
    case F_COLUMN: snprintf(module, cap, "decoder.layers.%d.%s.%s", layer, part, first); break;
    case F_CE: snprintf(module, cap, "loss"); break;
    case F_EMBEDDING: snprintf(module, cap, "embedding"); break;
    case F_SP_NORM:
        if (norm == 2 * LAYERS)
            snprintf(module, cap, "decoder.final_layernorm");
        else
            snprintf(module, cap, "decoder.layers.%d.%s", norm / 2,
                     norm % 2 ? "pre_mlp_layernorm" : "input_layernorm");
        break;
    default:
        snprintf(module, cap, "decoder.layers.%d.%s.%s", layer, part, weight ? second : first);
        break;
    }
    return kind;
}

/* The first nonce (of a fixed sequence) whose fault is `kind`. */
static void nonce_of_kind(int kind, char nonce[7]) {
    char module[96];
    for (unsigned i = 0; i < 100000; i++) {
        snprintf(nonce, 7, "%06x", (0x200000u + i * 7919u) & 0xffffffu);
        if (expected_fault(nonce, module, sizeof module) == kind) return;
    }
    cr_assert_fail("no nonce for fault kind %d", kind);
}

/* ---------------------------------------------------------------------------------------------
   the default run: the package map against the documented rules, the fault hidden */

static const char *const main_preds[] = {
    "stage_of:", "stage_of: {embedding: 0, layer1: 0, layer2: 1, final_layernorm: 1, loss: 1}",
    NULL};

/* TP collectives of one module per micro-batch, from facts.modules: the count of one kind. */
#define FWD "forward_per_microbatch"
#define BWD "backward_per_microbatch"
static int module_count(const cJSON *doc, const char *module, const char *dir, const char *key) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(ls_get(doc, "facts.modules"), module);
    cr_assert_not_null(m, "facts.modules lacks %s", module);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(m, dir);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(d, key);
    return v ? v->valueint : 0;
}

Test(lab02, default_run_measures_the_package_map_and_keeps_the_fault_hidden) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/a.md", tmp_dir);
    make_sheet(sheet, "107bbc", main_preds);
    cJSON *doc = NULL;
    double t0 = mc_test_now();
    int rc = run_lab_in(tmp_dir, 4, sheet, NULL, &doc);
    double secs = mc_test_now() - t0;
    cr_assert_eq(rc, 0, "lab02 exited %d\n%s", rc, out);
    cr_assert_not_null(doc);
    cr_expect(secs < 120.0, "the default run took %.1f s", secs);
    /* stages: L / PP layers per stage, the embedding first, the head last */
    for (int l = 0; l < LAYERS; l++) {
        char key[64];
        snprintf(key, sizeof key, "facts.stage_of.layer%d", l);
        cr_expect_eq(ls_geti(doc, key), l / (LAYERS / 2), "%s", key);
    }
    cr_expect_eq(ls_geti(doc, "facts.stage_of.embedding"), 0);
    cr_expect_eq(ls_geti(doc, "facts.stage_of.loss"), 1);
    cr_expect_eq(ls_geti(doc, "facts.stage_of.output_layer"), 1);
    /* SP rules, per micro-batch on one rank */
    for (int l = 0; l < LAYERS; l++) {
        char m[96];
        static const char *const column[] = {"self_attention.linear_qkv", "mlp.linear_fc1"};
        static const char *const row[] = {"self_attention.linear_proj", "mlp.linear_fc2"};
        for (int i = 0; i < 2; i++) {
            snprintf(m, sizeof m, "decoder.layers.%d.%s", l, column[i]);
            /* forward: all-gather the sequence; backward: all-gather it again, reduce-scatter dX */
            cr_expect_eq(module_count(doc, m, FWD, "tp_all_gather"), 1, "%s", m);
            cr_expect_eq(module_count(doc, m, BWD, "tp_all_gather"), 1, "%s", m);
            cr_expect_eq(module_count(doc, m, BWD, "tp_reduce_scatter"), 1, "%s", m);
            snprintf(m, sizeof m, "decoder.layers.%d.%s", l, row[i]);
            /* forward: reduce-scatter the partial sums; backward: all-gather dY */
            cr_expect_eq(module_count(doc, m, FWD, "tp_reduce_scatter"), 1, "%s", m);
            cr_expect_eq(module_count(doc, m, BWD, "tp_all_gather"), 1, "%s", m);
            cr_expect_eq(module_count(doc, m, FWD, "tp_all_reduce"), 0, "%s", m);
        }
        snprintf(m, sizeof m, "decoder.layers.%d.input_layernorm", l);
        cr_expect_eq(module_count(doc, m, FWD, "tp_all_reduce") +
                         module_count(doc, m, FWD, "tp_all_gather"), 0, "%s", m);
    }
    cr_expect_eq(module_count(doc, "embedding", FWD, "tp_all_reduce"), 1);
    cr_expect_eq(module_count(doc, "embedding", BWD, "tp_all_gather"), 1);
    cr_expect_eq(module_count(doc, "loss", FWD, "tp_all_reduce"), 3);
    cr_expect_eq(module_count(doc, "output_layer", FWD, "tp_all_gather"), 1);
    cr_expect_eq(ls_geti(doc, "facts.package_map.tp_collectives_attention_forward"), 2);
    cr_expect_eq(ls_geti(doc, "facts.package_map.tp_collectives_loss_forward"), 3);
    cr_expect_eq(ls_geti(doc, "facts.package_map.activations_sent_per_step"), M);
    cr_expect_eq(ls_geti(doc, "facts.package_map.finalize_collectives_last_stage.tp"), 1);
    cr_expect_eq(ls_geti(doc, "facts.package_map.finalize_collectives_last_stage.embedding"), 1);
    cr_expect_str_eq(ls_gets(doc, "facts.package_map.optimizer_grad_norm_group"), "mp");
    cr_expect(ls_getb(doc, "facts.package_map.checkpoint.tp1_load_matches"));
    cr_expect(ls_getb(doc, "facts.clean.matches_reference"));
    cr_expect_lt(ls_getd(doc, "facts.clean.max_rel_diff"), 1e-4);
    cr_expect_not(ls_getb(doc, "facts.control_max_as_sum.loss_changes"));
    /* the symptom of this nonce (a forward fault): the step-0 loss already differs */
    cr_expect(ls_getb(doc, "facts.symptom.step0_loss_differs"));
    cr_expect_eq(ls_geti(doc, "facts.symptom.first_loss_step"), 0);
    /* hidden: no fault in the results, the output or the checks */
    cr_expect_not(ls_getb(doc, "facts.revealed"));
    cr_expect_null(mc_test_json_at(doc, "facts.fault"));
    char *text = cJSON_PrintUnformatted(doc);
    cr_expect(!mc_test_contains(text, "row_no_reduce") && !mc_test_contains(out, "row_no_reduce"),
              "the hidden fault leaked");
    free(text);
    cr_expect(mc_test_contains(out, "The fault stays hidden"), "%s", out);
    cJSON_Delete(doc);
}

/* ---------------------------------------------------------------------------------------------
   every kind of fault, localised from the probes alone by a bisection written here */

typedef struct probe_view {
    double in, outv;          /* forward input / output, or output grad / input grad */
    int grads_differ;         /* param grads differ at step 0 */
    char worst_grad[96];
    char worst_param_step1[96];
} probe_view;

static double step_value(const cJSON *probe, int step, const char *key) {
    const cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(probe, "steps"), step);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1.0;
}

static void step_string(const cJSON *probe, int step, const char *key, char *dst, size_t cap) {
    const cJSON *s = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(probe, "steps"), step);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    snprintf(dst, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static int probes_used;

static void probe(const char *sheet, const char *module, int backward, probe_view *v) {
    char extra[160];
    snprintf(extra, sizeof extra, "--probe %s", module);
    cJSON *doc = NULL;
    int rc = run_lab_in(tmp_dir, 4, sheet, extra, &doc);
    cr_assert_eq(rc, 0, "--probe %s exited %d\n%s", module, rc, out);
    probes_used++;
    const cJSON *p = ls_get(doc, "facts.probe");
    cr_assert_str_eq(cJSON_GetObjectItemCaseSensitive(p, "module")->valuestring, module);
    v->in = step_value(p, 0, backward ? "output_grad" : "forward_input");
    v->outv = step_value(p, 0, backward ? "input_grad" : "forward_output");
    v->grads_differ = step_value(p, 0, "param_grads") > 1e-3;
    step_string(p, 0, "worst_grad", v->worst_grad, sizeof v->worst_grad);
    step_string(p, 1, "worst_param", v->worst_param_step1, sizeof v->worst_param_step1);
    cJSON_Delete(doc);
}

/* Where the first wrong tensor is, relative to the probed module (forward: its input and
   output; backward: its output grad and input grad, since backward runs the other way). */
enum { BEFORE, INSIDE, AFTER };

/* Forward: input wrong -> before, output wrong -> inside, both right -> after. Backward: the
   output grad wrong -> after (in forward order), input grad wrong -> inside, both right ->
   before. */
static int locate(const probe_view *v, int backward) {
    int in_bad = v->in > 1e-3, out_bad = v->outv > 1e-3;
    if (!backward) return in_bad ? BEFORE : out_bad ? INSIDE : AFTER;
    return in_bad ? AFTER : out_bad ? INSIDE : BEFORE;
}

/* The owner of a parameter: its name without the last part; the tied copy is the embedding. */
static void owner(const char *param, char *module, size_t cap) {
    if (strcmp(param, "output_layer.weight") == 0 ||
        strncmp(param, "embedding.", 10) == 0) {
        snprintf(module, cap, "embedding");
        return;
    }
    snprintf(module, cap, "%s", param);
    char *dot = strrchr(module, '.');
    if (dot) *dot = '\0';
}

/* Inside layer l: probe linear_proj, then linear_qkv or linear_fc1 (each probe tells before /
   inside / after, so 7 leaves take 2 probes). */
static void bisect_layer(const char *sheet, int l, int backward, char *found, size_t cap) {
    static const char *const before[] = {"input_layernorm", "self_attention.linear_qkv",
                                         "self_attention.core_attention"};
    static const char *const after[] = {"pre_mlp_layernorm", "mlp.linear_fc1", "mlp.linear_fc2"};
    char m[128];
    probe_view v;
    snprintf(m, sizeof m, "decoder.layers.%d.self_attention.linear_proj", l);
    probe(sheet, m, backward, &v);
    int w = locate(&v, backward);
    if (w == INSIDE) {
        snprintf(found, cap, "%s", m);
        return;
    }
    const char *const *side = w == BEFORE ? before : after;
    snprintf(m, sizeof m, "decoder.layers.%d.%s", l, side[1]);
    probe(sheet, m, backward, &v);
    w = locate(&v, backward);
    snprintf(found, cap, "decoder.layers.%d.%s", l, side[w == BEFORE ? 0 : w == INSIDE ? 1 : 2]);
}

/* The bisection: the symptom picks the direction; the layers are cut at decoder.layers.1 and
   decoder.layers.3 (or .0), then the layer inside; finalize faults (every activation grad
   right) are read from the parameter gradients; optimizer faults from the parameters. */
static void bisect(const char *sheet, const cJSON *symptom_doc, char *found, size_t cap) {
    int loss0 = ls_getb(symptom_doc, "facts.symptom.step0_loss_differs");
    int norm0 = ls_getb(symptom_doc, "facts.symptom.step0_grad_norm_differs");
    probe_view v;
    if (!loss0 && !norm0) {   /* step 0 is right everywhere: the update is wrong */
        probe(sheet, "gpt", 0, &v);
        owner(v.worst_param_step1, found, cap);
        return;
    }
    int backward = !loss0;
    probe(sheet, "decoder.layers.1", backward, &v);
    int w = locate(&v, backward);
    if (backward && w == BEFORE && v.grads_differ) {   /* grads right, a param grad wrong */
        owner(v.worst_grad, found, cap);
        return;
    }
    if (w == INSIDE) {
        bisect_layer(sheet, 1, backward, found, cap);
        return;
    }
    if (w == BEFORE) {
        probe(sheet, "decoder.layers.0", backward, &v);
        w = locate(&v, backward);
        if (w == INSIDE) {
            bisect_layer(sheet, 0, backward, found, cap);
        } else if (!backward) {
            snprintf(found, cap, "embedding");
        } else {   /* no activation grad wrong anywhere: grad finalize */
            if (v.grads_differ) {
                owner(v.worst_grad, found, cap);
                return;
            }
            probe(sheet, "gpt", 1, &v);
            owner(v.worst_grad, found, cap);
        }
        return;
    }
    probe(sheet, "decoder.layers.3", backward, &v);
    w = locate(&v, backward);
    if (w == INSIDE) {
        bisect_layer(sheet, 3, backward, found, cap);
    } else if (w == BEFORE) {
        bisect_layer(sheet, 2, backward, found, cap);
    } else {   /* the head: final_layernorm, output_layer, loss */
        probe(sheet, "output_layer", backward, &v);
        w = locate(&v, backward);
        snprintf(found, cap, "%s", w == BEFORE ? "decoder.final_layernorm"
                                   : w == INSIDE ? "output_layer" : "loss");
    }
}

Test(lab02, a_bisection_finds_every_kind_of_fault_in_at_most_4_probes) {
    for (int kind = 0; kind < N_FAULTS; kind++) {
        char nonce[7], want[96], found[128] = "", sheet[256], cmd[300];
        nonce_of_kind(kind, nonce);
        cr_assert_eq(expected_fault(nonce, want, sizeof want), kind);
        snprintf(cmd, sizeof cmd, "rm -rf '%s/results'", tmp_dir);
        cr_assert_eq(system(cmd), 0);
        snprintf(sheet, sizeof sheet, "%s/%s.md", tmp_dir, nonce);
        make_sheet(sheet, nonce, main_preds);
        cJSON *sym = NULL;
        int rc = run_lab_in(tmp_dir, 4, sheet, NULL, &sym);
        cr_assert_eq(rc, 0, "%s: the symptom run exited %d\n%s", fault_id[kind], rc, out);
        /* the symptom each phase must show: forward/loss at step 0 in the loss, gradient faults
           in the grad norm only, optimizer faults from step 1 on */
        const char *phase = fault_phase[kind];
        int forwardish = !strcmp(phase, "forward") || !strcmp(phase, "loss");
        cr_expect_eq(ls_getb(sym, "facts.symptom.step0_loss_differs"), forwardish, "%s",
                     fault_id[kind]);
        if (!forwardish)
            cr_expect_eq(ls_getb(sym, "facts.symptom.step0_grad_norm_differs"),
                         strcmp(phase, "optimizer") != 0, "%s", fault_id[kind]);
        if (!strcmp(phase, "optimizer") || !strcmp(phase, "grad_finalize") ||
            !strcmp(phase, "backward_communication"))
            cr_expect_geq(ls_geti(sym, "facts.symptom.first_loss_step"), 1, "%s", fault_id[kind]);
        probes_used = 0;
        bisect(sheet, sym, found, sizeof found);
        cJSON_Delete(sym);
        cr_expect_str_eq(found, want, "%s (nonce %s): the bisection found %s", fault_id[kind],
                         nonce, found);
        cr_expect_leq(probes_used, 4, "%s: %d probes", fault_id[kind], probes_used);

        /* the diagnosis, then the reveal */
        char diag[4][160];
        int layer = -1;
        snprintf(diag[0], sizeof diag[0], "faulty_module: %s", found);
        if (sscanf(found, "decoder.layers.%d.", &layer) == 1)
            snprintf(diag[1], sizeof diag[1], "faulty_layer: %d", layer);
        else
            snprintf(diag[1], sizeof diag[1], "faulty_layer: none");
        snprintf(diag[2], sizeof diag[2], "faulty_phase: %s", phase);
        snprintf(diag[3], sizeof diag[3], "culprit_collective: %s", fault_collective[kind]);
        const char *edits[] = {main_preds[0], main_preds[1], "faulty_module:", diag[0],
                               "faulty_layer:", diag[1], "faulty_phase:", diag[2],
                               "culprit_collective:", diag[3], "found_within_4_probes:",
                               "found_within_4_probes: yes", NULL};
        make_sheet(sheet, nonce, edits);   /* the nonce's ledger stays in tmp_dir/results */
        cJSON *doc = NULL;
        rc = run_lab_in(tmp_dir, 4, sheet, NULL, &doc);
        cr_assert_eq(rc, 0, "%s: the reveal exited %d\n%s", fault_id[kind], rc, out);
        cr_expect(ls_getb(doc, "facts.revealed"), "%s", fault_id[kind]);
        cr_expect_str_eq(ls_gets(doc, "facts.fault.id"), fault_id[kind]);
        cr_expect_str_eq(ls_gets(doc, "facts.fault.module"), want);
        cr_expect_str_eq(ls_gets(doc, "facts.fault.phase"), phase);
        cr_expect_str_eq(ls_gets(doc, "facts.fault.collective"), fault_collective[kind]);
        cr_expect_str_eq(ls_gets(doc, "facts.first_divergence.module"), want, "%s", fault_id[kind]);
        cr_expect_str_eq(ls_gets(doc, "facts.first_divergence.phase"), phase, "%s", fault_id[kind]);
        cr_expect_eq(ls_geti(doc, "facts.bisection.probes_before_reveal"), probes_used);
        cr_expect_str_eq(ls_gets(doc, "facts.bisection.found_within_budget"),
                         strcmp(found, want) == 0 && probes_used <= 4 ? "yes" : "no");
        cr_expect(mc_test_contains(out, "FU2.faulty_module") && mc_test_contains(out, "0.50/0.50"),
                  "%s: the diagnosis did not earn its points\n%s", fault_id[kind], out);
        cJSON_Delete(doc);
    }
}

/* ---------------------------------------------------------------------------------------------
   findings, probes, refusals, builds, grading */

Test(lab02, findings_lock_when_first_filled_and_the_fault_waits_for_all_of_them) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/f.md", tmp_dir);
    const char *partial[] = {"faulty_module:", "faulty_module: loss", NULL};
    make_sheet(sheet, "5e0202", partial);
    cJSON *doc = NULL;
    cr_assert_eq(run_lab_in(tmp_dir, 4, sheet, NULL, &doc), 0, "%s", out);
    cr_expect_not(ls_getb(doc, "facts.revealed"), "revealed with one finding of five");
    cr_expect_null(mc_test_json_at(doc, "facts.fault"));
    cJSON_Delete(doc);
    char ledger[256], value[96];
    snprintf(ledger, sizeof ledger, "%s/results/lab02.ledger.json", tmp_dir);
    cr_expect_eq(gr_ledger_locked_value(ledger, "5e0202", "followup/faulty_module", value,
                                        sizeof value), 1);
    cr_expect_str_eq(value, "loss");
    cr_expect_eq(gr_ledger_locked_value(ledger, "5e0202", "followup/faulty_phase", NULL, 0), 0);
    /* a probe before the reveal counts for the bisection */
    cr_assert_eq(run_lab_in(tmp_dir, 4, sheet, "--probe decoder", &doc), 0, "%s", out);
    cr_expect_eq(ls_geti(doc, "facts.probes.count"), 1);
    cr_expect_eq(ls_geti(doc, "facts.probes.before_reveal"), 1);
    cJSON_Delete(doc);
    /* all five filled, one of them changed: the reveal; the changed one earns nothing */
    const char *all[] = {"faulty_module:", "faulty_module: embedding",
                         "faulty_layer:", "faulty_layer: none",
                         "faulty_phase:", "faulty_phase: loss",
                         "culprit_collective:", "culprit_collective: none",
                         "found_within_4_probes:", "found_within_4_probes: yes", NULL};
    make_sheet(sheet, "5e0202", all);
    cr_assert_eq(run_lab_in(tmp_dir, 4, sheet, "--probe gpt", &doc), 0, "%s", out);
    cr_expect(ls_getb(doc, "facts.revealed"));
    cr_expect_not_null(mc_test_json_at(doc, "facts.fault.module"));
    cr_expect_eq(ls_geti(doc, "facts.probes.count"), 2);
    cr_expect_eq(ls_geti(doc, "facts.probes.before_reveal"), 1, "a probe after the reveal counted");
    cr_expect(mc_test_contains(out, "changed since the first run"), "%s", out);
    cr_expect_eq(gr_ledger_locked_value(ledger, "5e0202", "followup/faulty_module", value,
                                        sizeof value), 1);
    cr_expect_str_eq(value, "loss", "a finding was re-locked");
    cJSON_Delete(doc);
}

Test(lab02, worlds_and_flags_it_cannot_use_exit_2_with_the_rule) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/x.md", tmp_dir);
    int rc = run_lab_in(tmp_dir, 8, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 8 at tp 2 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs dp = 1"), "%s", out);
    rc = run_lab_in(tmp_dir, 3, sheet, NULL, NULL);
    cr_expect_eq(rc, 2, "world 3 exited %d\n%s", rc, out);
    rc = run_lab_in(tmp_dir, 2, sheet, "--tp 1", NULL);
    cr_expect_eq(rc, 2, "tp 1 exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs tp = 2 or 4"), "%s", out);
    rc = run_lab_in(tmp_dir, 4, sheet, "--probe decoder.layers.9", NULL);
    cr_expect_eq(rc, 2, "a bad probe exited %d\n%s", rc, out);
    cr_expect(mc_test_contains(out, "needs --probe to name a module"), "%s", out);
}

/* TP=4 on 8 ranks: the same lab, four ranks per stage. */
Test(lab02, tp4_on_eight_ranks_also_matches_tp1) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/t.md", tmp_dir);
    cJSON *doc = NULL;
    int rc = run_lab_in(tmp_dir, 8, sheet, "--tp 4 --nonce 107bbc", &doc);
    cr_assert_eq(rc, 0, "tp 4 exited %d\n%s", rc, out);
    cr_expect_eq(ls_geti(doc, "facts.layout.tp"), 4);
    cr_expect(ls_getb(doc, "facts.clean.matches_reference"));
    cr_expect(ls_getb(doc, "facts.package_map.checkpoint.tp1_load_matches"));
    cJSON_Delete(doc);
}

/* The fault hooks exist only in the library build lab02 (and lab11) links. */
Test(lab02, ordinary_library_builds_compile_the_fault_hooks_out) {
    int rc = mc_test_run("nm build/mc_impl.o | grep -c mc_fault_inject", 30, out, OUT_CAP);
    cr_expect_neq(rc, 0, "the ordinary build exports the fault hook:\n%s", out);
    rc = mc_test_run("nm build/mc_impl_faults.o | grep -c ' T mc_fault_inject'", 30, out, OUT_CAP);
    cr_expect_eq(rc, 0, "build/mc_impl_faults.o lacks the fault hook:\n%s", out);
}

Test(lab02, an_empty_sheet_scores_near_zero_and_says_what_to_do_next) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/e.md", tmp_dir);
    int rc = run_lab_in(tmp_dir, 4, sheet, "--nonce 5e0203", NULL);
    cr_assert_eq(rc, 0, "%s", out);
    double total = ls_total_score(out);
    cr_expect(total >= 0.0 && total <= 0.5, "the empty sheet scored %.2f\n%s", total, out);
    cr_expect(mc_test_contains(out, "What to do next"), "%s", out);
}

/* The adversarial sheets of tests/fixtures/lab02 (nonce 107bbc, the English reference's),
   graded against one run of that nonce: each returns the grader's output in `out`. */
static double grade_fixture(const char *fixture) {
    char cmd[1024], res[256];
    snprintf(res, sizeof res, "%s/results/lab02.json", tmp_dir);
    snprintf(cmd, sizeof cmd, "./lab02 --grade-only --answers '%s' --results '%s'", fixture, res);
    cr_assert_eq(mc_test_run(cmd, 30, out, OUT_CAP), 0, "%s\n%s", fixture, out);
    return ls_total_score(out);
}

static void run_for_fixtures(void) {
    char sheet[256];
    snprintf(sheet, sizeof sheet, "%s/f.md", tmp_dir);
    char *text = ls_read_file("tests/fixtures/lab02/negated.md");
    cr_assert_not_null(text);
    ls_write_file(sheet, text);
    free(text);
    cr_assert_eq(run_lab_in(tmp_dir, 4, sheet, NULL, NULL), 0, "%s", out);
}

Test(lab02, negated_truths_and_keyword_lists_earn_nothing) {
    run_for_fixtures();
    /* a conditional under "it is not true that" still earns its claims (the engine ends the
       denial at "if"), and so does what follows a semicolon or a "but" (they end a denial
       frame: "It is not true that X; in backward it is Y" states Y): at most 2 */
    double negated = grade_fixture("tests/fixtures/lab02/negated.md");
    cr_expect_leq(negated, 2.0, "negated sheet scored %.2f\n%s", negated, out);
    cr_expect(mc_test_contains(out, "stated only as denied"), "%s", out);
    double keywords = grade_fixture("tests/fixtures/lab02/keywords.md");
    cr_expect_leq(keywords, 0.5, "keyword sheet scored %.2f\n%s", keywords, out);
}

Test(lab02, package_duties_earn_their_item_and_not_the_cross_links) {
    run_for_fixtures();
    grade_fixture("tests/fixtures/lab02/duties_only.md");
    static const char *const earned[] = {"M1.parallel_state ..", "M1.tensor_parallel .",
                                         "M1.pipeline_parallel", "M1.grads_optimizer .",
                                         "M1.dist_checkpointing"};
    for (int i = 0; i < 5; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s line", earned[i]);
        cr_expect(mc_test_contains(out, want), "%s not earned\n%s", earned[i], out);
    }
    static const char *const not_earned[] = {"M3.optimizer_on_grads", "M3.checkpoint_layout",
                                             "FU3.the_collective ."};
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "%s not found", not_earned[i]);
        cr_expect(mc_test_contains(out, want), "%s earned by a duty sentence\n%s",
                  not_earned[i], out);
    }
}

Test(lab02, a_symptom_value_counts_only_under_its_own_name) {
    /* the run's step-0 loss called a grad norm and its grad norm called a loss: the sentence
       still earns its comparison with TP=1, the values nothing */
    run_for_fixtures();
    grade_fixture("tests/fixtures/lab02/evidence_misnamed.md");
    cr_expect(mc_test_contains(out, "M4.symptom_loss .... not quoted"), "%s", out);
    cr_expect(mc_test_contains(out, "M4.symptom_grad_norm not quoted"), "%s", out);
    cr_expect(mc_test_contains(out, "M4.against_a_reference line"), "%s", out);
}

Test(lab02, every_misconception_fires_in_english_and_chinese) {
    static const char *const ids[] = {"MC1", "MC2", "MC3", "MC4", "MC5", "MC6", "MC7", "MC8"};
    static const char *const sheets[] = {"tests/fixtures/lab02/misconceptions.md",
                                         "tests/fixtures/lab02/misconceptions.zh.md"};
    run_for_fixtures();
    for (int s = 0; s < 2; s++) {
        double total = grade_fixture(sheets[s]);
        cr_expect_leq(total, 0.5, "%s scored %.2f\n%s", sheets[s], total, out);
        for (int i = 0; i < 8; i++) {
            char want[32];
            snprintf(want, sizeof want, "[MISC] %s ", ids[i]);
            cr_expect(mc_test_contains(out, want), "%s: %s did not fire\n%s", sheets[s], ids[i],
                      out);
        }
    }
}

static void expect_reference_scores(const char *ref) {
    char sheet[256], cmd[512];
    snprintf(sheet, sizeof sheet, "%s/ref.md", tmp_dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/results'", tmp_dir);
    cr_assert_eq(system(cmd), 0);
    char *text = ls_read_file(ref);
    cr_assert_not_null(text, "missing %s", ref);
    ls_write_file(sheet, text);   /* its nonce is in its header; the first run locks everything */
    free(text);
    int rc = run_lab_in(tmp_dir, 4, sheet, NULL, NULL);
    cr_assert_eq(rc, 0, "lab02 on %s exited %d\n%s", ref, rc, out);
    double total = ls_total_score(out);
    cr_expect_geq(total, 14.0, "%s scored %.2f/15\n%s", ref, total, out);
    cr_expect(mc_test_contains(out, "locked=yes"), "%s: predictions not locked\n%s", ref, out);
    cr_expect(mc_test_contains(out, "no misconception fired"), "%s\n%s", ref, out);
}

Test(lab02, reference_answers_score_at_least_14) {
    expect_reference_scores("answers/reference/lab02.md");
    expect_reference_scores("answers/reference/lab02.zh.md");
}
