// One LSTM layer over a run of time steps as a single op each way, for
// texar_lite/decoder.py: forward, the recurrence of every step (h_prev W_h
// and the cell); backward, backpropagation through time (the cell's gradient
// and d_gates W_h^T of every step, last to first).
//
// Built by scripts/setup.sh into lstm_cell.so next to this file.
//
// Why: in the small config a time step is a [20, 200] x [200, 800] product
// and a few elementwise passes over [20, 800]. Written as TF ops a step is
// about 12 ops forward and 15 backward; even as one op per step, each step
// pays the executor's scheduling, and the steps' outputs are stacked into
// [T, B, *] tensors afterwards. Here the time loop runs inside the op and
// every step writes straight into those tensors. The input projection x W_x
// + b has no time dependency and comes in computed for all steps (one matmul
// in TF, by oneDNN), as does the recurrent kernel's gradient after the loop.
//
// Layout: every [B, 4H] row holds the gates i | j | f | o (TF's
// BasicLSTMCell order), H values each. The nonlinearities are Eigen's
// vectorised logistic and tanh, the functions tf.sigmoid and tf.tanh use;
// setup builds this file for the widest instruction set the CPU has, FMA
// included, so they differ from the TF ops (built for plain AVX) by an ulp
// or two, and the products from oneDNN's by their order of summation.
#include <cstring>
#include <string>
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
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::errors::InvalidArgument;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

REGISTER_OP("LstmSequenceForward")
    .Input("projected: float")    // [T, B, 4H]: x W_x + b for every step
    .Input("h0: float")           // [B, H]
    .Input("c0: float")           // [B, H]
    .Input("kernel: float")       // [H, 4H]: W_h
    .Output("outputs: float")     // [T, B, H]: h of every step
    .Output("cells: float")       // [T, B, H]: c of every step
    .Output("activations: float") // [T, B, 4H]: sigmoid(i) | tanh(j) | sigmoid(f) | sigmoid(o)
    .Output("tanh_c: float")      // [T, B, H]
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle projected, state;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &projected));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &state));
      TF_RETURN_IF_ERROR(c->Merge(state, c->input(2), &state));
      ShapeHandle steps = c->MakeShape({c->Dim(projected, 0), c->Dim(state, 0), c->Dim(state, 1)});
      c->set_output(0, steps);
      c->set_output(1, steps);
      c->set_output(2, projected);
      c->set_output(3, steps);
      return tsl::OkStatus();
    });

REGISTER_OP("LstmSequenceBackward")
    .Input("d_outputs: float")    // [T, B, H]
    .Input("d_h: float")          // [B, H]: of the final h, besides its output
    .Input("d_c: float")          // [B, H]: of the final c
    .Input("activations: float")  // [T, B, 4H]: the forward's
    .Input("tanh_c: float")       // [T, B, H]
    .Input("cells: float")        // [T, B, H]
    .Input("c0: float")           // [B, H]
    .Input("kernel: float")       // [H, 4H]
    .Output("d_projected: float") // [T, B, 4H]: the gates' gradient (of x W_x + b and of h_prev W_h)
    .Output("d_c0: float")        // [B, H]
    .Output("d_h0: float")        // [B, H]
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle state;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &state));
      c->set_output(0, c->input(3));
      c->set_output(1, state);
      c->set_output(2, state);
      return tsl::OkStatus();
    });

// The shapes an input may have, from the steps T, the batch B and the units H.
enum Kind { kState /* [B, H] */, kKernel /* [H, 4H] */, kSteps /* [T, B, H] */, kStepGates /* [T, B, 4H] */ };

struct Input {
  const char* name;
  Kind kind;
};

// Input `sequence` (a [T, B, *] tensor) fixes T and input `state` (a [B, H]
// matrix) B and H; input i must then have the shape `inputs[i].kind`.
tensorflow::Status CheckInputs(OpKernelContext* ctx, int sequence, int state, std::initializer_list<Input> inputs,
                               int64_t* steps, int64_t* batch, int64_t* units) {
  const Tensor& first = ctx->input(sequence);
  if (first.dims() != 3 || first.dim_size(0) < 1) {
    return InvalidArgument(inputs.begin()[sequence].name, " must be [T, B, *] with T >= 1, got ",
                           first.shape().DebugString());
  }
  if (ctx->input(state).dims() != 2) {
    return InvalidArgument(inputs.begin()[state].name, " must be a [B, H] matrix, got ",
                           ctx->input(state).shape().DebugString());
  }
  *steps = first.dim_size(0);
  *batch = ctx->input(state).dim_size(0);
  *units = ctx->input(state).dim_size(1);
  int index = 0;
  for (const Input& input : inputs) {
    std::vector<int64_t> want;
    if (input.kind == kSteps || input.kind == kStepGates) want.push_back(*steps);
    want.push_back(input.kind == kKernel ? *units : *batch);
    want.push_back(input.kind == kState || input.kind == kSteps ? *units : 4 * *units);
    const Tensor& t = ctx->input(index++);
    if (t.shape() != TensorShape(want)) {
      std::string dims;
      for (int64_t size : want) dims += (dims.empty() ? "" : ", ") + std::to_string(size);
      return InvalidArgument(input.name, " must be [", dims, "], got ", t.shape().DebugString());
    }
  }
  return tsl::OkStatus();
}

const float* In(OpKernelContext* ctx, int index) { return ctx->input(index).flat<float>().data(); }

// The recurrent products run here, inside the time loop, their output
// columns split over TF's intra-op threads: split, a step's product uses
// every core when nothing else in the training step is ready to run.
//
// They are small ([B, H] x [H, 4H] with B the rows of one rank), and a GEMM
// library copies ("packs") both operands into its own layout on every call,
// which at this size costs about as much memory traffic as the product
// itself. The tiles below read the row-major operands where they lie: each
// keeps a block of the output in registers and walks the shared dimension
// once. Every output element is summed over k in one fixed order whatever
// the batch, so a rank's rows come out exactly as in a one-process run.
using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int64_t kPacket = Eigen::internal::packet_traits<float>::size;
constexpr int kTileRows = 4;
constexpr int kTileColumns = 3;  // packets forward, rows of W_h backward

// out[r, p packets] = sum over k of a[r, k] w[k, p packets], for r < R.
template <int R, int P>
struct ProductTile {
  static void Run(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t depth, float* out,
                  int64_t ldo) {
    using namespace Eigen::internal;
    Packet acc[R][P];
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) acc[r][p] = pset1<Packet>(0.0f);
    for (int64_t k = 0; k < depth; ++k) {
      Packet wk[P];
      for (int p = 0; p < P; ++p) wk[p] = ploadu<Packet>(w + k * ldw + p * kPacket);
      for (int r = 0; r < R; ++r) {
        const Packet ak = pset1<Packet>(a[r * lda + k]);
        for (int p = 0; p < P; ++p) acc[r][p] = pmadd(ak, wk[p], acc[r][p]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) pstoreu(out + r * ldo + p * kPacket, acc[r][p]);
  }
};

// out[r, q] = sum over j of a[r, j] w[q, j], for r < R and q < Q: rows of a
// against rows of w, so a product with w^T needs no transposed copy.
template <int R, int Q>
struct DotTile {
  static void Run(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t depth, float* out,
                  int64_t ldo) {
    using namespace Eigen::internal;
    Packet acc[R][Q];
    for (int r = 0; r < R; ++r)
      for (int q = 0; q < Q; ++q) acc[r][q] = pset1<Packet>(0.0f);
    int64_t j = 0;
    for (; j + kPacket <= depth; j += kPacket) {
      Packet wj[Q];
      for (int q = 0; q < Q; ++q) wj[q] = ploadu<Packet>(w + q * ldw + j);
      for (int r = 0; r < R; ++r) {
        const Packet aj = ploadu<Packet>(a + r * lda + j);
        for (int q = 0; q < Q; ++q) acc[r][q] = pmadd(aj, wj[q], acc[r][q]);
      }
    }
    for (int r = 0; r < R; ++r) {
      for (int q = 0; q < Q; ++q) {
        float sum = predux(acc[r][q]);
        for (int64_t tail = j; tail < depth; ++tail) sum += a[r * lda + tail] * w[q * ldw + tail];
        out[r * ldo + q] = sum;
      }
    }
  }
};

// Runs Tile<R, C> over column groups of C (packets or w rows) up to `groups`,
// then the remainder as Tile<R, 1>; w_step and out_step are how far one group moves in w and out.
template <int R, template <int, int> class Tile>
struct Columns {
  static void Run(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t w_step, int64_t depth,
                  float* out, int64_t ldo, int64_t out_step, int64_t groups) {
    int64_t g = 0;
    for (; g + kTileColumns <= groups; g += kTileColumns) {
      Tile<R, kTileColumns>::Run(a, lda, w + g * w_step, ldw, depth, out + g * out_step, ldo);
    }
    for (; g < groups; ++g) Tile<R, 1>::Run(a, lda, w + g * w_step, ldw, depth, out + g * out_step, ldo);
  }
};

// Rows in blocks of kTileRows, the last block shorter.
template <template <int, int> class Tile>
void OverRows(int64_t rows, const float* a, int64_t lda, const float* w, int64_t ldw, int64_t w_step,
              int64_t depth, float* out, int64_t ldo, int64_t out_step, int64_t groups) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) {
    Columns<kTileRows, Tile>::Run(a + r * lda, lda, w, ldw, w_step, depth, out + r * ldo, ldo, out_step, groups);
  }
  const float* a_rest = a + r * lda;
  float* out_rest = out + r * ldo;
  switch (rows - r) {
    case 3: Columns<3, Tile>::Run(a_rest, lda, w, ldw, w_step, depth, out_rest, ldo, out_step, groups); break;
    case 2: Columns<2, Tile>::Run(a_rest, lda, w, ldw, w_step, depth, out_rest, ldo, out_step, groups); break;
    case 1: Columns<1, Tile>::Run(a_rest, lda, w, ldw, w_step, depth, out_rest, ldo, out_step, groups); break;
    default: break;
  }
}

// out[:, first : first + count] = a [rows, depth] x w[:, first : first + count] (w [depth, ldw]).
void MultiplyColumns(const float* a, int64_t rows, int64_t depth, const float* w, int64_t ldw, float* out,
                     int64_t ldo, int64_t first, int64_t count) {
  const int64_t packets = count / kPacket;
  OverRows<ProductTile>(rows, a, depth, w + first, ldw, kPacket, depth, out + first, ldo, kPacket, packets);
  for (int64_t c = first + packets * kPacket; c < first + count; ++c) {  // columns past the last packet
    for (int64_t r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int64_t k = 0; k < depth; ++k) sum += a[r * depth + k] * w[k * ldw + c];
      out[r * ldo + c] = sum;
    }
  }
}

// out[:, first : first + count] = a [rows, depth] x w[first : first + count, :]^T (w [*, depth]).
void MultiplyTransposedRows(const float* a, int64_t rows, int64_t depth, const float* w, float* out, int64_t ldo,
                            int64_t first, int64_t count) {
  OverRows<DotTile>(rows, a, depth, w + first * depth, depth, depth, depth, out + first, ldo, 1, count);
}

// Calls fn(first, count) over [0, size) in blocks of a packet, the blocks
// spread over TF's intra-op threads.
template <typename Fn>
void ForBlocks(OpKernelContext* ctx, int64_t size, int64_t cost_per_item, Fn fn) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, (size + kPacket - 1) / kPacket,
                    kPacket * cost_per_item, [&](int64_t begin, int64_t end) {
                      fn(begin * kPacket, std::min(end * kPacket, size) - begin * kPacket);
                    });
}

// One step forward: acts = the gates of gx + h_prev W_h, then c, tanh_c and h.
void ForwardStep(OpKernelContext* ctx, const float* gx, const float* h_prev, const float* c_prev,
                 const float* kernel, int64_t batch, int64_t n, float* acts, float* c_out, float* tanh_c_out,
                 float* h_out) {
  // h_prev W_h goes into the activations buffer, which the gates then overwrite.
  ForBlocks(ctx, 4 * n, 2 * batch * n, [&](int64_t first, int64_t count) {
    MultiplyColumns(h_prev, batch, n, kernel, 4 * n, acts, 4 * n, first, count);
  });
  for (int64_t b = 0; b < batch; ++b) {
    const float* x = gx + b * 4 * n;
    float* a = acts + b * 4 * n;
    Row i(a, n), j(a + n, n), f(a + 2 * n, n), o(a + 3 * n, n);
    // As in the TF ops: the sum is rounded first, then the function applied.
    i = (ConstRow(x, n) + i).logistic();
    j = (ConstRow(x + n, n) + j).tanh();
    f = (ConstRow(x + 2 * n, n) + f).logistic();
    o = (ConstRow(x + 3 * n, n) + o).logistic();
    Row c(c_out + b * n, n), tanh_c(tanh_c_out + b * n, n);
    c = f * ConstRow(c_prev + b * n, n) + i * j;
    tanh_c = c.tanh();
    Row(h_out + b * n, n) = o * tanh_c;
  }
}

// One step backward. On entry d_h and d_c hold the gradients of this step's
// h (besides its output's, d_output) and c; on return, those of the step
// before's: d_c_prev, and d_h_prev = d_gates W_h^T.
void BackwardStep(OpKernelContext* ctx, const float* d_output, const float* acts, const float* tanh_c_in,
                  const float* c_prev, const float* kernel, int64_t batch, int64_t n, float* d_gates, float* d_h,
                  float* d_c) {
  Eigen::ArrayXf dh(n), dc(n);
  for (int64_t b = 0; b < batch; ++b) {
    const float* a = acts + b * 4 * n;
    ConstRow i(a, n), j(a + n, n), f(a + 2 * n, n), o(a + 3 * n, n);
    ConstRow tanh_c(tanh_c_in + b * n, n), c(c_prev + b * n, n);
    dh = ConstRow(d_h + b * n, n) + ConstRow(d_output + b * n, n);
    // From the saved values: tanh' = 1 - tanh^2 and sigmoid' = s (1 - s),
    // grouped as TF's TanhGrad and SigmoidGrad group them (same rounding).
    dc = ConstRow(d_c + b * n, n) + dh * o * (1.0f - tanh_c * tanh_c);
    float* g = d_gates + b * 4 * n;
    Row(g, n) = (dc * j) * (i * (1.0f - i));
    Row(g + n, n) = dc * i * (1.0f - j * j);
    Row(g + 2 * n, n) = (dc * c) * (f * (1.0f - f));
    Row(g + 3 * n, n) = (dh * tanh_c) * (o * (1.0f - o));
    Row(d_c + b * n, n) = dc * f;
  }
  // Every row of d_h has been read above; the product overwrites it.
  ForBlocks(ctx, n, 2 * batch * 4 * n, [&](int64_t first, int64_t count) {
    MultiplyTransposedRows(d_gates, batch, 4 * n, kernel, d_h, n, first, count);
  });
}

float* Out(Tensor* t) { return t->flat<float>().data(); }

class LstmSequenceForwardOp : public OpKernel {
 public:
  explicit LstmSequenceForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t steps, batch, n;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, 0, 1,
                                    {{"projected", kStepGates}, {"h0", kState}, {"c0", kState}, {"kernel", kKernel}},
                                    &steps, &batch, &n));
    Tensor *outputs, *cells, *acts, *tanh_c;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({steps, batch, n}), &outputs));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({steps, batch, n}), &cells));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({steps, batch, 4 * n}), &acts));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({steps, batch, n}), &tanh_c));
    const int64_t state = batch * n;
    for (int64_t t = 0; t < steps; ++t) {
      const float* h_prev = t ? Out(outputs) + (t - 1) * state : In(ctx, 1);
      const float* c_prev = t ? Out(cells) + (t - 1) * state : In(ctx, 2);
      ForwardStep(ctx, In(ctx, 0) + t * 4 * state, h_prev, c_prev, In(ctx, 3), batch, n, Out(acts) + t * 4 * state,
                  Out(cells) + t * state, Out(tanh_c) + t * state, Out(outputs) + t * state);
    }
  }
};

class LstmSequenceBackwardOp : public OpKernel {
 public:
  explicit LstmSequenceBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t steps, batch, n;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, 0, 1,
                                    {{"d_outputs", kSteps}, {"d_h", kState}, {"d_c", kState},
                                     {"activations", kStepGates}, {"tanh_c", kSteps}, {"cells", kSteps},
                                     {"c0", kState}, {"kernel", kKernel}},
                                    &steps, &batch, &n));
    Tensor *d_projected, *d_c, *d_h;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({steps, batch, 4 * n}), &d_projected));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, n}), &d_c));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch, n}), &d_h));
    // d_c0 and d_h0 carry the gradients from step to step, last to first.
    const int64_t state = batch * n;
    std::memcpy(Out(d_h), In(ctx, 1), state * sizeof(float));
    std::memcpy(Out(d_c), In(ctx, 2), state * sizeof(float));
    for (int64_t t = steps - 1; t >= 0; --t) {
      const float* c_prev = t ? In(ctx, 5) + (t - 1) * state : In(ctx, 6);
      BackwardStep(ctx, In(ctx, 0) + t * state, In(ctx, 3) + t * 4 * state, In(ctx, 4) + t * state, c_prev,
                   In(ctx, 7), batch, n, Out(d_projected) + t * 4 * state, Out(d_h), Out(d_c));
    }
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("LstmSequenceForward").Device(DEVICE_CPU), LstmSequenceForwardOp);
REGISTER_KERNEL_BUILDER(Name("LstmSequenceBackward").Device(DEVICE_CPU), LstmSequenceBackwardOp);
