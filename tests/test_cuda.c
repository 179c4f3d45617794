/* tests/test_cuda.c - the NCCL communicator backend (megatron_c_cuda.cu).

   The GPU cases live in the MPI program build/tests/nccl_cases (a Criterion binary must not
   run under mpirun); these tests launch it and judge its exit status and summary line. Only
   the skip path runs everywhere; the rest need a CUDA build (make cuda) and GPUs. */
#include <criterion/criterion.h>

#include <stdio.h>

#include "megatron_c.h"
#include "test_util.h"

#if defined(MC_ENABLE_CUDA)
#include <cuda_runtime_api.h>
#endif

TestSuite(cuda, .timeout = 240);

#define NCCL_CASES_RANKS 2
/* Cases nccl_cases runs when the world is nccl; a run that passes fewer stopped early. */
#define NCCL_CASES_COUNT 14

#if defined(MC_ENABLE_CUDA)
static int visible_cuda_devices(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    return count;
}
#endif

/* With every GPU hidden, the program must step aside cleanly (exit 0, no summary), whatever
   the build: this is what CI machines without GPUs see. */
Test(cuda, nccl_cases_skip_without_devices) {
    char prog[4096], cmd[4200], out[1 << 15];
    snprintf(cmd, sizeof cmd, "env CUDA_VISIBLE_DEVICES= %s",
             mc_test_sibling("nccl_cases", prog, sizeof prog));
    int rc = mc_test_mpirun(NCCL_CASES_RANKS, cmd, 120, out, sizeof out);
    cr_assert_eq(rc, 0, "nccl_cases exited with %d:\n%s", rc, out);
    cr_expect(mc_test_contains(out, "skipped: no CUDA devices"), "no skip line:\n%s", out);
    int passed = 0, failed = 0;
    cr_expect_not(mc_test_summary(out, &passed, &failed),
                  "cases ran although no device was visible:\n%s", out);
}

#if defined(MC_ENABLE_CUDA)
/* Without a driver or a device the probe answers 0 instead of failing; with devices it
   answers by the count: one GPU per local rank. */
Test(cuda, nccl_available_follows_device_count) {
    int count = visible_cuda_devices();
    cr_expect_eq(mc__nccl_available(0, 1), count >= 1, "%d device(s), one local rank", count);
    cr_expect_eq(mc__nccl_available(0, count + 1), 0, "%d device(s), %d local ranks", count,
                 count + 1);
    cr_expect_eq(mc__nccl_available(-1, 1), 0, "a negative local rank");
}
#endif

Test(cuda, nccl_cases_on_two_gpus) {
#if !defined(MC_ENABLE_CUDA)
    cr_skip_test("no CUDA device (built without MC_ENABLE_CUDA; use make cuda)");
#else
    int count = visible_cuda_devices();
    if (count < NCCL_CASES_RANKS)
        cr_skip_test("no CUDA device (%d visible, %d needed)", count, NCCL_CASES_RANKS);
    char prog[4096], out[1 << 16];
    int rc = mc_test_mpirun(NCCL_CASES_RANKS, mc_test_sibling("nccl_cases", prog, sizeof prog),
                            200, out, sizeof out);
    int passed = -1, failed = -1;
    cr_assert(mc_test_summary(out, &passed, &failed), "no summary line (exit %d):\n%s", rc, out);
    cr_expect_eq(failed, 0, "%d case(s) failed:\n%s", failed, out);
    cr_expect_eq(passed, NCCL_CASES_COUNT, "%d of %d cases passed:\n%s", passed,
                 NCCL_CASES_COUNT, out);
    cr_expect_eq(rc, 0, "nccl_cases exited with %d:\n%s", rc, out);
#endif
}

/* The CUDA op table against the CPU, op by op and for the whole model (tests/gpu/gpu_check.c,
   a plain program so that it also runs where Criterion is not installed). Without a GPU it
   exits 77 and this test is reported as skipped, never as passed. */
Test(cuda, gpu_check_against_the_cpu, .timeout = 600) {
#if !defined(MC_ENABLE_CUDA)
    cr_skip_test("no CUDA device (built without MC_ENABLE_CUDA; make gpu-check builds the table)");
#else
    if (visible_cuda_devices() < 1) cr_skip_test("no CUDA device visible");
    char prog[4096], out[1 << 16];
    int rc = mc_test_run(mc_test_sibling("gpu_check", prog, sizeof prog), 560, out, sizeof out);
    if (rc == 77) cr_skip_test("gpu_check skipped:\n%s", out);
    int passed = -1, failed = -1;
    cr_assert(mc_test_summary(out, &passed, &failed), "no summary line (exit %d):\n%s", rc, out);
    cr_expect_eq(failed, 0, "%d check(s) failed:\n%s", failed, out);
    cr_expect_gt(passed, 0, "no check passed:\n%s", out);
    cr_expect_eq(rc, 0, "gpu_check exited with %d:\n%s", rc, out);
#endif
}

/* The switch that answers a failed fused path without a rebuild: with MC_CUDA_FUSE=0 the
   auto table runs GELU as its own kernels (gpu_check then expects every gemm_gelu call
   unfused, and still compares with the CPU and the unfused table). */
Test(cuda, gpu_check_with_fusion_off, .timeout = 400) {
#if !defined(MC_ENABLE_CUDA)
    cr_skip_test("no CUDA device (built without MC_ENABLE_CUDA; make gpu-check builds the table)");
#else
    if (visible_cuda_devices() < 1) cr_skip_test("no CUDA device visible");
    char prog[4096], cmd[4300], out[1 << 16];
    snprintf(cmd, sizeof cmd, "env MC_CUDA_FUSE=0 %s --section ops --section model",
             mc_test_sibling("gpu_check", prog, sizeof prog));
    int rc = mc_test_run(cmd, 360, out, sizeof out);
    if (rc == 77) cr_skip_test("gpu_check skipped:\n%s", out);
    int passed = -1, failed = -1;
    cr_assert(mc_test_summary(out, &passed, &failed), "no summary line (exit %d):\n%s", rc, out);
    cr_expect(mc_test_contains(out, "gelu fusion off"), "fusion not reported off:\n%s", out);
    cr_expect_eq(failed, 0, "%d check(s) failed:\n%s", failed, out);
    cr_expect_gt(passed, 0, "no check passed:\n%s", out);
    cr_expect_eq(rc, 0, "gpu_check exited with %d:\n%s", rc, out);
#endif
}
