/* mc_impl.c - the one translation unit that holds megatron_c's implementation (MPI backend). */
#ifndef MC_COMM_MPI
#define MC_COMM_MPI
#endif
#define MEGATRON_C_IMPLEMENTATION
#include "../megatron_c.h"
