/* fuzz_rubric - libFuzzer target: the grader's rubric loader on any rubric file.

   The input is the rubric (an in-memory file); gr_rubric_items lists its items and gr_grade
   grades the reference answer sheet with it against the frozen lab03 results. A rubric that
   cannot be used must be refused with a negative status, never crash or leak. Run from the
   repository root (make fuzz). Corpus: tests/fuzz/corpus/rubric */
#include "labs/grader.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("rubric", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char rubric[64];
    snprintf(rubric, sizeof rubric, "/proc/self/fd/%d", fd);
    gr_rubric_item *items = NULL;
    int n = gr_rubric_items(rubric, &items);
    if (n >= 0) free(items);
    gr_report rep;
    memset(&rep, 0, sizeof rep);
    gr_grade_desc d;
    memset(&d, 0, sizeof d);
    d.rubric_path = rubric;
    d.answers_path = "answers/reference/lab03.md";
    d.results_path = "tests/fixtures/lab03/results.json";
    d.ledger_path = "/nonexistent/fuzz.ledger.json";
    d.quiet = 1;
    (void)gr_grade(&d, &rep);
    gr_report_free(&rep);
    close(fd);
    return 0;
}
