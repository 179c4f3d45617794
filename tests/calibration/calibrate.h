/* tests/calibration/calibrate.h - grading a lab's labelled calibration corpus, shared by `make calibrate` (tests/calibration/calibrate.c) and the Criterion suite
   tests/test_lab03_calibration.c.

   A corpus is tests/calibration/<lab>/sheets/<id>.md with tests/calibration/<lab>/labels.tsv:
   a header row, then one row per sheet with the columns id, split (dev | test), label (the
   total out of 15 a separate rater gave from the seed's points), one column per rubric item
   (M1 ... FU4), ledger (as_written | empty_at_first_run), style and note.

   Every sheet is graded against results that a real run of the lab measured for the sheet's
   nonce, and a ledger that replays how the sheet stood at its first run: as_written locks the
   sheet's predictions as they are; empty_at_first_run locks the sheet with every prediction
   blanked (the learner filled them in after seeing the run).

   The results are frozen where the corpus has them: <lab>/results/<id>.json is the run that
   sheet is graded against, kept so that a grade does not depend on the machine's load (a
   timing, or a race a lab provokes on purpose, differs from run to run and a quoted value
   then matches one run and not the next). `make calibration-results` (cal_grade_all with
   freeze set) makes them from real runs; cal_check_frozen fails once the lab writes results
   of another shape, so they cannot go stale silently. A sheet without a frozen file (one
   copied in to be measured) is graded against a fresh run: one per nonce, cached for the
   corpus. A lab that reveals facts once the sheet is locked (lab02) also keeps
   the ledger its revealing run left, results/<id>.ledger.json.

   The bar, on the test half: |grader - label| <= 2 on at least 90% of the sheets, every sheet
   labelled >= 13 grades >= 13, every sheet labelled <= 3 grades <= 4. */
#ifndef GR_CALIBRATE_H_INCLUDED
#define GR_CALIBRATE_H_INCLUDED

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "labs/grader.h"
#include "tests/test_util.h"

#define CAL_MAX_SHEETS 256
#define CAL_MAX_ITEMS 16

typedef struct cal_sheet {
    char id[64];
    char split[8];
    double label;
    int nitems;
    char item_id[CAL_MAX_ITEMS][16];
    double item_label[CAL_MAX_ITEMS];
    char ledger[32];
    char style[160];
    /* filled by grading */
    int graded;      /* 1 when the grader produced a total */
    int frozen;      /* 1 when graded against results/<id>.json */
    double score;
    int check_by_hand; /* the report asked for the grade to be checked by hand */
    double item_score[CAL_MAX_ITEMS];
    char error[2 * PATH_MAX];
} cal_sheet;

typedef struct cal_corpus {
    char lab[32];
    char dir[PATH_MAX];
    int freeze; /* set after cal_load: grade against fresh runs and keep them in results/ */
    int frozen; /* filled by grading: the sheets graded against results/<id>.json */
    int n;
    cal_sheet sheet[CAL_MAX_SHEETS];
} cal_corpus;

typedef struct cal_bar {
    int n, within, high_n, high_ok, low_n, low_ok;
    int pass;
} cal_bar;

/* The output of the last lab run (mpirun's stdout and stderr), quoted when a run fails. */
#define CAL_RUN_OUTPUT (1 << 16)
static char cal_run_output[CAL_RUN_OUTPUT];

/* Whether the lab reveals hidden facts once the sheet's findings are locked (lab02's fault: the
   rubric's "lock_when_filled"), so its results hold more after the learner's next run. */
static inline int cal_rubric_reveals(const char *rubric) {
    char *text = mc_test_read_file(rubric, NULL);
    int reveals = text != NULL && strstr(text, "\"lock_when_filled\"") != NULL;
    free(text);
    return reveals;
}

static inline int cal_spit(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -1;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Cuts a string that snprintf truncated back to whole UTF-8 characters, so that a style
   column written in Chinese does not end the printed table in half a character. */
static inline void cal_utf8_whole(char *s) {
    size_t n = strlen(s), i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) i--;   /* continuation bytes */
    if (i == 0 || (unsigned char)s[i - 1] < 0xC0) return;           /* ends on ASCII */
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (n - (i - 1) < want) s[i - 1] = '\0';
}

/* Splits one TSV line in place. */
static inline int cal_fields(char *line, char **out, int cap) {
    int n = 0;
    for (char *p = line; n < cap;) {
        out[n++] = p;
        char *tab = strchr(p, '\t');
        if (tab == NULL) break;
        *tab = '\0';
        p = tab + 1;
    }
    return n;
}

/* Reads <dir>/labels.tsv. Returns 0, or -1 with a message in err. */
static inline int cal_load(cal_corpus *cp, const char *lab, const char *dir, char *err,
                           size_t cap) {
    memset(cp, 0, sizeof *cp);
    snprintf(cp->lab, sizeof cp->lab, "%s", lab);
    snprintf(cp->dir, sizeof cp->dir, "%.4000s", dir);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%.4000s/labels.tsv", dir);
    char *text = mc_test_read_file(path, NULL);
    if (text == NULL) {
        snprintf(err, cap, "%.700s cannot be read: %s", path, strerror(errno));
        return -1;
    }
    char *cols[64];
    int ncol = 0, c_id = -1, c_split = -1, c_label = -1, c_ledger = -1, c_style = -1;
    int item_cols[CAL_MAX_ITEMS], nitem = 0;
    int lineno = 0;
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        lineno++;
        size_t l = strlen(line);
        if (l > 0 && line[l - 1] == '\r') line[l - 1] = '\0';
        if (line[0] == '\0' || line[0] == '#') continue;
        char *f[64];
        int nf = cal_fields(line, f, 64);
        if (ncol == 0) { /* header */
            ncol = nf;
            for (int i = 0; i < nf; i++) {
                cols[i] = f[i];
                if (!strcmp(f[i], "id")) c_id = i;
                else if (!strcmp(f[i], "split")) c_split = i;
                else if (!strcmp(f[i], "label")) c_label = i;
                else if (!strcmp(f[i], "ledger")) c_ledger = i;
                else if (!strcmp(f[i], "style")) c_style = i;
                else if (strcmp(f[i], "note") != 0 && nitem < CAL_MAX_ITEMS)
                    item_cols[nitem++] = i;
            }
            if (c_id < 0 || c_split < 0 || c_label < 0 || c_ledger < 0) {
                snprintf(err, cap, "%.700s: the header needs id, split, label and ledger columns",
                         path);
                free(text);
                return -1;
            }
            continue;
        }
        if (cp->n >= CAL_MAX_SHEETS) break;
        if (nf <= c_ledger || nf <= c_label) {
            snprintf(err, cap, "%.700s line %d: %d columns, the header has %d", path, lineno, nf, ncol);
            free(text);
            return -1;
        }
        cal_sheet *s = &cp->sheet[cp->n++];
        snprintf(s->id, sizeof s->id, "%s", f[c_id]);
        snprintf(s->split, sizeof s->split, "%s", f[c_split]);
        s->label = strtod(f[c_label], NULL);
        snprintf(s->ledger, sizeof s->ledger, "%s", f[c_ledger]);
        snprintf(s->style, sizeof s->style, "%s", c_style >= 0 && c_style < nf ? f[c_style] : "");
        s->nitems = nitem;
        for (int i = 0; i < nitem; i++) {
            snprintf(s->item_id[i], sizeof s->item_id[i], "%s", cols[item_cols[i]]);
            s->item_label[i] = item_cols[i] < nf ? strtod(f[item_cols[i]], NULL) : 0;
        }
        if (strcmp(s->split, "dev") != 0 && strcmp(s->split, "test") != 0) {
            snprintf(err, cap, "%.700s line %d: split must be dev or test, got '%s'", path, lineno,
                     s->split);
            free(text);
            return -1;
        }
        if (strcmp(s->ledger, "as_written") != 0 && strcmp(s->ledger, "empty_at_first_run") != 0) {
            snprintf(err, cap, "%.700s line %d: ledger must be as_written or empty_at_first_run, got "
                               "'%s'", path, lineno, s->ledger);
            free(text);
            return -1;
        }
    }
    /* the header's strings live in text: copy the item ids out before freeing (done above) */
    free(text);
    return 0;
}

/* The sheet with every prediction value replaced by "?" (how it stood before the learner
   filled the pred blocks). */
static inline char *cal_blank_predictions(const char *sheet) {
    size_t n = strlen(sheet);
    char *out = malloc(n * 2 + 16);
    if (out == NULL) return NULL;
    size_t k = 0;
    int in_pred = 0;
    for (const char *p = sheet; *p != '\0';) {
        const char *eol = strchr(p, '\n');
        size_t len = eol != NULL ? (size_t)(eol - p) : strlen(p);
        const char *q = p;
        while (q < p + len && (*q == ' ' || *q == '\t'))
            q++;
        int fence = len - (size_t)(q - p) >= 3 && strncmp(q, "```", 3) == 0;
        const char *colon = memchr(p, ':', len);
        if (fence) {
            in_pred = !in_pred && strncmp(q + 3, "pred", 4) == 0;
            memcpy(out + k, p, len);
            k += len;
        } else if (in_pred && colon != NULL) {
            size_t head = (size_t)(colon - p) + 1;
            memcpy(out + k, p, head);
            k += head;
            memcpy(out + k, " ?", 2);
            k += 2;
        } else if (!in_pred) {
            memcpy(out + k, p, len);
            k += len;
        }
        if (eol == NULL) break;
        out[k++] = '\n';
        p = eol + 1;
    }
    out[k] = '\0';
    return out;
}

/* World size from the rubric's run command ("mpirun ... -np 8 ./lab03"); 8 when absent. */
static inline int cal_world(const char *rubric_path) {
    cJSON *r = mc_test_json_load(rubric_path);
    int np = 8;
    const cJSON *cmd = cJSON_GetObjectItemCaseSensitive(r, "run_command");
    if (cJSON_IsString(cmd)) {
        const char *p = strstr(cmd->valuestring, "-np ");
        if (p != NULL) np = atoi(p + 4);
    }
    cJSON_Delete(r);
    return np > 0 ? np : 8;
}

/* Reads "nonce: X" from the sheet's header comment. */
static inline int cal_nonce(const char *sheet_path, char nonce[17]) {
    char variant[8];
    int probe = -1;
    return gr_read_header(sheet_path, nonce, &probe, variant);
}

/* Copies the results a sheet was graded against to <dir>/results/<id>.json (frozen). */
static inline int cal_keep_results(const char *dir, const char *results, const char *frozen) {
    char rdir[PATH_MAX + 32];
    snprintf(rdir, sizeof rdir, "%.4000s/results", dir);
    if (mkdir(rdir, 0755) != 0 && errno != EEXIST) return -1;
    char *text = mc_test_read_file(results, NULL);
    int rc = text != NULL ? cal_spit(frozen, text) : -1;
    free(text);
    return rc;
}

/* A real run of the lab for the sheet at src (its predictions blanked, as at a first run),
   writing results to cache unless an earlier sheet of the same nonce already did. Returns 0,
   1 when the sheet cannot be prepared (sheet_err says why), or -1 when the run failed (err). */
static inline int cal_fresh_run(const char *binary, int np, const char *src, const char *nonce,
                                const char *work, const char *cache, char *sheet_err,
                                size_t sheet_cap, char *err, size_t cap) {
    char *out = cal_run_output;
    char dir[PATH_MAX + 96], answers[PATH_MAX + 128], cmd[4 * PATH_MAX];
    if (access(cache, R_OK) == 0) return 0;
    snprintf(dir, sizeof dir, "%s/run-%s", work, nonce);
    mkdir(dir, 0755);
    snprintf(answers, sizeof answers, "%s/answers.md", dir);
    char *sheet = mc_test_read_file(src, NULL);
    char *blank = sheet != NULL ? cal_blank_predictions(sheet) : NULL;
    int w = blank != NULL ? cal_spit(answers, blank) : -1;
    free(sheet);
    free(blank);
    if (w != 0) {
        snprintf(sheet_err, sheet_cap, "cannot write %s", answers);
        return 1;
    }
    snprintf(cmd, sizeof cmd, "%s --answers '%s' --results '%s'", binary, answers, cache);
    int rc = mc_test_mpirun(np, cmd, 120, out, CAL_RUN_OUTPUT);
    if (rc != 0 || access(cache, R_OK) != 0) {
        snprintf(err, cap, "the run for nonce %s failed (exit %d): %.300s", nonce, rc, out);
        return -1;
    }
    return 0;
}

/* Grades every sheet. work is a scratch directory; lab_binary e.g. "./lab03". Returns 0, or -1
   when the lab could not be run (err says why). Per-sheet problems go to sheet->error. */
static inline int cal_grade_all(cal_corpus *cp, const char *root, const char *work, char *err,
                                size_t cap) {
    char rubric[PATH_MAX + 64], binary[PATH_MAX + 64];
    snprintf(rubric, sizeof rubric, "%s/labs/rubric/%s.json", root, cp->lab);
    snprintf(binary, sizeof binary, "%s/%s", root, cp->lab);
    if (access(binary, X_OK) != 0) {
        snprintf(err, cap, "%.700s not found: build it first (make %s)", binary, cp->lab);
        return -1;
    }
    int np = cal_world(rubric);
    int reveals = cal_rubric_reveals(rubric);
    char *out = cal_run_output;
    for (int i = 0; i < cp->n; i++) {
        cal_sheet *s = &cp->sheet[i];
        char src[PATH_MAX + 96], dir[PATH_MAX + 96], answers[PATH_MAX + 128],
            results[PATH_MAX + 128], ledger[PATH_MAX + 128], cache[PATH_MAX + 128],
            frozen[PATH_MAX + 160], frozen_ledger[PATH_MAX + 180], cmd[4 * PATH_MAX];
        snprintf(src, sizeof src, "%s/sheets/%s.md", cp->dir, s->id);
        char nonce[17] = "";
        if (cal_nonce(src, nonce) != 0) {
            snprintf(s->error, sizeof s->error, "%s has no header with a nonce", src);
            continue;
        }
        /* the frozen run of this sheet, or one real run per nonce */
        snprintf(frozen, sizeof frozen, "%s/results/%s.json", cp->dir, s->id);
        s->frozen = !cp->freeze && access(frozen, R_OK) == 0;
        snprintf(cache, sizeof cache, "%s/run-%s/results.json", work, nonce);
        if (!s->frozen) {
            int rc = cal_fresh_run(binary, np, src, nonce, work, cache, s->error,
                                   sizeof s->error, err, cap);
            if (rc < 0) return -1;
            if (rc > 0) continue;
        }
        /* the sheet as it stood at the first run, locked; then the sheet as written */
        snprintf(dir, sizeof dir, "%s/sheet-%s", work, s->id);
        mkdir(dir, 0755);
        snprintf(answers, sizeof answers, "%s/answers.md", dir);
        snprintf(results, sizeof results, "%s/results.json", dir);
        snprintf(ledger, sizeof ledger, "%s/results.ledger.json", dir);
        remove(ledger);
        char *sheet = mc_test_read_file(src, NULL);
        char *res = mc_test_read_file(s->frozen ? frozen : cache, NULL);
        if (sheet == NULL || res == NULL || cal_spit(results, res) != 0) {
            snprintf(s->error, sizeof s->error, "cannot prepare %s", dir);
            free(sheet);
            free(res);
            continue;
        }
        free(res);
        char *first = strcmp(s->ledger, "empty_at_first_run") == 0 ? cal_blank_predictions(sheet)
                                                                   : strdup(sheet);
        gr_lock_info info;
        int lrc = first != NULL && cal_spit(answers, first) == 0
                      ? gr_ledger_lock(ledger, rubric, answers, nonce, &info)
                      : -1;
        free(first);
        if (lrc != 0) {
            snprintf(s->error, sizeof s->error, "lock failed: %s", info.message);
            free(sheet);
            continue;
        }
        cal_spit(answers, sheet);
        free(sheet);
        /* a lab that reveals its hidden facts once the findings are locked (lab02's fault:
           the rubric's "lock_when_filled") runs once more on the locked sheet, as the learner's
           next run would, so the findings are graded against the revealed facts */
        snprintf(frozen_ledger, sizeof frozen_ledger, "%s/results/%s.ledger.json", cp->dir, s->id);
        if (reveals && s->frozen) { /* the ledger as that revealing run left it */
            char *kept = mc_test_read_file(frozen_ledger, NULL);
            int ok = kept != NULL && cal_spit(ledger, kept) == 0;
            free(kept);
            if (!ok) {
                snprintf(s->error, sizeof s->error, "%s cannot be read: make calibration-results",
                         frozen_ledger);
                continue;
            }
        }
        if (reveals && !s->frozen) {
            snprintf(cmd, sizeof cmd, "%s --answers '%s' --results '%s'", binary, answers, results);
            int rc = mc_test_mpirun(np, cmd, 120, out, CAL_RUN_OUTPUT);
            if (rc != 0 && rc != 1) {
                snprintf(s->error, sizeof s->error, "the revealing run failed (exit %d): %.300s",
                         rc, out);
                continue;
            }
        }
        if (cp->freeze && (cal_keep_results(cp->dir, results, frozen) != 0 ||
                           (reveals && cal_keep_results(cp->dir, ledger, frozen_ledger) != 0))) {
            snprintf(s->error, sizeof s->error, "cannot write %s", frozen);
            continue;
        }
        cp->frozen += s->frozen;
        gr_report rep;
        const char *show = getenv("GR_CALIBRATE_SHOW"); /* a sheet id, or "all": print its table */
        int quiet = show == NULL || (strcmp(show, "all") != 0 && strcmp(show, s->id) != 0);
        if (!quiet) printf("==== %s (%s, label %.2f)\n", s->id, s->split, s->label);
        fflush(stdout);
        int grc = gr_grade(&(gr_grade_desc){.rubric_path = rubric,
                                            .answers_path = answers,
                                            .results_path = results,
                                            .ledger_path = ledger,
                                            .out = stdout,
                                            .quiet = quiet},
                           &rep);
        if (grc != 0) {
            char lab[sizeof cp->lab];
            memcpy(lab, cp->lab, sizeof lab);
            snprintf(s->error, sizeof s->error, "grader status %d (run ./%s --grade-only --answers "
                                                "%.900s for the message)", grc, lab, src);
            continue;
        }
        s->graded = 1;
        s->score = rep.total;
        s->check_by_hand = rep.check_by_hand;
        for (int k = 0; k < s->nitems; k++)
            for (int j = 0; j < rep.n_items; j++)
                if (strcmp(rep.items[j].kind, "item") == 0 && strcmp(rep.items[j].id, s->item_id[k]) == 0)
                    s->item_score[k] = rep.items[j].score;
        gr_report_free(&rep);
    }
    return 0;
}

static inline const char *cal_json_kind(const cJSON *v) {
    return cJSON_IsObject(v) ? "an object" : cJSON_IsArray(v) ? "a list" : cJSON_IsString(v) ? "a string"
         : cJSON_IsNumber(v) ? "a number" : cJSON_IsBool(v) ? "a boolean" : "null";
}

/* Whether frozen has the shape of fresh: the same keys in every object (where exact, no keys
   that fresh lacks either), the same kind of value under each (null, a measurement that was not
   taken, matches any), list elements compared pairwise. The first difference goes to why. */
static inline int cal_same_shape(const cJSON *frozen, const cJSON *fresh, int exact, char *path,
                                 size_t at, char *why, size_t cap) {
    if (cJSON_IsNull(frozen) || cJSON_IsNull(fresh)) return 1;
    int kind_differs = strcmp(cal_json_kind(frozen), cal_json_kind(fresh)) != 0;
    if (kind_differs) {
        snprintf(why, cap, "%s is %s in the frozen results and %s in a fresh run", path,
                 cal_json_kind(frozen), cal_json_kind(fresh));
        return 0;
    }
    const cJSON *c;
    if (cJSON_IsObject(fresh)) {
        cJSON_ArrayForEach(c, fresh) {
            const cJSON *o = cJSON_GetObjectItemCaseSensitive(frozen, c->string);
            snprintf(path + at, PATH_MAX - at, ".%s", c->string);
            if (o == NULL) {
                snprintf(why, cap, "a fresh run writes %s, which the frozen results lack", path);
                return 0;
            }
            if (!cal_same_shape(o, c, exact, path, strlen(path), why, cap)) return 0;
        }
        cJSON_ArrayForEach(c, frozen) {
            snprintf(path + at, PATH_MAX - at, ".%s", c->string);
            if (exact && cJSON_GetObjectItemCaseSensitive(fresh, c->string) == NULL) {
                snprintf(why, cap, "the frozen results have %s, which a fresh run no longer writes",
                         path);
                return 0;
            }
        }
    } else if (cJSON_IsArray(fresh)) {
        int n = cJSON_GetArraySize(fresh), m = cJSON_GetArraySize(frozen);
        for (int i = 0; i < n && i < m; i++) {
            snprintf(path + at, PATH_MAX - at, "[%d]", i);
            if (!cal_same_shape(cJSON_GetArrayItem(frozen, i), cJSON_GetArrayItem(fresh, i), exact,
                                path, strlen(path), why, cap))
                return 0;
        }
    }
    path[at] = '\0';
    return 1;
}

/* Checks that the corpus's frozen results still have the shape the lab writes: one fresh run,
   for the nonce of the first sheet with a frozen file, against that file (a lab that reveals
   facts once the sheet is locked writes more after the reveal, so its frozen files may hold
   keys the fresh run lacks). Returns 0 when they agree or nothing is frozen, or -1 with err
   naming the first difference and how to remake the files. */
static inline int cal_check_frozen(const cal_corpus *cp, const char *root, const char *work,
                                   char *err, size_t cap) {
    char rubric[PATH_MAX + 64], binary[PATH_MAX + 64];
    snprintf(rubric, sizeof rubric, "%s/labs/rubric/%s.json", root, cp->lab);
    snprintf(binary, sizeof binary, "%s/%s", root, cp->lab);
    int exact = !cal_rubric_reveals(rubric);
    for (int i = 0; i < cp->n; i++) {
        char frozen[PATH_MAX + 160], src[PATH_MAX + 96], cache[PATH_MAX + 128], nonce[17] = "";
        char sheet_err[2 * PATH_MAX] = "";
        snprintf(frozen, sizeof frozen, "%s/results/%s.json", cp->dir, cp->sheet[i].id);
        snprintf(src, sizeof src, "%s/sheets/%s.md", cp->dir, cp->sheet[i].id);
        if (access(frozen, R_OK) != 0 || cal_nonce(src, nonce) != 0) continue;
        snprintf(cache, sizeof cache, "%s/shape-%s.json", work, nonce);
        int rc = cal_fresh_run(binary, cal_world(rubric), src, nonce, work, cache, sheet_err,
                               sizeof sheet_err, err, cap);
        if (rc != 0) {
            if (rc > 0) snprintf(err, cap, "%s", sheet_err);
            return -1;
        }
        cJSON *fa = mc_test_json_load(frozen), *fb = mc_test_json_load(cache);
        char path[PATH_MAX] = "results", why[1024] = "";
        int same = fa != NULL && fb != NULL && cal_same_shape(fa, fb, exact, path, 7, why, sizeof why);
        if (fa == NULL || fb == NULL) snprintf(why, sizeof why, "one of them is not JSON");
        cJSON_Delete(fa);
        cJSON_Delete(fb);
        if (!same) {
            snprintf(err, cap, "%.600s is stale: %.700s; remake the frozen runs with "
                               "make calibration-results", frozen, why);
            return -1;
        }
        return 0;
    }
    return 0;
}

/* The bar of A0.7 over the sheets of one split. */
static inline cal_bar cal_check(const cal_corpus *cp, const char *split) {
    cal_bar b;
    memset(&b, 0, sizeof b);
    for (int i = 0; i < cp->n; i++) {
        const cal_sheet *s = &cp->sheet[i];
        if (strcmp(s->split, split) != 0) continue;
        b.n++;
        double g = s->graded ? s->score : -100;
        b.within += fabs(g - s->label) <= 2.0 + 1e-9;
        if (s->label >= 13 - 1e-9) {
            b.high_n++;
            b.high_ok += g >= 13 - 1e-9;
        }
        if (s->label <= 3 + 1e-9) {
            b.low_n++;
            b.low_ok += s->graded && g <= 4 + 1e-9;
        }
    }
    b.pass = b.n > 0 && b.within * 10 >= b.n * 9 && b.high_ok == b.high_n && b.low_ok == b.low_n;
    return b;
}

/* The table: each sheet's grader score beside its label, per split, then the bar. */
static inline void cal_print(const cal_corpus *cp, FILE *f) {
    fprintf(f, "%s calibration: %d sheets (%s)\n", cp->lab, cp->n, cp->dir);
    static const char *const splits[] = {"dev", "test"};
    for (int sp = 0; sp < 2; sp++) {
        int any = 0;
        for (int i = 0; i < cp->n; i++)
            any |= strcmp(cp->sheet[i].split, splits[sp]) == 0;
        if (!any) {
            fprintf(f, "-- %s: no sheets\n", splits[sp]);
            continue;
        }
        fprintf(f, "-- %s\n%-8s %6s %6s %6s  %-44s %s\n", splits[sp], "sheet", "label", "grader",
                "diff", "per item (label/grader)", "style");
        for (int i = 0; i < cp->n; i++) {
            const cal_sheet *s = &cp->sheet[i];
            if (strcmp(s->split, splits[sp]) != 0) continue;
            char items[512] = "";
            size_t u = 0;
            for (int k = 0; k < s->nitems && u + 24 < sizeof items; k++)
                u += (size_t)snprintf(items + u, sizeof items - u, "%s%s %g/%g", k ? " " : "",
                                      s->item_id[k], s->item_label[k], s->item_score[k]);
            char style[61];
            snprintf(style, sizeof style, "%s", s->style);
            cal_utf8_whole(style);
            if (s->graded)
                fprintf(f, "%-8s %6.2f %6.2f %+6.2f%s %-44s %s\n", s->id, s->label, s->score,
                        s->score - s->label, fabs(s->score - s->label) > 2 + 1e-9 ? "!" : " ",
                        items, style);
            else
                fprintf(f, "%-8s %6.2f  error  %s\n", s->id, s->label, s->error);
        }
        int frozen = 0;
        for (int i = 0; i < cp->n; i++)
            frozen += cp->sheet[i].frozen && strcmp(cp->sheet[i].split, splits[sp]) == 0;
        if (frozen > 0) fprintf(f, "(%d of them graded against their frozen runs in results/)\n", frozen);
        int hand = 0;
        for (int i = 0; i < cp->n; i++)
            hand += cp->sheet[i].check_by_hand && strcmp(cp->sheet[i].split, splits[sp]) == 0;
        if (hand > 0) {
            fprintf(f, "check by hand (the report says so):");
            for (int i = 0; i < cp->n; i++) {
                const cal_sheet *s = &cp->sheet[i];
                if (s->check_by_hand && strcmp(s->split, splits[sp]) == 0)
                    fprintf(f, " %s (%+.2f)", s->id, s->score - s->label);
            }
            fprintf(f, "\n");
        }
        cal_bar b = cal_check(cp, splits[sp]);
        fprintf(f, "%s bar: |grader-label|<=2 on %d/%d (need >= 90%%), label>=13 -> >=13: %d/%d, "
                   "label<=3 -> <=4: %d/%d: %s\n",
                splits[sp], b.within, b.n, b.high_ok, b.high_n, b.low_ok, b.low_n,
                b.pass ? "PASS" : "FAIL");
    }
}

/* Loads the corpus in dir and grades it in a scratch directory it removes afterwards, then
   checks its frozen runs (cal_check_frozen); where require_frozen, every development sheet must
   have one, so that no dev grade depends on the machine's load. Returns 0, or -1 with err
   (a corpus, run or sheet that could not be graded, a stale or missing frozen run). */
static inline int cal_run_corpus(cal_corpus *cp, const char *lab, const char *dir, const char *root,
                                 int require_frozen, char *err, size_t cap) {
    char work[] = "/tmp/gr_calibration_XXXXXX", cmd[64];
    if (cal_load(cp, lab, dir, err, cap) != 0) return -1;
    if (mkdtemp(work) == NULL) {
        snprintf(err, cap, "mkdtemp: %s", strerror(errno));
        return -1;
    }
    int rc = cal_grade_all(cp, root, work, err, cap);
    if (rc == 0) rc = cal_check_frozen(cp, root, work, err, cap);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
    if (system(cmd) != 0 && rc == 0) {
        snprintf(err, cap, "cannot remove %s", work);
        rc = -1;
    }
    for (int i = 0; i < cp->n && rc == 0; i++) {
        const cal_sheet *s = &cp->sheet[i];
        if (!s->graded) {
            snprintf(err, cap, "%s: %.900s", s->id, s->error);
            rc = -1;
        } else if (require_frozen && !s->frozen && strcmp(s->split, "dev") == 0) {
            snprintf(err, cap, "%s has no frozen run (%.600s/results/%s.json): make "
                               "calibration-results", s->id, cp->dir, s->id);
            rc = -1;
        }
    }
    return rc;
}

/* Whether one split meets the bar; where it does not, msg says how and holds the table. */
static inline int cal_meets_bar(const cal_corpus *cp, const char *split, char *msg, size_t cap) {
    cal_bar b = cal_check(cp, split);
    if (b.pass) return 1;
    char *table = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&table, &len);
    if (f != NULL) {
        cal_print(cp, f);
        fclose(f);
    }
    snprintf(msg, cap, "%s %s: |grader-label| <= 2 on %d/%d sheets (need 90%%), labelled >= 13 "
                       "graded >= 13 on %d/%d, labelled <= 3 graded <= 4 on %d/%d\n%s",
             cp->lab, split, b.within, b.n, b.high_ok, b.high_n, b.low_ok, b.low_n,
             table != NULL ? table : "");
    free(table);
    return 0;
}


/* What labs/rubric/agreement.json records of one split, the figures each grade report quotes
   to say how far its grade can be trusted: how many sheets, how many the grader put within 2
   points of the marker, and the mean (grader - label) on the sheets marked <= 5 and >= 12
   (where a grade goes wrong in each direction). */
static inline cJSON *cal_agreement(const cal_corpus *cp, const char *split) {
    cal_bar b = cal_check(cp, split);
    double low = 0, high = 0;
    int nlow = 0, nhigh = 0;
    for (int i = 0; i < cp->n; i++) {
        const cal_sheet *s = &cp->sheet[i];
        if (strcmp(s->split, split) != 0 || !s->graded) continue;
        if (s->label <= 5 + 1e-9) low += s->score - s->label, nlow++;
        if (s->label >= 12 - 1e-9) high += s->score - s->label, nhigh++;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "sheets", b.n);
    cJSON_AddNumberToObject(o, "within_2", b.within);
    cJSON_AddNumberToObject(o, "marked_13_up", b.high_n);
    cJSON_AddNumberToObject(o, "marked_13_up_graded_13_up", b.high_ok);
    cJSON_AddNumberToObject(o, "marked_3_down", b.low_n);
    cJSON_AddNumberToObject(o, "marked_3_down_graded_4_down", b.low_ok);
    cJSON_AddNumberToObject(o, "marked_5_down", nlow);
    cJSON_AddNumberToObject(o, "mean_diff_marked_5_down", nlow ? round(100 * low / nlow) / 100 : 0);
    cJSON_AddNumberToObject(o, "marked_12_up", nhigh);
    cJSON_AddNumberToObject(o, "mean_diff_marked_12_up", nhigh ? round(100 * high / nhigh) / 100 : 0);
    cJSON_AddBoolToObject(o, "meets_bar", b.pass);
    return o;
}

/* The lab's entry of labs/rubric/agreement.json: {"dev": {...}, "test": {...}}. */
static inline cJSON *cal_agreement_entry(const cal_corpus *cp) {
    cJSON *e = cJSON_CreateObject();
    cJSON_AddItemToObject(e, "dev", cal_agreement(cp, "dev"));
    cJSON_AddItemToObject(e, "test", cal_agreement(cp, "test"));
    return e;
}

/* Whether labs/rubric/agreement.json under root holds what grading the corpus measured now;
   where not, msg names the lab, the figure, both values and the command that remakes it. */
static inline int cal_agreement_current(const cal_corpus *cp, const char *root, char *msg,
                                        size_t cap) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%.3000s/labs/rubric/agreement.json", root);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(msg, cap, "%s: cannot read %s: make agreement", cp->lab, path);
        return 0;
    }
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    cJSON *doc = cJSON_Parse(text), *now = cal_agreement_entry(cp);
    const cJSON *had = cJSON_GetObjectItemCaseSensitive(doc, cp->lab);
    int ok = had != NULL;
    if (!ok) snprintf(msg, cap, "%s: %s has no entry for it: make agreement", cp->lab, path);
    static const char *const splits[] = {"dev", "test"};
    for (int sp = 0; sp < 2 && ok; sp++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(had, splits[sp]), *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(now, splits[sp])) {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(a, v->string);
            double want = cJSON_IsBool(v) ? cJSON_IsTrue(v) : v->valuedouble;
            double got = w == NULL ? NAN : cJSON_IsBool(w) ? cJSON_IsTrue(w) : w->valuedouble;
            if (!(fabs(want - got) < 1e-9)) {
                snprintf(msg, cap, "%s: %s says %s.%s = %g, grading the corpus now gives %g: "
                                   "make agreement", cp->lab, path, splits[sp], v->string, got, want);
                ok = 0;
                break;
            }
        }
    }
    cJSON_Delete(doc);
    cJSON_Delete(now);
    return ok;
}

#endif /* GR_CALIBRATE_H_INCLUDED */
