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
#include <cmath>

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
    OP_REQUIRES(ctx, labels_t.dims() == 1 && labels_t.dim_size(0) == rows,
                InvalidArgument("labels must be [", rows, "], got ", labels_t.shape().DebugString()));
    OP_REQUIRES(ctx, vocab > 0, InvalidArgument("logits must have at least one column"));
    const auto labels = labels_t.flat<Label>();
    for (int64_t r = 0; r < rows; ++r) {
      OP_REQUIRES(ctx, labels(r) >= 0 && labels(r) < vocab,
                  InvalidArgument("labels[", r, "] = ", labels(r), " is outside [0, ", vocab, ")"));
    }
    Tensor *nll_t, *backprop_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows}), &nll_t));
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({0}, 1, logits_t.shape(), &backprop_t));
    const float* logits = logits_t.flat<float>().data();
    float* backprop = backprop_t->flat<float>().data();
    float* nll = nll_t->flat<float>().data();

    auto work = [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        Eigen::Map<const Eigen::ArrayXf> in(logits + r * vocab, vocab);
        Eigen::Map<Eigen::ArrayXf> out(backprop + r * vocab, vocab);
        // Read before `out` may overwrite it (the buffers can be the same).
        const float label_logit = in(labels(r));
        const float max = in.maxCoeff();
        out = (in - max).exp();
        const float sum = out.sum();
        out *= 1.0f / sum;
        out(labels(r)) -= 1.0f;
        nll[r] = std::log(sum) + max - label_logit;
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

}  // namespace
}  // namespace tensorflow
