/* fuzz_cli - libFuzzer target: the megatron_c calculator's option parser and commands.

   The first byte picks the command: layout (option parsing only: a valid layout of a large
   world prints for a long time), schedule and microbatches (run whole: schedule is bounded,
   microbatches parses ramp-up lists and step schedules). The rest are words split at NUL and
   newline bytes. Output goes to /dev/null; the exit code must be 0, 1 or 2.
   make fuzz (corpus: tests/fuzz/corpus/cli) */
#define MEGATRON_C_CLI_NO_MAIN
#include "tools/megatron_c.c"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!freopen("/dev/null", "w", stdout)) abort();   /* stderr stays: libFuzzer reports there */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const names[] = {"layout", "schedule", "microbatches"};
    const char *name = names[data[0] % 3];
    fuzz_argv fa;
    if (fuzz_argv_make(&fa, name, data + 1, size - 1) != 0) return 0;
    int rc;
    if (data[0] % 3 == 0) {
        layout_args a;
        memset(&a, 0, sizeof a);
        cli_option opts[32];
        int n = layout_options(&a, opts);
        rc = (int)cli_parse("layout", opts, n, fa.argc, fa.argv);
        if (rc < 0 || rc > 2) abort();
    } else {
        rc = cli_find_command(name)->run(fa.argc, fa.argv);
        if (rc < 0 || rc > 2) abort();
    }
    fuzz_argv_free(&fa);
    return 0;
}
