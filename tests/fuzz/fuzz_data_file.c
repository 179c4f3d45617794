/* fuzz_data_file - libFuzzer target: pretrain_gpt's --data-path reader on any file.

   The first byte picks seq_length (1..64); the rest is the file's contents (an in-memory file,
   /proc/self/fd/N). dataset_open must read it whole or refuse it with a reason; every sample
   dataset_sample then draws must lie inside the bytes read (tokens 0..255), for any sample
   index. make fuzz (corpus: tests/fuzz/corpus/data_file) */
#define MEGATRON_C_IMPLEMENTATION
#define PRETRAIN_GPT_NO_MAIN
#include "examples/pretrain_gpt.c"

#include <sys/mman.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int fd = memfd_create("fuzz_data", 0);
    if (fd < 0) return 0;
    if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) {
        close(fd);
        return 0;
    }
    char path[64], why[512] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    args a;
    memset(&a, 0, sizeof a);
    a.seq_length = 1 + data[0] % 64, a.vocab_size = 256, a.seed = 1, a.data_path = path;
    dataset d;
    int rc = dataset_open(&d, &a, why, sizeof why);
    if (rc == 0) {
        if (!d.bytes || d.n_bytes != size - 1) abort();   /* read whole, never synthetic */
        int tokens[65];
        static const long long ks[] = {0, 1, 2, 3, 1000, 123456789, 9223372036854775807LL / 64};
        for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
            dataset_sample(&d, ks[i], tokens);
            for (int t = 0; t <= a.seq_length; t++)
                if (tokens[t] < 0 || tokens[t] > 255) abort();
        }
    } else if (why[0] == '\0') {
        abort();   /* a refusal always says why */
    }
    free(d.bytes);
    close(fd);
    return 0;
}
