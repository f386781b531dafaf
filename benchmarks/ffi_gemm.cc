// An experiment, not used by replug_jax (benchmarks/bench_ffi_gemm.py builds and times it; benchmarks/README.md
// "A BLAS GEMM inside XLA's programs"): fp32 out[..., n] = x[..., k] @ w[k, n] as an XLA FFI custom call, through
// OpenBLAS's cblas_sgemm (numpy's bundled library, one thread per call), the rows split in parts over XLA's own
// CPU thread pool so that no second thread pool competes with XLA's. PARTS_PER_THREAD is set at compile time.
#include <dlfcn.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
using sgemm_t = void (*)(int, int, int, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                         int64_t, float, float*, int64_t);
using local_threads_t = int (*)(int);
static sgemm_t g_sgemm = nullptr;
static local_threads_t g_local = nullptr;

extern "C" int replug_gemm_init(const char* path, const char* sgemm_name) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) return 1;
  g_sgemm = reinterpret_cast<sgemm_t>(dlsym(h, sgemm_name));
  g_local = reinterpret_cast<local_threads_t>(dlsym(h, "openblas_set_num_threads_local"));
  return g_sgemm ? 0 : 2;
}

struct Job {
  const float* x; const float* w; float* out; int64_t m, k, n, rows_per_part, parts;
  std::atomic<int64_t> next{0}, done{0};
  void Work() {
    if (g_local) g_local(1);
    for (int64_t p; (p = next.fetch_add(1)) < parts;) {
      int64_t r0 = p * rows_per_part, r1 = std::min(m, r0 + rows_per_part);
      g_sgemm(101, 111, 111, r1 - r0, n, k, 1.0f, x + r0 * k, k, w, n, 0.0f, out + r0 * n, n);
      done.fetch_add(1);
    }
  }
};

static ffi::Error Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                       ffi::ResultBuffer<ffi::F32> out) {
  if (!g_sgemm) return ffi::Error(ffi::ErrorCode::kFailedPrecondition, "replug_gemm_init was not called");
  int64_t k = x.dimensions().back(), m = x.element_count() / k, n = w.dimensions().back();
  int64_t threads = std::max<int64_t>(1, pool.num_threads());
  auto job = std::make_shared<Job>();
  job->x = x.typed_data(); job->w = w.typed_data(); job->out = out->typed_data();
  job->m = m; job->k = k; job->n = n;
  job->parts = std::min<int64_t>(std::max<int64_t>(1, m / 64), threads * PARTS_PER_THREAD);
  job->rows_per_part = (m + job->parts - 1) / job->parts;
  job->parts = (m + job->rows_per_part - 1) / job->rows_per_part;
  for (int64_t t = 1; t < std::min(threads, job->parts); ++t) pool.Schedule([job] { job->Work(); });
  job->Work();
  while (job->done.load() < job->parts) std::this_thread::yield();
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReplugGemm, Gemm,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>().Ret<ffi::Buffer<ffi::F32>>());
