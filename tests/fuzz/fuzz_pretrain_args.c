/* fuzz_pretrain_args - libFuzzer target: pretrain_gpt's argument parser on any argv.

   Words are split at NUL and newline bytes. parse_args must accept (ARGS_OK), ask for the help
   (ARGS_HELP) or refuse with a message (ARGS_ERROR, or ARGS_UNKNOWN for an unknown flag); an
   accepted set must pass the recipe's own rules (check_args) and give finite numbers, and
   args_to_text must describe it. stderr is discarded.
   make fuzz (corpus: tests/fuzz/corpus/pretrain_args) */
#define MEGATRON_C_IMPLEMENTATION
#define PRETRAIN_GPT_NO_MAIN
#include "examples/pretrain_gpt.c"
#include "tests/fuzz/fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (!freopen("/dev/null", "w", stdout)) abort();   /* stderr stays: libFuzzer reports there */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_argv fa;
    if (fuzz_argv_make(&fa, "pretrain_gpt", data, size) != 0) return 0;
    args a;
    int rc = parse_args(fa.argc, fa.argv, &a);
    if (rc == ARGS_OK) {
        static char text[N_ARG_SPECS][ARG_TEXT_LEN];
        if (!isfinite(a.lr) || !isfinite(a.min_lr) || !isfinite(a.clip_grad) ||
            !isfinite(a.weight_decay) || a.log_interval < 1 || a.train_iters < 1)
            abort();
        args_to_text(&a, text);
        if (!(timeout_s_from_args(&a) > 0)) abort();
    } else if (rc != ARGS_HELP && rc != ARGS_ERROR && rc != ARGS_UNKNOWN) {
        abort();
    }
    fuzz_argv_free(&fa);
    return 0;
}
