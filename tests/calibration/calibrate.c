/* tests/calibration/calibrate.c - `make calibrate`: grades every lab's calibration corpus
   (tests/calibration/<lab>/) and prints each sheet's grader score beside its label, with the
   dev/test split (see calibrate.h).

       build/tests/calibrate            every lab that has tests/calibration/<lab>/labels.tsv
       build/tests/calibrate lab03      one lab
       build/tests/calibrate --freeze   grade against fresh runs and keep each sheet's run as
                                        tests/calibration/<lab>/results/<id>.json, the frozen
                                        run it is graded against from then on
       build/tests/calibrate --agreement
                                        also write what it measured, per lab and split, to
                                        labs/rubric/agreement.json: each grade report quotes it
                                        to say how far its grade can be trusted

   Exit status: 0 when every lab's test half meets the bar (or a lab has no test half yet,
   which the table says), 1 when a test half misses it, 2 when a corpus or a run is unusable. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/calibration/calibrate.h"

static int calibrate_lab(const char *root, const char *lab, const char *work_base, int freeze,
                         cJSON *agreement) {
    static cal_corpus cp;
    char dir[PATH_MAX + 64], err[1024], work[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s/tests/calibration/%s", root, lab);
    if (cal_load(&cp, lab, dir, err, sizeof err) != 0) {
        fprintf(stderr, "calibrate: %s\n", err);
        return 2;
    }
    cp.freeze = freeze;
    snprintf(work, sizeof work, "%s/%s", work_base, lab);
    mkdir(work, 0755);
    if (cal_grade_all(&cp, root, work, err, sizeof err) != 0) {
        fprintf(stderr, "calibrate: %s\n", err);
        return 2;
    }
    cal_print(&cp, stdout);
    int errors = 0;
    for (int i = 0; i < cp.n; i++)
        errors += !cp.sheet[i].graded;
    if (errors > 0) return 2;
    if (agreement != NULL) {
        cJSON_DeleteItemFromObjectCaseSensitive(agreement, lab);
        cJSON_AddItemToObject(agreement, lab, cal_agreement_entry(&cp));
    }
    cal_bar test = cal_check(&cp, "test");
    if (test.n == 0) {
        printf("%s: no test half in the corpus yet; the bar is checked on the test half only\n",
               lab);
        return 0;
    }
    return test.pass ? 0 : 1;
}

/* labs/rubric/agreement.json as it stands (an empty object when there is none), so that a run
   over some labs keeps the others' entries. */
static cJSON *read_agreement(const char *path) {
    cJSON *doc = NULL;
    FILE *f = fopen(path, "rb");
    if (f != NULL) {
        static char text[1 << 16];
        size_t n = fread(text, 1, sizeof text - 1, f);
        text[n] = '\0';
        fclose(f);
        doc = cJSON_Parse(text);
    }
    return cJSON_IsObject(doc) ? doc : (cJSON_Delete(doc), cJSON_CreateObject());
}

/* Writes the labs in name order, through a temporary file renamed over the old one. */
static int write_agreement(const char *path, cJSON *agreement) {
    cJSON *sorted = cJSON_CreateObject();
    for (;;) {
        cJSON *first = NULL, *e;
        cJSON_ArrayForEach(e, agreement) {
            if (first == NULL || strcmp(e->string, first->string) < 0) first = e;
        }
        if (first == NULL) break;
        cJSON_AddItemToObject(sorted, first->string, cJSON_DetachItemViaPointer(agreement, first));
    }
    char *json = cJSON_Print(sorted), tmp[PATH_MAX + 80];
    cJSON_Delete(sorted);
    size_t n = strlen(json);
    char *text = malloc(n + 2);
    memcpy(text, json, n);
    memcpy(text + n, "\n", 2);
    free(json);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = cal_spit(tmp, text) == 0 ? rename(tmp, path) : -1;
    free(text);
    if (rc != 0) fprintf(stderr, "calibrate: cannot write %s\n", path);
    else printf("wrote %s\n", path);
    return rc;
}

int main(int argc, char **argv) {
    const char *root = mc_test_repo_root();
    char work_base[] = "/tmp/gr_calibrate_XXXXXX";
    if (mkdtemp(work_base) == NULL) {
        perror("calibrate: mkdtemp");
        return 2;
    }
    int worst = 0, labs = 0, freeze = 0, agree = 0;
    for (; argc > 1 && strncmp(argv[1], "--", 2) == 0; argv++, argc--) {
        if (strcmp(argv[1], "--freeze") == 0) freeze = 1;
        else if (strcmp(argv[1], "--agreement") == 0) agree = 1;
        else {
            fprintf(stderr, "calibrate: unknown option %s (--freeze, --agreement)\n", argv[1]);
            return 2;
        }
    }
    char apath[PATH_MAX + 64];
    snprintf(apath, sizeof apath, "%s/labs/rubric/agreement.json", root);
    cJSON *agreement = agree ? read_agreement(apath) : NULL;
    if (argc > 1) {
        for (int i = 1; i < argc; i++, labs++) {
            int rc = calibrate_lab(root, argv[i], work_base, freeze, agreement);
            if (rc > worst) worst = rc;
        }
    } else {
        char cdir[PATH_MAX + 32];
        snprintf(cdir, sizeof cdir, "%s/tests/calibration", root);
        DIR *d = opendir(cdir);
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            char labels[PATH_MAX + 320];
            snprintf(labels, sizeof labels, "%s/%s/labels.tsv", cdir, e->d_name);
            if (e->d_name[0] == '.' || access(labels, R_OK) != 0) continue;
            labs++;
            int rc = calibrate_lab(root, e->d_name, work_base, freeze, agreement);
            if (rc > worst) worst = rc;
        }
        if (d != NULL) closedir(d);
    }
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", work_base);
    if (system(cmd) != 0) fprintf(stderr, "calibrate: could not remove %s\n", work_base);
    if (labs == 0) {
        fprintf(stderr, "calibrate: no corpus (tests/calibration/<lab>/labels.tsv)\n");
        return 2;
    }
    if (agreement != NULL && worst < 2 && write_agreement(apath, agreement) != 0) return 2;
    cJSON_Delete(agreement);
    return worst;
}
