/* tests/calibration/calibrate.c - `make calibrate`: grades every lab's calibration corpus
   (tests/calibration/<lab>/) and prints each sheet's grader score beside its label, with the
   dev/test split (see calibrate.h).

       build/tests/calibrate            every lab that has tests/calibration/<lab>/labels.tsv
       build/tests/calibrate lab03      one lab
       build/tests/calibrate --freeze   grade against fresh runs and keep each sheet's run as
                                        tests/calibration/<lab>/results/<id>.json, the frozen
                                        run it is graded against from then on

   Exit status: 0 when every lab's test half meets the bar (or a lab has no test half yet,
   which the table says), 1 when a test half misses it, 2 when a corpus or a run is unusable. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/calibration/calibrate.h"

static int calibrate_lab(const char *root, const char *lab, const char *work_base, int freeze) {
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
    cal_bar test = cal_check(&cp, "test");
    if (test.n == 0) {
        printf("%s: no test half in the corpus yet; the bar is checked on the test half only\n",
               lab);
        return 0;
    }
    return test.pass ? 0 : 1;
}

int main(int argc, char **argv) {
    const char *root = mc_test_repo_root();
    char work_base[] = "/tmp/gr_calibrate_XXXXXX";
    if (mkdtemp(work_base) == NULL) {
        perror("calibrate: mkdtemp");
        return 2;
    }
    int worst = 0, labs = 0, freeze = argc > 1 && strcmp(argv[1], "--freeze") == 0;
    if (freeze) {
        argv++;
        argc--;
    }
    if (argc > 1) {
        for (int i = 1; i < argc; i++, labs++) {
            int rc = calibrate_lab(root, argv[i], work_base, freeze);
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
            int rc = calibrate_lab(root, e->d_name, work_base, freeze);
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
    return worst;
}
