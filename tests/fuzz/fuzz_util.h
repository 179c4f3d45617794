/* tests/fuzz/fuzz_util.h - turning a fuzzer's bytes into an argv.

   The input is split at NUL and newline bytes into at most FUZZ_MAX_ARGS words (empty words
   kept: "" is a value a user can type). argv[0] is the program name. */
#ifndef FUZZ_UTIL_H_INCLUDED
#define FUZZ_UTIL_H_INCLUDED

#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_MAX_ARGS 64

typedef struct fuzz_argv {
    int argc;
    char *argv[FUZZ_MAX_ARGS + 2];
    char *text;   /* one copy of the input, NUL-terminated words */
} fuzz_argv;

static inline int fuzz_argv_make(fuzz_argv *a, const char *prog, const uint8_t *data,
                                 size_t size) {
    a->text = (char *)malloc(size + 1);
    if (!a->text) return -1;
    memcpy(a->text, data, size);
    a->text[size] = '\0';
    a->argc = 0;
    a->argv[a->argc++] = (char *)prog;
    char *word = a->text;
    for (size_t i = 0; i <= size && a->argc < FUZZ_MAX_ARGS; i++) {
        if (i == size || a->text[i] == '\0' || a->text[i] == '\n') {
            a->text[i] = '\0';
            a->argv[a->argc++] = word;
            word = a->text + i + 1;
        }
    }
    a->argv[a->argc] = NULL;
    return 0;
}

static inline void fuzz_argv_free(fuzz_argv *a) { free(a->text); }

#endif
