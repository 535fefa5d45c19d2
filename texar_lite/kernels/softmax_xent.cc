// Softmax cross entropy and its gradient in one pass over the logits, for
// texar_lite/losses.py.
//
// Built by scripts/setup.sh into softmax_xent.so next to this file.
//
// Why: the small config's logits are a [400, 10000] block, 16 MB. TF's
// SparseSoftmaxCrossEntropyWithLogits and its oneDNN softmax each sweep it
// several times (max, exp, sum, divide, then subtract the one-hot) and write
// a fresh 16 MB result, so the softmax is bound by memory bandwidth, not
// arithmetic. Here each row of V floats
// (40 kB) is read once from memory, and every later pass over it runs in the
// core's cache. The gradient overwrites the logits when nothing else reads
// them (the training step), so no new block is allocated either.
//
// Per row, with m = max(logits) and s = sum(exp(logits - m)):
//   nll      = log(s) + m - logits[label]        (exact, no underflow)
//   backprop = exp(logits - m) / s - onehot(label)
//
// Under mixed_bfloat16 the affine maps' products (the softmax layer's, each
// LSTM layer's input projection) come out of oneDNN in bf16, and the f32
// bias joins them. As TF ops that boundary is a cast to f32 and an add
// forward, and backward a cast of the f32 gradient to bf16 plus a column
// sum for the bias: four sweeps over a [400, 10000] block in the small
// config. Bf16ProductPlusBias and its gradient below do each direction in
// one sweep, with the same values: the widening cast is exact, the add is
// the same f32 add, and the narrowing cast rounds to nearest even, as TF's
// Cast does. The bias gradient sums each column's rows in row order, so it
// is the same for any number of threads.
//
// At the softmax layer even that boundary is more traffic than needed: its
// float32 logits go from one op to the loss and back as a gradient, 16 MB
// each way in the small config. Bf16AffineSoftmaxCrossEntropy reads the bf16
// product and the bias, and writes the bf16 gradient over the product, with
// the same values as Bf16ProductPlusBias, then SoftmaxCrossEntropyInPlace,
// then Bf16ProductPlusBiasGrad. Each row's float32 logits live only in the
// core's cache. The bias gradient sums fixed blocks of rows, then the
// blocks in order, so its order depends on the rows alone, never on the
// threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace {

using errors::InvalidArgument;
using shape_inference::InferenceContext;
using shape_inference::ShapeHandle;

REGISTER_OP("SoftmaxCrossEntropyInPlace")
    .Input("logits: float")     // [N, V]
    .Input("labels: Tlabels")   // [N], each in [0, V)
    .Output("nll: float")       // [N]: -log softmax(logits)[label]
    .Output("backprop: float")  // [N, V]: softmax(logits) - onehot(labels); may reuse the logits' buffer
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle logits, labels;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &logits));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &labels));
      shape_inference::DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(logits, 0), c->Dim(labels, 0), &rows));
      c->set_output(0, c->Vector(rows));
      c->set_output(1, logits);
      return tsl::OkStatus();
    });

// Labels must be [rows], each in [0, vocab): an out-of-range one would index past a row.
template <typename Label>
Status CheckLabels(const Tensor& labels_t, int64_t rows, int64_t vocab) {
  if (labels_t.dims() != 1 || labels_t.dim_size(0) != rows) {
    return InvalidArgument("labels must be [", rows, "], got ", labels_t.shape().DebugString());
  }
  if (vocab <= 0) return InvalidArgument("logits must have at least one column");
  const auto labels = labels_t.flat<Label>();
  for (int64_t r = 0; r < rows; ++r) {
    if (labels(r) < 0 || labels(r) >= vocab) {
      return InvalidArgument("labels[", r, "] = ", labels(r), " is outside [0, ", vocab, ")");
    }
  }
  return tsl::OkStatus();
}

// One row's loss over its float32 logits: nll = log(s) + m - logits[label],
// and the row becomes softmax - onehot(label).
inline float SoftmaxCrossEntropyRow(float* logits_row, int64_t vocab, int64_t label) {
  Eigen::Map<Eigen::ArrayXf> row(logits_row, vocab);
  const float label_logit = row(label);
  const float max = row.maxCoeff();
  row = (row - max).exp();
  const float sum = row.sum();
  row *= 1.0f / sum;
  row(label) -= 1.0f;
  return std::log(sum) + max - label_logit;
}

template <typename Label>
class SoftmaxCrossEntropyInPlaceOp : public OpKernel {
 public:
  explicit SoftmaxCrossEntropyInPlaceOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits_t = ctx->input(0);
    const Tensor& labels_t = ctx->input(1);
    OP_REQUIRES(ctx, logits_t.dims() == 2,
                InvalidArgument("logits must be a [N, V] matrix, got ", logits_t.shape().DebugString()));
    const int64_t rows = logits_t.dim_size(0), vocab = logits_t.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckLabels<Label>(labels_t, rows, vocab));
    const auto labels = labels_t.flat<Label>();
    Tensor *nll_t, *backprop_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows}), &nll_t));
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 1, logits_t.shape(), &backprop_t));
    const float* logits = logits_t.flat<float>().data();
    float* backprop = backprop_t->flat<float>().data();
    float* nll = nll_t->flat<float>().data();

    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        float* out = backprop + r * vocab;
        if (out != logits + r * vocab) std::copy(logits + r * vocab, logits + (r + 1) * vocab, out);
        nll[r] = SoftmaxCrossEntropyRow(out, vocab, labels(r));
      }
    };
    // Cost per row in cycles, roughly: an exp and a few passes per column.
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, 30 * vocab, work);
  }
};

REGISTER_KERNEL_BUILDER(Name("SoftmaxCrossEntropyInPlace").Device(DEVICE_CPU).TypeConstraint<int32>("Tlabels"),
                        SoftmaxCrossEntropyInPlaceOp<int32>);
REGISTER_KERNEL_BUILDER(Name("SoftmaxCrossEntropyInPlace").Device(DEVICE_CPU).TypeConstraint<int64>("Tlabels"),
                        SoftmaxCrossEntropyInPlaceOp<int64>);

REGISTER_OP("Bf16ProductPlusBias")
    .Input("product: bfloat16")  // [N, K]
    .Input("bias: float")        // [K]
    .Output("sum: float")        // [N, K]: float(product) + bias
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle product, bias;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &product));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
      shape_inference::DimensionHandle columns;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(product, 1), c->Dim(bias, 0), &columns));
      c->set_output(0, c->Matrix(c->Dim(product, 0), columns));
      return tsl::OkStatus();
    });

REGISTER_OP("Bf16ProductPlusBiasGrad")
    .Input("d_sum: float")          // [N, K]
    .Output("d_product: bfloat16")  // [N, K]: d_sum rounded to bf16
    .Output("d_bias: float")        // [K]: d_sum's column sums, rows added in order
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle d_sum;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &d_sum));
      c->set_output(0, d_sum);
      c->set_output(1, c->Vector(c->Dim(d_sum, 1)));
      return tsl::OkStatus();
    });

// The conversions as bit operations on plain integers, which the compiler
// vectorises: Eigen's bfloat16 conversions are scalar code with a branch.
// The widening is exact; the narrowing rounds to nearest even and turns
// every NaN into 0x7fc0, bit for bit as TF's Cast does.
inline float WidenBf16(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

inline uint16_t RoundToBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc0u : rounded);
}

// A bf16 product [N, K] and the float32 bias [K] that joins each of its rows.
inline Status CheckProductAndBias(const Tensor& product_t, const Tensor& bias_t) {
  if (product_t.dims() != 2 || bias_t.dims() != 1 || bias_t.dim_size(0) != product_t.dim_size(1)) {
    return InvalidArgument("product must be [N, K] and bias [K], got ", product_t.shape().DebugString(), " and ",
                           bias_t.shape().DebugString());
  }
  return tsl::OkStatus();
}

class Bf16ProductPlusBiasOp : public OpKernel {
 public:
  explicit Bf16ProductPlusBiasOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& product_t = ctx->input(0);
    const Tensor& bias_t = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckProductAndBias(product_t, bias_t));
    const int64_t rows = product_t.dim_size(0), columns = product_t.dim_size(1);
    Tensor* sum_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, product_t.shape(), &sum_t));
    const auto* product = reinterpret_cast<const uint16_t*>(product_t.flat<bfloat16>().data());
    const float* bias = bias_t.flat<float>().data();
    float* sum = sum_t->flat<float>().data();
    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const uint16_t* in = product + r * columns;
        float* out = sum + r * columns;
        for (int64_t k = 0; k < columns; ++k) out[k] = WidenBf16(in[k]) + bias[k];
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, rows, 2 * columns, work);
  }
};

class Bf16ProductPlusBiasGradOp : public OpKernel {
 public:
  explicit Bf16ProductPlusBiasGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& d_sum_t = ctx->input(0);
    OP_REQUIRES(ctx, d_sum_t.dims() == 2,
                InvalidArgument("d_sum must be a [N, K] matrix, got ", d_sum_t.shape().DebugString()));
    const int64_t rows = d_sum_t.dim_size(0), columns = d_sum_t.dim_size(1);
    Tensor *d_product_t, *d_bias_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, d_sum_t.shape(), &d_product_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({columns}), &d_bias_t));
    const float* d_sum = d_sum_t.flat<float>().data();
    auto* d_product = reinterpret_cast<uint16_t*>(d_product_t->flat<bfloat16>().data());
    float* d_bias = d_bias_t->flat<float>().data();
    // Each thread takes a band of columns and walks every row through it, so
    // a column's sum has one order whatever the split.
    auto work = [&](int64_t begin, int64_t end) {
      float* acc = d_bias + begin;
      std::fill(acc, acc + (end - begin), 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        const float* in = d_sum + r * columns;
        uint16_t* out = d_product + r * columns;
        for (int64_t k = begin; k < end; ++k) {
          out[k] = RoundToBf16(in[k]);
          acc[k - begin] += in[k];
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, columns, 3 * rows, work);
  }
};

REGISTER_OP("Bf16AffineSoftmaxCrossEntropy")
    .Input("product: bfloat16")    // [N, V]: the softmax layer's bf16 product
    .Input("bias: float")          // [V]
    .Input("labels: Tlabels")      // [N], each in [0, V)
    .Output("nll: float")          // [N]: -log softmax(float(product) + bias)[label]
    .Output("backprop: bfloat16")  // [N, V]: (softmax - onehot) rounded to bf16; may reuse the product's buffer
    .Output("d_bias: float")       // [V]: the unrounded backprop's column sums
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle product, bias, labels;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &product));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &bias));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &labels));
      shape_inference::DimensionHandle rows, columns;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(product, 0), c->Dim(labels, 0), &rows));
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(product, 1), c->Dim(bias, 0), &columns));
      c->set_output(0, c->Vector(rows));
      c->set_output(1, c->Matrix(rows, columns));
      c->set_output(2, c->Vector(columns));
      return tsl::OkStatus();
    });

// The rows whose bias gradient one partial sum holds: a fixed count, so the
// order of summation is the same however the blocks are shared out.
constexpr int64_t kBiasRowBlock = 16;

template <typename Label>
class Bf16AffineSoftmaxCrossEntropyOp : public OpKernel {
 public:
  explicit Bf16AffineSoftmaxCrossEntropyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& product_t = ctx->input(0);
    const Tensor& bias_t = ctx->input(1);
    const Tensor& labels_t = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckProductAndBias(product_t, bias_t));
    const int64_t rows = product_t.dim_size(0), vocab = product_t.dim_size(1);
    OP_REQUIRES_OK(ctx, CheckLabels<Label>(labels_t, rows, vocab));
    const auto labels = labels_t.flat<Label>();
    const int64_t blocks = (rows + kBiasRowBlock - 1) / kBiasRowBlock;
    Tensor *nll_t, *backprop_t, *d_bias_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows}), &nll_t));
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 1, product_t.shape(), &backprop_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({vocab}), &d_bias_t));
    Tensor partial_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_FLOAT, TensorShape({blocks, vocab}), &partial_t));
    const auto* product = reinterpret_cast<const uint16_t*>(product_t.flat<bfloat16>().data());
    const float* bias = bias_t.flat<float>().data();
    auto* backprop = reinterpret_cast<uint16_t*>(backprop_t->flat<bfloat16>().data());
    float* nll = nll_t->flat<float>().data();
    float* partial = partial_t.flat<float>().data();
    float* d_bias = d_bias_t->flat<float>().data();

    auto rows_work = [&](int64_t begin, int64_t end) {
      Eigen::ArrayXf row(vocab);
      float* logits = row.data();
      for (int64_t block = begin; block < end; ++block) {
        float* acc = partial + block * vocab;
        std::fill(acc, acc + vocab, 0.0f);
        for (int64_t r = block * kBiasRowBlock; r < std::min(rows, (block + 1) * kBiasRowBlock); ++r) {
          const uint16_t* in = product + r * vocab;
          uint16_t* out = backprop + r * vocab;
          for (int64_t k = 0; k < vocab; ++k) logits[k] = WidenBf16(in[k]) + bias[k];
          nll[r] = SoftmaxCrossEntropyRow(logits, vocab, labels(r));
          for (int64_t k = 0; k < vocab; ++k) {
            out[k] = RoundToBf16(logits[k]);
            acc[k] += logits[k];
          }
        }
      }
    };
    auto columns_work = [&](int64_t begin, int64_t end) {
      std::fill(d_bias + begin, d_bias + end, 0.0f);
      for (int64_t block = 0; block < blocks; ++block) {
        const float* acc = partial + block * vocab;
        for (int64_t k = begin; k < end; ++k) d_bias[k] += acc[k];
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Shard(workers->num_threads, workers->workers, blocks, 34 * vocab * kBiasRowBlock, rows_work);
    Shard(workers->num_threads, workers->workers, vocab, blocks, columns_work);
  }
};

REGISTER_KERNEL_BUILDER(Name("Bf16ProductPlusBias").Device(DEVICE_CPU), Bf16ProductPlusBiasOp);
REGISTER_KERNEL_BUILDER(Name("Bf16ProductPlusBiasGrad").Device(DEVICE_CPU), Bf16ProductPlusBiasGradOp);
REGISTER_KERNEL_BUILDER(
    Name("Bf16AffineSoftmaxCrossEntropy").Device(DEVICE_CPU).TypeConstraint<int32>("Tlabels"),
    Bf16AffineSoftmaxCrossEntropyOp<int32>);
REGISTER_KERNEL_BUILDER(
    Name("Bf16AffineSoftmaxCrossEntropy").Device(DEVICE_CPU).TypeConstraint<int64>("Tlabels"),
    Bf16AffineSoftmaxCrossEntropyOp<int64>);

}  // namespace
}  // namespace tensorflow
