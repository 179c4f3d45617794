/* Two translation units, one implementation: this one only includes the declarations. */
#include "megatron_c.h"

#include <string.h>

int two_b_dp_size(int world, int tp, int pp);

int two_b_dp_size(int world, int tp, int pp) {
    mc_grid grid;
    mc_grid_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.world = world;
    desc.tp = tp;
    desc.pp = pp;
    if (mc_grid_init(&grid, &desc) != MC_OK) return -1;
    return grid.dp;
}
