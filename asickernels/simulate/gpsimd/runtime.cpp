// The shim's runtime: tensors over host buffers, the per-core TCM pool, the checked TCM
// copies, the op registry filled by NEURON_LIBRARY, and the multicore runner.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "asickernels_shim/runner.hpp"

namespace asickernels_shim {

struct Storage {
  void* data = nullptr;
  std::vector<int64_t> sizes;
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool writable = false;
  // Factory tensors own zeroed memory, allocated on first data access: a shape function
  // only reads their shape, as on the host at trace time.
  bool owns_memory = false;
  std::vector<unsigned char> owned;
  std::once_flag materialized;

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
  return "unknown dtype";
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

std::string shape_text(const std::vector<int64_t>& sizes) {
  std::string text = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(sizes[i]);
  }
  return text + "]";
}

// The device's limits: up to 8 dimensions of at most 65535, or up to 4 of at most 2^32-1.
int64_t checked_numel(const std::vector<int64_t>& sizes) {
  bool narrow = sizes.size() <= 8;
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

std::shared_ptr<Storage> make_storage(c10::ScalarType dtype, std::vector<int64_t> sizes,
                                      bool writable) {
  auto storage = std::make_shared<Storage>();
  storage->numel = checked_numel(sizes);
  storage->sizes = std::move(sizes);
  storage->dtype = dtype;
  storage->writable = writable;
  return storage;
}

struct CoreContext {
  uint32_t id = 0;
  const torch::Tensor* dst = nullptr;
  bool used_dst = false;
  std::map<uintptr_t, size_t> tcm_blocks;  // start -> requested bytes
  size_t tcm_in_use = 0;                   // pool bytes charged (16-byte granules)
  size_t tcm_peak = 0;
  std::vector<std::pair<size_t, size_t>> dst_writes;  // [begin, end) flattened elements
  uint64_t bytes_to_tcm = 0;
  uint64_t bytes_from_tcm = 0;
  std::string error;
};

thread_local CoreContext* t_core = nullptr;

CoreContext& current_core(const char* api) {
  if (t_core == nullptr) {
    throw ShimError(format("%s() called outside a kernel run by the shim's multicore runner", api));
  }
  return *t_core;
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
};

std::mutex g_stats_mutex;
RunStats g_last_stats;

void run_core(CoreContext& core, const std::function<void()>& kernel) {
  t_core = &core;
  try {
    kernel();
  } catch (const std::exception& e) {
    core.error = e.what();
  } catch (...) {
    core.error = "unknown C++ exception";
  }
  if (core.error.empty() && !core.used_dst) {
    core.error = "never called get_dst_tensor(), which multicore mode requires (the kernel's "
                 "return value is ignored)";
  }
  if (core.error.empty() && !core.tcm_blocks.empty()) {
    core.error = format("returned with %zu TCM buffer(s) (%zu pool bytes) never passed to "
                        "tcm_free", core.tcm_blocks.size(), core.tcm_in_use);
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

  void run(std::vector<CoreContext>& cores, const std::function<void()>& kernel) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    start_missing_threads();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cores_ = &cores;
      kernel_ = &kernel;
      remaining_ = kCoreCount;
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

  // Runs core `id` of every run after generation `seen`.
  void serve(uint32_t id, uint64_t seen) {
    for (;;) {
      std::vector<CoreContext>* cores;
      const std::function<void()>* kernel;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        start_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
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
  std::vector<CoreContext>* cores_ = nullptr;
  const std::function<void()>* kernel_ = nullptr;
};

// Every output element must be written by exactly one core: no synchronization exists
// between cores, and what no core writes is garbage on the device.
void check_disjoint_cover(const std::vector<CoreContext>& cores, int64_t numel) {
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
  size_t covered = 0;
  size_t unwritten = 0;
  size_t first_gap_begin = 0, first_gap_end = 0;
  Span furthest{0, 0, 0};
  for (const Span& span : spans) {
    if (span.begin < furthest.end && span.core != furthest.core) {
      throw ShimError(format(
          "cores %u and %u both wrote output elements [%zu, %zu) (flattened offsets): in "
          "multicore mode each core must write a disjoint slice of get_dst_tensor()",
          furthest.core, span.core, span.begin, std::min(span.end, furthest.end)));
    }
    if (span.begin > covered) {
      if (unwritten == 0) first_gap_begin = covered, first_gap_end = span.begin;
      unwritten += span.begin - covered;
    }
    covered = std::max(covered, span.end);
    if (span.end > furthest.end) furthest = span;
  }
  const auto total = static_cast<size_t>(numel);
  if (covered < total) {
    if (unwritten == 0) first_gap_begin = covered, first_gap_end = total;
    unwritten += total - covered;
  }
  if (unwritten > 0) {
    throw ShimError(format("%zu of %zu output elements were written by no core (first: [%zu, "
                           "%zu)); the device would leave garbage there",
                           unwritten, total, first_gap_begin, first_gap_end));
  }
}

struct ShapeEntry {
  std::string library;
  std::string kernel_name;
  std::type_index signature;
  ErasedFunction function;
  int definitions;
};

std::mutex& registry_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, ShapeEntry>& shape_registry() {
  static std::map<std::string, ShapeEntry> registry;
  return registry;
}

}  // namespace

void* Storage::ensure_data() {
  if (owns_memory) {
    std::call_once(materialized, [this] {
      owned.assign(static_cast<size_t>(numel) * element_size(dtype), 0);
      data = owned.data();
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

torch::Tensor wrap(void* data, c10::ScalarType dtype, std::vector<int64_t> sizes,
                   bool writable) {
  auto storage = make_storage(dtype, std::move(sizes), writable);
  if (data == nullptr && storage->numel > 0) throw ShimError("null data for a non-empty tensor");
  storage->data = data;
  return torch::Tensor(std::move(storage));
}

void register_shape_function(const char* library, const char* op, const char* kernel_name,
                             std::type_index signature, ErasedFunction shape_fn) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& registry = shape_registry();
  auto found = registry.find(op);
  if (found != registry.end()) {
    ++found->second.definitions;
    return;
  }
  registry.emplace(op, ShapeEntry{library, kernel_name, signature, shape_fn, 1});
}

ErasedFunction find_shape_function(const char* op, const char* kernel_name,
                                   std::type_index signature) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto& registry = shape_registry();
  const auto found = registry.find(op);
  if (found == registry.end()) {
    throw ShimError(format("op \"%s\" has no m.def(...) in a NEURON_LIBRARY shape source", op));
  }
  const ShapeEntry& entry = found->second;
  if (entry.definitions > 1) {
    throw ShimError(format("op \"%s\" is defined %d times", op, entry.definitions));
  }
  if (entry.kernel_name != kernel_name) {
    throw ShimError(format("op \"%s\" is registered with kernel \"%s\", not \"%s\"", op,
                           entry.kernel_name.c_str(), kernel_name));
  }
  if (entry.signature != signature) {
    throw ShimError(format("the shape function of op \"%s\" does not have the signature of "
                           "kernel \"%s\"", op, kernel_name));
  }
  return entry.function;
}

void check_output_shape(const char* op, const torch::Tensor& expected,
                        const torch::Tensor& dst) {
  const Storage& want = *expected.shim_storage();
  const Storage& got = *dst.shim_storage();
  if (want.sizes != got.sizes || want.dtype != got.dtype) {
    throw ShimError(format("op \"%s\": the shape function gives %s %s, the output buffer is %s %s",
                           op, shape_text(want.sizes).c_str(), dtype_name(want.dtype),
                           shape_text(got.sizes).c_str(), dtype_name(got.dtype)));
  }
}

void run_multicore(const torch::Tensor& dst, const std::function<void()>& kernel) {
  const Storage& output = *dst.shim_storage();
  std::vector<CoreContext> cores(kCoreCount);
  for (uint32_t id = 0; id < kCoreCount; ++id) {
    cores[id].id = id;
    cores[id].dst = &dst;
  }
  CorePool::get().run(cores, kernel);

  std::string errors;
  for (const CoreContext& core : cores) {
    if (!core.error.empty()) errors += format("core %u: %s\n", core.id, core.error.c_str());
  }
  if (!errors.empty()) throw ShimError(errors.substr(0, errors.size() - 1));
  check_disjoint_cover(cores, output.numel);

  RunStats stats;
  for (const CoreContext& core : cores) {
    stats.active_cores += core.dst_writes.empty() ? 0 : 1;
    stats.tcm_peak_bytes = std::max<uint64_t>(stats.tcm_peak_bytes, core.tcm_peak);
    stats.bytes_to_tcm += core.bytes_to_tcm;
    stats.bytes_from_tcm += core.bytes_from_tcm;
  }
  std::lock_guard<std::mutex> lock(g_stats_mutex);
  g_last_stats = stats;
}

void write_error(char* error, size_t error_size, const char* message) noexcept {
  if (error != nullptr && error_size > 0) std::snprintf(error, error_size, "%s", message);
}

}  // namespace asickernels_shim

namespace shim = asickernels_shim;

[[noreturn]] void c10::shim_index_error(size_t index, size_t size) {
  throw shim::ShimError(shim::format("index %zu out of range for an ArrayRef of size %zu", index,
                                     size));
}

namespace torch {

const std::shared_ptr<shim::Storage>& Tensor::shim_storage() const {
  if (!storage_) throw shim::ShimError("use of an undefined torch::Tensor");
  return storage_;
}

IntArrayRef Tensor::sizes() const { return IntArrayRef(shim_storage()->sizes); }

int64_t Tensor::numel() const { return shim_storage()->numel; }

ScalarType Tensor::scalar_type() const { return shim_storage()->dtype; }

TensorTcmAccessor<true> Tensor::tcm_accessor() const& {
  return TensorTcmAccessor<true>(shim_storage());
}

TensorTcmAccessor<false> Tensor::tcm_accessor() & {
  return TensorTcmAccessor<false>(shim_storage());
}

Tensor empty(IntArrayRef size, TensorOptions options) {
  auto storage = shim::make_storage(options.dtype(), size.vec(), true);
  storage->owns_memory = true;
  return Tensor(std::move(storage));
}

Tensor zeros(IntArrayRef size, TensorOptions options) { return empty(size, options); }

void* neuron::tcm_malloc(size_t nbytes) {
  shim::CoreContext& core = shim::current_core("tcm_malloc");
  const size_t charge = shim::pool_charge(nbytes);
  if (nbytes > shim::kTcmPoolBytes || core.tcm_in_use + charge > shim::kTcmPoolBytes) {
    throw shim::ShimError(shim::format(
        "tcm_malloc(%zu) does not fit the %zu-byte TCM pool (%zu bytes already in use); the "
        "device would return nullptr", nbytes, shim::kTcmPoolBytes, core.tcm_in_use));
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

uint32_t get_cpu_count() { return shim::kCoreCount; }

torch::Tensor get_dst_tensor() {
  shim::CoreContext& core = shim::current_core("get_dst_tensor");
  core.used_dst = true;
  return *core.dst;
}

extern "C" void asickernels_shim_last_run_stats(uint64_t* out) {
  std::lock_guard<std::mutex> lock(shim::g_stats_mutex);
  out[0] = shim::g_last_stats.active_cores;
  out[1] = shim::g_last_stats.tcm_peak_bytes;
  out[2] = shim::g_last_stats.bytes_to_tcm;
  out[3] = shim::g_last_stats.bytes_from_tcm;
}

extern "C" int asickernels_shim_sanitized() {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#else
  return 0;
#endif
}
