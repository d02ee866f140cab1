// The shim's runtime: tensors over host buffers, the tensor library, the per-core TCM pool,
// the checked accessors, the op registry filled by NEURON_LIBRARY and the glue, printf, and
// the runner that executes an op on 1 core (single-core mode) or 8 (multicore mode) and
// reports every finding of the run. Python drives it through the extern "C" functions at
// the end (see __init__.py).
#include <cxxabi.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include <neuron/neuron-utils.hpp>
#include <torch/torch.h>

#include "asickernels_shim/ops.hpp"

namespace asickernels_shim {

constexpr uint32_t kCoreCount = 8;
// custom-ops-ref-guide "TCM Accessor": "Users have access to a 16KB pool of TCM memory. Note
// the streaming accessors also allocate from this pool (4KB each)."
constexpr size_t kTcmPoolBytes = 16 * 1024;
constexpr size_t kStreamTcmBytes = 4 * 1024;
// custom-c++-operators-devguide: "the library can have 10 functions registered".
constexpr size_t kMaxOpsPerLibrary = 10;
constexpr size_t kMaxDims = 8;
// aws-neuron-sdk neuron-customops/programming-guide/custom-c++-operators-devguide.rst@27461f50
// "Performance Guidance": without -DSTACK_SIZE (or with an estimate under ~8KB) "the stack
// will go in local memory ... if your stack grows beyond ~8KB, there's a risk of a stack
// overflow"; a larger STACK_SIZE places it in NeuronCore memory, and "the maximum supported
// stack size is 400KB".
constexpr size_t kLocalStackBytes = 8 * 1024;

// A kernel broke a device rule (fatal for its core), or the host glue was misused.
class ShimError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Init { Sentinel, Value, Identity };

struct Storage {
  void* data = nullptr;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool writable = true;
  // An operator input as a shape function sees it: an XLA tensor with no storage yet.
  bool shape_only = false;
  // An operator input: the caller's buffer, never written. A writable standard accessor
  // gets a private copy (`owned`), compared with the caller's after the run.
  const void* caller_data = nullptr;
  // Factory tensors own their memory, allocated and initialized on first data access.
  bool owns_memory = false;
  Init init = Init::Sentinel;
  c10::Scalar init_value;
  std::vector<unsigned char> owned;
  std::once_flag materialized;
  torch::CoherencyEnforcer::Policy policy = torch::CoherencyEnforcer::COHERENT;
  int active_read_streams = 0;
  int active_write_streams = 0;

  void* ensure_data();
};

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int length = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string text(length > 0 ? static_cast<size_t>(length) : 0, '\0');
  if (length > 0) std::vsnprintf(&text[0], text.size() + 1, fmt, args);
  va_end(args);
  return text;
}

const char* dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Byte: return "kByte";
    case c10::ScalarType::Char: return "kChar";
    case c10::ScalarType::Short: return "kShort";
    case c10::ScalarType::Int: return "kInt";
    case c10::ScalarType::Long: return "kLong";
    case c10::ScalarType::Half: return "kHalf";
    case c10::ScalarType::Float: return "kFloat";
    case c10::ScalarType::BFloat16: return "kBFloat16";
  }
  return "an unknown dtype";
}

size_t element_size(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Byte:
    case c10::ScalarType::Char: return 1;
    case c10::ScalarType::Short:
    case c10::ScalarType::Half:
    case c10::ScalarType::BFloat16: return 2;
    case c10::ScalarType::Int:
    case c10::ScalarType::Float: return 4;
    case c10::ScalarType::Long: return 8;
  }
  return 0;
}

bool is_integral(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Byte || dtype == c10::ScalarType::Char ||
         dtype == c10::ScalarType::Short || dtype == c10::ScalarType::Int ||
         dtype == c10::ScalarType::Long;
}

// custom-ops-ref-guide "Tensor Factory Functions" lists the supported dtypes; kLong was
// removed from that list ("we are unable to support 64-bit custom ops").
void check_supported_dtype(c10::ScalarType dtype) {
  if (dtype == c10::ScalarType::Long) {
    throw ShimError("kLong (64-bit) tensors are not supported by the custom operator toolchain; "
                    "use kInt (supported dtypes: kFloat, kBFloat16, kHalf, kInt, kChar, kShort, "
                    "kByte)");
  }
  if (element_size(dtype) == 0) throw ShimError("unsupported tensor dtype");
}

std::string shape_text(const std::vector<int64_t>& sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

// The device's limits: up to 8 dimensions of at most 65535, or up to 4 of at most 2^32-1
// (custom-ops-ref-guide "Library Limitations").
int64_t checked_numel(const std::vector<int64_t>& sizes) {
  bool narrow = sizes.size() <= kMaxDims;
  bool wide = sizes.size() <= 4;
  int64_t numel = 1;
  for (int64_t size : sizes) {
    if (size < 0) throw ShimError("negative tensor dimension in " + shape_text(sizes));
    narrow = narrow && size <= 65535;
    wide = wide && size <= 4294967295LL;
    if (size != 0 && numel > (int64_t{1} << 62) / size) {
      throw ShimError("tensor " + shape_text(sizes) + " has too many elements");
    }
    numel *= size;
  }
  if (!narrow && !wide) {
    throw ShimError("tensor shape " + shape_text(sizes) +
                    " exceeds the device limits: up to 8 dimensions of at most 65535, or up "
                    "to 4 dimensions of at most 2^32-1");
  }
  return numel;
}

std::shared_ptr<Storage> make_storage(c10::ScalarType dtype, std::vector<int64_t> sizes) {
  check_supported_dtype(dtype);
  auto storage = std::make_shared<Storage>();
  storage->numel = checked_numel(sizes);
  storage->strides.assign(sizes.size(), 1);
  for (size_t i = sizes.size(); i-- > 1;) storage->strides[i - 1] = storage->strides[i] * sizes[i];
  storage->sizes = std::move(sizes);
  storage->dtype = dtype;
  return storage;
}

// ---- element values, as double (or int64 for integral dtypes) -------------------------

uint16_t float_to_half(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t exponent = (bits >> 23) & 0xffu;
  uint32_t mantissa = bits & 0x7fffffu;
  if (exponent == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mantissa ? 0x200u : 0u));
  const int32_t half_exponent = static_cast<int32_t>(exponent) - 127 + 15;
  if (half_exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t shift = 13;
  uint32_t base = sign | (static_cast<uint32_t>(std::max(half_exponent, 0)) << 10);
  if (half_exponent <= 0) {  // subnormal: round the implicit-one mantissa into 10 bits
    if (half_exponent < -10) return static_cast<uint16_t>(sign);
    mantissa |= 0x800000u;
    shift = static_cast<uint32_t>(14 - half_exponent);
    base = sign;
  }
  uint32_t half = base | (mantissa >> shift);
  const uint32_t remainder = mantissa & ((1u << shift) - 1);
  const uint32_t midpoint = 1u << (shift - 1);
  if (remainder > midpoint || (remainder == midpoint && (half & 1u))) ++half;  // to even
  return static_cast<uint16_t>(half);
}

float half_to_float(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  const uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0) {
    const float value = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -value : value;
  }
  const uint32_t bits = exponent == 31 ? (sign | 0x7f800000u | (mantissa << 13))
                                       : (sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t float_to_bfloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);  // to even
}

float bfloat16_to_float(uint16_t bf16) {
  const uint32_t bits = static_cast<uint32_t>(bf16) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// Element i as T: integers exactly (an int64 through a double would round), 16-bit floats
// widened to float first.
template <typename T>
T load(c10::ScalarType dtype, const void* data, size_t i) {
  switch (dtype) {
    case c10::ScalarType::Byte: return static_cast<T>(static_cast<const uint8_t*>(data)[i]);
    case c10::ScalarType::Char: return static_cast<T>(static_cast<const int8_t*>(data)[i]);
    case c10::ScalarType::Short: return static_cast<T>(static_cast<const int16_t*>(data)[i]);
    case c10::ScalarType::Int: return static_cast<T>(static_cast<const int32_t*>(data)[i]);
    case c10::ScalarType::Long: return static_cast<T>(static_cast<const int64_t*>(data)[i]);
    case c10::ScalarType::Half:
      return static_cast<T>(half_to_float(static_cast<const uint16_t*>(data)[i]));
    case c10::ScalarType::Float: return static_cast<T>(static_cast<const float*>(data)[i]);
    case c10::ScalarType::BFloat16:
      return static_cast<T>(bfloat16_to_float(static_cast<const uint16_t*>(data)[i]));
  }
  return T{};
}

// Integral stores wrap like C++ conversions (bitwise ops rely on it).
void store(c10::ScalarType dtype, void* data, size_t i, double value, int64_t integral) {
  switch (dtype) {
    case c10::ScalarType::Byte: static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(integral); break;
    case c10::ScalarType::Char: static_cast<int8_t*>(data)[i] = static_cast<int8_t>(integral); break;
    case c10::ScalarType::Short: static_cast<int16_t*>(data)[i] = static_cast<int16_t>(integral); break;
    case c10::ScalarType::Int: static_cast<int32_t*>(data)[i] = static_cast<int32_t>(integral); break;
    case c10::ScalarType::Long: static_cast<int64_t*>(data)[i] = integral; break;
    case c10::ScalarType::Half:
      static_cast<uint16_t*>(data)[i] = float_to_half(static_cast<float>(value));
      break;
    case c10::ScalarType::Float: static_cast<float*>(data)[i] = static_cast<float>(value); break;
    case c10::ScalarType::BFloat16:
      static_cast<uint16_t*>(data)[i] = float_to_bfloat16(static_cast<float>(value));
      break;
  }
}

void store_scalar(c10::ScalarType dtype, void* data, size_t i, const c10::Scalar& value) {
  store(dtype, data, i, value.toDouble(), value.toLong());
}

// What `empty` memory holds: NaN for floating dtypes (unwritten results stand out), a
// recognizable pattern for integral ones. The device leaves garbage there.
void fill_sentinel(c10::ScalarType dtype, void* data, size_t numel) {
  if (dtype == c10::ScalarType::Float) {
    std::fill_n(static_cast<float*>(data), numel, std::nanf(""));
    return;
  }
  if (is_integral(dtype)) {
    std::memset(data, 0xA5, numel * element_size(dtype));
    return;
  }
  for (size_t i = 0; i < numel; ++i) store(dtype, data, i, std::nan(""), 0);
}

// ---- cores and runs -------------------------------------------------------------------

struct CoreContext {
  uint32_t id = 0;
  uint32_t count = 1;
  bool multicore = false;
  const torch::Tensor* dst = nullptr;
  bool used_dst = false;
  torch::Tensor returned;
  std::map<uintptr_t, size_t> tcm_blocks;  // start -> requested bytes
  size_t tcm_in_use = 0;                   // pool bytes charged (16-byte granules + streams)
  size_t tcm_peak = 0;
  std::vector<size_t> failed_tcm_mallocs;
  std::vector<std::pair<size_t, size_t>> dst_writes;  // [begin, end) flattened elements
  uint64_t bytes_to_tcm = 0;
  uint64_t bytes_from_tcm = 0;
  uint64_t denied_printfs = 0;
  size_t stack_bytes = 0;  // peak stack depth of the kernel on this core (0: not measured)
  std::vector<std::string> findings;
};

thread_local CoreContext* t_core = nullptr;

// Output of printf on the cores that may print, in order (the runtime prints it after the
// run, as the device's runtime does).
std::mutex g_stdout_mutex;
std::string g_stdout;

CoreContext& current_core(const char* api) {
  if (t_core == nullptr) {
    throw ShimError(format("%s() called outside a kernel run by the shim", api));
  }
  return *t_core;
}

// Data of a tensor for direct (non-TCM) access by `api`.
void* direct_data(Storage& storage, const char* api) {
  if (t_core != nullptr && t_core->multicore) {
    throw ShimError(format(
        "%s in multicore mode: tensors can only be accessed through TCM accessors there "
        "(custom-ops-ref-guide \"Using multiple GPSIMD cores\"; other access races)", api));
  }
  void* data = storage.ensure_data();
  if (t_core != nullptr && t_core->dst != nullptr && &storage == t_core->dst->shim_storage().get()) {
    t_core->dst_writes.emplace_back(0, static_cast<size_t>(storage.numel));
  }
  return data;
}

size_t pool_charge(size_t nbytes) { return (std::max<size_t>(nbytes, 1) + 15) / 16 * 16; }

void check_tcm_range(const CoreContext& core, const void* ptr, size_t bytes, const char* api) {
  const auto address = reinterpret_cast<uintptr_t>(ptr);
  auto block = core.tcm_blocks.upper_bound(address);
  if (block == core.tcm_blocks.begin()) {
    throw ShimError(format("%s: %p is not inside a buffer tcm_malloc returned on this core", api,
                           ptr));
  }
  --block;
  if (address + bytes > block->first + block->second) {
    throw ShimError(format("%s: %zu bytes at offset %zu overrun the %zu-byte TCM buffer", api,
                           bytes, static_cast<size_t>(address - block->first), block->second));
  }
}

struct RunStats {
  uint64_t active_cores = 0;
  uint64_t tcm_peak_bytes = 0;
  uint64_t bytes_to_tcm = 0;
  uint64_t bytes_from_tcm = 0;
  uint64_t failed_tcm_mallocs = 0;
  uint64_t stack_peak_bytes = 0;
};

std::mutex g_stats_mutex;
RunStats g_last_stats;

// The stack budget of the library's kernels: the -DSTACK_SIZE it was built with, if any
// (registered by the glue), never less than the local-memory stack.
std::atomic<size_t> g_stack_limit{kLocalStackBytes};

#if !defined(__SANITIZE_ADDRESS__)
// ---- the kernel's stack -----------------------------------------------------------------
// Each core runs its kernel on a stack of its own (a ucontext), laid out from high to low:
//
//   [top - limit, top)   the kernel's stack: `limit` bytes below its entry, painted
//   overflow zone        kOverflowZoneBytes, inaccessible until touched
//   guard                kGuardBytes, inaccessible for good
//
// The first access to an overflow-zone page (a write, a read, or the probe that
// -fstack-clash-protection makes at every page of a large frame, written or not) faults: the
// handler records the address, opens and paints the page, and the kernel goes on. After the
// run the deepest access is the lowest recorded fault or written byte, wherever in its frame
// the kernel wrote. An access to the guard (a frame larger than the zone) ends the run.
constexpr unsigned char kStackPaint = 0xC5;
constexpr size_t kOverflowZoneBytes = 4 * 1024 * 1024;
constexpr size_t kGuardBytes = 64 * 1024;
// custom-c++-operators-devguide: "the maximum supported stack size is 400KB" (the Python
// side refuses a larger -DSTACK_SIZE; the runtime clamps to it).
constexpr size_t kMaxStackBytes = 400 * 1024;
// siglongjmp value of an access to the guard.
constexpr int kStackOverflow = -1;

size_t page_bytes() {
  static const size_t bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}

uintptr_t round_up(uintptr_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct KernelStack {
  uintptr_t base = 0;  // the guard's first byte
  uintptr_t zone = 0;  // the overflow zone's first byte
  uintptr_t end = 0;   // one past the mapping
  // Per run: the kernel's stack is [top - limit, top), `open` its first (page-aligned) byte.
  uintptr_t open = 0;
  uintptr_t top = 0;
  bool running = false;
  uintptr_t deepest_fault = 0;  // lowest overflow-zone address accessed (0: none)
  uintptr_t lowest_opened = 0;  // lowest overflow-zone page opened (0: none)
};

thread_local KernelStack t_stack;

// Maps this core thread's kernel stack (once): address space only, no memory until used.
void ensure_kernel_stack() {
  KernelStack& stack = t_stack;
  if (stack.base != 0) return;
  const size_t page = page_bytes();
  const size_t guard = round_up(kGuardBytes, page);
  const size_t total = guard + round_up(kOverflowZoneBytes, page) + round_up(kMaxStackBytes, page);
  void* memory = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
  if (memory == MAP_FAILED) {
    throw ShimError(format("could not reserve %zu bytes of address space for the kernel's stack",
                           total));
  }
  stack.base = reinterpret_cast<uintptr_t>(memory);
  stack.zone = stack.base + guard;
  stack.end = stack.base + total;
}

// Opens `limit` bytes of stack below `top` (page-aligned at the bottom, so that the first
// byte beyond the limit is the first byte of an inaccessible page), paints them, and closes
// everything below.
void arm_kernel_stack(size_t limit) {
  KernelStack& stack = t_stack;
  const size_t page = page_bytes();
  limit = std::min(limit, kMaxStackBytes) / 16 * 16;
  stack.open = stack.end - round_up(limit, page);
  stack.top = stack.open + limit;
  stack.deepest_fault = stack.lowest_opened = 0;
  if (mprotect(reinterpret_cast<void*>(stack.zone), stack.open - stack.zone, PROT_NONE) != 0 ||
      mprotect(reinterpret_cast<void*>(stack.open), stack.end - stack.open,
               PROT_READ | PROT_WRITE) != 0) {
    throw ShimError("could not set up the kernel's stack (mprotect failed)");
  }
  std::memset(reinterpret_cast<void*>(stack.open), kStackPaint, limit);
}

// The signal handler's part: true when `address` is in the overflow zone of this thread's
// running kernel (its page is then opened, painted and the access may go on).
bool open_overflow_page(uintptr_t address) {
  KernelStack& stack = t_stack;
  if (!stack.running || address < stack.zone || address >= stack.open) return false;
  const uintptr_t page = address / page_bytes() * page_bytes();
  if (mprotect(reinterpret_cast<void*>(page), page_bytes(), PROT_READ | PROT_WRITE) != 0) {
    return false;
  }
  std::memset(reinterpret_cast<void*>(page), kStackPaint, page_bytes());
  if (stack.deepest_fault == 0 || address < stack.deepest_fault) stack.deepest_fault = address;
  if (stack.lowest_opened == 0 || page < stack.lowest_opened) stack.lowest_opened = page;
  return true;
}

bool in_guard(uintptr_t address) {
  const KernelStack& stack = t_stack;
  return stack.running && address >= stack.base && address < stack.zone;
}

// How many bytes below `top` the finished kernel reached: its lowest fault in the overflow
// zone or its lowest written (unpainted) byte, whichever is deeper.
size_t kernel_stack_depth() {
  const KernelStack& stack = t_stack;
  uintptr_t deepest = stack.top;
  const uintptr_t from = stack.lowest_opened != 0 ? stack.lowest_opened : stack.open;
  const uintptr_t to = stack.lowest_opened != 0 ? stack.lowest_opened + page_bytes() : stack.top;
  const auto* bytes = reinterpret_cast<const volatile unsigned char*>(from);
  for (uintptr_t i = 0; from + i < to; ++i) {
    if (bytes[i] != kStackPaint) {
      deepest = from + i;
      break;
    }
  }
  if (stack.deepest_fault != 0) deepest = std::min(deepest, stack.deepest_fault);
  return stack.top - deepest;
}

// The kernel call a core's context makes, and what it returned or threw.
struct KernelCall {
  const std::function<torch::Tensor()>* kernel = nullptr;
  torch::Tensor result;
  std::exception_ptr error;
};

thread_local KernelCall* t_call = nullptr;

void kernel_entry() {
  try {
    t_call->result = (*t_call->kernel)();
  } catch (...) {
    t_call->error = std::current_exception();
  }
}  // returns to the context's uc_link: the core's runner

// A kernel that faults (a null or wild pointer, e.g. after an unchecked failed tcm_malloc;
// integer division by zero; a stack overflow) becomes a finding of its core instead of
// killing the process: the handler jumps back to the core's runner. Faults outside a kernel
// go to the handler that was there before.
const int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE};
struct sigaction g_previous_actions[3];
thread_local sigjmp_buf* t_fault_jump = nullptr;
thread_local uintptr_t t_fault_address = 0;

void on_fault(int signal, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  if (signal == SIGSEGV && open_overflow_page(address)) return;  // the access goes on
  if (t_fault_jump != nullptr) {
    t_fault_address = address;
    siglongjmp(*t_fault_jump, signal == SIGSEGV && in_guard(address) ? kStackOverflow : signal);
  }
  for (size_t i = 0; i < 3; ++i) {
    if (kFaultSignals[i] == signal) sigaction(signal, &g_previous_actions[i], nullptr);
  }
  // Returning re-runs the faulting instruction under the previous handler.
}

void install_fault_handlers() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = &on_fault;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < 3; ++i) sigaction(kFaultSignals[i], &action, &g_previous_actions[i]);
  });
}

// Each core thread handles its faults on a stack of its own (its stack may be exhausted).
void ensure_signal_stack() {
  thread_local std::vector<unsigned char> signal_stack;
  if (!signal_stack.empty()) return;
  signal_stack.resize(64 * 1024);
  stack_t stack{};
  stack.ss_sp = signal_stack.data();
  stack.ss_size = signal_stack.size();
  sigaltstack(&stack, nullptr);
}

const char* kStackRule =
    "~8KB in local memory, or -DSTACK_SIZE=N up to 400KB; custom-c++-operators-devguide "
    "\"Performance Guidance\"";

std::string fault_text(int signal, size_t limit) {
  if (signal == kStackOverflow) {
    return format("the kernel's stack overflowed: it reached %zu bytes below its entry, more "
                  "than the %zu bytes it may use (%s)",
                  static_cast<size_t>(t_stack.top - t_fault_address), limit, kStackRule);
  }
  const char* name = signal == SIGSEGV ? "SIGSEGV" : signal == SIGBUS ? "SIGBUS" : "SIGFPE";
  if (signal == SIGFPE) return "the kernel faulted: SIGFPE (an integer division by zero?)";
  return format("the kernel faulted: %s accessing address %p%s", name,
                reinterpret_cast<void*>(t_fault_address),
                t_fault_address < 4096 ? " (a null pointer: a tcm_malloc that returned nullptr?)"
                                       : "");
}
#endif

// Runs the kernel on its core's stack, measuring its deepest stack use and catching its
// faults where the build allows (AddressSanitizer moves frames elsewhere and handles faults
// itself).
__attribute__((noinline)) void run_kernel_measured(CoreContext& core,
                                                   const std::function<torch::Tensor()>& kernel) {
#if !defined(__SANITIZE_ADDRESS__)
  const size_t limit = g_stack_limit.load();
  ensure_signal_stack();
  ensure_kernel_stack();
  arm_kernel_stack(limit);
  KernelStack& stack = t_stack;
  KernelCall call;
  call.kernel = &kernel;
  t_call = &call;
  ucontext_t runner, callee;
  if (getcontext(&callee) != 0) throw ShimError("getcontext failed");
  callee.uc_stack.ss_sp = reinterpret_cast<void*>(stack.open);
  callee.uc_stack.ss_size = stack.top - stack.open;
  callee.uc_link = &runner;
  makecontext(&callee, kernel_entry, 0);
  sigjmp_buf jump;
  const int signal = sigsetjmp(jump, 1);
  if (signal != 0) {
    t_fault_jump = nullptr;
    t_stack.running = false;
    throw ShimError(fault_text(signal, limit));
  }
  t_fault_jump = &jump;
  stack.running = true;
  const int switched = swapcontext(&runner, &callee);
  stack.running = false;
  t_fault_jump = nullptr;
  if (switched != 0) throw ShimError("swapcontext failed");
  if (call.error) std::rethrow_exception(call.error);
  core.returned = call.result;
  core.stack_bytes = kernel_stack_depth();
  if (core.stack_bytes > limit) {
    core.findings.push_back(format(
        "the kernel used %zu bytes of stack (host build), more than the %zu bytes it may use (%s)",
        core.stack_bytes, limit, kStackRule));
  }
#else
  core.returned = kernel();
#endif
}

void run_core(CoreContext& core, const std::function<torch::Tensor()>& kernel) {
  t_core = &core;
  try {
    run_kernel_measured(core, kernel);
  } catch (const std::exception& e) {
#if !defined(__SANITIZE_ADDRESS__)
    t_fault_jump = nullptr;
#endif
    core.findings.push_back(e.what());
  } catch (...) {
#if !defined(__SANITIZE_ADDRESS__)
    t_fault_jump = nullptr;
#endif
    core.findings.push_back("unknown C++ exception");
  }
  if (core.multicore && !core.used_dst) {
    core.findings.push_back("never called get_dst_tensor(), which multicore mode requires (the "
                            "kernel's return value is ignored)");
  }
  if (!core.tcm_blocks.empty()) {
    size_t bytes = 0;
    for (const auto& block : core.tcm_blocks) bytes += block.second;
    core.findings.push_back(format("returned with %zu TCM buffer(s) (%zu bytes) never passed to "
                                   "tcm_free", core.tcm_blocks.size(), bytes));
  }
  if (core.denied_printfs > 0) {
    core.findings.push_back(format(
        "called printf %llu time(s): printf is only supported in single core mode or on GPSIMD "
        "core 0 when using multiple cores (custom-ops-ref-guide \"printf()\" Limitations)",
        static_cast<unsigned long long>(core.denied_printfs)));
  }
  for (const auto& block : core.tcm_blocks) std::free(reinterpret_cast<void*>(block.first));
  core.tcm_blocks.clear();
  t_core = nullptr;
}

// The simulated cores: kCoreCount threads, started once per process and then reused
// (starting threads costs more than running a small kernel). Runs are serialized.
class CorePool {
 public:
  static CorePool& get() {
    static std::mutex guard;
    static CorePool* pool = nullptr;
    std::lock_guard<std::mutex> lock(guard);
    // A fork()ed child has none of the parent's threads: it gets a fresh pool, and the old
    // one is left alone (its mutexes may be in any state).
    if (pool == nullptr || pool->owner_ != getpid()) pool = new CorePool();
    return *pool;
  }

  // Runs `kernel` once on each of cores[0 .. cores.size()).
  void run(std::vector<CoreContext>& cores, const std::function<torch::Tensor()>& kernel) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    start_missing_threads();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cores_ = &cores;
      kernel_ = &kernel;
      cores_in_run_ = static_cast<uint32_t>(cores.size());
      remaining_ = cores_in_run_;
      ++generation_;
    }
    start_.notify_all();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return remaining_ == 0; });
  }

 private:
  CorePool() : owner_(getpid()) {}

  void start_missing_threads() {
    uint64_t current;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current = generation_;
    }
    try {
      for (; started_ < kCoreCount; ++started_) {
        const uint32_t id = started_;
        std::thread([this, id, current] { serve(id, current); }).detach();
      }
    } catch (const std::exception& e) {
      throw ShimError(std::string("could not start the core threads: ") + e.what());
    }
  }

  // Runs core `id` of every run after generation `seen` that uses that many cores.
  void serve(uint32_t id, uint64_t seen) {
    for (;;) {
      std::vector<CoreContext>* cores;
      const std::function<torch::Tensor()>* kernel;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        // A core this run does not use must not touch it: the run may be over already.
        if (id >= cores_in_run_) continue;
        cores = cores_;
        kernel = kernel_;
      }
      run_core((*cores)[id], *kernel);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--remaining_ == 0) done_.notify_one();
    }
  }

  const pid_t owner_;
  uint32_t started_ = 0;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable start_;
  std::condition_variable done_;
  uint64_t generation_ = 0;
  uint32_t remaining_ = 0;
  uint32_t cores_in_run_ = 0;
  std::vector<CoreContext>* cores_ = nullptr;
  const std::function<torch::Tensor()>* kernel_ = nullptr;
};

// In multicore mode every output element must be written by exactly one core: there is no
// synchronization between cores, and what no core writes is garbage on the device
// (custom-ops-ref-guide "Return Value Handling"). Returns one finding per problem.
std::vector<std::string> check_disjoint_cover(const std::vector<CoreContext>& cores,
                                              int64_t numel) {
  struct Span {
    size_t begin, end;
    uint32_t core;
  };
  std::vector<Span> spans;
  for (const CoreContext& core : cores) {
    for (const auto& write : core.dst_writes) {
      if (write.first < write.second) spans.push_back({write.first, write.second, core.id});
    }
  }
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  std::vector<std::string> findings;
  std::set<std::pair<uint32_t, uint32_t>> reported_pairs;
  std::vector<std::pair<size_t, size_t>> gaps;
  size_t covered = 0;
  Span furthest{0, 0, 0};
  for (const Span& span : spans) {
    if (span.begin < furthest.end && span.core != furthest.core &&
        reported_pairs.insert({furthest.core, span.core}).second) {
      findings.push_back(format(
          "cores %u and %u both wrote output elements [%zu, %zu) (flattened offsets): in "
          "multicore mode each core must write a disjoint slice of get_dst_tensor()",
          furthest.core, span.core, span.begin, std::min(span.end, furthest.end)));
    }
    if (span.begin > covered) gaps.emplace_back(covered, span.begin);
    covered = std::max(covered, span.end);
    if (span.end > furthest.end) furthest = span;
  }
  const auto total = static_cast<size_t>(numel);
  if (covered < total) gaps.emplace_back(covered, total);
  if (!gaps.empty()) {
    size_t unwritten = 0;
    std::string ranges;
    for (size_t i = 0; i < gaps.size(); ++i) {
      unwritten += gaps[i].second - gaps[i].first;
      if (i < 4) ranges += format("%s[%zu, %zu)", i ? ", " : "", gaps[i].first, gaps[i].second);
    }
    if (gaps.size() > 4) ranges += format(", ... (%zu ranges)", gaps.size());
    findings.push_back(format("%zu of %zu output elements were written by no core: %s; the "
                              "device would leave garbage there", unwritten, total,
                              ranges.c_str()));
  }
  return findings;
}

// ---- the op registry ------------------------------------------------------------------

struct OpEntry {
  std::string library;
  std::string kernel_name;
  std::vector<Parameter> parameters;
  Invoker shape_fn;
  int definitions;
};

struct KernelEntry {
  std::string signature;
  std::vector<Parameter> parameters;
  Invoker function;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, OpEntry>& op_registry() {
  static std::map<std::string, OpEntry> registry;
  return registry;
}

std::multimap<std::string, KernelEntry>& kernel_registry() {
  static std::multimap<std::string, KernelEntry> registry;
  return registry;
}

std::string kinds_text(const std::vector<Parameter>& parameters) {
  std::string text;
  for (const Parameter& p : parameters) {
    text += p.kind == ParamKind::Tensor ? 'T' : p.kind == ParamKind::Double ? 'D'
            : p.kind == ParamKind::Scalar ? 'S' : '?';
  }
  return text;
}

std::string parameter_list(const std::vector<Parameter>& parameters) {
  std::string text = "(";
  for (size_t i = 0; i < parameters.size(); ++i) {
    text += (i ? ", " : "") + parameters[i].type_name;
  }
  return text + ")";
}

void check_parameters(const std::string& what, const std::vector<Parameter>& parameters,
                      std::vector<std::string>& problems) {
  for (size_t i = 0; i < parameters.size(); ++i) {
    if (parameters[i].kind == ParamKind::Unsupported) {
      problems.push_back(format(
          "%s: parameter %zu has type %s; arguments may be torch::Tensor, torch::Scalar or "
          "double (\"double is the only supported\" scalar dtype, custom-c++-operators-devguide)",
          what.c_str(), i + 1, parameters[i].type_name.c_str()));
    }
  }
}

// Every reason the registered library cannot be built by the toolchain.
std::vector<std::string> library_problems() {
  std::vector<std::string> problems;
  const auto& ops = op_registry();
  const auto& kernels = kernel_registry();
  std::set<std::string> libraries;
  for (const auto& item : ops) libraries.insert(item.second.library);
  if (ops.empty()) {
    problems.push_back("no operator: the shape sources define no NEURON_LIBRARY(lib, m) { "
                       "m.def(\"op\", &shape_fn, \"kernel_fn\"); }");
  }
  if (libraries.size() > 1) {
    std::string names;
    for (const auto& name : libraries) names += (names.empty() ? "" : ", ") + name;
    problems.push_back("several NEURON_LIBRARY names (" + names + "): each model can only have "
                       "one CustomOp library (custom-c++-operators-devguide)");
  }
  if (ops.size() > kMaxOpsPerLibrary) {
    problems.push_back(format("%zu functions registered: a CustomOp library can have %zu "
                              "(custom-c++-operators-devguide)", ops.size(), kMaxOpsPerLibrary));
  }
  for (const auto& item : ops) {
    const std::string& op = item.first;
    const OpEntry& entry = item.second;
    const std::string shape = "op \"" + op + "\" shape function";
    if (entry.definitions > 1) {
      problems.push_back(format("op \"%s\" is defined %d times", op.c_str(), entry.definitions));
    }
    if (entry.parameters.empty()) {
      problems.push_back("op \"" + op + "\" has no inputs: an operator's output shape comes "
                         "from its inputs (the shape function), so it needs at least one");
    }
    check_parameters(shape, entry.parameters, problems);
    const auto range = kernels.equal_range(entry.kernel_name);
    const auto found = std::distance(range.first, range.second);
    if (found == 0) {
      problems.push_back(format("op \"%s\": no kernel function \"%s\" is defined in the compute "
                                "sources (as a global function returning torch::Tensor)",
                                op.c_str(), entry.kernel_name.c_str()));
      continue;
    }
    if (found > 1) {
      problems.push_back(format("op \"%s\": the compute sources define %ld overloads of \"%s\"",
                                op.c_str(), static_cast<long>(found), entry.kernel_name.c_str()));
      continue;
    }
    const KernelEntry& kernel = range.first->second;
    check_parameters("kernel " + kernel.signature, kernel.parameters, problems);
    if (kinds_text(kernel.parameters) != kinds_text(entry.parameters)) {
      problems.push_back(format(
          "op \"%s\": kernel %s does not take the arguments of its shape function %s (the "
          "schema comes from the shape function)", op.c_str(), kernel.signature.c_str(),
          parameter_list(entry.parameters).c_str()));
    }
  }
  return problems;
}

struct ResolvedOp {
  const OpEntry* op;
  const KernelEntry* kernel;
};

ResolvedOp resolve(const char* name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto found = op_registry().find(name);
  if (found == op_registry().end()) throw ShimError(format("no op \"%s\" in this library", name));
  const auto kernel = kernel_registry().find(found->second.kernel_name);
  if (kernel == kernel_registry().end() || !found->second.shape_fn || !kernel->second.function) {
    throw ShimError(format("op \"%s\" cannot run: the library has problems", name));
  }
  return {&found->second, &kernel->second};
}

}  // namespace

// ---- the C ABI that Python calls ---------------------------------------------------------

// One argument as Python passes it (mirrored by a ctypes Structure in __init__.py).
struct ArgumentSpec {
  int32_t is_tensor;
  int32_t dtype;  // c10::ScalarType
  int32_t ndim;
  int32_t reserved;
  int64_t sizes[kMaxDims];
  void* data;
  double number;
};

namespace {

std::vector<Argument> make_arguments(const ResolvedOp& op, const ArgumentSpec* specs,
                                     size_t count, bool shape_only) {
  const auto& parameters = op.op->parameters;
  if (count != parameters.size()) {
    throw ShimError(format("%zu arguments for %zu parameters", count, parameters.size()));
  }
  std::vector<Argument> arguments(count);
  for (size_t i = 0; i < count; ++i) {
    const ArgumentSpec& spec = specs[i];
    const bool wants_tensor = parameters[i].kind == ParamKind::Tensor;
    if (wants_tensor != (spec.is_tensor != 0)) {
      throw ShimError(format("argument %zu must be %s", i + 1, wants_tensor ? "a tensor" : "a number"));
    }
    if (!wants_tensor) {
      arguments[i].number = spec.number;
      continue;
    }
    if (spec.ndim < 0 || spec.ndim > static_cast<int32_t>(kMaxDims)) {
      throw ShimError(format("argument %zu has %d dimensions: the device allows up to 8", i + 1,
                             spec.ndim));
    }
    auto storage = make_storage(static_cast<c10::ScalarType>(spec.dtype),
                                std::vector<int64_t>(spec.sizes, spec.sizes + spec.ndim));
    storage->shape_only = shape_only;
    if (!shape_only) {
      storage->writable = false;
      storage->caller_data = spec.data;
      storage->data = const_cast<void*>(spec.data);  // written only through a private copy
    }
    arguments[i].tensor = torch::Tensor(std::move(storage));
  }
  return arguments;
}

// The output the shape function declares (run on the host, on data-less inputs).
torch::Tensor declared_output(const ResolvedOp& op, const ArgumentSpec* specs, size_t count) {
  std::vector<Argument> arguments = make_arguments(op, specs, count, true);
  torch::Tensor output = op.op->shape_fn(arguments);
  if (!output.defined()) throw ShimError("the shape function returned an undefined tensor");
  return output;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += (text.empty() ? "" : "\n") + line;
  return text;
}

void run_op(const char* name, bool multicore, const ArgumentSpec* specs, size_t count, void* out) {
  const ResolvedOp op = resolve(name);
  const torch::Tensor declared = declared_output(op, specs, count);
  const Storage& want = *declared.shim_storage();
  std::vector<Argument> arguments = make_arguments(op, specs, count, false);

  auto output_storage = make_storage(want.dtype, want.sizes);
  output_storage->data = out;
  const torch::Tensor dst(output_storage);

  const uint32_t cores_in_run = multicore ? kCoreCount : 1;
  std::vector<CoreContext> cores(cores_in_run);
  for (uint32_t id = 0; id < cores_in_run; ++id) {
    cores[id].id = id;
    cores[id].count = cores_in_run;
    cores[id].multicore = multicore;
    cores[id].dst = &dst;
  }
  {
    std::lock_guard<std::mutex> lock(g_stdout_mutex);
    g_stdout.clear();
  }
#if !defined(__SANITIZE_ADDRESS__)
  install_fault_handlers();
#endif
  const Invoker& kernel = op.kernel->function;
  // Each core gets its own copy of the arguments, as each core runs the whole function.
  CorePool::get().run(cores, [&]() {
    std::vector<Argument> own = arguments;
    return kernel(own);
  });

  std::vector<std::string> findings;
  std::vector<std::string> notes;
  for (const CoreContext& core : cores) {
    const std::string prefix = multicore ? format("core %u: ", core.id) : "";
    for (const auto& finding : core.findings) findings.push_back(prefix + finding);
    for (size_t bytes : core.failed_tcm_mallocs) {
      notes.push_back(prefix + format("note: tcm_malloc(%zu) returned nullptr (the 16 KB pool "
                                      "was full)", bytes));
    }
  }
  if (multicore) {
    for (auto& finding : check_disjoint_cover(cores, want.numel)) findings.push_back(finding);
  } else if (!cores[0].used_dst && cores[0].findings.empty()) {
    const torch::Tensor& returned = cores[0].returned;
    if (!returned.defined()) {
      findings.push_back("the kernel returned an undefined tensor and never called "
                         "get_dst_tensor()");
    } else {
      Storage& got = *returned.shim_storage();
      if (got.sizes != want.sizes || got.dtype != want.dtype) {
        findings.push_back(format(
            "the kernel returned %s %s, but the shape function declares %s %s",
            shape_text(got.sizes).c_str(), dtype_name(got.dtype), shape_text(want.sizes).c_str(),
            dtype_name(want.dtype)));
      } else {
        std::memcpy(out, got.ensure_data(), static_cast<size_t>(want.numel) * element_size(want.dtype));
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    if (!specs[i].is_tensor) continue;
    const Storage& input = *arguments[i].tensor.shim_storage();
    if (!input.owned.empty() && std::memcmp(input.data, input.caller_data, input.owned.size()) != 0) {
      findings.push_back(format("the kernel wrote into input %zu (operator inputs are read-only)",
                                i + 1));
    }
  }
  if (!findings.empty()) {
    for (auto& note : notes) findings.push_back(note);
    throw ShimError(join_lines(findings));
  }

  RunStats stats;
  for (const CoreContext& core : cores) {
    stats.active_cores += (!core.dst_writes.empty() || !multicore) ? 1 : 0;
    stats.tcm_peak_bytes = std::max<uint64_t>(stats.tcm_peak_bytes, core.tcm_peak);
    stats.bytes_to_tcm += core.bytes_to_tcm;
    stats.bytes_from_tcm += core.bytes_from_tcm;
    stats.failed_tcm_mallocs += core.failed_tcm_mallocs.size();
    stats.stack_peak_bytes = std::max<uint64_t>(stats.stack_peak_bytes, core.stack_bytes);
  }
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_last_stats = stats;
}

void write_error(char* error, size_t error_size, const char* message) noexcept {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message);
}

// 0 on success, else 1 with the message in `error`.
template <typename Body>
int guarded(char* error, size_t error_size, Body&& body) noexcept {
  try {
    body();
    return 0;
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
  } catch (...) {
    write_error(error, error_size, "unknown C++ exception");
  }
  return 1;
}

size_t copy_text(const std::string& text, char* buffer, size_t size) noexcept {
  if (buffer != nullptr && size > 0) std::snprintf(buffer, size, "%s", text.c_str());
  return text.size();
}

}  // namespace

// ---- definitions of the header's declarations ---------------------------------------------

std::string demangle(const char* mangled) {
  int status = 0;
  char* text = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string result = status == 0 && text != nullptr ? text : mangled;
  std::free(text);
  return result;
}

void register_op(const char* library, const char* op, const char* kernel_name,
                 std::vector<Parameter> parameters, Invoker shape_fn) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& registry = op_registry();
  auto found = registry.find(op);
  if (found != registry.end()) {
    ++found->second.definitions;
    return;
  }
  registry.emplace(op, OpEntry{library, kernel_name, std::move(parameters), std::move(shape_fn), 1});
}

int declare_stack_size(long long bytes) noexcept {
  g_stack_limit = std::max<size_t>(kLocalStackBytes, bytes > 0 ? static_cast<size_t>(bytes) : 0);
  return 0;
}

void register_kernel(const char* name, const char* signature, std::vector<Parameter> parameters,
                     Invoker kernel) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  kernel_registry().emplace(name, KernelEntry{signature, std::move(parameters), std::move(kernel)});
}

[[noreturn]] void assertion_failed(const char* expression, const char* file, int line) {
  throw ShimError(format("assertion failed: %s (%s:%d)", expression, file, line));
}

void* Storage::ensure_data() {
  if (shape_only) {
    throw ShimError("a shape function read tensor data: it runs at trace time on XLA tensors "
                    "that have no storage; only shape information such as numel() and sizes() "
                    "may be used (custom-c++-operators-devguide \"Shape Function\")");
  }
  if (owns_memory) {
    std::call_once(materialized, [this] {
      owned.assign(static_cast<size_t>(numel) * element_size(dtype), 0);
      data = owned.data();
      const size_t count = static_cast<size_t>(numel);
      if (init == Init::Sentinel) fill_sentinel(dtype, data, count);
      if (init == Init::Value) {
        for (size_t i = 0; i < count; ++i) store_scalar(dtype, data, i, init_value);
      }
      if (init == Init::Identity) {
        for (int64_t r = 0; r < sizes[0] && r < sizes[1]; ++r) {
          store(dtype, data, static_cast<size_t>(r * sizes[1] + r), 1.0, 1);
        }
      }
    });
  }
  return data;
}

void tcm_transfer(Storage& storage, c10::ScalarType element_type, size_t element_size_bytes,
                  void* tcm_ptr, size_t tensor_offset, size_t num_elem, bool to_tensor) {
  const char* api = to_tensor ? "tcm_to_tensor" : "tensor_to_tcm";
  CoreContext& core = current_core(api);
  if (element_type != storage.dtype) {
    throw ShimError(format("%s<%s> on a %s tensor", api, dtype_name(element_type),
                           dtype_name(storage.dtype)));
  }
  const auto numel = static_cast<size_t>(storage.numel);
  if (tensor_offset > numel || num_elem > numel - tensor_offset) {
    throw ShimError(format("%s of elements [%zu, %zu) is out of bounds of a tensor of %zu "
                           "elements %s", api, tensor_offset, tensor_offset + num_elem, numel,
                           shape_text(storage.sizes).c_str()));
  }
  if (num_elem == 0) return;
  const size_t bytes = num_elem * element_size_bytes;
  check_tcm_range(core, tcm_ptr, bytes, api);
  auto* tensor_bytes = static_cast<unsigned char*>(storage.ensure_data()) +
                       tensor_offset * element_size_bytes;
  if (to_tensor) {
    if (!storage.writable) throw ShimError("tcm_to_tensor into an input tensor (read-only)");
    std::memcpy(tensor_bytes, tcm_ptr, bytes);
    core.bytes_from_tcm += bytes;
    if (&storage == core.dst->shim_storage().get()) {
      core.dst_writes.emplace_back(tensor_offset, tensor_offset + num_elem);
    }
  } else {
    std::memcpy(tcm_ptr, tensor_bytes, bytes);
    core.bytes_to_tcm += bytes;
  }
}

void* open_accessor(Storage& storage, c10::ScalarType element_type, size_t dims,
                    bool writable_access, const int64_t** sizes, const int64_t** strides) {
  if (element_type != storage.dtype) {
    throw ShimError(format("accessor<%s, %zu> on a %s tensor", dtype_name(element_type), dims,
                           dtype_name(storage.dtype)));
  }
  if (dims != storage.sizes.size()) {
    throw ShimError(format("accessor<%s, %zu> on a %zu-dimensional tensor %s",
                           dtype_name(element_type), dims, storage.sizes.size(),
                           shape_text(storage.sizes).c_str()));
  }
  void* data = direct_data(storage, "a standard tensor accessor");
  if (writable_access && storage.caller_data != nullptr && storage.owned.empty()) {
    const auto* bytes = static_cast<const unsigned char*>(storage.caller_data);
    storage.owned.assign(bytes, bytes + static_cast<size_t>(storage.numel) * element_size(storage.dtype));
    storage.data = data = storage.owned.data();
  }
  *sizes = storage.sizes.data();
  *strides = storage.strides.data();
  return data;
}

struct Stream {
  Storage* storage;
  bool write;
  size_t element_bytes;
  size_t position = 0;
  bool open = true;
  size_t tcm_charge = 0;
  std::vector<unsigned char> pending;  // written elements not yet flushed
};

Stream* open_stream(Storage& storage, c10::ScalarType element_type, bool write) {
  const char* api = write ? "write_stream_accessor" : "read_stream_accessor";
  if (element_type != storage.dtype) {
    throw ShimError(format("%s<%s> on a %s tensor", api, dtype_name(element_type),
                           dtype_name(storage.dtype)));
  }
  direct_data(storage, api);
  // custom-ops-ref-guide "Coherence": no stream may be active while a write stream is.
  const bool incoherent = write ? storage.active_read_streams + storage.active_write_streams > 0
                                : storage.active_write_streams > 0;
  if (incoherent && storage.policy == torch::CoherencyEnforcer::COHERENT) {
    throw ShimError(format("%s while a %s stream is active on the same tensor: potentially "
                           "incoherent access under the COHERENT policy", api,
                           write && storage.active_write_streams == 0 ? "read" : "write"));
  }
  if (incoherent && storage.policy == torch::CoherencyEnforcer::INCOHERENT_VERBOSE) {
    std::lock_guard<std::mutex> lock(g_stdout_mutex);
    g_stdout += format("warning: %s: potentially incoherent stream access\n", api);
  }
  auto* stream = new Stream{&storage, write, element_size(storage.dtype), 0, true, 0, {}};
  (write ? storage.active_write_streams : storage.active_read_streams) += 1;
  // Each stream caches 4 KB of TCM from the kernel's pool while it is open; beyond the pool,
  // streams still work, only slower (custom-ops-ref-guide "Streaming Accessors").
  CoreContext& core = current_core(api);
  if (core.tcm_in_use + kStreamTcmBytes <= kTcmPoolBytes) {
    stream->tcm_charge = kStreamTcmBytes;
    core.tcm_in_use += kStreamTcmBytes;
    core.tcm_peak = std::max(core.tcm_peak, core.tcm_in_use);
  }
  return stream;
}

const void* stream_read(Stream* stream) {
  if (!stream->open) throw ShimError("read() on a closed read stream");
  if (stream->position >= static_cast<size_t>(stream->storage->numel)) {
    throw ShimError(format("read() past the end of a stream over %lld elements",
                           static_cast<long long>(stream->storage->numel)));
  }
  const auto* data = static_cast<const unsigned char*>(stream->storage->data);
  return data + stream->element_bytes * stream->position++;
}

void stream_write(Stream* stream, const void* value) {
  if (!stream->open) throw ShimError("write() on a closed write stream");
  if (stream->position >= static_cast<size_t>(stream->storage->numel)) {
    throw ShimError(format("write() past the end of a stream over %lld elements",
                           static_cast<long long>(stream->storage->numel)));
  }
  if (!stream->storage->writable) throw ShimError("write stream into an input tensor (read-only)");
  const auto* bytes = static_cast<const unsigned char*>(value);
  stream->pending.insert(stream->pending.end(), bytes, bytes + stream->element_bytes);
  ++stream->position;
}

int close_stream(Stream* stream) noexcept {
  if (stream == nullptr || !stream->open) return 0;
  stream->open = false;
  Storage& storage = *stream->storage;
  if (stream->write) {
    const size_t first = stream->position * stream->element_bytes - stream->pending.size();
    std::memcpy(static_cast<unsigned char*>(storage.data) + first, stream->pending.data(),
                stream->pending.size());
    stream->pending.clear();
  }
  (stream->write ? storage.active_write_streams : storage.active_read_streams) -= 1;
  if (t_core != nullptr) t_core->tcm_in_use -= stream->tcm_charge;
  return 0;
}

void delete_stream(Stream* stream) noexcept {
  close_stream(stream);
  delete stream;
}

}  // namespace asickernels_shim

namespace shim = asickernels_shim;

[[noreturn]] void c10::shim_index_error(int64_t index, int64_t size, const char* what) {
  throw shim::ShimError(shim::format("%s index %lld out of range [0, %lld)", what,
                                     static_cast<long long>(index), static_cast<long long>(size)));
}

c10::ScalarType c10::TensorOptions::dtype() const {
  if (!has_dtype_) {
    throw shim::ShimError("TensorOptions without a dtype: the dtype must be specified "
                          "(custom-ops-ref-guide \"Tensor Factory Functions\")");
  }
  return dtype_;
}

c10::Half::Half(float value) : x(shim::float_to_half(value)) {}
c10::Half::operator float() const { return shim::half_to_float(x); }
c10::BFloat16::BFloat16(float value) : x(shim::float_to_bfloat16(value)) {}
c10::BFloat16::operator float() const { return shim::bfloat16_to_float(x); }

namespace torch {

const std::shared_ptr<shim::Storage>& Tensor::shim_storage() const {
  if (!storage_) throw shim::ShimError("use of an undefined torch::Tensor");
  return storage_;
}

IntArrayRef Tensor::sizes() const { return IntArrayRef(shim_storage()->sizes); }

int64_t Tensor::size(int64_t dim) const {
  const int64_t dims = this->dim();
  const int64_t wrapped = dim < 0 ? dim + dims : dim;
  if (wrapped < 0 || wrapped >= dims) c10::shim_index_error(dim, dims, "Tensor::size dim");
  return shim_storage()->sizes[static_cast<size_t>(wrapped)];
}

int64_t Tensor::dim() const { return static_cast<int64_t>(shim_storage()->sizes.size()); }

int64_t Tensor::numel() const { return shim_storage()->numel; }

ScalarType Tensor::scalar_type() const { return shim_storage()->dtype; }

CoherencyEnforcer::Policy Tensor::get_accessor_coherence_policy() const {
  return shim_storage()->policy;
}

void Tensor::set_accessor_coherence_policy(CoherencyEnforcer::Policy policy) const {
  shim_storage()->policy = policy;
}

TensorTcmAccessor<true> Tensor::tcm_accessor() const& {
  return TensorTcmAccessor<true>(shim_storage());
}

TensorTcmAccessor<false> Tensor::tcm_accessor() & {
  return TensorTcmAccessor<false>(shim_storage());
}

Tensor& Tensor::fill_(const Scalar& value) const {
  shim::Storage& storage = *shim_storage();
  if (!storage.writable) throw shim::ShimError("fill_ on an input tensor (read-only)");
  void* data = shim::direct_data(storage, "Tensor::fill_");
  for (size_t i = 0; i < static_cast<size_t>(storage.numel); ++i) {
    shim::store_scalar(storage.dtype, data, i, value);
  }
  return const_cast<Tensor&>(*this);
}

namespace {

Tensor factory(IntArrayRef size, TensorOptions options, shim::Init init, Scalar value = 0) {
  auto storage = shim::make_storage(options.dtype(), size.vec());
  storage->owns_memory = true;
  storage->init = init;
  storage->init_value = value;
  return Tensor(std::move(storage));
}

// One operand of an element-wise op: a tensor or a scalar.
struct Operand {
  const Tensor* tensor;
  Scalar scalar;
  Operand(const Tensor& t) : tensor(&t) {}  // NOLINT
  Operand(const Scalar& s) : tensor(nullptr), scalar(s) {}  // NOLINT
};

using FloatOp = double (*)(const double*, double);
using IntegralOp = int64_t (*)(const int64_t*, int64_t);

// result[i] = op(operands[..][i], parameter), computed in int64 when the result and every
// tensor operand are integral and an integral form exists, else in double.
Tensor& elementwise(const char* name, Tensor& result, std::initializer_list<Operand> operands,
                    FloatOp float_op, IntegralOp integral_op, bool integral_only,
                    const Scalar& parameter = 0) {
  shim::Storage& out = *result.shim_storage();
  if (!out.writable) throw shim::ShimError(shim::format("torch::%s into an input tensor", name));
  bool all_integral = shim::is_integral(out.dtype);
  for (const Operand& operand : operands) {
    if (operand.tensor == nullptr) continue;
    const shim::Storage& in = *operand.tensor->shim_storage();
    if (in.sizes != out.sizes) {
      throw shim::ShimError(shim::format(
          "torch::%s: shapes %s and %s differ; the device's tensor library does not broadcast",
          name, shim::shape_text(in.sizes).c_str(), shim::shape_text(out.sizes).c_str()));
    }
    all_integral = all_integral && shim::is_integral(in.dtype);
  }
  if (integral_only && !all_integral) {
    throw shim::ShimError(shim::format("torch::%s needs tensors of integral types", name));
  }
  std::vector<const void*> data;
  for (const Operand& operand : operands) {
    data.push_back(operand.tensor == nullptr
                       ? nullptr
                       : shim::direct_data(*operand.tensor->shim_storage(), name));
  }
  void* out_data = shim::direct_data(out, name);
  const bool integral = all_integral && integral_op != nullptr;
  double values[3];
  int64_t integers[3];
  for (size_t i = 0; i < static_cast<size_t>(out.numel); ++i) {
    size_t k = 0;
    for (const Operand& operand : operands) {
      if (operand.tensor == nullptr) {
        values[k] = operand.scalar.toDouble();
        integers[k] = operand.scalar.toLong();
      } else {
        const c10::ScalarType dtype = operand.tensor->shim_storage()->dtype;
        values[k] = shim::load<double>(dtype, data[k], i);
        integers[k] = shim::load<int64_t>(dtype, data[k], i);
      }
      ++k;
    }
    if (integral) {
      const int64_t value = integral_op(integers, parameter.toLong());
      shim::store(out.dtype, out_data, i, static_cast<double>(value), value);
    } else {
      const double value = float_op(values, parameter.toDouble());
      shim::store(out.dtype, out_data, i, value, static_cast<int64_t>(value));
    }
  }
  return result;
}

// The dtype op() gives its result: that of its first tensor operand, except that
// transcendental ops and division of integers give kFloat, as in ATen.
Tensor result_like(const Tensor& like, bool floating) {
  const ScalarType dtype = like.scalar_type();
  return empty(like.sizes(), floating && shim::is_integral(dtype) ? kFloat : dtype);
}

}  // namespace

Tensor empty(IntArrayRef size, TensorOptions options) {
  return factory(size, options, shim::Init::Sentinel);
}
Tensor zeros(IntArrayRef size, TensorOptions options) {
  return factory(size, options, shim::Init::Value, 0);
}
Tensor ones(IntArrayRef size, TensorOptions options) {
  return factory(size, options, shim::Init::Value, 1);
}
Tensor full(IntArrayRef size, const Scalar& fill_value, TensorOptions options) {
  return factory(size, options, shim::Init::Value, fill_value);
}
Tensor eye(int64_t n, int64_t m, TensorOptions options) {
  return factory({n, m}, options, shim::Init::Identity);
}

#define ASICKERNELS_SHIM_UNARY(name, floating, float_expr, integral_expr)                  \
  Tensor& name##_out(Tensor& result, const Tensor& self) {                                 \
    return elementwise(#name, result, {self},                                              \
                       [](const double* v, double) -> double { return float_expr; },       \
                       integral_expr, false);                                              \
  }                                                                                        \
  Tensor name(const Tensor& self) {                                                        \
    Tensor result = result_like(self, floating);                                           \
    return name##_out(result, self);                                                       \
  }
#define ASICKERNELS_SHIM_SAME [](const int64_t* v, int64_t) -> int64_t { return v[0]; }
ASICKERNELS_SHIM_UNARY(abs, false, std::fabs(v[0]),
                       [](const int64_t* v, int64_t) -> int64_t { return v[0] < 0 ? -v[0] : v[0]; })
ASICKERNELS_SHIM_UNARY(ceil, false, std::ceil(v[0]), ASICKERNELS_SHIM_SAME)
ASICKERNELS_SHIM_UNARY(floor, false, std::floor(v[0]), ASICKERNELS_SHIM_SAME)
ASICKERNELS_SHIM_UNARY(sin, true, std::sin(v[0]), nullptr)
ASICKERNELS_SHIM_UNARY(cos, true, std::cos(v[0]), nullptr)
ASICKERNELS_SHIM_UNARY(tan, true, std::tan(v[0]), nullptr)
ASICKERNELS_SHIM_UNARY(log, true, std::log(v[0]), nullptr)
ASICKERNELS_SHIM_UNARY(log2, true, std::log2(v[0]), nullptr)
ASICKERNELS_SHIM_UNARY(log10, true, std::log10(v[0]), nullptr)
ASICKERNELS_SHIM_UNARY(exp, true, std::exp(v[0]), nullptr)
#undef ASICKERNELS_SHIM_SAME
#undef ASICKERNELS_SHIM_UNARY

Tensor& bitwise_not_out(Tensor& result, const Tensor& self) {
  return elementwise("bitwise_not", result, {self}, nullptr,
                     [](const int64_t* v, int64_t) -> int64_t { return ~v[0]; }, true);
}
Tensor bitwise_not(const Tensor& self) {
  Tensor result = result_like(self, false);
  return bitwise_not_out(result, self);
}
Tensor bitwise_not(Tensor& result, const Tensor& self) { return bitwise_not_out(result, self); }

#define ASICKERNELS_SHIM_BINARY_FORMS(name, floating, float_expr, integral_expr, integral_only) \
  Tensor& name##_out(Tensor& result, const Tensor& self, const Tensor& other) {               \
    return elementwise(#name, result, {self, other},                                          \
                       [](const double* v, double) -> double { return float_expr; },          \
                       integral_expr, integral_only);                                         \
  }                                                                                           \
  Tensor& name##_out(Tensor& result, const Tensor& self, const Scalar& other) {               \
    return elementwise(#name, result, {self, other},                                          \
                       [](const double* v, double) -> double { return float_expr; },          \
                       integral_expr, integral_only);                                         \
  }                                                                                           \
  Tensor name(const Tensor& self, const Tensor& other) {                                      \
    Tensor result = result_like(self, floating);                                              \
    return name##_out(result, self, other);                                                   \
  }                                                                                           \
  Tensor name(const Tensor& self, const Scalar& other) {                                      \
    Tensor result = result_like(self, floating);                                              \
    return name##_out(result, self, other);                                                   \
  }
ASICKERNELS_SHIM_BINARY_FORMS(mul, false, v[0] * v[1],
                              [](const int64_t* v, int64_t) -> int64_t { return v[0] * v[1]; }, false)
ASICKERNELS_SHIM_BINARY_FORMS(div, true, v[0] / v[1], nullptr, false)
ASICKERNELS_SHIM_BINARY_FORMS(pow, false, std::pow(v[0], v[1]), nullptr, false)
ASICKERNELS_SHIM_BINARY_FORMS(bitwise_and, false, (static_cast<void>(v), 0.0),
                              [](const int64_t* v, int64_t) -> int64_t { return v[0] & v[1]; }, true)
ASICKERNELS_SHIM_BINARY_FORMS(bitwise_or, false, (static_cast<void>(v), 0.0),
                              [](const int64_t* v, int64_t) -> int64_t { return v[0] | v[1]; }, true)
#undef ASICKERNELS_SHIM_BINARY_FORMS

namespace {

// self + alpha * other (sub passes -alpha).
template <typename Other>
Tensor& add_scaled(const char* name, Tensor& result, const Tensor& self, const Other& other,
                   const Scalar& alpha) {
  return elementwise(name, result, {self, other},
                     [](const double* v, double a) { return v[0] + a * v[1]; },
                     [](const int64_t* v, int64_t a) { return v[0] + a * v[1]; }, false, alpha);
}

Scalar negated(const Scalar& value) {
  return value.isFloatingPoint() ? Scalar(-value.toDouble()) : Scalar(-value.toLong());
}

template <typename Other>
Tensor allocating(Tensor& (*out_form)(Tensor&, const Tensor&, const Other&, const Scalar&),
                  const Tensor& self, const Other& other, const Scalar& alpha) {
  Tensor result = result_like(self, false);
  return out_form(result, self, other, alpha);
}

}  // namespace

Tensor& add_out(Tensor& result, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  return add_scaled("add", result, self, other, alpha);
}
Tensor& add_out(Tensor& result, const Tensor& self, const Scalar& other, const Scalar& alpha) {
  return add_scaled("add", result, self, other, alpha);
}
Tensor& sub_out(Tensor& result, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  return add_scaled("sub", result, self, other, negated(alpha));
}
Tensor& sub_out(Tensor& result, const Tensor& self, const Scalar& other, const Scalar& alpha) {
  return add_scaled("sub", result, self, other, negated(alpha));
}
Tensor add(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  return allocating<Tensor>(&add_out, self, other, alpha);
}
Tensor add(const Tensor& self, const Scalar& other, const Scalar& alpha) {
  return allocating<Scalar>(&add_out, self, other, alpha);
}
Tensor sub(const Tensor& self, const Tensor& other, const Scalar& alpha) {
  return allocating<Tensor>(&sub_out, self, other, alpha);
}
Tensor sub(const Tensor& self, const Scalar& other, const Scalar& alpha) {
  return allocating<Scalar>(&sub_out, self, other, alpha);
}

Tensor& pow_out(Tensor& result, const Scalar& self, const Tensor& exponent) {
  return elementwise("pow", result, {self, exponent},
                     [](const double* v, double) { return std::pow(v[0], v[1]); }, nullptr, false);
}
Tensor pow(const Scalar& self, const Tensor& exponent) {
  Tensor result = result_like(exponent, false);
  return pow_out(result, self, exponent);
}
Tensor& bitwise_and_out(Tensor& result, const Scalar& self, const Tensor& other) {
  return bitwise_and_out(result, other, self);
}
Tensor bitwise_and(const Scalar& self, const Tensor& other) { return bitwise_and(other, self); }
Tensor& bitwise_or_out(Tensor& result, const Scalar& self, const Tensor& other) {
  return bitwise_or_out(result, other, self);
}
Tensor bitwise_or(const Scalar& self, const Tensor& other) { return bitwise_or(other, self); }

Tensor& clamp_out(Tensor& result, const Tensor& self, const Scalar& minval, const Scalar& maxval) {
  return elementwise("clamp", result, {self, minval, maxval},
                     [](const double* v, double) { return std::min(std::max(v[0], v[1]), v[2]); },
                     [](const int64_t* v, int64_t) { return std::min(std::max(v[0], v[1]), v[2]); },
                     false);
}
Tensor clamp(const Tensor& self, const Scalar& minval, const Scalar& maxval) {
  Tensor result = result_like(self, false);
  return clamp_out(result, self, minval, maxval);
}

void* neuron::tcm_malloc(size_t nbytes) {
  shim::CoreContext& core = shim::current_core("tcm_malloc");
  const size_t charge = shim::pool_charge(nbytes);
  // custom-ops-ref-guide "TCM Management Functions": "Upon failure, returns null."
  if (nbytes > shim::kTcmPoolBytes || core.tcm_in_use + charge > shim::kTcmPoolBytes) {
    core.failed_tcm_mallocs.push_back(nbytes);
    return nullptr;
  }
  // A separate heap block per buffer, so AddressSanitizer sees overruns in kernel code too.
  void* block = std::malloc(std::max<size_t>(nbytes, 1));
  if (block == nullptr) throw std::bad_alloc();
  core.tcm_blocks.emplace(reinterpret_cast<uintptr_t>(block), nbytes);
  core.tcm_in_use += charge;
  core.tcm_peak = std::max(core.tcm_peak, core.tcm_in_use);
  return block;
}

void neuron::tcm_free(void* ptr) {
  if (ptr == nullptr) return;
  shim::CoreContext& core = shim::current_core("tcm_free");
  const auto found = core.tcm_blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (found == core.tcm_blocks.end()) {
    throw shim::ShimError(shim::format(
        "tcm_free(%p): not a buffer tcm_malloc returned on this core, or freed twice", ptr));
  }
  core.tcm_in_use -= shim::pool_charge(found->second);
  core.tcm_blocks.erase(found);
  std::free(ptr);
}

}  // namespace torch

uint32_t get_cpu_id() { return shim::current_core("get_cpu_id").id; }

uint32_t get_cpu_count() { return shim::current_core("get_cpu_count").count; }

torch::Tensor get_dst_tensor() {
  shim::CoreContext& core = shim::current_core("get_dst_tensor");
  // Elements a single-core kernel leaves unwritten read as the sentinel (NaN for floats);
  // in multicore mode every element's writer is tracked instead.
  if (!core.multicore && !core.used_dst) {
    const shim::Storage& out = *core.dst->shim_storage();
    shim::fill_sentinel(out.dtype, out.data, static_cast<size_t>(out.numel));
  }
  core.used_dst = true;
  return *core.dst;
}

// Kernels' printf, bound to this definition when the library is linked (-Bsymbolic): on a
// core that may print, the text is kept for the runtime to print after the run; elsewhere
// it is a finding. Outside a kernel (a shape function on the host) it prints as usual.
extern "C" int vprintf(const char* fmt, va_list args) {
  shim::CoreContext* core = shim::t_core;
  if (core == nullptr) return std::vfprintf(stdout, fmt, args);
  if (core->multicore && core->id != 0) {
    ++core->denied_printfs;
    return 0;
  }
  va_list copy;
  va_copy(copy, args);
  const int length = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (length <= 0) return length;
  std::string text(static_cast<size_t>(length), '\0');
  std::vsnprintf(&text[0], text.size() + 1, fmt, args);
  std::lock_guard<std::mutex> lock(shim::g_stdout_mutex);
  shim::g_stdout += text;
  return length;
}

extern "C" int printf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  const int length = vprintf(fmt, args);
  va_end(args);
  return length;
}

// ---- entry points for Python (ctypes) ---------------------------------------------------

// Every problem of the loaded library, one per line; empty when it is valid.
extern "C" size_t asickernels_shim_library_problems(char* buffer, size_t size) {
  std::lock_guard<std::mutex> lock(shim::registry_mutex());
  return shim::copy_text(shim::join_lines(shim::library_problems()), buffer, size);
}

// One line per op: "<library>\t<op>\t<parameter kinds>", kinds T (tensor), D (double),
// S (torch::Scalar).
extern "C" size_t asickernels_shim_describe(char* buffer, size_t size) {
  std::lock_guard<std::mutex> lock(shim::registry_mutex());
  std::vector<std::string> lines;
  for (const auto& item : shim::op_registry()) {
    lines.push_back(item.second.library + "\t" + item.first + "\t" +
                    shim::kinds_text(item.second.parameters));
  }
  return shim::copy_text(shim::join_lines(lines), buffer, size);
}

// The output the op's shape function declares for these arguments.
extern "C" int asickernels_shim_output_spec(const char* op, const shim::ArgumentSpec* args,
                                            size_t count, int32_t* dtype, int32_t* ndim,
                                            int64_t* sizes, char* error, size_t error_size) {
  return shim::guarded(error, error_size, [&] {
    const torch::Tensor output = shim::declared_output(shim::resolve(op), args, count);
    const shim::Storage& storage = *output.shim_storage();
    *dtype = static_cast<int32_t>(storage.dtype);
    *ndim = static_cast<int32_t>(storage.sizes.size());
    std::copy(storage.sizes.begin(), storage.sizes.end(), sizes);
  });
}

// Runs the op on 1 core (single-core mode) or 8 (multicore), writing its output to `out`
// (laid out as asickernels_shim_output_spec says); every finding goes to `error`.
extern "C" int asickernels_shim_run(const char* op, int multicore, const shim::ArgumentSpec* args,
                                    size_t count, void* out, char* error, size_t error_size) {
  return shim::guarded(error, error_size,
                       [&] { shim::run_op(op, multicore != 0, args, count, out); });
}

// What the last run printed (printf on core 0 and coherence warnings).
extern "C" size_t asickernels_shim_last_stdout(char* buffer, size_t size) {
  std::lock_guard<std::mutex> lock(shim::g_stdout_mutex);
  return shim::copy_text(shim::g_stdout, buffer, size);
}

// Counters of the most recent successful run: cores that wrote output, peak TCM bytes on
// one core, bytes copied tensor -> TCM and TCM -> tensor, failed tcm_malloc calls, peak
// stack bytes on one core.
extern "C" void asickernels_shim_last_run_stats(uint64_t* out) {
  std::lock_guard<std::mutex> lock(shim::g_stats_mutex);
  out[0] = shim::g_last_stats.active_cores;
  out[1] = shim::g_last_stats.tcm_peak_bytes;
  out[2] = shim::g_last_stats.bytes_to_tcm;
  out[3] = shim::g_last_stats.bytes_from_tcm;
  out[4] = shim::g_last_stats.failed_tcm_mallocs;
  out[5] = shim::g_last_stats.stack_peak_bytes;
}

extern "C" int asickernels_shim_sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#else
  return 0;
#endif
}
