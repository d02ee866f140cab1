// Linear sum assignment per image (asickernels/kernels/linear_sum_assignment.py's kernel
// convention, masks and sentinel included): SciPy's algorithm, line for line (scipy/optimize/rectangular_lsap/
// rectangular_lsap.cpp, Crouse's shortest augmenting path), in double whatever the input
// dtype, on each image's valid rows and columns. The same arithmetic and the same tie
// rules as SciPy's, so the same assignment, ties included.
//
// One image per task of the thread pool. No per-level build: the loops are scalar and
// branchy, so everything is under ASICKERNELS_CPU_ENTRY_POINTS.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "csrc/kernels.h"

#ifdef ASICKERNELS_CPU_ENTRY_POINTS
namespace asickernels_cpu {
namespace {

// SciPy's augmenting_path: the shortest path from row i to a free column over reduced
// costs; the sink column, or -1 when none is reachable (infeasible).
int64_t augmenting_path(int64_t nc, const std::vector<double>& cost, std::vector<double>& u,
                        std::vector<double>& v, std::vector<int64_t>& path,
                        const std::vector<int64_t>& row4col,
                        std::vector<double>& shortest_path_costs, int64_t i,
                        std::vector<char>& sr, std::vector<char>& sc,
                        std::vector<int64_t>& remaining, double* p_min_val) {
  double min_val = 0;
  // Columns still to settle, crossed off by swapping with the last (in reverse order, so
  // that ties go as in SciPy).
  int64_t num_remaining = nc;
  for (int64_t it = 0; it < nc; it++) remaining[it] = nc - it - 1;
  std::fill(sr.begin(), sr.end(), 0);
  std::fill(sc.begin(), sc.end(), 0);
  std::fill(shortest_path_costs.begin(), shortest_path_costs.end(),
            std::numeric_limits<double>::infinity());
  int64_t sink = -1;
  while (sink == -1) {
    int64_t index = -1;
    double lowest = std::numeric_limits<double>::infinity();
    sr[i] = 1;
    for (int64_t it = 0; it < num_remaining; it++) {
      const int64_t j = remaining[it];
      const double r = min_val + cost[i * nc + j] - u[i] - v[j];
      if (r < shortest_path_costs[j]) {
        path[j] = i;
        shortest_path_costs[j] = r;
      }
      // Ties: prefer a free column (it ends the search).
      if (shortest_path_costs[j] < lowest ||
          (shortest_path_costs[j] == lowest && row4col[j] == -1)) {
        lowest = shortest_path_costs[j];
        index = it;
      }
    }
    min_val = lowest;
    if (min_val == std::numeric_limits<double>::infinity()) return -1;
    const int64_t j = remaining[index];
    if (row4col[j] == -1) {
      sink = j;
    } else {
      i = row4col[j];
    }
    sc[j] = 1;
    remaining[index] = remaining[--num_remaining];
  }
  *p_min_val = min_val;
  return sink;
}

// SciPy's solve on a dense nr x nc matrix with nr <= nc; false when infeasible.
bool solve(int64_t nr, int64_t nc, const std::vector<double>& cost,
           std::vector<int64_t>& col4row, std::vector<int64_t>& row4col) {
  std::vector<double> u(nr, 0), v(nc, 0), shortest_path_costs(nc);
  std::vector<int64_t> path(nc, -1), remaining(nc);
  std::vector<char> sr(nr), sc(nc);
  col4row.assign(nr, -1);
  row4col.assign(nc, -1);
  for (int64_t cur_row = 0; cur_row < nr; cur_row++) {
    double min_val;
    const int64_t sink = augmenting_path(nc, cost, u, v, path, row4col, shortest_path_costs,
                                         cur_row, sr, sc, remaining, &min_val);
    if (sink < 0) return false;
    u[cur_row] += min_val;
    for (int64_t i = 0; i < nr; i++) {
      if (sr[i] && i != cur_row) u[i] += min_val - shortest_path_costs[col4row[i]];
    }
    for (int64_t j = 0; j < nc; j++) {
      if (sc[j]) v[j] -= min_val - shortest_path_costs[j];
    }
    int64_t j = sink;
    while (true) {
      const int64_t i = path[j];
      row4col[j] = i;
      std::swap(col4row[i], j);
      if (i == cur_row) break;
    }
  }
  return true;
}

// cost [B, N, M], row_mask [B, N], col_mask [B, M] -> assignment [B, N] (the column of each
// row, -1 where unmatched), num_assigned [B]; both -1 for an image SciPy refuses (NaN or
// -inf among its valid entries, or infeasible). An image with more valid rows than columns
// is solved transposed, as SciPy solves it.
template <typename T>
void linear_sum_assignment(const T* cost, const bool* row_mask, const bool* col_mask,
                           int64_t batch, int64_t n, int64_t m, int32_t* assignment,
                           int32_t* num_assigned) {
  parallel_for(batch, [&](int64_t b) {
    const T* image = cost + b * n * m;
    int32_t* out = assignment + b * n;
    std::fill(out, out + n, -1);
    num_assigned[b] = 0;
    std::vector<int64_t> rows, cols;
    for (int64_t i = 0; i < n; i++) {
      if (row_mask[b * n + i]) rows.push_back(i);
    }
    for (int64_t j = 0; j < m; j++) {
      if (col_mask[b * m + j]) cols.push_back(j);
    }
    if (rows.empty() || cols.empty()) return;
    const bool transpose = cols.size() < rows.size();
    const std::vector<int64_t>& short_side = transpose ? cols : rows;
    const std::vector<int64_t>& long_side = transpose ? rows : cols;
    const int64_t nr = static_cast<int64_t>(short_side.size());
    const int64_t nc = static_cast<int64_t>(long_side.size());
    std::vector<double> dense(nr * nc);
    for (int64_t i = 0; i < nr; i++) {
      for (int64_t j = 0; j < nc; j++) {
        const int64_t r = transpose ? long_side[j] : short_side[i];
        const int64_t c = transpose ? short_side[i] : long_side[j];
        const double value = image[r * m + c];
        if (std::isnan(value) || value == -std::numeric_limits<double>::infinity()) {
          num_assigned[b] = -1;  // SciPy: "matrix contains invalid numeric entries"
          return;
        }
        dense[i * nc + j] = value;
      }
    }
    std::vector<int64_t> col4row, row4col;
    if (!solve(nr, nc, dense, col4row, row4col)) {
      num_assigned[b] = -1;  // SciPy: "cost matrix is infeasible"
      return;
    }
    for (int64_t i = 0; i < nr; i++) {
      const int64_t r = transpose ? long_side[col4row[i]] : short_side[i];
      const int64_t c = transpose ? short_side[i] : long_side[col4row[i]];
      out[r] = static_cast<int32_t>(c);
    }
    num_assigned[b] = static_cast<int32_t>(nr);
  });
}

}  // namespace
}  // namespace asickernels_cpu

namespace asickernels_cpu::entry {
namespace {

// cost [..., N, M], row_mask [..., N] and col_mask [..., M] bool -> assignment [..., N],
// num_assigned [...] int32 (leading dimensions are images).
template <ffi::DataType kType>
ffi::Error LinearSumAssignment(ffi::Buffer<kType> cost, ffi::Buffer<ffi::PRED> row_mask,
                               ffi::Buffer<ffi::PRED> col_mask,
                               ffi::ResultBuffer<ffi::S32> assignment,
                               ffi::ResultBuffer<ffi::S32> num_assigned) {
  const auto dims = cost.dimensions();
  if (dims.size() < 2) {
    return ffi::Error::InvalidArgument("linear_sum_assignment: cost [..., N, M] expected");
  }
  const int64_t n = dims[dims.size() - 2], m = dims.back();
  int64_t batch = 1;
  for (size_t i = 0; i + 2 < dims.size(); ++i) batch *= dims[i];
  const auto count = [](int64_t value) { return static_cast<size_t>(value); };
  if (row_mask.element_count() != count(batch * n) ||
      col_mask.element_count() != count(batch * m) ||
      assignment->element_count() != count(batch * n) ||
      num_assigned->element_count() != count(batch)) {
    return ffi::Error::InvalidArgument(
        "linear_sum_assignment: cost [..., N, M], masks [..., N], [..., M] -> [..., N], [...]");
  }
  return ffi_guarded([&] {
    asickernels_cpu::linear_sum_assignment<Native<kType>>(
        cost.typed_data(), row_mask.typed_data(), col_mask.typed_data(), batch, n, m,
        assignment->typed_data(), num_assigned->typed_data());
  });
}

}  // namespace

AK_FLOAT_HANDLER(linear_sum_assignment, LinearSumAssignment)

}  // namespace asickernels_cpu::entry
#endif  // ASICKERNELS_CPU_ENTRY_POINTS
