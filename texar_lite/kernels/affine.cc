// An affine layer's float32 products, for texar_lite/decoder.py: for the softmax layer,
// forward, logits = x W + b; backward, [x, 1]^T d_logits, which is the
// kernel's gradient with the bias's as its last row; the same for each LSTM
// layer's input projection. (The third product, d_x = d_logits W^T, stays
// TensorFlow's BatchMatMulV2, which packs less for that shape.)
//
// Built by scripts/setup.sh into affine.so next to this file.
//
// Why: TensorFlow runs a float32 MatMul as an Eigen contraction whose inner
// kernel is oneDNN's sgemm. Eigen copies ("packs") blocks of both operands
// into its layout, and oneDNN's kernel then reads them through its own. At
// the softmax layer's shapes ([B*T, H] x [H, V], V = 10000) the product is a
// few tens of milliseconds on a CPU core, and those copies are a part of it
// that does not shrink with the shared dimension. Here each operand is
// packed once, into the layout the register tile reads.
//
// The layout is the usual one of a packed GEMM. The tile keeps kRows x 2
// packets of the output in vector registers and walks the shared dimension
// once, reading kRows values of the left operand and 2 packets of the right
// one at each step: the left operand packed as [kRows-row blocks][depth][kRows],
// the right one as [2-packet panels][depth][2 packets]. The shared dimension
// runs in blocks of kDepthBlock. For each, a thread packs all rows of the
// left operand (the smaller one: the rows of a batch, or the layer's width),
// which then stream from the caches, and one panel of its columns at a
// time, which stays in a near cache while every row block passes over it.
// Two kinds of memory wait are hidden behind the sums: a tile's output rows,
// a whole output row apart, are fetched for writing as the tile starts, and
// the next panel's rows of the right operand, as far apart, are fetched a few
// at a time beside each row block of the current panel.
// Each depth block reads and writes the whole output once more, and at the
// softmax layer's shapes the output outgrows the caches, so an extra pass
// through memory costs more than a deeper block of the left operand does:
// the block is deep enough for the configs' widths and batch rows (up to
// 700) to take one pass.
//
// Sums: every output element is one chain of fused multiply-adds over the
// shared dimension, first to last, started at zero. Between depth blocks the
// chain waits in the output in float32, which is exactly the accumulator, so
// the result does not depend on the block sizes. The work is split over TF's
// intra-op threads by columns, and a column is computed whole by one thread,
// so it does not depend on the threads either, nor (forward) on which rows
// come in the same call: rank r of N computes its rows' logits and its
// rows' gradient sum exactly as one process does for the same row group.
// The forward adds the bias after the sum, as BiasAdd does after MatMul.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace {

using tensorflow::DEVICE_CPU;
using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Status;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int64_t kPacket = Eigen::internal::packet_traits<float>::size;
// The tile's kRows x 2 sums, its 2 packets of the right operand and one
// broadcast value must fit the vector registers: 32 with AVX-512, else 16.
// With AVX-512 a panel is 2 x 16 columns, and the block of the left operand's
// rows that passes over it must leave it room in the level-1 data cache
// (32 KB on some of these CPUs): at the small config's width 8 rows do, and
// 14, the most the registers hold, do not.
#if defined(__AVX512F__)
constexpr int64_t kRows = 8;
#else
constexpr int64_t kRows = 6;
#endif
constexpr int64_t kColumns = 2 * kPacket;
constexpr int64_t kDepthBlock = 704;

using Buffer = std::vector<float, Eigen::aligned_allocator<float>>;

// Element (i, j) of a matrix operand at data[i * row_step + j * column_step].
struct Matrix {
  const float* data;
  int64_t row_step, column_step;
  float at(int64_t i, int64_t j) const { return data[i * row_step + j * column_step]; }
};

// c[kRows, kColumns] = a[depth][kRows] x b[depth][kColumns], added to c's
// values when `accumulate`, and then, given, the bias [kColumns] added.
template <bool accumulate>
void Tile(int64_t depth, const float* a, const float* b, float* c, int64_t ldc, const float* bias) {
  using namespace Eigen::internal;
  if (!accumulate) {
    // The output's rows lie a whole row of the output apart, far in memory, and each
    // store would wait for its line: the lines are fetched while the tile sums.
    for (int r = 0; r < kRows; ++r) {
      for (int p = 0; p < 2; ++p) __builtin_prefetch(c + r * ldc + p * kPacket, 1, 3);
    }
  }
  Packet sum[kRows][2];
  for (int r = 0; r < kRows; ++r) {
    for (int p = 0; p < 2; ++p) {
      sum[r][p] = accumulate ? ploadu<Packet>(c + r * ldc + p * kPacket) : pset1<Packet>(0.0f);
    }
  }
  for (int64_t k = 0; k < depth; ++k) {
    const Packet b0 = pload<Packet>(b + k * kColumns), b1 = pload<Packet>(b + k * kColumns + kPacket);
    for (int r = 0; r < kRows; ++r) {
      const Packet ak = pset1<Packet>(a[k * kRows + r]);
      sum[r][0] = pmadd(ak, b0, sum[r][0]);
      sum[r][1] = pmadd(ak, b1, sum[r][1]);
    }
  }
  if (bias != nullptr) {
    const Packet bias0 = ploadu<Packet>(bias), bias1 = ploadu<Packet>(bias + kPacket);
    for (int r = 0; r < kRows; ++r) {
      sum[r][0] = padd(sum[r][0], bias0);
      sum[r][1] = padd(sum[r][1], bias1);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int p = 0; p < 2; ++p) pstoreu(c + r * ldc + p * kPacket, sum[r][p]);
  }
}

// The left operand's first `padded_rows` rows (a multiple of kRows) and depth
// [k0, k0 + depth), as [padded_rows / kRows blocks][depth][kRows]. Rows from
// `rows` on are zeros, except row `ones_row` (if any), all ones.
void PackRows(Matrix a, int64_t rows, int64_t ones_row, int64_t padded_rows, int64_t k0, int64_t depth,
              float* packed) {
  for (int64_t block = 0; block < padded_rows; block += kRows) {
    float* out = packed + block * depth;
    for (int64_t k = 0; k < depth; ++k) {
      for (int64_t r = 0; r < kRows; ++r) {
        const int64_t row = block + r;
        out[k * kRows + r] = row < rows ? a.at(row, k0 + k) : (row == ones_row ? 1.0f : 0.0f);
      }
    }
  }
}

// The right operand's columns [first, first + kColumns) and depth [k0, k0 + depth)
// as [depth][kColumns], zeros from column `columns` on.
void PackPanel(Matrix b, int64_t columns, int64_t first, int64_t k0, int64_t depth, float* packed) {
  using namespace Eigen::internal;
  const int64_t valid = std::min(kColumns, columns - first);
  for (int64_t k = 0; k < depth; ++k) {
    float* out = packed + k * kColumns;
    if (b.column_step == 1 && valid == kColumns) {
      // Two vector moves, not a call of memcpy for every step of the depth.
      const float* in = b.data + (k0 + k) * b.row_step + first;
      pstore(out, ploadu<Packet>(in));
      pstore(out + kPacket, ploadu<Packet>(in + kPacket));
      continue;
    }
    for (int64_t j = 0; j < valid; ++j) out[j] = b.at(k0 + k, first + j);
    std::fill(out + valid, out + kColumns, 0.0f);
  }
}

// c[rows, columns] (ldc) over columns [first, last) = a [rows, depth] x b [depth, columns] (+ bias), on one thread.
// The left operand has `a_rows` rows of its own; the rest up to `rows` are as PackRows says.
struct Product {
  Matrix a, b;
  int64_t a_rows, ones_row, rows, depth, columns;
  const float* bias;
  float* c;
  int64_t ldc;

  // The next panel's part of the right operand, brought toward the core beside row block
  // `row_block` of this panel: its rows lie a row of the operand apart, and PackPanel would
  // otherwise wait on each in turn. Spread over the row blocks, a few lines each.
  void PrefetchNextPanel(int64_t n, int64_t k0, int64_t block, int64_t row_block) const {
    if (b.column_step != 1 || n + 2 * kColumns > columns) return;
    const int64_t row_blocks = (rows + kRows - 1) / kRows;
    const int64_t per_block = (block + row_blocks - 1) / row_blocks, from = row_block * per_block;
    for (int64_t k = from; k < std::min(block, from + per_block); ++k) {
      const float* next = b.data + (k0 + k) * b.row_step + n + kColumns;
      for (int p = 0; p < 2; ++p) __builtin_prefetch(next + p * kPacket, 0, 2);
    }
  }

  void Columns(int64_t first, int64_t last) const {
    const int64_t padded_rows = (rows + kRows - 1) / kRows * kRows;
    Buffer packed_rows(padded_rows * std::min(depth, kDepthBlock)), panel(kColumns * std::min(depth, kDepthBlock));
    Buffer spill(kRows * kColumns), bias_spill(kColumns);
    for (int64_t k0 = 0; k0 < depth; k0 += kDepthBlock) {
      const int64_t block = std::min(kDepthBlock, depth - k0);
      const bool first_block = k0 == 0, last_block = k0 + block == depth;
      PackRows(a, a_rows, ones_row, padded_rows, k0, block, packed_rows.data());
      for (int64_t n = first; n < last; n += kColumns) {
        PackPanel(b, columns, n, k0, block, panel.data());
        const int64_t width = std::min(kColumns, last - n);
        const float* tile_bias = nullptr;
        if (last_block && bias != nullptr) {
          tile_bias = bias + n;
          if (width < kColumns) {
            std::fill(bias_spill.begin(), bias_spill.end(), 0.0f);
            std::copy(bias + n, bias + n + width, bias_spill.begin());
            tile_bias = bias_spill.data();
          }
        }
        for (int64_t m = 0; m < rows; m += kRows) {
          const int64_t height = std::min(kRows, rows - m);
          PrefetchNextPanel(n, k0, block, m / kRows);
          const bool whole = height == kRows && width == kColumns;
          // A tile past the output's edge is summed whole into `spill`, and its part inside copied out.
          float* out = whole ? c + m * ldc + n : spill.data();
          const int64_t ld = whole ? ldc : kColumns;
          if (!whole && !first_block) {
            for (int64_t r = 0; r < height; ++r) {
              std::copy(c + (m + r) * ldc + n, c + (m + r) * ldc + n + width, out + r * ld);
            }
          }
          if (first_block) {
            Tile<false>(block, packed_rows.data() + m * block, panel.data(), out, ld, tile_bias);
          } else {
            Tile<true>(block, packed_rows.data() + m * block, panel.data(), out, ld, tile_bias);
          }
          if (!whole) {
            for (int64_t r = 0; r < height; ++r) std::copy(out + r * ld, out + r * ld + width, c + (m + r) * ldc + n);
          }
        }
      }
    }
  }

  // All columns, in panels spread over TF's intra-op threads.
  void Run(OpKernelContext* ctx) const {
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t panels = (columns + kColumns - 1) / kColumns;
    tensorflow::Shard(workers->num_threads, workers->workers, panels, 2 * rows * depth * kColumns,
                      [&](int64_t begin, int64_t end) {
                        Columns(begin * kColumns, std::min(end * kColumns, columns));
                      });
  }
};

Status CheckMatrix(const Tensor& t, const char* name) {
  if (t.dims() != 2) return InvalidArgument(name, " must be a matrix, got ", t.shape().DebugString());
  return Status();
}

REGISTER_OP("AffineForward")
    .Input("x: float")       // [N, D]
    .Input("kernel: float")  // [D, K]
    .Input("bias: float")    // [K]
    .Output("y: float")      // [N, K]: x kernel + bias
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, kernel, bias;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &kernel));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &bias));
      DimensionHandle depth, columns;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 1), c->Dim(kernel, 0), &depth));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(kernel, 1), c->Dim(bias, 0), &columns));
      c->set_output(0, c->Matrix(c->Dim(x, 0), columns));
      return Status();
    });

class AffineForwardOp : public OpKernel {
 public:
  explicit AffineForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor &x = ctx->input(0), &kernel = ctx->input(1), &bias = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckMatrix(x, "x"));
    OP_REQUIRES_OK(ctx, CheckMatrix(kernel, "kernel"));
    const int64_t rows = x.dim_size(0), depth = x.dim_size(1), columns = kernel.dim_size(1);
    OP_REQUIRES(ctx, kernel.dim_size(0) == depth,
                InvalidArgument("x is ", x.shape().DebugString(), " but kernel is ", kernel.shape().DebugString()));
    OP_REQUIRES(ctx, bias.dims() == 1 && bias.dim_size(0) == columns,
                InvalidArgument("bias must be [", columns, "], got ", bias.shape().DebugString()));
    Tensor* y;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, columns}), &y));
    if (rows == 0 || columns == 0) return;
    float* out = y->flat<float>().data();
    const float* b = bias.flat<float>().data();
    if (depth == 0) {
      for (int64_t r = 0; r < rows; ++r) std::copy(b, b + columns, out + r * columns);
      return;
    }
    Product{{x.flat<float>().data(), depth, 1}, {kernel.flat<float>().data(), columns, 1}, rows, -1, rows, depth,
            columns, b, out, columns}
        .Run(ctx);
  }
};

REGISTER_OP("AffineKernelGradient")
    .Input("x: float")       // [N, D]
    .Input("d_y: float")     // [N, K]
    .Output("d_kb: float")   // [D + 1, K]: [x, 1]^T d_y, the kernel's gradient and (last row) the bias's
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle x, d_y;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &x));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &d_y));
      DimensionHandle rows, depth_plus_one;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(x, 0), c->Dim(d_y, 0), &rows));
      TF_RETURN_IF_ERROR(c->Add(c->Dim(x, 1), 1, &depth_plus_one));
      c->set_output(0, c->Matrix(depth_plus_one, c->Dim(d_y, 1)));
      return Status();
    });

class AffineKernelGradientOp : public OpKernel {
 public:
  explicit AffineKernelGradientOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor &x = ctx->input(0), &d_y = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckMatrix(x, "x"));
    OP_REQUIRES_OK(ctx, CheckMatrix(d_y, "d_y"));
    const int64_t rows = x.dim_size(0), width = x.dim_size(1), columns = d_y.dim_size(1);
    OP_REQUIRES(ctx, d_y.dim_size(0) == rows,
                InvalidArgument("x is ", x.shape().DebugString(), " but d_y is ", d_y.shape().DebugString()));
    Tensor* d_kb;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({width + 1, columns}), &d_kb));
    float* out = d_kb->flat<float>().data();
    if (columns == 0) return;
    if (rows == 0) {
      std::fill(out, out + (width + 1) * columns, 0.0f);
      return;
    }
    // Left operand [x, 1]^T: its row i, summed over the N rows of x, is x's
    // column i, and its last row the ones that sum d_y's columns.
    Product{{x.flat<float>().data(), 1, width}, {d_y.flat<float>().data(), columns, 1}, width, width, width + 1,
            rows, columns, nullptr, out, columns}
        .Run(ctx);
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("AffineForward").Device(DEVICE_CPU), AffineForwardOp);
REGISTER_KERNEL_BUILDER(Name("AffineKernelGradient").Device(DEVICE_CPU), AffineKernelGradientOp);
