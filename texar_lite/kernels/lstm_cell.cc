// One LSTM time step as a single op each way, for texar_lite/decoder.py:
// the recurrent product h_prev W_h and the cell forward, the cell's gradient
// and d_gates W_h^T backward.
//
// Built by scripts/setup.sh into lstm_cell.so next to this file.
//
// Why: in the small config a cell step is a [20, 800] block. Written as TF
// ops it is about 12 ops forward and 15 backward, each costing more in
// scheduling than in arithmetic, and the step repeats them for every time
// step of every layer. Here each direction is one op.
// The input projections and the kernels' gradients, one matmul per layer
// each, stay in TF (oneDNN).
//
// Layout: every [B, 4H] row holds the gates i | j | f | o (TF's
// BasicLSTMCell order), H values each. The nonlinearities are Eigen's
// vectorised logistic and tanh, the functions tf.sigmoid and tf.tanh use;
// setup builds this file for the widest instruction set the CPU has, FMA
// included, so they differ from the TF ops (built for plain AVX) by an ulp
// or two, and the products from oneDNN's by their order of summation.
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

// OK when `t` is a [batch, width] matrix.
tensorflow::Status CheckMatrix(const Tensor& t, const char* name, int64_t batch, int64_t width) {
  if (t.dims() == 2 && t.dim_size(0) == batch && t.dim_size(1) == width) return tsl::OkStatus();
  return InvalidArgument(name, " must be [", batch, ", ", width, "], got ", t.shape().DebugString());
}

REGISTER_OP("LstmStepForward")
    .Input("gates_x: float")      // [B, 4H]: x W_x + b for this step
    .Input("h_prev: float")       // [B, H]
    .Input("c_prev: float")       // [B, H]
    .Input("kernel: float")       // [H, 4H]: W_h
    .Output("c: float")           // [B, H]
    .Output("h: float")           // [B, H]
    .Output("activations: float") // [B, 4H]: sigmoid(i) | tanh(j) | sigmoid(f) | sigmoid(o)
    .Output("tanh_c: float")      // [B, H]
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle gates, state;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &gates));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &state));
      TF_RETURN_IF_ERROR(c->Merge(state, c->input(2), &state));
      c->set_output(0, state);
      c->set_output(1, state);
      c->set_output(2, gates);
      c->set_output(3, state);
      return tsl::OkStatus();
    });

REGISTER_OP("LstmStepBackward")
    .Input("d_h: float")          // [B, H]: from the next step (or the final h)
    .Input("d_output: float")     // [B, H]: from this step's output
    .Input("d_c: float")          // [B, H]: from the next step (or the final c)
    .Input("activations: float")  // [B, 4H]
    .Input("tanh_c: float")       // [B, H]
    .Input("c_prev: float")       // [B, H]
    .Input("kernel: float")       // [H, 4H]
    .Output("d_gates: float")     // [B, 4H]: gradient of gates_x (and of h_prev W_h)
    .Output("d_c_prev: float")    // [B, H]
    .Output("d_h_prev: float")    // [B, H]: d_gates W_h^T
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle state;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &state));
      c->set_output(0, c->input(3));
      c->set_output(1, state);
      c->set_output(2, state);
      return tsl::OkStatus();
    });

// The shapes an input may have, from the batch B and the units H.
enum Kind { kState /* [B, H] */, kGates /* [B, 4H] */, kKernel /* [H, 4H] */ };

struct Input {
  const char* name;
  Kind kind;
};

// The [B, H] input `state_index` fixes B and H; input i must have the shape `inputs[i].kind`.
tensorflow::Status CheckInputs(OpKernelContext* ctx, int state_index, std::initializer_list<Input> inputs,
                               int64_t* batch, int64_t* units) {
  const Tensor& state = ctx->input(state_index);
  if (state.dims() != 2) return InvalidArgument("input ", state_index, " must be a [B, H] matrix");
  *batch = state.dim_size(0);
  *units = state.dim_size(1);
  int index = 0;
  for (const Input& input : inputs) {
    TF_RETURN_IF_ERROR(CheckMatrix(ctx->input(index), input.name, input.kind == kKernel ? *units : *batch,
                                   input.kind == kState ? *units : 4 * *units));
    ++index;
  }
  return tsl::OkStatus();
}

const float* In(OpKernelContext* ctx, int index) { return ctx->input(index).flat<float>().data(); }

// The recurrent products run here, their output columns split over TF's
// intra-op threads: one op per time step each way instead of a MatMul op and
// a cell op, which saves an op's scheduling per step. Split, a step's product
// uses every core when nothing else in the step is ready to run.
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

class LstmStepForwardOp : public OpKernel {
 public:
  explicit LstmStepForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t batch, n;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, 1,
                                    {{"gates_x", kGates}, {"h_prev", kState}, {"c_prev", kState}, {"kernel", kKernel}},
                                    &batch, &n));
    Tensor *c_t, *h_t, *acts_t, *tanh_c_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, n}), &c_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, n}), &h_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch, 4 * n}), &acts_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({batch, n}), &tanh_c_t));
    // h_prev W_h goes into the activations buffer, which the gates then overwrite.
    float* product = acts_t->flat<float>().data();
    ForBlocks(ctx, 4 * n, 2 * batch * n, [&](int64_t first, int64_t count) {
      MultiplyColumns(In(ctx, 1), batch, n, In(ctx, 3), 4 * n, product, 4 * n, first, count);
    });
    for (int64_t b = 0; b < batch; ++b) {
      const float* gx = In(ctx, 0) + b * 4 * n;
      float* a = acts_t->flat<float>().data() + b * 4 * n;
      Row i(a, n), j(a + n, n), f(a + 2 * n, n), o(a + 3 * n, n);
      // As in the TF ops: the sum is rounded first, then the function applied.
      i = (ConstRow(gx, n) + i).logistic();
      j = (ConstRow(gx + n, n) + j).tanh();
      f = (ConstRow(gx + 2 * n, n) + f).logistic();
      o = (ConstRow(gx + 3 * n, n) + o).logistic();
      Row c(c_t->flat<float>().data() + b * n, n), tanh_c(tanh_c_t->flat<float>().data() + b * n, n);
      c = f * ConstRow(In(ctx, 2) + b * n, n) + i * j;
      tanh_c = c.tanh();
      Row(h_t->flat<float>().data() + b * n, n) = o * tanh_c;
    }
  }
};

class LstmStepBackwardOp : public OpKernel {
 public:
  explicit LstmStepBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    int64_t batch, n;
    OP_REQUIRES_OK(ctx, CheckInputs(ctx, 0,
                                    {{"d_h", kState}, {"d_output", kState}, {"d_c", kState}, {"activations", kGates},
                                     {"tanh_c", kState}, {"c_prev", kState}, {"kernel", kKernel}},
                                    &batch, &n));
    Tensor *d_gates_t, *d_c_prev_t, *d_h_prev_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, 4 * n}), &d_gates_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, n}), &d_c_prev_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({batch, n}), &d_h_prev_t));
    Eigen::ArrayXf dh(n), dc(n);
    for (int64_t b = 0; b < batch; ++b) {
      const float* a = In(ctx, 3) + b * 4 * n;
      ConstRow i(a, n), j(a + n, n), f(a + 2 * n, n), o(a + 3 * n, n);
      ConstRow tanh_c(In(ctx, 4) + b * n, n), c_prev(In(ctx, 5) + b * n, n);
      dh = ConstRow(In(ctx, 0) + b * n, n) + ConstRow(In(ctx, 1) + b * n, n);
      // From the saved values: tanh' = 1 - tanh^2 and sigmoid' = s (1 - s),
      // grouped as TF's TanhGrad and SigmoidGrad group them (same rounding).
      dc = ConstRow(In(ctx, 2) + b * n, n) + dh * o * (1.0f - tanh_c * tanh_c);
      float* g = d_gates_t->flat<float>().data() + b * 4 * n;
      Row(g, n) = (dc * j) * (i * (1.0f - i));
      Row(g + n, n) = dc * i * (1.0f - j * j);
      Row(g + 2 * n, n) = (dc * c_prev) * (f * (1.0f - f));
      Row(g + 3 * n, n) = (dh * tanh_c) * (o * (1.0f - o));
      Row(d_c_prev_t->flat<float>().data() + b * n, n) = dc * f;
    }
    const float* d_gates = d_gates_t->flat<float>().data();
    float* d_h_prev = d_h_prev_t->flat<float>().data();
    ForBlocks(ctx, n, 2 * batch * 4 * n, [&](int64_t first, int64_t count) {
      MultiplyTransposedRows(d_gates, batch, 4 * n, In(ctx, 6), d_h_prev, n, first, count);
    });
  }
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("LstmStepForward").Device(DEVICE_CPU), LstmStepForwardOp);
REGISTER_KERNEL_BUILDER(Name("LstmStepBackward").Device(DEVICE_CPU), LstmStepBackwardOp);
