/* Two translation units, one implementation: this one defines it. */
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"

int two_b_dp_size(int world, int tp, int pp);   /* from two_b.c */

int main(void) {
    /* world 8, TP 2, PP 2 -> DP 2 */
    return two_b_dp_size(8, 2, 2) == 2 ? 0 : 1;
}
