# fusedloss — top-level GNU Makefile (llm.c style).
#   make                 library (static + shared), tests, benchmark/demo; CUDA objects when nvcc exists
#   make test            CPU tests (what CI runs)     make test-sanitize   the same under ASan + UBSan
#   make test-cuda       GPU tests (needs a GPU)            make bench   GPU benchmark (bench-gelu: GeLU, bench-lce: linear CE)
#   make demo            fused cross-entropy on a real-sized problem (GPU if present, else CPU)
#   make install PREFIX=/usr/local
#   make NO_CUDA=1       force a CPU-only build;  make GPU_ARCH=80  change the primary sm target
CC      ?= cc
PREFIX  ?= /usr/local
BUILD   := build
GPU_ARCH ?= 90

CFLAGS  := -std=c11 -O2 -Wall -Wextra -fPIC -fvisibility=hidden -Iinclude $(EXTRA_CFLAGS)
LDLIBS  := -lm -lpthread

# ---- OpenMP ---------------------------------------------------------------------------
OMP_OK := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo 1)
ifeq ($(OMP_OK),1)
  CFLAGS += -fopenmp
  LDLIBS += -fopenmp
  $(info ✓ OpenMP found)
else
  $(info ✗ OpenMP not found: CPU backend runs single-threaded)
endif

# ---- CUDA -----------------------------------------------------------------------------
NVCC ?= $(shell command -v nvcc 2>/dev/null)
ifneq ($(NO_CUDA),)
  NVCC :=
endif
ifneq ($(NVCC),)
  CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
  # machine code for the primary arch (sm_90: H100/H200) and sm_80 (A100), PTX for compute_80
  GENCODE := -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH)
  ifneq ($(GPU_ARCH),80)
    GENCODE += -gencode arch=compute_80,code=sm_80
  endif
  GENCODE += -gencode arch=compute_80,code=compute_80
  NVCCFLAGS := -O3 -std=c++17 -Iinclude $(GENCODE) -Xcompiler -fPIC,-fvisibility=hidden \
               -Xptxas -warn-spills $(EXTRA_NVCCFLAGS)
  CFLAGS += -DFL_WITH_CUDA
  CUDA_INC := -I$(CUDA_HOME)/include
  CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
  CUDA_LIBS := -L$(CUDA_LIBDIR) -lcublasLt -Wl,-rpath,$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lstdc++
  CU_SRC  := $(wildcard src/cuda/*.cu)
  CU_OBJ  := $(patsubst src/%.cu,$(BUILD)/obj/%.o,$(CU_SRC))
  STUB_OBJ :=
  $(info ✓ nvcc found: $(NVCC) (sm_$(GPU_ARCH), sm_80, compute_80 PTX))
else
  CU_OBJ  :=
  CUDA_LIBS :=
  CUDA_INC :=
  STUB_OBJ := $(BUILD)/obj/cuda/stub.o
  $(info ✗ nvcc not found: CUDA entry points return FL_ERR_NOT_BUILT)
endif

C_SRC := $(wildcard src/common/*.c) $(wildcard src/cpu/*.c)
C_OBJ := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(C_SRC)) $(STUB_OBJ)
HDRS  := include/fusedloss.h src/internal.h $(wildcard src/cuda/*.cuh) $(wildcard src/cpu/*.h)

LIB_A  := $(BUILD)/libfusedloss.a
LIB_SO := $(BUILD)/libfusedloss.so

CPU_TESTS  := $(patsubst tests/%.c,$(BUILD)/%,$(filter-out %_cuda.c,$(wildcard tests/test_*.c tests/fuzz_*.c)))
CUDA_TESTS := $(patsubst tests/%.c,$(BUILD)/%,$(wildcard tests/*_cuda.c))
TOOLS      := $(BUILD)/fl_demo $(if $(NVCC),$(BUILD)/bench_cross_entropy $(BUILD)/bench_gelu $(BUILD)/bench_linear_ce $(BUILD)/bench_vp_linear $(BUILD)/bench_launch_floor $(BUILD)/bench_stream_floor)

.PHONY: all lib test test-sanitize test-cuda bench bench-gelu bench-lce demo install example clean
all: lib $(CPU_TESTS) $(TOOLS) $(if $(NVCC),$(CUDA_TESTS))
lib: $(LIB_A) $(LIB_SO)

$(BUILD)/obj/%.o: src/%.c $(HDRS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: src/%.cu $(HDRS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(LIB_A): $(C_OBJ) $(CU_OBJ)
	@mkdir -p $(BUILD)
	rm -f $@ && ar rcs $@ $^
	@# the tree this library was built from (carried to the GPU machine with it: scripts/gpu_check.sh)
	@c=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown); \
	 [ "$$c" = unknown ] || [ -z "$$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || c="$$c-dirty"; \
	 echo "$$c" > $(BUILD)/BUILD_COMMIT

$(LIB_SO): $(C_OBJ) $(CU_OBJ) src/libfusedloss.map
	$(CC) -shared -o $@ $(C_OBJ) $(CU_OBJ) -Wl,--version-script=src/libfusedloss.map $(CUDA_LIBS) $(LDLIBS)

# tests and tools link the static library (plus cudart when CUDA is built)
$(BUILD)/%: tests/%.c $(LIB_A) $(wildcard tests/*.h)
	$(CC) $(CFLAGS) $(CUDA_INC) $< -o $@ $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/fl_demo: bench/fl_demo.c $(LIB_A)
	$(CC) $(CFLAGS) $(CUDA_INC) $< -o $@ $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/bench_cross_entropy: bench/bench_cross_entropy.c $(LIB_A)
	$(CC) $(CFLAGS) $(CUDA_INC) $< -o $@ $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/bench_gelu: bench/bench_gelu.c $(LIB_A)
	$(CC) $(CFLAGS) $(CUDA_INC) $< -o $@ $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

$(BUILD)/bench_linear_ce: bench/bench_linear_ce.c $(LIB_A)
	$(CC) $(CFLAGS) $(CUDA_INC) $< -o $@ $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

# a CUDA program of its own (its probe kernels), linked with the library for the CE call
# (bench_stream_floor, issue 6: the streaming-floor sweep, its own copy kernels; the library only for bench_begin)
$(BUILD)/bench_launch_floor $(BUILD)/bench_stream_floor: $(BUILD)/%: bench/%.cu $(LIB_A)
	$(NVCC) -O3 -std=c++17 -Iinclude -Ibench $(GENCODE) $< -o $@ $(LIB_A) -L$(CUDA_LIBDIR) -lcublasLt -lm -lpthread -Xcompiler -fopenmp

$(BUILD)/bench_vp_linear: bench/bench_vp_linear.c $(LIB_A)
	$(CC) $(CFLAGS) $(CUDA_INC) $< -o $@ $(LIB_A) $(CUDA_LIBS) $(LDLIBS)

# CPU tests: each prints "N passed, M failed"; any failure fails make
test: lib $(CPU_TESTS)
	@set -e; for t in $(CPU_TESTS); do echo "== $$t"; ./$$t; done; echo "overall okay: 1"

# the CPU tests again under AddressSanitizer + UndefinedBehaviorSanitizer (CI), in a CPU-only build of
# their own; allocator_may_return_null: test_linear_cross_entropy asks for an impossible workspace on
# purpose (the library must report FL_ERR_OUT_OF_MEMORY, not abort)
SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1
test-sanitize:
	ASAN_OPTIONS=allocator_may_return_null=1 $(MAKE) BUILD=build-asan NO_CUDA=1 EXTRA_CFLAGS="$(SAN_FLAGS)" test

test-cuda: lib $(CUDA_TESTS)
	@set -e; for t in $(CUDA_TESTS); do echo "== $$t"; ./$$t; done; echo "overall okay: 1"

bench: $(BUILD)/bench_cross_entropy
	./$(BUILD)/bench_cross_entropy

bench-gelu: $(BUILD)/bench_gelu
	./$(BUILD)/bench_gelu

bench-lce: $(BUILD)/bench_linear_ce
	./$(BUILD)/bench_linear_ce

demo: $(BUILD)/fl_demo
	./$(BUILD)/fl_demo

install: lib
	install -d $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/fusedloss.h $(DESTDIR)$(PREFIX)/include/
	install -m 644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|0.1.0|' \
	    -e 's|@PRIVATE_LIBS@|$(strip $(CUDA_LIBS) $(LDLIBS))|' fusedloss.pc.in \
	    > $(DESTDIR)$(PREFIX)/lib/pkgconfig/fusedloss.pc

# builds examples/hello.c against an installed copy (make install PREFIX=... first)
example:
	$(CC) -std=c99 examples/hello.c -o $(BUILD)/hello $$(PKG_CONFIG_PATH=$(PREFIX)/lib/pkgconfig pkg-config --cflags --libs fusedloss) -Wl,-rpath,$(PREFIX)/lib
	./$(BUILD)/hello

clean:
	rm -rf $(BUILD)
