/* labs/lab_driver.c - the lab driver. See lab_driver.h for what a run does, in order. */
#include "lab_driver.h"

#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "grader.h"

#define LAB__RESULTS_FORMAT 2      /* 1: lab03 before the driver (no "format" key) */
#define LAB__DEFAULT_WORLD_TIMEOUT_S 30.0

/* ---------------------------------------------------------------------------------------------
   >>heap  The allocator the driver gives the library: malloc/free with counters, so a lab can
   measure what a call allocated (the parallel state vs the model) and watch what a destroy
   releases. Sizes come from malloc_usable_size, so there is no header before the block and a
   pointer from plain malloc would still be freed correctly. */

static lab_heap_stats lab__heap;
static void (*lab__free_watch)(void *ptr, void *user);
static void *lab__free_watch_user;

static void *lab__alloc(size_t size, void *user) {
    (void)user;
    void *p = malloc(size);
    if (p == NULL) return NULL;
    long long live = __atomic_add_fetch(&lab__heap.live_bytes, (long long)malloc_usable_size(p),
                                        __ATOMIC_RELAXED);
    long long peak = __atomic_load_n(&lab__heap.peak_bytes, __ATOMIC_RELAXED);
    while (live > peak && !__atomic_compare_exchange_n(&lab__heap.peak_bytes, &peak, live, 1,
                                                       __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
    __atomic_add_fetch(&lab__heap.live_blocks, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&lab__heap.allocs, 1, __ATOMIC_RELAXED);
    return p;
}

static void lab__free(void *ptr, void *user) {
    (void)user;
    if (ptr == NULL) return;
    if (lab__free_watch != NULL) lab__free_watch(ptr, lab__free_watch_user);
    __atomic_sub_fetch(&lab__heap.live_bytes, (long long)malloc_usable_size(ptr),
                       __ATOMIC_RELAXED);
    __atomic_sub_fetch(&lab__heap.live_blocks, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&lab__heap.frees, 1, __ATOMIC_RELAXED);
    free(ptr);
}

void lab_heap_stats_get(lab_heap_stats *out) {
    out->live_bytes = __atomic_load_n(&lab__heap.live_bytes, __ATOMIC_RELAXED);
    out->live_blocks = __atomic_load_n(&lab__heap.live_blocks, __ATOMIC_RELAXED);
    out->allocs = __atomic_load_n(&lab__heap.allocs, __ATOMIC_RELAXED);
    out->frees = __atomic_load_n(&lab__heap.frees, __ATOMIC_RELAXED);
    out->peak_bytes = __atomic_load_n(&lab__heap.peak_bytes, __ATOMIC_RELAXED);
}

void lab_heap_peak_reset(void) {
    __atomic_store_n(&lab__heap.peak_bytes, __atomic_load_n(&lab__heap.live_bytes, __ATOMIC_RELAXED),
                     __ATOMIC_RELAXED);
}

void lab_heap_watch_frees(void (*fn)(void *ptr, void *user), void *user) {
    lab__free_watch = fn;
    lab__free_watch_user = user;
}

/* The library's log lines, shown with LAB_VERBOSE=1 (experiments produce expected errors and
   timeouts, so they are quiet by default). */
static void lab__logger(const char *tag, uint32_t level, int item, const char *message,
                        uint32_t line, const char *file, void *user_data) {
    (void)item;
    (void)user_data;
    const char *verbose = getenv("LAB_VERBOSE");
    if (verbose != NULL && verbose[0] == '1')
        fprintf(stderr, "[rank %d] %s L%u %s:%u %s\n", lab_rank(), tag ? tag : "mc", level,
                file ? file : "?", line, message ? message : "");
}

/* ---------------------------------------------------------------------------------------------
   >>small */

void lab_meet_idle(lab_ctx *cx, double timeout_s) {
    mc_request *req = NULL;
    double deadline = lab_now() + (timeout_s > 0 ? timeout_s : 600.0);
    MC_CHECK(mc_barrier_async(cx->world, &req));
    for (;;) {
        int done = 0;
        MC_CHECK(mc_test(req, &done));
        if (done) return;
        if (lab_now() > deadline) {
            fprintf(stderr, "%s: rank %d waited %.0f s for the other ranks at a meeting point; "
                    "stopping\n", cx->spec->name, cx->me, timeout_s > 0 ? timeout_s : 600.0);
            lab_abort(LAB_EXIT_FAILED);
        }
        struct timespec nap = {0, 5 * 1000 * 1000};
        nanosleep(&nap, NULL);
    }
}

double lab_round_s(double seconds) { return (double)(long long)(seconds * 1e4 + 0.5) / 1e4; }
double lab_round_ms(double ms) { return (double)(long long)(ms * 1e3 + 0.5) / 1e3; }

void lab_heading(lab_ctx *cx, const char *fmt, ...) {
    (void)cx;
    if (lab_rank() != 0) return;
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    lab_printf0("\n== %s ==\n", text);
}

/* ---------------------------------------------------------------------------------------------
   >>run  The driver's bookkeeping behind lab_ctx.run. */

typedef struct lab__check {
    int experiment;        /* index into the spec's experiments */
    int ok;
    char what[256];
} lab__check;

typedef struct lab__ledger {
    int available;         /* the grader has a ledger */
    int status;            /* its return value */
    int locked_empty;      /* this run locked a sheet without predictions */
    char message[512];
    cJSON *json;           /* rank 0: what goes into the results */
} lab__ledger;

typedef struct lab__sheet {
    int header_ok;         /* the sheet had a readable header */
    int written;           /* this run wrote the template (the sheet was missing) */
    int pred_present, pred_blocks;
    char pred_hash[17];
    char pred_time[32];
} lab__sheet;

typedef struct lab__run {
    double started;
    char started_iso[32];
    int current;           /* experiment running now, -1 outside */
    double *seconds;       /* per experiment, slowest rank */
    int *status;           /* LAB_RAN / LAB_SKIPPED, -1 not reached */
    lab__check *checks;
    int n_checks, cap_checks, failed_checks;
    char **figures;
    int n_figures;
    lab__sheet sheet;
    lab__ledger ledger;
} lab__run;

int lab_check(lab_ctx *cx, int ok, const char *fmt, ...) {
    lab__run *r = cx->run;
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (!ok) {
        r->failed_checks++;
        lab_printf0("check failed: %s\n", what);
    }
    if (r->n_checks == r->cap_checks) {
        int cap = r->cap_checks ? 2 * r->cap_checks : 16;
        lab__check *bigger = realloc(r->checks, (size_t)cap * sizeof *bigger);
        if (bigger == NULL) return ok;   /* the failure is counted even if not listed */
        r->checks = bigger;
        r->cap_checks = cap;
    }
    lab__check *c = &r->checks[r->n_checks++];
    c->experiment = r->current;
    c->ok = ok != 0;
    snprintf(c->what, sizeof c->what, "%s", what);
    return ok;
}

cJSON *lab_json_from_rank(lab_ctx *cx, cJSON *mine, int root) {
    char *text = NULL;
    int len = 0;
    if (cx->me == root) {
        text = mine != NULL ? cJSON_PrintUnformatted(mine) : NULL;
        len = text != NULL ? (int)strlen(text) + 1 : 0;
    }
    cJSON_Delete(mine);
    MC_CHECK(lab_broadcast_bytes(cx->world, &len, sizeof len, root));
    if (len == 0) return NULL;
    if (cx->me != root) text = lab_xcalloc((size_t)len, 1);
    MC_CHECK(lab_broadcast_bytes(cx->world, text, (size_t)len, root));
    cJSON *out = cJSON_Parse(text);
    free(text);
    return out;
}

const char *lab_flag_value(const lab_ctx *cx, const char *name) {
    for (int k = 0; k < cx->spec->n_flags; k++)
        if (strcmp(cx->spec->flags[k].name, name) == 0) return cx->args->flag_values[k];
    return NULL;
}

int lab_figure(lab_ctx *cx, const char *name, lab_svg *svg) {
    if (cx->me != 0) return MC_OK;
    char path[4200];
    lab_path_beside_results(cx->args->results_path, name, "svg", path, sizeof path);
    int rc = lab_svg_write(svg, path);
    if (rc != MC_OK) return rc;
    char **bigger = realloc(cx->run->figures, (size_t)(cx->run->n_figures + 1) * sizeof *bigger);
    if (bigger == NULL) return MC_ERR_NO_MEMORY;
    cx->run->figures = bigger;
    bigger[cx->run->n_figures] = strdup(path);
    if (bigger[cx->run->n_figures] != NULL) cx->run->n_figures++;
    lab_printf0("figure: %s\n", path);
    return MC_OK;
}

/* ---------------------------------------------------------------------------------------------
   >>grader  Every call into the grader (labs/grader.h) is in this section, so that the
   grader's interface changes in one place. */

static int lab__gr_read_header(const char *answers_path, char nonce[17], int *probe,
                               char variant[8]) {
    return gr_read_header(answers_path, nonce, probe, variant);
}

static int lab__gr_prediction_hash(const char *answers_path, char hex[17], int *filled) {
    return gr_prediction_hash(answers_path, hex, filled);
}

/* The grader's name for the envelope version: "results_format" 2 = predictions locked in the
   ledger (the envelope's own "format" says the same to other readers). */
static int lab__gr_results_format(void) { return GR_RESULTS_FORMAT; }

/* Writes <results>.grade.json and prints the table (last line "Total x/15"). Rank 0 only. */
static int lab__gr_grade(const lab_args *args, int print) {
    char grade_path[4200], ledger_path[4200];
    lab_grade_path_from_results(args->results_path, grade_path, sizeof grade_path);
    gr_ledger_path_for(args->results_path, ledger_path, sizeof ledger_path);
    gr_grade_desc desc = {
        .rubric_path = args->rubric_path,
        .answers_path = args->answers_path,
        .results_path = args->results_path,
        .ledger_path = ledger_path,
        .grade_out_path = grade_path,
        .out = stdout,
        .quiet = print ? 0 : 1,
    };
    fflush(stdout);
    int rc = gr_grade(&desc, NULL);
    fflush(stdout);
    return rc;
}

/* The prediction ledger beside the results: the first measured run per nonce locks the
   sheet's predictions, later runs never re-lock (they say how many keys changed). Rank 0,
   before anything is measured; the outcome goes into the results' "ledger". */
static void lab__gr_ledger_lock(const lab_args *args, const char *nonce, lab__ledger *out) {
    char ledger_path[4200];
    gr_ledger_path_for(args->results_path, ledger_path, sizeof ledger_path);
    lab_make_parent_dirs(ledger_path);   /* the first run may come before results/ exists */
    gr_lock_info info;
    memset(&info, 0, sizeof info);
    memset(out, 0, sizeof *out);
    out->available = 1;
    out->status = gr_ledger_lock(ledger_path, args->rubric_path, args->answers_path, nonce,
                                 &info);
    snprintf(out->message, sizeof out->message, "%s", info.message);
    out->locked_empty = out->status == 0 && info.locked_now && info.n_keys == 0;
    out->json = cJSON_CreateObject();
    cJSON_AddStringToObject(out->json, "path", ledger_path);
    cJSON_AddBoolToObject(out->json, "ok", out->status == 0);
    cJSON_AddBoolToObject(out->json, "locked_now", info.locked_now);
    cJSON_AddStringToObject(out->json, "locked_at", info.locked_at);
    cJSON_AddNumberToObject(out->json, "keys", info.n_keys);
    cJSON_AddNumberToObject(out->json, "changed_since_lock", info.n_changed);
    cJSON_AddStringToObject(out->json, "message", info.message);
}

/* ---------------------------------------------------------------------------------------------
   >>rubric  What the driver reads from the rubric file: its version and the variants'
   question text (for the template's {variant_question}). */

static cJSON *lab__rubric_load(const char *path) {
    char *text = lab_read_text(path, NULL);
    if (text == NULL) return NULL;
    cJSON *root = cJSON_Parse(text);
    free(text);
    return root;
}

static const char *lab__json_str(const cJSON *obj, const char *key, const char *fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) && v->valuestring != NULL ? v->valuestring : fallback;
}

/* ---------------------------------------------------------------------------------------------
   >>template  labs/templates/<lab>.md with {nonce} {probe_rank} {variant} {variant_question}
   (and {variant_title}, {followup_probe_rank}) filled in. */

typedef struct lab__subst {
    const char *name;      /* without braces */
    const char *value;
} lab__subst;

/* One pass of substitution; unknown {names} stay as they are. Caller frees. */
static char *lab__substitute(const char *text, const lab__subst *subs, int n) {
    size_t cap = strlen(text) + 1, len = 0;
    for (int i = 0; i < n; i++) cap += 8 * strlen(subs[i].value) + 64;
    char *out = malloc(cap);
    if (out == NULL) return NULL;
    for (const char *p = text; *p != '\0';) {
        const lab__subst *hit = NULL;
        if (*p == '{')
            for (int i = 0; i < n && hit == NULL; i++) {
                size_t k = strlen(subs[i].name);
                if (strncmp(p + 1, subs[i].name, k) == 0 && p[1 + k] == '}') hit = &subs[i];
            }
        if (hit == NULL) {
            if (len + 1 >= cap) break;
            out[len++] = *p++;
            continue;
        }
        size_t vl = strlen(hit->value);
        if (len + vl + 1 >= cap) {
            char *bigger = realloc(out, cap + vl + 64);
            if (bigger == NULL) break;
            out = bigger;
            cap += vl + 64;
        }
        memcpy(out + len, hit->value, vl);
        len += vl;
        p += strlen(hit->name) + 2;
    }
    out[len] = '\0';
    return out;
}

static void lab__variant_name(int variant, char *out, size_t cap) {
    snprintf(out, cap, "F%d", variant);
}

/* The sheet for `nonce`, or NULL with a message on stderr. Caller frees. */
static char *lab__render_template(const lab_spec *spec, const lab_args *args,
                                  const char *nonce) {
    char *tmpl = lab_read_text(args->template_path, NULL);
    if (tmpl == NULL) {
        fprintf(stderr, "cannot read the answer-sheet template %s: %s\n", args->template_path,
                strerror(errno));
        return NULL;
    }
    char probe[16], followup_probe[16], variant[8];
    snprintf(probe, sizeof probe, "%d", lab_nonce_probe_rank(nonce, spec->default_world));
    snprintf(followup_probe, sizeof followup_probe, "%d",
             spec->followup_world > 0 ? lab_nonce_probe_rank(nonce, spec->followup_world) : -1);
    lab__variant_name(lab_nonce_variant(nonce, spec->n_variants), variant, sizeof variant);
    cJSON *rubric = lab__rubric_load(args->rubric_path);
    const cJSON *var = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(rubric, "variants"), variant);
    const char *question = lab__json_str(var, "question", NULL);
    if (question == NULL) {
        fprintf(stderr, "warning: the rubric %s has no variants.%s.question; the sheet's "
                        "follow-up question stays empty\n", args->rubric_path, variant);
        question = "";
    }
    lab__subst subs[] = {{"nonce", nonce},
                         {"probe_rank", probe},
                         {"followup_probe_rank", followup_probe},
                         {"variant", variant},
                         {"variant_question", question},
                         {"variant_title", lab__json_str(var, "title", "")}};
    int n = (int)(sizeof subs / sizeof subs[0]);
    char *once = lab__substitute(tmpl, subs, n);
    /* the variant's question may itself name {probe_rank}: a second pass fills it */
    char *twice = once != NULL ? lab__substitute(once, subs, n) : NULL;
    free(once);
    free(tmpl);
    cJSON_Delete(rubric);
    return twice;
}

/* The text with every HTML comment and all white space removed: what a learner wrote. */
static char *lab__sheet_substance(const char *text) {
    char *out = malloc(strlen(text) + 1);
    size_t len = 0;
    if (out == NULL) return NULL;
    for (const char *p = text; *p != '\0';) {
        if (strncmp(p, "<!--", 4) == 0) {
            const char *end = strstr(p + 4, "-->");
            p = end != NULL ? end + 3 : p + strlen(p);
            continue;
        }
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') out[len++] = *p;
        p++;
    }
    out[len] = '\0';
    return out;
}

/* 1 when the sheet at `path` holds anything beyond the template its own nonce gives (or
   anything at all when its header cannot be read). */
static int lab__sheet_has_answers(const lab_spec *spec, const lab_args *args, const char *path) {
    char *text = lab_read_text(path, NULL);
    if (text == NULL) return 0;
    char *mine = lab__sheet_substance(text);
    free(text);
    char nonce[17] = "", variant[8] = "";
    int probe = -1, answers = 1;
    if (mine != NULL && mine[0] == '\0') {
        answers = 0;
    } else if (mine != NULL && lab__gr_read_header(path, nonce, &probe, variant) >= 0 &&
               lab_nonce_valid(nonce)) {
        char *fresh = lab__render_template(spec, args, nonce);
        char *theirs = fresh != NULL ? lab__sheet_substance(fresh) : NULL;
        answers = theirs == NULL || strcmp(mine, theirs) != 0;
        free(fresh);
        free(theirs);
    }
    free(mine);
    return answers;
}

/* --init, and the first run without a sheet. Prints what it did. */
static int lab__write_sheet(const lab_spec *spec, const lab_args *args, const char *nonce_in,
                            int force) {
    char nonce[LAB_NONCE_LEN + 1];
    if (nonce_in != NULL) {
        snprintf(nonce, sizeof nonce, "%s", nonce_in);
    } else if (lab_nonce_new(nonce) != 0) {
        fprintf(stderr, "cannot read /dev/urandom to draw a nonce\n");
        return LAB_EXIT_FAILED;
    }
    if (!force && lab__sheet_has_answers(spec, args, args->answers_path)) {
        fprintf(stderr,
                "%s already holds answers; not overwritten.\n"
                "Pass --force to replace it with a fresh template (your answers will be lost).\n",
                args->answers_path);
        return LAB_EXIT_FAILED;
    }
    char *text = lab__render_template(spec, args, nonce);
    if (text == NULL) return LAB_EXIT_FAILED;
    int rc = lab_write_text_atomic(text, args->answers_path);
    free(text);
    if (rc != MC_OK) return LAB_EXIT_FAILED;
    char variant[8];
    lab__variant_name(lab_nonce_variant(nonce, spec->n_variants), variant, sizeof variant);
    printf("wrote %s: nonce %s, probe rank %d, follow-up %s\n", args->answers_path, nonce,
           lab_nonce_probe_rank(nonce, spec->default_world), variant);
    return LAB_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------------
   >>sheet  Step 0 of a run, before anything is measured. Rank 0 reads the sheet; the nonce
   and what it derives travel to every rank. */

static void lab__sheet_rank0(lab_ctx *cx, char nonce_out[LAB_NONCE_LEN + 1]) {
    const lab_spec *spec = cx->spec;
    const lab_args *args = cx->args;
    lab__sheet *sh = &cx->run->sheet;
    char nonce[17] = "", variant_text[8] = "";
    int header_probe = -1;
    int rc = lab__gr_read_header(args->answers_path, nonce, &header_probe, variant_text);
    if (rc < 0 && access(args->answers_path, F_OK) != 0) {
        printf("%s does not exist: writing the template (as ./%s --init does)\n",
               args->answers_path, spec->name);
        if (lab__write_sheet(spec, args, args->nonce, 0) == LAB_EXIT_OK) {
            sh->written = 1;
            rc = lab__gr_read_header(args->answers_path, nonce, &header_probe, variant_text);
        }
    }
    sh->header_ok = rc >= 0 && lab_nonce_valid(nonce);
    if (args->nonce != NULL) {
        if (sh->header_ok && strcmp(nonce, args->nonce) != 0)
            printf("note: --nonce %s overrides the nonce %s of %s\n", args->nonce, nonce,
                   args->answers_path);
        snprintf(nonce, sizeof nonce, "%s", args->nonce);
    } else if (!sh->header_ok) {
        if (lab_nonce_new(nonce) != 0) snprintf(nonce, sizeof nonce, "000000");
        printf("warning: %s has no usable header; this run uses the one-off nonce %s "
               "(./%s --init writes a sheet with its own nonce)\n",
               args->answers_path, nonce, spec->name);
    }
    snprintf(nonce_out, LAB_NONCE_LEN + 1, "%.6s", nonce);
    int probe = lab_nonce_probe_rank(nonce_out, spec->default_world);
    char derived[8];
    lab__variant_name(lab_nonce_variant(nonce_out, spec->n_variants), derived, sizeof derived);
    if (sh->header_ok && args->nonce == NULL &&
        (header_probe != probe || strcmp(variant_text, derived) != 0))
        printf("warning: the header of %s says probe %d / %s but nonce %s gives probe %d / %s;"
               " the nonce wins (the header is not meant to be edited)\n",
               args->answers_path, header_probe, variant_text, nonce_out, probe, derived);

    /* Recorded before any measurement: what the predictions looked like at run time. */
    lab_iso8601_utc(sh->pred_time, sizeof sh->pred_time);
    int filled = 0;
    if (lab__gr_prediction_hash(args->answers_path, sh->pred_hash, &filled) == 0) {
        sh->pred_blocks = filled;
        sh->pred_present = filled > 0;
    } else {
        sh->pred_hash[0] = '\0';
    }
    lab__gr_ledger_lock(args, nonce_out, &cx->run->ledger);
}

static void lab__sheet_step(lab_ctx *cx) {
    char nonce[LAB_NONCE_LEN + 1];
    memset(nonce, 0, sizeof nonce);
    if (cx->me == 0) lab__sheet_rank0(cx, nonce);
    MC_CHECK(lab_broadcast_bytes(cx->world, nonce, sizeof nonce, 0));
    nonce[LAB_NONCE_LEN] = '\0';
    memcpy(cx->nonce, nonce, sizeof cx->nonce);
    cx->probe_base = lab_nonce_probe_rank(cx->nonce, cx->spec->default_world);
    cx->probe = lab_probe_in_world(cx->probe_base, cx->world_size);
    cx->followup_probe = cx->spec->followup_world > 0
                             ? lab_nonce_probe_rank(cx->nonce, cx->spec->followup_world)
                             : -1;
    cx->variant = lab_nonce_variant(cx->nonce, cx->spec->n_variants);
    lab__variant_name(cx->variant, cx->variant_name, sizeof cx->variant_name);
}

/* ---------------------------------------------------------------------------------------------
   >>world  The grid from the flags over the spec's sizes, and the refusal of a world the lab
   cannot use: one message on rank 0, exit 2 everywhere. */

static int lab__pick(int flag, int spec_value) { return flag ? flag : spec_value; }

static void lab__refuse_grid(const lab_ctx *cx, const mc_grid_desc *d, int rc) {
    const lab_spec *spec = cx->spec;
    int tp = d->tp ? d->tp : 1, pp = d->pp ? d->pp : 1, cp = d->cp ? d->cp : 1;
    int model = tp * pp * cp, W = cx->world_size;
    int suggest = ((W + model - 1) / model) * model;
    if (suggest < spec->default_world && spec->default_world % model == 0)
        suggest = spec->default_world;
    char cp_text[24] = "";
    if (cp > 1) snprintf(cp_text, sizeof cp_text, " cp=%d", cp);
    if (W % model != 0)
        lab_printf0("%s needs world %% (tp*pp*cp) == 0: got %d rank%s for tp=%d pp=%d%s; "
                    "try mpirun -np %d\n",
                    spec->name, W, W == 1 ? "" : "s", tp, pp, cp_text, suggest);
    else
        lab_printf0("%s cannot lay out %d ranks with tp=%d pp=%d cp=%d ep=%d etp=%d "
                    "order=%s:\n  %s: %s\n",
                    spec->name, W, tp, pp, cp, d->ep ? d->ep : 1, d->etp ? d->etp : tp,
                    d->order ? d->order : "tp-cp-ep-dp-pp", mc_err_name(rc), mc_last_error());
}

/* 0, or LAB_EXIT_USAGE after the message. */
static int lab__make_grid(lab_ctx *cx) {
    const lab_args *a = cx->args;
    const mc_grid_desc *s = &cx->spec->sizes;
    const lab_spec *spec = cx->spec;
    int W = cx->world_size;
    if ((spec->min_world > 0 && W < spec->min_world) ||
        (spec->max_world > 0 && W > spec->max_world)) {
        int low = spec->min_world > 0 ? spec->min_world : 1;
        if (spec->max_world > 0 && spec->max_world == low)
            lab_printf0("%s needs exactly %d ranks: got %d; try mpirun -np %d\n", spec->name, low,
                        W, spec->default_world);
        else if (spec->max_world > 0)
            lab_printf0("%s needs %d to %d ranks: got %d; try mpirun -np %d\n", spec->name, low,
                        spec->max_world, W, spec->default_world);
        else
            lab_printf0("%s needs at least %d ranks: got %d; try mpirun -np %d\n", spec->name,
                        low, W, spec->default_world);
        return LAB_EXIT_USAGE;
    }
    mc_grid_desc d = {
        .world = W,
        .tp = lab__pick(a->tp, s->tp),
        .pp = lab__pick(a->pp, s->pp),
        .cp = lab__pick(a->cp, s->cp),
        .ep = lab__pick(a->ep, s->ep),
        .etp = lab__pick(a->etp, s->etp),
        .vpp = lab__pick(a->vpp, s->vpp),
        .order = a->order != NULL ? a->order : s->order,
    };
    int rc = mc_grid_init(&cx->grid, &d);
    if (rc != MC_OK) {
        lab__refuse_grid(cx, &d, rc);
        return LAB_EXIT_USAGE;
    }
    char why[512] = "";
    if (spec->check_world != NULL && spec->check_world(cx, why, sizeof why) != 0) {
        lab_printf0("%s cannot use this world: %s; try mpirun -np %d\n", spec->name, why,
                    spec->default_world);
        return LAB_EXIT_USAGE;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
   >>results  The envelope (format 2). Format 1 had every key but "format", "title",
   "backend", "ledger", "run.experiments", "run.checks" and "figures"; readers of format 1
   find all their keys where they were. */

static cJSON *lab__config_json(const lab_ctx *cx) {
    const mc_grid_desc *d = &cx->grid.desc;
    const mc_backend_info *b = &cx->backend;
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "world", cx->world_size);
    cJSON_AddNumberToObject(c, "tp", d->tp);
    cJSON_AddNumberToObject(c, "pp", d->pp);
    cJSON_AddNumberToObject(c, "cp", d->cp);
    cJSON_AddNumberToObject(c, "ep", d->ep);
    cJSON_AddNumberToObject(c, "etp", d->etp);
    cJSON_AddNumberToObject(c, "vpp", d->vpp);
    cJSON_AddStringToObject(c, "order", cx->grid.order);
    cJSON_AddStringToObject(c, "backend", b->backend);
    cJSON_AddStringToObject(c, "backend_reason", b->backend_reason);
    cJSON_AddStringToObject(c, "mpi_library", b->mpi_library);
    /* the NCCL in use: only when the world runs on it */
    if (cx->world->backend == MC_BACKEND_NCCL && b->nccl_version[0])
        cJSON_AddStringToObject(c, "nccl_version", b->nccl_version);
    else
        cJSON_AddNullToObject(c, "nccl_version");
    cJSON_AddNumberToObject(c, "gpus", b->gpu_count);
    cJSON_AddNumberToObject(c, "timeout_seconds", cx->world->timeout_s);
    cJSON_AddNumberToObject(c, "call_timeout_seconds", cx->call_timeout_s);
    cJSON_AddBoolToObject(c, "quick", cx->args->quick);
    return c;
}

static cJSON *lab__backend_json(const mc_backend_info *b) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "backend", b->backend);
    cJSON_AddStringToObject(o, "reason", b->backend_reason);
    cJSON_AddNumberToObject(o, "world_size", b->world_size);
    cJSON_AddStringToObject(o, "device_kind", b->device_kind);
    cJSON_AddStringToObject(o, "device_name", b->device_name);
    cJSON_AddNumberToObject(o, "device_count", b->device_count);
    cJSON_AddStringToObject(o, "cpu_name", b->cpu_name);
    cJSON_AddNumberToObject(o, "cpu_count", b->cpu_count);
    cJSON_AddBoolToObject(o, "cuda_built", b->cuda_built);
    cJSON_AddNumberToObject(o, "gpu_count", b->gpu_count);
    cJSON_AddStringToObject(o, "gpu_name", b->gpu_name);
    cJSON_AddStringToObject(o, "cuda_runtime", b->cuda_runtime);
    cJSON_AddStringToObject(o, "cuda_driver", b->cuda_driver);
    cJSON_AddStringToObject(o, "nccl_version", b->nccl_version);
    cJSON_AddStringToObject(o, "mpi_version", b->mpi_version);
    cJSON_AddStringToObject(o, "mpi_library", b->mpi_library);
    return o;
}

static cJSON *lab__predictions_json(const lab_ctx *cx) {
    const lab__sheet *sh = &cx->run->sheet;
    cJSON *p = cJSON_CreateObject();
    cJSON_AddBoolToObject(p, "present_at_run", sh->pred_present);
    if (sh->pred_hash[0])
        cJSON_AddStringToObject(p, "hash", sh->pred_hash);
    else
        cJSON_AddNullToObject(p, "hash");
    cJSON_AddStringToObject(p, "time", sh->pred_time);
    cJSON_AddNumberToObject(p, "filled_blocks", sh->pred_blocks);
    cJSON_AddStringToObject(p, "answers_path", cx->args->answers_path);
    cJSON_AddBoolToObject(p, "template_written_by_run", sh->written);
    return p;
}

static cJSON *lab__run_json(const lab_ctx *cx) {
    const lab__run *r = cx->run;
    const lab_spec *spec = cx->spec;
    cJSON *run = cJSON_CreateObject();
    cJSON_AddStringToObject(run, "started", r->started_iso);
    cJSON_AddNumberToObject(run, "seconds", lab_round_s(lab_now() - r->started));
    cJSON *exps = cJSON_AddArrayToObject(run, "experiments");
    for (int i = 0; i < spec->n_experiments; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "name", spec->experiments[i].name);
        cJSON_AddStringToObject(e, "status", r->status[i] == LAB_RAN       ? "ran"
                                             : r->status[i] == LAB_SKIPPED ? "skipped"
                                                                           : "not reached");
        cJSON_AddNumberToObject(e, "seconds", lab_round_s(r->seconds[i]));
        cJSON_AddItemToArray(exps, e);
    }
    cJSON *checks = cJSON_AddArrayToObject(run, "checks");
    for (int i = 0; i < r->n_checks; i++) {
        const lab__check *c = &r->checks[i];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "experiment",
                                c->experiment >= 0 ? spec->experiments[c->experiment].name : "");
        cJSON_AddStringToObject(o, "what", c->what);
        cJSON_AddBoolToObject(o, "ok", c->ok);
        cJSON_AddItemToArray(checks, o);
    }
    return run;
}

/* rubric_version: the rubric's own, read at run time (the results say which rubric the run
   was graded for). */
static cJSON *lab__results_json(lab_ctx *cx, cJSON *facts, int all_checks_held) {
    const lab_spec *spec = cx->spec;
    cJSON *rubric = lab__rubric_load(cx->args->rubric_path);
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddNumberToObject(doc, "format", LAB__RESULTS_FORMAT);
    cJSON_AddNumberToObject(doc, "results_format", lab__gr_results_format());
    cJSON_AddStringToObject(doc, "lab", spec->name);
    cJSON_AddStringToObject(doc, "question", spec->question);
    cJSON_AddStringToObject(doc, "rubric_version", lab__json_str(rubric, "rubric_version", ""));
    cJSON_AddStringToObject(doc, "megatron_c_version", mc_version_string());
    cJSON *build = cJSON_AddObjectToObject(doc, "build");   /* what built this binary */
    cJSON_AddStringToObject(build, "commit", lab_build_commit());
    cJSON_AddNumberToObject(build, "dirty", lab_build_dirty());
    cJSON_Delete(rubric);
    cJSON_AddStringToObject(doc, "title", spec->title);
    cJSON_AddItemToObject(doc, "config", lab__config_json(cx));
    cJSON_AddItemToObject(doc, "backend", lab__backend_json(&cx->backend));
    cJSON_AddStringToObject(doc, "nonce", cx->nonce);
    cJSON_AddNumberToObject(doc, "probe_rank", cx->probe);
    if (spec->followup_world > 0)
        cJSON_AddNumberToObject(doc, "followup_probe_rank", cx->followup_probe);
    cJSON_AddStringToObject(doc, "followup_variant", cx->variant_name);
    cJSON_AddItemToObject(doc, "predictions", lab__predictions_json(cx));
    cJSON *ledger = cx->run->ledger.json;
    cJSON_AddItemToObject(doc, "ledger", ledger != NULL ? ledger : cJSON_CreateNull());
    cx->run->ledger.json = NULL;   /* now owned by doc */
    cJSON *run = lab__run_json(cx);
    cJSON_AddBoolToObject(run, "all_checks_held", all_checks_held);
    cJSON_AddItemToObject(doc, "run", run);
    cJSON *figs = cJSON_AddArrayToObject(doc, "figures");
    for (int i = 0; i < cx->run->n_figures; i++)
        cJSON_AddItemToArray(figs, cJSON_CreateString(cx->run->figures[i]));
    cJSON_AddItemToObject(doc, "facts", facts != NULL ? facts : cJSON_CreateObject());
    return doc;
}

/* --grade-only needs a results file of this lab with facts: say what is wrong otherwise. */
static int lab__results_usable(const lab_spec *spec, const lab_args *args) {
    char run_cmd[128];
    snprintf(run_cmd, sizeof run_cmd, "mpirun --oversubscribe -np %d ./%s", spec->default_world,
             spec->name);
    char *text = lab_read_text(args->results_path, NULL);
    if (text == NULL) {
        fprintf(stderr, "%s: cannot read %s (%s): run `%s` first\n", spec->name,
                args->results_path, strerror(errno), run_cmd);
        return 0;
    }
    cJSON *doc = cJSON_Parse(text);
    free(text);
    const char *lab = lab__json_str(doc, "lab", NULL);
    int ok = 0;
    if (doc == NULL)
        fprintf(stderr, "%s: %s is not valid JSON: run `%s` again\n", spec->name,
                args->results_path, run_cmd);
    else if (lab == NULL || strcmp(lab, spec->name) != 0)
        fprintf(stderr, "%s: %s holds the results of %s, not of %s: run `%s`\n", spec->name,
                args->results_path, lab != NULL ? lab : "no lab", spec->name, run_cmd);
    else if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(doc, "facts")))
        fprintf(stderr, "%s: %s has no \"facts\" object: run `%s` again\n", spec->name,
                args->results_path, run_cmd);
    else
        ok = 1;
    cJSON_Delete(doc);
    return ok;
}

/* ---------------------------------------------------------------------------------------------
   >>run  The measured run, on every rank. */

static void lab__print_header(const lab_ctx *cx) {
    const lab__sheet *sh = &cx->run->sheet;
    lab_printf0("%s / %s %s: world %d, tp %d, pp %d, cp %d, dp %d, order %s\n", cx->spec->name,
                cx->spec->question, cx->spec->title, cx->world_size, cx->grid.desc.tp,
                cx->grid.desc.pp, cx->grid.desc.cp, cx->grid.dp, cx->grid.order);
    lab_printf0("answers %s: nonce %s -> probe rank %d, follow-up %s\n", cx->args->answers_path,
                cx->nonce, cx->probe, cx->variant_name);
    if (cx->me != 0) return;
    lab_printf0("predictions at run time: %s (%d block%s filled, hash %s, %s)\n",
                sh->pred_present ? "present" : "not filled in", sh->pred_blocks,
                sh->pred_blocks == 1 ? "" : "s", sh->pred_hash[0] ? sh->pred_hash : "-",
                sh->pred_time);
    if (!cx->run->ledger.available) return;
    lab_printf0("ledger: %s%s\n", cx->run->ledger.status == 0 ? "" : "ERROR: ",
                cx->run->ledger.message);
    if (cx->run->ledger.locked_empty)
        lab_printf0("  to predict for real: ./%s --init --force draws a fresh nonce; fill in the "
                    "pred blocks, then run again\n", cx->spec->name);
}

static void lab__run_experiments(lab_ctx *cx) {
    const lab_spec *spec = cx->spec;
    lab__run *r = cx->run;
    for (int i = 0; i < spec->n_experiments; i++) {
        r->current = i;
        double t0 = lab_now();
        r->status[i] = spec->experiments[i].run(cx) == LAB_SKIPPED ? LAB_SKIPPED : LAB_RAN;
        double mine = lab_now() - t0;
        MC_CHECK(lab_all_reduce_f64(cx->world, &mine, &r->seconds[i], 1, MC_MAX));
    }
    r->current = -1;
}

/* Rank 0: facts, envelope, file. Returns MC_OK or the write's status. */
static int lab__write_results(lab_ctx *cx, int all_checks_held) {
    cJSON *facts = cx->spec->facts != NULL ? cx->spec->facts(cx) : NULL;
    cJSON *doc = lab__results_json(cx, facts, all_checks_held);
    int rc = lab_json_write_atomic(doc, cx->args->results_path);
    if (cx->spec->report != NULL) cx->spec->report(cx);
    if (rc == MC_OK) lab_printf0("wrote %s\n", cx->args->results_path);
    if (cx->args->json) {
        char *text = cJSON_Print(doc);
        if (text != NULL) lab_printf0("%s\n", text);
        free(text);
    }
    cJSON_Delete(doc);
    return rc;
}

static void lab__run_free(lab__run *r) {
    free(r->seconds);
    free(r->status);
    free(r->checks);
    for (int i = 0; i < r->n_figures; i++) free(r->figures[i]);
    free(r->figures);
    cJSON_Delete(r->ledger.json);
}

/* The world outwaits the experiments' own watchdog: ranks that finished an experiment wait
   on the world for the ones still stuck in a call that will time out. */
static double lab__world_timeout(const lab_args *args, double call_timeout_s) {
    if (args->world_timeout_min > 0) return args->world_timeout_min * 60.0;
    return 3.0 * call_timeout_s > LAB__DEFAULT_WORLD_TIMEOUT_S ? 3.0 * call_timeout_s : 0.0;
}

/* --device cuda: a deterministic CUDA table on the rank's GPU (its local rank modulo the GPUs
   visible) for the world to own. With one GPU per rank the world is nccl; ranks that share a GPU get an
   mpi world that stages every collective through the host. Returns 1 when it made one, 0 for
   the CPU, -1 (message printed) when it cannot. */
static int lab__device_table(const lab_args *args, mc_ops *table) {
    if (args->device == NULL || strcmp(args->device, "cpu") == 0) return 0;
#if defined(MC_ENABLE_CUDA)
    int n = mc_cuda_device_count();
    if (n == 0) {
        if (lab_launcher_rank() == 0)
            fprintf(stderr, "--device cuda: no CUDA device is visible to this process\n");
        return -1;
    }
    int dev = lab_launcher_local_rank() % n;
    /* deterministic: the labs compare runs and ranks bit for bit */
    if (mc_ops_cuda_init(table, &(mc_cuda_desc){.device = dev, .deterministic = 1}) != MC_OK) {
        fprintf(stderr, "--device cuda: rank %d cannot start GPU %d: %s\n", lab_launcher_rank(),
                dev, mc_last_error());
        return -1;
    }
    return 1;
#else
    (void)table;
    if (lab_launcher_rank() == 0)
        fprintf(stderr, "--device cuda: this build has no CUDA op table (build with make cuda)\n");
    return -1;
#endif
}

static void lab__device_table_free(mc_ops *table, int made) {
#if defined(MC_ENABLE_CUDA)
    if (made == 1) mc_ops_cuda_destroy(table);
#else
    (void)table, (void)made;
#endif
}

static int lab__run_lab(const lab_spec *spec, const lab_args *args, int *argc, char ***argv) {
    lab__run run;
    memset(&run, 0, sizeof run);
    run.started = lab_now();
    run.current = -1;
    lab_iso8601_utc(run.started_iso, sizeof run.started_iso);
    lab_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.spec = spec;
    cx.args = args;
    cx.run = &run;
    cx.call_timeout_s = args->timeout_s > 0 ? args->timeout_s : spec->call_timeout_s;
    mc_setup(&(mc_desc){.logger = {.func = lab__logger},
                        .allocator = {.alloc_fn = lab__alloc, .free_fn = lab__free}});

    static mc_ops device_table;   /* --device cuda: outlives the world that owns it */
    int made_table = lab__device_table(args, &device_table);
    if (made_table < 0) return LAB_EXIT_USAGE;
    mc_comm_desc cd = {.backend = (mc_comm_backend)lab_backend_from_name(args->backend),
                       .timeout_s = lab__world_timeout(args, cx.call_timeout_s),
                       .argc = argc,
                       .argv = argv,
                       .memory = made_table ? &device_table : NULL};
    int rc = mc_comm_init_world(&cx.world, &cd);
    if (rc != MC_OK) {
        if (lab_launcher_rank() == 0)
            fprintf(stderr, "%s cannot start its world: %s: %s\n", spec->name, mc_err_name(rc),
                    mc_last_error());
        lab__device_table_free(&device_table, made_table);
        return LAB_EXIT_USAGE;
    }
    cx.me = cx.world->rank;
    cx.world_size = cx.world->size;
    lab_set_rank(cx.me);
    if (lab__make_grid(&cx) != 0) {
        mc_comm_destroy(cx.world);
        lab__device_table_free(&device_table, made_table);
        return LAB_EXIT_USAGE;
    }
    MC_CHECK(mc_backend_query(cx.world, &cx.backend));
    lab__sheet_step(&cx);
    lab__print_header(&cx);

    cx.state = lab_xcalloc(1, spec->state_size);
    run.seconds = lab_xcalloc((size_t)spec->n_experiments, sizeof *run.seconds);
    run.status = lab_xcalloc((size_t)spec->n_experiments, sizeof *run.status);
    for (int i = 0; i < spec->n_experiments; i++) run.status[i] = -1;
    lab__run_experiments(&cx);

    int failed_anywhere = 0;
    MC_CHECK(lab_all_reduce_i32(cx.world, &run.failed_checks, &failed_anywhere, 1, MC_MAX));
    int exit_code = failed_anywhere ? LAB_EXIT_FAILED : LAB_EXIT_OK;
    int write_rc = cx.me == 0 ? lab__write_results(&cx, !failed_anywhere) : MC_OK;
    if (spec->cleanup != NULL) spec->cleanup(&cx);
    MC_CHECK(mc_barrier(cx.world));
    if (cx.me == 0 && write_rc == MC_OK) {
        lab_printf0("\n== Grading %s ==\n", args->answers_path);
        if (lab__gr_grade(args, 1) < 0) exit_code = LAB_EXIT_FAILED;
    } else if (write_rc != MC_OK) {
        exit_code = LAB_EXIT_FAILED;
    }
    free(cx.state);
    lab__run_free(&run);
    mc_comm_destroy(cx.world);
    lab__device_table_free(&device_table, made_table);
    return exit_code;
}

/* ---------------------------------------------------------------------------------------------
   >>main */

static void lab__usage(FILE *f, const lab_spec *spec, int with_summary) {
    lab_print_usage(f, spec->name, with_summary ? spec->summary : NULL, spec->usage);
}

int lab_main(int argc, char **argv, const lab_spec *spec) {
    lab_args args;
    char err[256];
    if (lab_parse_args_ex(argc, argv, spec->name, spec->flags, spec->n_flags, &args, err,
                          sizeof err) != 0) {
        if (lab_launcher_rank() == 0) {
            fprintf(stderr, "%s: %s\n\n", spec->name, err);
            lab__usage(stderr, spec, 0);
        }
        return LAB_EXIT_USAGE;
    }
    if (args.help) {
        if (lab_launcher_rank() == 0) lab__usage(stdout, spec, 1);
        return LAB_EXIT_OK;
    }
    char nonce[LAB_NONCE_LEN + 1];   /* --nonce in lower case, as --init writes nonces */
    if (args.nonce != NULL) {
        for (int i = 0; i <= LAB_NONCE_LEN; i++)
            nonce[i] = (char)tolower((unsigned char)args.nonce[i]);
        args.nonce = nonce;
    }
    /* --init and --grade-only need no MPI: under mpirun only the first rank acts. */
    if (args.init)
        return lab_launcher_rank() == 0 ? lab__write_sheet(spec, &args, args.nonce, args.force)
                                        : LAB_EXIT_OK;
    if (args.grade_only) {
        if (lab_launcher_rank() != 0) return LAB_EXIT_OK;
        if (!lab__results_usable(spec, &args)) return LAB_EXIT_FAILED;
        return lab__gr_grade(&args, 1) < 0 ? LAB_EXIT_FAILED : LAB_EXIT_OK;
    }
    return lab__run_lab(spec, &args, &argc, &argv);
}
