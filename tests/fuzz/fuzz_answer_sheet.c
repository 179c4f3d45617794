/* fuzz_answer_sheet - libFuzzer target: the grader on any answer sheet.

   The input is the sheet (an in-memory file, /proc/self/fd/N), graded with lab03's rubric
   against the frozen results tests/fixtures/lab03/results.json; the header reader and the
   prediction hash read it too. Each must grade it or refuse it with a negative status,
   never crash, read out of bounds or leak. Run from the repository root (make fuzz).
   Corpus: tests/fuzz/corpus/answer_sheet */
#include "labs/grader.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("answer_sheet", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char sheet[64], nonce[17], variant[8], hash[17];
    int probe = -1, filled = 0;
    snprintf(sheet, sizeof sheet, "/proc/self/fd/%d", fd);
    (void)gr_read_header(sheet, nonce, &probe, variant);
    (void)gr_prediction_hash(sheet, hash, &filled);
    gr_report rep;
    memset(&rep, 0, sizeof rep);
    gr_grade_desc d;
    memset(&d, 0, sizeof d);
    d.rubric_path = "labs/rubric/lab03.json";
    d.answers_path = sheet;
    d.results_path = "tests/fixtures/lab03/results.json";
    d.ledger_path = "/nonexistent/fuzz.ledger.json";
    d.quiet = 1;
    int rc = gr_grade(&d, &rep);
    if (rc == 0 && !(rep.total <= rep.total_max + 1e-9)) abort();   /* never above the max */
    gr_report_free(&rep);
    close(fd);
    return 0;
}
