/* Compiles the header with its implementation (C99, C11, C++17, MC_STATIC, MPI) and calls a few
   functions, so that check-header also proves the result links and runs. */
#define MEGATRON_C_IMPLEMENTATION
#include "megatron_c.h"

#include <string.h>

int main(void) {
    mc_grid grid;
    mc_grid_desc desc;
    int pp_group[4];
    memset(&desc, 0, sizeof desc);
    desc.world = 16;
    desc.tp = 2;
    desc.pp = 4;
    if (mc_grid_init(&grid, &desc) != MC_OK) return 1;
    /* world 16, TP 2, PP 4: the first pp group is {0, 4, 8, 12} */
    if (mc_grid_group_members(&grid, MC_GROUP_PP, 0, pp_group, 4) != 4) return 2;
    if (pp_group[1] != 4 || pp_group[3] != 12) return 3;
    if (strcmp(mc_err_name(MC_ERR_TIMEOUT), "MC_ERR_TIMEOUT") != 0) return 4;
    return 0;
}
