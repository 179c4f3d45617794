/* llmc_inputs.c - the files llm.c's CPU trainer (train_gpt2) reads, written without a network:
   a GPT-2 checkpoint with random weights and two token files of random tokens.

       llmc_inputs DIR L C NH V MAXT
   writes DIR/gpt2_124M.bin (the name train_gpt2 opens, whatever the shape) and
   DIR/dev/data/tinyshakespeare/tiny_shakespeare_{train,val}.bin. Run train_gpt2 in DIR.

   Formats, as llm.c documents them: the checkpoint is 256 int32 (20240326, version 3, max_seq_len,
   vocab_size, num_layers, num_heads, channels, padded_vocab_size = V rounded up to 128, zeros)
   then the fp32 parameters tensor by tensor: wte [Vp,C], wpe [MAXT,C], ln1w, ln1b [L,C],
   qkvw [L,3C,C], qkvb [L,3C], attprojw [L,C,C], attprojb [L,C], ln2w, ln2b [L,C],
   fcw [L,4C,C], fcb [L,4C], fcprojw [L,C,4C], fcprojb [L,C], lnfw, lnfb [C]. A token file is
   256 int32 (20240520, version 1, token count, zeros) then the tokens as uint16. Weights are
   N(0, 0.02) (LayerNorm weights 1, biases 0); the timing does not depend on their values. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t state = 0x9e3779b97f4a7c15ull;
static double uniform(void) {   /* xorshift64*, (0, 1) */
    state ^= state >> 12, state ^= state << 25, state ^= state >> 27;
    return ((double)((state * 2685821657736338717ull) >> 11) + 0.5) / 9007199254740992.0;
}
static float normal(void) {
    return (float)(sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()));
}

/* n values: 0 zeros, 1 ones, 2 N(0, 0.02) */
static int write_values(FILE *f, size_t n, int kind) {
    for (size_t i = 0; i < n; i++) {
        float x = kind == 0 ? 0.0f : kind == 1 ? 1.0f : 0.02f * normal();
        if (fwrite(&x, sizeof x, 1, f) != 1) return -1;
    }
    return 0;
}

static int write_tokens(const char *path, int V, size_t n) {
    FILE *f = fopen(path, "wb");
    int32_t header[256] = {20240520, 1, (int32_t)n};
    if (!f) return -1;
    int bad = fwrite(header, sizeof header, 1, f) != 1;
    for (size_t i = 0; !bad && i < n; i++) {
        uint16_t t = (uint16_t)(uniform() * V);
        bad = fwrite(&t, sizeof t, 1, f) != 1;
    }
    return fclose(f) != 0 || bad ? -1 : 0;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: llmc_inputs DIR L C NH V MAXT\n");
        return 2;
    }
    const char *dir = argv[1];
    const int L = atoi(argv[2]), C = atoi(argv[3]), NH = atoi(argv[4]), V = atoi(argv[5]);
    const int T = atoi(argv[6]), Vp = (V + 127) / 128 * 128;
    if (L <= 0 || C <= 0 || NH <= 0 || C % NH || V <= 0 || V > 65536 || T <= 0) {
        fprintf(stderr, "llmc_inputs: need L, C, NH, V, MAXT > 0, C divisible by NH, V <= 65536\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/dev", dir), mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/dev/data", dir), mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/dev/data/tinyshakespeare", dir), mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/gpt2_124M.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        return 1;
    }
    int32_t header[256] = {20240326, 3, T, V, L, NH, C, Vp};
    const size_t c = (size_t)C, l = (size_t)L;
    /* (elements, kind) per tensor, in the checkpoint's order */
    const size_t sizes[16] = {(size_t)Vp * c, (size_t)T * c, l * c, l * c, l * 3 * c * c,
                              l * 3 * c, l * c * c, l * c, l * c, l * c, l * 4 * c * c, l * 4 * c,
                              l * c * 4 * c, l * c, c, c};
    const int kinds[16] = {2, 2, 1, 0, 2, 0, 2, 0, 1, 0, 2, 0, 2, 0, 1, 0};
    int bad = fwrite(header, sizeof header, 1, f) != 1;
    for (int i = 0; i < 16 && !bad; i++) bad = write_values(f, sizes[i], kinds[i]) != 0;
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "llmc_inputs: could not write %s\n", path);
        return 1;
    }
    snprintf(path, sizeof path, "%s/dev/data/tinyshakespeare/tiny_shakespeare_train.bin", dir);
    if (write_tokens(path, V, 1 << 16) != 0) return 1;
    snprintf(path, sizeof path, "%s/dev/data/tinyshakespeare/tiny_shakespeare_val.bin", dir);
    if (write_tokens(path, V, 1 << 14) != 0) return 1;
    return 0;
}
