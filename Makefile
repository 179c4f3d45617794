# megatron_c - `make help` lists the targets.
#
#   make lab03 && mpirun --oversubscribe -np 8 ./lab03      run a lab (add --allow-run-as-root as root)
#   make test                                               build and run every test suite
#
# Switches: CUDA=1 (NCCL backend, needs nvcc), NVCC_ARCH=sm_90, NO_DEPS=1 (never call apt-get),
#           WITH_CBLAS=0 (no OpenBLAS: mc_ops_cpu_cblas() is then NULL; `make clean` first).

SHELL       := /bin/bash
CC          ?= cc
MPICC       ?= mpicc
NVCC        ?= nvcc
NVCC_ARCH   ?= sm_90
CUDA        ?= 0
CSTD        ?= -std=c11
# -O3 and the build machine's AVX2/FMA where it has them (x86-64-v3): programs are built where
# they run (make labNN && mpirun ./labNN), never shipped as binaries. Not -march=native: on a
# CPU with AVX-512 it emits instructions valgrind cannot run (make valgrind, CI), for little
# gain here (the GEMM is OpenBLAS's, which picks its kernels at run time). MARCH=native,
# MARCH= (empty) or MARCH=x86-64-v2 choose otherwise. -std=c11 keeps -ffp-contract=off, so no
# multiply-adds are fused in the library's own loops (the reference loops give the same bits
# as at -O2).
MARCH       ?= $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo 2>/dev/null && echo x86-64-v3)
CFLAGS      ?= -O3 -g $(if $(MARCH),-march=$(MARCH),)
WARN        := -Wall -Wextra -Wno-unused-parameter -Wpointer-arith
CPPFLAGS    += -I. -D_GNU_SOURCE
BUILD       := build
DEB_PACKAGES := g++ libopenmpi-dev openmpi-bin libcriterion-dev libcjson-dev libcmark-dev libunistring-dev pkg-config \
                libopenblas-dev

# The fast CPU table (>>core.ops cpu fast): OpenMP threads inside a rank (OPENMP= builds it
# single-threaded) and its GEMM through OpenBLAS when pkg-config finds it (BLAS=0: the own
# blocked kernel, threaded). Expanded late, after $(BUILD)/.deps-ok may have installed it.
# The library objects are compiled with IMPL_FLAGS; every program links FAST_LIBS.
OPENMP      ?= -fopenmp
BLAS        ?= 1
BLAS_FOUND   = $(if $(filter 1,$(BLAS)),$(shell pkg-config --exists openblas 2>/dev/null && echo 1),)
IMPL_FLAGS   = $(OPENMP) $(if $(BLAS_FOUND),-DMC_USE_CBLAS $(shell pkg-config --cflags openblas),)
FAST_LIBS    = $(OPENMP) $(if $(BLAS_FOUND),$(shell pkg-config --libs openblas),)
# (tests that link a program from build/mc_impl.o themselves read it: tests/test_lab06.c)
export MC_FAST_LIBS = $(FAST_LIBS)

# Libraries the grader and the tests use (each one is justified in README.md). The Criterion
# flags are expanded late, after $(BUILD)/.deps-ok may have installed the package.
GRADER_LIBS := -lcjson -lcmark -lunistring -lm
CRIT_CFLAGS  = $(shell pkg-config --cflags criterion 2>/dev/null)
CRIT_LIBS    = $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion) -lm

# The MPI runner used by tests and examples (root needs the allow flags).
MPIRUN      ?= mpirun --oversubscribe $(if $(filter 0,$(shell id -u)),--allow-run-as-root,)
export MC_MPIRUN := $(MPIRUN)

# The CBLAS-backed CPU op table beside the reference one (mc_ops_cpu_cblas, MC_WITH_CBLAS):
# OpenBLAS from Debian. Only the programs that need it link it (lab01, tests/test_ops_cblas):
# the library's own object, the other labs, the tests and pretrain_gpt are built without it.
WITH_CBLAS  ?= 1
ifeq ($(WITH_CBLAS),1)
  CBLAS_CPPFLAGS := -DMC_WITH_CBLAS
  CBLAS_LIBS     := -lopenblas
else
  CBLAS_CPPFLAGS :=
  CBLAS_LIBS     :=
endif

# CUDNN=0 builds the CUDA table without cuDNN (the own attention kernels only); CUDNN_HOME points
# at a cuDNN outside the CUDA toolkit (include/ and lib/, e.g. the one torch's wheels carry).
CUDNN       ?= 1
CUDNN_HOME  ?=
ifeq ($(CUDA),1)
  CUDA_HOME  ?= /usr/local/cuda
  CPPFLAGS   += -DMC_ENABLE_CUDA -I$(CUDA_HOME)/include
  CUDA_OBJ   := $(BUILD)/megatron_c_cuda.o
  CUDA_LIBS  := -L$(CUDA_HOME)/lib64 -lnccl -lcublasLt $(if $(filter 1,$(CUDNN)),-lcudnn,) \
                -lcudart -lstdc++
  ifneq ($(CUDNN),1)
    CPPFLAGS += -DMC_NO_CUDNN
  endif
  ifneq ($(CUDNN_HOME),)
    CPPFLAGS  += -I$(CUDNN_HOME)/include
    CUDA_LIBS := -L$(CUDNN_HOME)/lib -Wl,-rpath,$(CUDNN_HOME)/lib $(CUDA_LIBS)
  endif
else
  CUDA_OBJ   :=
  CUDA_LIBS  :=
endif

# The objects every lab, test and case program links: the library, the lab driver and its
# helpers, the grader. They are named as prerequisites, so make keeps them and rebuilds any
# that is missing (no .SECONDARY: a bare one let make skip missing objects and call a lab
# "up to date" without them).
# The objects depend on the build's configuration (CUDA, CUDNN): switching it rebuilds them
# instead of linking CPU programs against CUDA objects or the other way round.
CONFIG_STAMP := $(BUILD)/.config-cuda$(CUDA)-cudnn$(CUDNN)-blas$(BLAS)-omp$(if $(OPENMP),1,0)-march$(MARCH)
$(CONFIG_STAMP):
	@mkdir -p $(BUILD)
	@rm -f $(BUILD)/.config-*
	@touch $@

LAB_COMMON  := $(BUILD)/mc_impl.o $(BUILD)/lab_common.o $(BUILD)/lab_driver.o \
               $(BUILD)/lab_svg.o $(BUILD)/grader.o $(CUDA_OBJ)

# The objects are also named targets (a static pattern rule below): a prerequisite of a pattern
# rule alone still counts as an intermediate file, which make deletes after a link and skips
# when missing ("lab03 is up to date" with an empty build folder).
LIB_OBJS    := $(BUILD)/mc_impl.o $(BUILD)/lab_common.o $(BUILD)/lab_driver.o $(BUILD)/lab_svg.o \
               $(BUILD)/grader.o

# The commit the binaries are built from (every lab's results, lab12's probe): git rev-parse
# at build time, "unknown" outside a git checkout (a release tarball); dirty 1 when tracked files
# differ from that commit, 0 when not, -1 when unknown. The stamp file changes only when one of
# the two does, so lab_common.o (which holds them) is rebuilt exactly then.
BUILD_COMMIT := $(or $(shell git rev-parse HEAD 2>/dev/null),unknown)
BUILD_DIRTY  := $(shell git rev-parse --git-dir >/dev/null 2>&1 && \
                  { git diff --quiet HEAD -- 2>/dev/null && echo 0 || echo 1; } || echo -1)

.PHONY: FORCE
$(BUILD)/build_commit.txt: FORCE
	@mkdir -p $(@D)
	@echo '$(BUILD_COMMIT) $(BUILD_DIRTY)' > $@.tmp; cmp -s $@.tmp $@ || mv -f $@.tmp $@; rm -f $@.tmp

$(BUILD)/lab_common.o: $(BUILD)/build_commit.txt
$(BUILD)/lab_common.o: CPPFLAGS += -DLAB_BUILD_COMMIT='"$(BUILD_COMMIT)"' -DLAB_BUILD_DIRTY=$(BUILD_DIRTY)

# Every labs/labNN.c is a lab: `make labs` builds them all, `make labNN` one.
LABS        := $(patsubst labs/%.c,%,$(wildcard labs/lab[0-9][0-9].c))

.PHONY: help all labs test test-unit test-mpi grade calibrate calibration-results agreement check-header cuda deps clean
.DEFAULT_GOAL := help

help: ## list the targets
	@echo "megatron_c targets:"
	@grep -E '^[a-zA-Z0-9_%-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([^:]+):.*## (.*)/  \1\t\2/' | expand -t 24

all: labs megatron_c pretrain_gpt ## build every lab and the calculator

deps: ## install the Debian packages the build needs (apt-get, as root or with sudo)
	@./.ci/deps.sh $(DEB_PACKAGES)

# ---------------------------------------------------------------------------------------------
# library objects

$(LIB_OBJS): $(BUILD)/%.o: labs/%.c $(wildcard labs/*.h) megatron_c.h $(CONFIG_STAMP) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) $(IMPL_FLAGS) -I/usr/include/cjson -DMC_COMM_MPI -c $< -o $@

$(BUILD)/megatron_c_cuda.o: megatron_c_cuda.cu megatron_c.h $(CONFIG_STAMP) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(NVCC) -O2 -arch=$(NVCC_ARCH) -Xcompiler -fPIC $(CPPFLAGS) -DMC_COMM_MPI \
	  $(shell $(MPICC) --showme:compile 2>/dev/null) -c $< -o $@

# Checks once that the Debian packages are there (installs them when it can).
$(BUILD)/.deps-ok:
	@mkdir -p $(BUILD)
	@[ "$(NO_DEPS)" = 1 ] || ./.ci/deps.sh $(DEB_PACKAGES)
	@touch $@

# ---------------------------------------------------------------------------------------------
# labs:  make lab03  ->  ./lab03

# A lab may add sources (LAB_SRCS_labNN), defines (LAB_DEFS_labNN) and link another build of
# the library (LAB_IMPL_labNN) in place of $(BUILD)/mc_impl.o.
lab_objs = $(subst $(BUILD)/mc_impl.o,$(or $(LAB_IMPL_$(1)),$(BUILD)/mc_impl.o),$(LAB_COMMON))

lab%: labs/lab%.c $(LAB_COMMON) $(wildcard labs/*.h) | $(BUILD)/.deps-ok ## build ./labNN (e.g. make lab03)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -I/usr/include/cjson -DMC_COMM_MPI $(LAB_DEFS_$@) \
	  $< $(LAB_SRCS_$@) $(call lab_objs,$@) -o $@ $(LDFLAGS) $(FAST_LIBS) $(GRADER_LIBS) $(LAB_LIBS_$@) $(CUDA_LIBS)

# lab11: the learner edits labs/lab11_task.c (its forward_step and loss_func), and the lab
# injects a library fault, so it links the library built with MC_FAULT_HOOKS (ordinary builds
# compile the hooks out).
LAB_SRCS_lab11 := labs/lab11_task.c
LAB_DEFS_lab11 := -DMC_FAULT_HOOKS
LAB_IMPL_lab11 := $(BUILD)/mc_impl_faults.o
lab11: $(LAB_SRCS_lab11) $(LAB_IMPL_lab11)

# lab02: a hidden model fault (mc_fault_inject) in the same fault build of the library.
LAB_DEFS_lab02 := -DMC_FAULT_HOOKS
LAB_IMPL_lab02 := $(BUILD)/mc_impl_faults.o
lab02: $(LAB_IMPL_lab02)

# lab07: the tied-embedding experiment skips the embedding-group all-reduce in one of its runs
# (mc_fault_finalize_skip_embedding_sync), so it links the same MC_FAULT_HOOKS build.
LAB_DEFS_lab07 := -DMC_FAULT_HOOKS
LAB_IMPL_lab07 := $(BUILD)/mc_impl_faults.o
lab07: $(LAB_IMPL_lab07)

# lab08: the broken mode steps the optimizer before finish_grad_sync through the library's fault
# hook, so it links the same build.
LAB_DEFS_lab08 := -DMC_FAULT_HOOKS
LAB_IMPL_lab08 := $(BUILD)/mc_impl_faults.o
lab08: $(LAB_IMPL_lab08)

# lab10: "one global seed", "a seed per rank" and recompute without its RNG handling are
# library faults (mc_fault_dropout_stream, mc_fault_recompute_rng): the MC_FAULT_HOOKS build.
LAB_DEFS_lab10 := -DMC_FAULT_HOOKS
LAB_IMPL_lab10 := $(BUILD)/mc_impl_faults.o
lab10: $(LAB_IMPL_lab10)

$(BUILD)/mc_impl_faults.o: labs/mc_impl.c megatron_c.h $(CONFIG_STAMP) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) $(IMPL_FLAGS) -DMC_COMM_MPI -DMC_FAULT_HOOKS -c $< -o $@

# lab06: the learner edits labs/lab06_attention.c (an attention module plugged in through the
# layer spec); labs/lab06_builtin.c holds the built-in module and its broken copies. They are
# the lab's own sources: the library is the ordinary build.
LAB_SRCS_lab06 := labs/lab06_attention.c labs/lab06_builtin.c
lab06: $(LAB_SRCS_lab06)

# lab01 compiles examples/pretrain_gpt.c into itself (the recipe path) and runs the CBLAS-backed
# CPU table beside the reference one, so it links the library built with MC_WITH_CBLAS.
LAB_IMPL_lab01 := $(BUILD)/mc_impl_cblas.o
LAB_LIBS_lab01 := $(CBLAS_LIBS)
lab01: examples/pretrain_gpt.c $(LAB_IMPL_lab01)

$(BUILD)/mc_impl_cblas.o: labs/mc_impl.c megatron_c.h $(CONFIG_STAMP) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -DMC_COMM_MPI $(CBLAS_CPPFLAGS) -c $< -o $@

labs: $(LABS) ## build every lab (each labs/labNN.c)

# ---------------------------------------------------------------------------------------------
# the recipe: mpirun -np N ./pretrain_gpt --tensor-model-parallel-size 2 ... (Megatron's flags)

pretrain_gpt: examples/pretrain_gpt.c examples/pretrain_gpt_args.h $(BUILD)/mc_impl.o $(CUDA_OBJ) | $(BUILD)/.deps-ok ## build ./pretrain_gpt (train a GPT, Megatron's flags)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -DMC_COMM_MPI $< $(BUILD)/mc_impl.o $(CUDA_OBJ) \
	  -o $@ $(LDFLAGS) $(FAST_LIBS) -lm $(CUDA_LIBS)

# ---------------------------------------------------------------------------------------------
# the command-line calculator (no MPI)

megatron_c: tools/megatron_c.c megatron_c.h examples/pretrain_gpt_args.h | $(BUILD)/.deps-ok ## build ./megatron_c (layout, schedule, memory calculator)
	$(CC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) $(IMPL_FLAGS) $< -o $@ -lm $(FAST_LIBS)

# ---------------------------------------------------------------------------------------------
# tests

UNIT_TESTS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))
MPI_CASES  := $(patsubst tests/mpi_cases/%.c,$(BUILD)/tests/%,$(wildcard tests/mpi_cases/*.c))

# A suite may add defines (TEST_DEFS_<name>), libraries (TEST_LIBS_<name>) and link another
# build of the library (TEST_IMPL_<name>) in place of $(BUILD)/mc_impl.o, as labs do.
test_objs = $(subst $(BUILD)/mc_impl.o,$(or $(TEST_IMPL_$(1)),$(BUILD)/mc_impl.o),$(LAB_COMMON))

$(UNIT_TESTS): $(BUILD)/tests/test_%: tests/test_%.c $(LAB_COMMON) $(wildcard tests/*.h tests/calibration/*.h) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -I/usr/include/cjson $(CRIT_CFLAGS) -DMC_COMM_MPI \
	  $(TEST_DEFS_$*) $< $(call test_objs,$*) -o $@ $(LDFLAGS) $(FAST_LIBS) $(CRIT_LIBS) $(GRADER_LIBS) \
	  $(TEST_LIBS_$*) $(CUDA_LIBS)

# the CBLAS-backed CPU table (mc_ops_cpu_cblas) against fp64 references
TEST_IMPL_ops_cblas := $(BUILD)/mc_impl_cblas.o
TEST_DEFS_ops_cblas := $(CBLAS_CPPFLAGS)
TEST_LIBS_ops_cblas := $(CBLAS_LIBS)
$(BUILD)/tests/test_ops_cblas: $(TEST_IMPL_ops_cblas)
# test_lab01 expects the accelerated table lab01 was built with
TEST_DEFS_lab01 := $(CBLAS_CPPFLAGS)

$(filter-out $(BUILD)/tests/nccl_cases,$(MPI_CASES)): $(BUILD)/tests/%: tests/mpi_cases/%.c $(LAB_COMMON) tests/test_util.h | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -I/usr/include/cjson -DMC_COMM_MPI $< $(LAB_COMMON) \
	  -o $@ $(LDFLAGS) $(FAST_LIBS) $(GRADER_LIBS) $(CUDA_LIBS)

# nccl_cases needs only the library, so that it builds on GPU machines that lack the grader's
# libraries: make CUDA=1 build/tests/nccl_cases && mpirun -np 2 build/tests/nccl_cases
$(BUILD)/tests/nccl_cases: tests/mpi_cases/nccl_cases.c $(BUILD)/mc_impl.o $(CUDA_OBJ) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -DMC_COMM_MPI $< $(BUILD)/mc_impl.o $(CUDA_OBJ) \
	  -o $@ $(LDFLAGS) $(FAST_LIBS) -lm $(CUDA_LIBS)

# gpu_check needs only the library too (no Criterion): the GPU-vs-CPU checks, op by op and for
# the whole model. make gpu-check && ./build/tests/gpu_check (exit 77: no GPU, skipped)
$(BUILD)/tests/gpu_check: tests/gpu/gpu_check.c $(BUILD)/mc_impl.o $(CUDA_OBJ)
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -DMC_COMM_MPI $< $(BUILD)/mc_impl.o $(CUDA_OBJ) \
	  -o $@ $(LDFLAGS) $(FAST_LIBS) -lm $(CUDA_LIBS)

test: $(UNIT_TESTS) $(MPI_CASES) $(BUILD)/tests/gpu_check labs megatron_c pretrain_gpt check-header ## build and run every test suite
	@./tests/run_all.sh $(UNIT_TESTS)

# make grade            every lab with a rubric and an answer sheet
# make grade LAB=lab03  one lab
# Exit status 0: every rubric item earned all its points and no misconception fired;
# non-zero: some item is short (its failing test says what is missing) or an input is missing.
grade: $(BUILD)/tests/grade ## self-grade answers/ with Criterion, one test per rubric item (LAB=lab03)
	@GR_LAB=$(LAB) ./$(BUILD)/tests/grade --short-filename $(CRITERION_OPTS)

$(BUILD)/tests/grade: tests/grade/grade.c $(LAB_COMMON) tests/test_util.h | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -I/usr/include/cjson $(CRIT_CFLAGS) -DMC_COMM_MPI \
	  $< $(LAB_COMMON) -o $@ $(LDFLAGS) $(FAST_LIBS) $(CRIT_LIBS) $(GRADER_LIBS) $(CUDA_LIBS)

# make calibrate: grades every labelled corpus (tests/calibration/<lab>/) against its frozen runs
# (results/<id>.json) or, for a sheet without one, fresh runs of
# the lab for the sheets' nonces and prints each sheet's score beside its label. Exit status 0:
# every lab's test half meets the bar (labs/rubric/SCHEMA.md, Calibration); 1: one misses it.
calibrate: $(BUILD)/tests/calibrate labs ## grade the labelled sheets of tests/calibration/ against real runs
	@./$(BUILD)/tests/calibrate

# make calibration-results: after a lab's results change shape (test_calibration says so),
# re-run every corpus sheet and keep each run as tests/calibration/<lab>/results/<id>.json
calibration-results: $(BUILD)/tests/calibrate labs ## remake the frozen runs the calibration sheets are graded against
	@./$(BUILD)/tests/calibrate --freeze

# make agreement: after a rubric or engine change moves a calibration grade (test_calibration
# says so), re-measure and keep labs/rubric/agreement.json, which each grade report quotes
agreement: $(BUILD)/tests/calibrate labs ## re-measure how far each lab's grades agree with the markers (labs/rubric/agreement.json)
	@./$(BUILD)/tests/calibrate --agreement > $(BUILD)/agreement.log; rc=$$?; \
	  grep -E ' bar: |^wrote ' $(BUILD)/agreement.log; [ $$rc -le 1 ]

$(BUILD)/tests/calibrate: tests/calibration/calibrate.c tests/calibration/calibrate.h $(LAB_COMMON) tests/test_util.h | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -I/usr/include/cjson -DMC_COMM_MPI \
	  $< $(LAB_COMMON) -o $@ $(LDFLAGS) $(FAST_LIBS) $(GRADER_LIBS) $(CUDA_LIBS)

# ---------------------------------------------------------------------------------------------
# header compile checks: C99, C11, C++, -Wall -Wextra -pedantic, two TUs with one implementation

comma := ,
HDR_FLAGS := -Wall -Wextra -pedantic -Wpointer-arith -Werror -I.
check-header: | $(BUILD)/.deps-ok
check-header: ## compile megatron_c.h as C99, C11, C++, MPI, MC_STATIC, and two TUs
	@mkdir -p $(BUILD)/compile
	$(CC)  -std=c99   $(HDR_FLAGS) tests/compile/impl.c -o $(BUILD)/compile/c99 -lm
	$(CC)  -std=c11   $(HDR_FLAGS) tests/compile/impl.c -o $(BUILD)/compile/c11 -lm
	$(CC)  -std=c11   $(HDR_FLAGS) -DMC_STATIC tests/compile/impl.c -o $(BUILD)/compile/c11_static -lm
	$(CXX) -std=c++17 $(HDR_FLAGS) -x c++ tests/compile/impl.c -o $(BUILD)/compile/cxx -lm
	$(MPICC) -std=c99 $(HDR_FLAGS) -DMC_COMM_MPI tests/compile/impl.c -o $(BUILD)/compile/c99_mpi -lm
	$(CC)  -std=c99   $(HDR_FLAGS) tests/compile/two_a.c tests/compile/two_b.c -o $(BUILD)/compile/two_tu -lm
	$(if $(CBLAS_LIBS),$(CXX) -std=c++17 $(HDR_FLAGS) $(CBLAS_CPPFLAGS) -x c++ tests/compile/impl.c -o $(BUILD)/compile/cxx_cblas -lm $(CBLAS_LIBS),@true)
	@for b in c99 c11 c11_static cxx two_tu $(if $(CBLAS_LIBS),cxx_cblas,); do ./$(BUILD)/compile/$$b >/dev/null || exit 1; done
	@echo "check-header: $(if $(CBLAS_LIBS),7,6) builds clean (C99, C11, MC_STATIC, C++17, MPI, two TUs$(if $(CBLAS_LIBS),$(comma) C++17 with MC_WITH_CBLAS,))"

# ---------------------------------------------------------------------------------------------
# CUDA / NCCL (needs nvcc; the GPU machine has CUDA 13 and NCCL 2.28)

cuda: ## rebuild the labs and the tests with the NCCL backend (CUDA=1)
	@command -v $(NVCC) >/dev/null || { echo "cuda: nvcc not found (install the CUDA toolkit)"; exit 1; }
	rm -f $(LABS) $(LAB_COMMON) $(BUILD)/mc_impl_faults.o $(BUILD)/mc_impl_cblas.o
	$(MAKE) CUDA=1 labs $(MPI_CASES)

clean: ## remove build outputs
	rm -rf $(BUILD) lab[0-9][0-9] megatron_c pretrain_gpt

# ---------------------------------------------------------------------------------------------
# bench: the CPU GEMM benchmark and the CPU training benchmark (plain programs, not tests)
#   make bench && ./build/bench/gemm_bench     GFLOP/s: reference kernel, the fast table at 1
#                                              and 2 threads, the BLAS itself at 1 and 2 threads
#   make bench-cpu [LLMC=/tmp/llmc/train_gpt2] pretrain_gpt tokens/s on two shapes, 1/2 ranks,
#                                              1/2 threads, beside llm.c's CPU trainer (when
#                                              built) and the GEMM table: docs/performance.md

.PHONY: bench bench-cpu
bench: $(BUILD)/bench/gemm_bench ## build the GEMM benchmark (reference, fast table, BLAS)

LLMC        ?= /tmp/llmc/train_gpt2
LLMC_DRIVER ?= /tmp/llmc/llmc_bench
BENCH_STEPS ?= 6
bench-cpu: pretrain_gpt $(BUILD)/bench/gemm_bench ## pretrain_gpt tokens/s and GEMM GFLOP/s beside llm.c (LLMC=path to train_gpt2)
	@LLMC="$(LLMC)" LLMC_DRIVER="$(LLMC_DRIVER)" BENCH_STEPS=$(BENCH_STEPS) MPIRUN="$(MPIRUN)" \
	  bash bench/bench_cpu.sh

# ---------------------------------------------------------------------------------------------
# GPU: the checks and the benchmark (need nvcc here; a GPU to run)
#   make gpu-check && ./build/tests/gpu_check       GPU against CPU, op by op and the model
#   make bench-gpu                                  megatron_c 124M / 350M and the peers, a table

.PHONY: gpu-check bench-gpu
gpu-check: ## build build/tests/gpu_check with the CUDA table (CUDA=1)
	@command -v $(NVCC) >/dev/null || { echo "gpu-check: nvcc not found"; exit 1; }
	$(MAKE) CUDA=1 $(BUILD)/tests/gpu_check

$(BUILD)/bench/mc_gpt_bench: bench/gpu/mc_gpt_bench.c $(BUILD)/mc_impl.o $(CUDA_OBJ)
	@mkdir -p $(@D)
	$(MPICC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) -DMC_COMM_MPI $< $(BUILD)/mc_impl.o $(CUDA_OBJ) \
	  -o $@ $(LDFLAGS) $(FAST_LIBS) -lm $(CUDA_LIBS)

bench-gpu: ## GPT-2 124M / 350M tokens/s, MFU, memory on one GPU, beside the PyTorch / Megatron-Core peers
	@command -v $(NVCC) >/dev/null || { echo "bench-gpu: nvcc not found"; exit 1; }
	$(MAKE) CUDA=1 $(BUILD)/bench/mc_gpt_bench
	@bash bench/gpu/bench_gpu.sh

$(BUILD)/bench/gemm_bench: bench/gemm_bench.c megatron_c.h $(CONFIG_STAMP) | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(CSTD) $(CFLAGS) $(WARN) $(CPPFLAGS) $(IMPL_FLAGS) $< -o $@ -lm $(FAST_LIBS)

# ---------------------------------------------------------------------------------------------
# CI checks beyond `make test` (.ci/run runs them after it; each one alone works too):
#   make sanitize     the whole Criterion suite again, built with AddressSanitizer + UBSan
#   make valgrind     memcheck over the single-rank suites and one short pretrain_gpt run
#   make fuzz         every libFuzzer target for FUZZ_SECONDS (corpora in tests/fuzz/corpus)
#   make fresh-check  the README's two commands in a bare Debian root (debootstrap)

CHECK_PACKAGES := clang libclang-rt-dev valgrind debootstrap
SAN_BUILD   := $(BUILD)/asan
SAN_FLAGS   := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
               -fno-sanitize-recover=undefined
# Open MPI's own allocations live until exit: leaks are not reported, every other error
# aborts the process (a crash Criterion counts).
SAN_ENV     := ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0 \
               UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 MC_CASE_TIME_SCALE=4

.PHONY: sanitize sanitize-build valgrind fuzz fresh-check ci-checks

$(BUILD)/.check-deps-ok:
	@mkdir -p $(BUILD)
	@[ "$(NO_DEPS)" = 1 ] || ./.ci/deps.sh $(CHECK_PACKAGES)
	@touch $@

sanitize: lab03 megatron_c pretrain_gpt | $(BUILD)/.deps-ok ## run every Criterion suite again under ASan + UBSan
	@$(MAKE) --no-print-directory BUILD=$(SAN_BUILD) NO_DEPS=1 CFLAGS="$(SAN_FLAGS)" \
	  LDFLAGS="-fsanitize=address,undefined" sanitize-build
	@$(SAN_ENV) ./tests/run_all.sh $(patsubst $(BUILD)/%,$(SAN_BUILD)/%,$(UNIT_TESTS))

sanitize-build: $(UNIT_TESTS) $(MPI_CASES)

# libFuzzer targets (clang): the checkpoint metadata parser, pretrain_gpt's data-file reader,
# both argument parsers, the grader's answer-sheet parser and rubric loader. Each runs FUZZ_SECONDS from its committed corpus
# (tests/fuzz/corpus/<name>, read only); new inputs go to $(BUILD)/fuzz/work/<name>, a crash
# to $(BUILD)/fuzz/<name>-crash-* and fails the target. -close_fd_mask=2 sends the programs' own
# refusals to /dev/null while libFuzzer and the sanitizers still report in the log; the low
# open-file limit makes a descriptor leaked per input fail within one run.
FUZZ_TARGETS := checkpoint_meta data_file pretrain_args cli answer_sheet rubric
FUZZ_SECONDS ?= 60
FUZZ_CC     ?= clang
FUZZ_FLAGS  := -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
               -I. -D_GNU_SOURCE
FUZZ_BINS   := $(patsubst %,$(BUILD)/fuzz/fuzz_%,$(FUZZ_TARGETS))

$(filter-out %/fuzz_answer_sheet %/fuzz_rubric,$(FUZZ_BINS)): $(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c tests/fuzz/fuzz_util.h megatron_c.h \
              examples/pretrain_gpt.c examples/pretrain_gpt_args.h tools/megatron_c.c | $(BUILD)/.deps-ok $(BUILD)/.check-deps-ok
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) $(shell $(MPICC) --showme:compile 2>/dev/null) $< -o $@ \
	  $(shell $(MPICC) --showme:link 2>/dev/null) -lm

# the grader's targets link the grader and its libraries
$(BUILD)/fuzz/fuzz_answer_sheet $(BUILD)/fuzz/fuzz_rubric: $(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.c \
              tests/fuzz/fuzz_util.h labs/grader.c labs/grader.h | $(BUILD)/.deps-ok $(BUILD)/.check-deps-ok
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -I/usr/include/cjson $< labs/grader.c -o $@ $(GRADER_LIBS)

fuzz: $(FUZZ_BINS) ## run every libFuzzer target for FUZZ_SECONDS (default 60) from its corpus
	@ulimit -n 512; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(BUILD)/fuzz/work/$$t; \
	  echo "==== fuzz_$$t ($(FUZZ_SECONDS) s)"; \
	  ./$(BUILD)/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 -close_fd_mask=2 \
	    -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/$$t- \
	    $(BUILD)/fuzz/work/$$t tests/fuzz/corpus/$$t > $(BUILD)/fuzz/$$t.log 2>&1; \
	  rc=$$?; grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::new_units_added)' \
	    $(BUILD)/fuzz/$$t.log; \
	  if [ $$rc -ne 0 ]; then tail -40 $(BUILD)/fuzz/$$t.log; echo "fuzz_$$t: FAILED (exit $$rc)"; \
	    exit 1; fi; \
	done; echo "fuzz: $(words $(FUZZ_TARGETS)) targets, no crash"

# valgrind memcheck: the single-rank suites (no mpirun inside) and one short pretrain_gpt
# run. Every process writes its own log ($(BUILD)/valgrind/<pid>.log, errors only): any
# error there (an uninitialised read, an invalid access) fails the target, even in a
# Criterion worker whose test had already passed. Open MPI's own reports are suppressed
# with the file it ships.
VALGRIND_SUITES := config grader microbatches ops optimizer params rank_grid \
                   rng schedule
VALGRIND_LOGS := $(BUILD)/valgrind
VALGRIND     := valgrind --error-exitcode=99 --quiet --track-origins=yes \
                --suppressions=/usr/share/openmpi/openmpi-valgrind.supp \
                --log-file=$(VALGRIND_LOGS)/%p.log
valgrind: $(patsubst %,$(BUILD)/tests/test_%,$(VALGRIND_SUITES)) pretrain_gpt | $(BUILD)/.check-deps-ok ## memcheck the single-rank suites and a short pretrain_gpt run
	@rm -rf $(VALGRIND_LOGS) && mkdir -p $(VALGRIND_LOGS)
	@MC_TEST_RUNNER="$(VALGRIND) --trace-children=yes" MC_TEST_BINARY_TIMEOUT=1800 \
	  ./tests/run_all.sh $(patsubst %,$(BUILD)/tests/test_%,$(VALGRIND_SUITES))
	@echo "==== pretrain_gpt under valgrind"
	$(VALGRIND) ./pretrain_gpt --train-iters 2 --num-layers 2 --hidden-size 32 \
	  --num-attention-heads 4 --seq-length 16 --global-batch-size 4 --data-path README.md
	@n=$$(ls $(VALGRIND_LOGS) | wc -l); bad=$$(find $(VALGRIND_LOGS) -name '*.log' -size +0); \
	  if [ -n "$$bad" ]; then for f in $$bad; do echo "== $$f"; head -60 $$f; done; \
	    echo "valgrind: errors in $$(echo $$bad | wc -w) of $$n processes"; exit 1; fi; \
	  echo "valgrind: $$n processes, 0 errors"

# The README's two commands in a bare Debian root (root only; needs debootstrap and the
# network). FRESH_ROOT is where the root is built (about 1 GB once the packages are in).
FRESH_ROOT ?= $(CURDIR)/$(BUILD)/fresh-root
fresh-check: | $(BUILD)/.check-deps-ok ## run the README's two commands in a fresh debootstrap root
	@./.ci/fresh-check.sh $(FRESH_ROOT)
