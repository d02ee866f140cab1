// Host shim of assert for kernels: a failed assert is a finding of the run (reported with
// the others) instead of aborting the Python process that runs the kernel. The system
// header comes first, so NDEBUG keeps its meaning.
#include_next <assert.h>

#if defined(__cplusplus) && !defined(NDEBUG)
namespace asickernels_shim {
[[noreturn]] void assertion_failed(const char* expression, const char* file, int line);
}  // namespace asickernels_shim
#undef assert
#define assert(expression) \
  ((expression) ? void(0) : ::asickernels_shim::assertion_failed(#expression, __FILE__, __LINE__))
#endif
