/* fuzz_checkpoint_meta - libFuzzer target: mc_checkpoint_parse_metadata on any bytes.

   The parser must return MC_OK or MC_ERR_IO (with a message), never read outside the text,
   and mc_checkpoint_meta_free must release whatever it built, after success or error.
   make fuzz FUZZ_SECONDS=60 (corpus: tests/fuzz/corpus/checkpoint_meta) */
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size heap copy, so that reading one byte past the text is caught */
    char *text = (char *)malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    mc_checkpoint_meta meta;
    memset(&meta, 0, sizeof meta);
    int rc = mc_checkpoint_parse_metadata(&meta, text, size, "fuzz", NULL);
    if (rc != MC_OK && rc != MC_ERR_IO && rc != MC_ERR_NO_MEMORY && rc != MC_ERR_INVALID_DESC) {
        fprintf(stderr, "unexpected status %s: %s\n", mc_err_name(rc), mc_last_error());
        abort();
    }
    if (rc != MC_OK && mc_last_error()[0] == '\0') {
        fprintf(stderr, "%s without a message\n", mc_err_name(rc));
        abort();
    }
    if (rc == MC_OK)
        for (int i = 0; i < meta.n_tensors; i++) (void)mc_checkpoint_meta_find(&meta, "model", "x");
    mc_checkpoint_meta_free(&meta);
    free(text);
    return 0;
}
