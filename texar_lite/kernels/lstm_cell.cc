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
//
// The kernel input is W_h in float32, or (Tkernel bfloat16, mixed_bfloat16)
// its bf16 copy: the recurrent products then read bf16 operands and sum in
// float32 (on AVX512_BF16 or AMX, see "The bfloat16 recurrent products"),
// and the rest stays as above. That code is compiled for those instructions
// by function attributes, whatever setup's flags, and the op refuses a bf16
// kernel on a CPU without them, so the library still loads on any CPU its
// flags fit; texar_lite/kernels decides where the bf16 kernel runs.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
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
    .Attr("Tkernel: {float, bfloat16} = DT_FLOAT")
    .Attr("amx: bool = false")    // bfloat16 kernel: the products on AMX tiles, else on vdpbf16ps
    .Input("projected: float")    // [T, B, 4H]: x W_x + b for every step
    .Input("h0: float")           // [B, H]
    .Input("c0: float")           // [B, H]
    .Input("kernel: Tkernel")     // [H, 4H]: W_h, or its bfloat16 copy (bf16 products, see below)
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
    .Attr("Tkernel: {float, bfloat16} = DT_FLOAT")
    .Attr("amx: bool = false")
    .Input("d_outputs: float")    // [T, B, H]
    .Input("d_h: float")          // [B, H]: of the final h, besides its output
    .Input("d_c: float")          // [B, H]: of the final c
    .Input("activations: float")  // [T, B, 4H]: the forward's
    .Input("tanh_c: float")       // [T, B, H]
    .Input("cells: float")        // [T, B, H]
    .Input("c0: float")           // [B, H]
    .Input("kernel: Tkernel")     // [H, 4H]
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
// itself. The tiles below read h_prev, d_gates and, backward, W_h where they
// lie, and forward W_h from panels copied once per op call, which every
// step reuses: each tile keeps a block of the output in registers and walks
// the shared dimension once. Every output element is summed over k in one
// fixed order whatever the batch, so a rank's rows come out exactly as in a
// one-process run.
using Packet = Eigen::internal::packet_traits<float>::type;
constexpr int64_t kPacket = Eigen::internal::packet_traits<float>::size;
// A tile's output block stays in vector registers: its R x C sums, C vectors
// of the kernel and one of the left operand must fit. AVX-512 has 32 of
// them: the forward's 10 x 2 reads W_h once per 10 rows, the backward's 5 x 4
// keeps its 5 rows of d_gates in the first-level cache. AVX2 has 16.
#if defined(__AVX512F__)
constexpr int kProductRows = 10, kProductColumns = 2;  // columns: packets of W_h
constexpr int kDotRows = 5, kDotColumns = 4;           // columns: rows of W_h
#else
constexpr int kProductRows = 4, kProductColumns = 3;
constexpr int kDotRows = 4, kDotColumns = 3;
#endif

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
template <int R, int C, template <int, int> class Tile>
void Columns(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t w_step, int64_t depth, float* out,
             int64_t ldo, int64_t out_step, int64_t groups) {
  int64_t g = 0;
  for (; g + C <= groups; g += C) Tile<R, C>::Run(a, lda, w + g * w_step, ldw, depth, out + g * out_step, ldo);
  for (; g < groups; ++g) Tile<R, 1>::Run(a, lda, w + g * w_step, ldw, depth, out + g * out_step, ldo);
}

// The rows after the last whole block of R: `rest` of them, fewer than R.
template <int R, int C, template <int, int> class Tile>
struct LastRows {
  static void Run(int64_t rest, const float* a, int64_t lda, const float* w, int64_t ldw, int64_t w_step,
                  int64_t depth, float* out, int64_t ldo, int64_t out_step, int64_t groups) {
    if (rest == R - 1) {
      Columns<R - 1, C, Tile>(a, lda, w, ldw, w_step, depth, out, ldo, out_step, groups);
    } else {
      LastRows<R - 1, C, Tile>::Run(rest, a, lda, w, ldw, w_step, depth, out, ldo, out_step, groups);
    }
  }
};
template <int C, template <int, int> class Tile>
struct LastRows<1, C, Tile> {
  static void Run(int64_t, const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*, int64_t, int64_t,
                  int64_t) {}
};

// Rows in blocks of R, the last block shorter.
template <int R, int C, template <int, int> class Tile>
void OverRows(int64_t rows, const float* a, int64_t lda, const float* w, int64_t ldw, int64_t w_step,
              int64_t depth, float* out, int64_t ldo, int64_t out_step, int64_t groups) {
  int64_t r = 0;
  for (; r + R <= rows; r += R) {
    Columns<R, C, Tile>(a + r * lda, lda, w, ldw, w_step, depth, out + r * ldo, ldo, out_step, groups);
  }
  LastRows<R, C, Tile>::Run(rows - r, a + r * lda, lda, w, ldw, w_step, depth, out + r * ldo, ldo, out_step, groups);
}

// The forward's product reads W_h in panels of kPanel columns, each [H, kPanel]
// in one piece: down a panel a tile then reads W_h in order, as the hardware
// prefetches it, rather than a row of W_h (4H columns) apart at every step
// of its sum, a new page each time at the larger configs' sizes.
constexpr int64_t kPanel = kProductColumns * kPacket;

// panels[p] = W_h[:, p kPanel : (p + 1) kPanel], zeros past W_h's `width` columns, for p in [first, first + count).
void PackPanels(const float* w, int64_t depth, int64_t width, int64_t first, int64_t count, float* panels) {
  for (int64_t p = first; p < first + count; ++p) {
    const int64_t column = p * kPanel, valid = std::min(kPanel, width - column);
    float* panel = panels + p * depth * kPanel;
    for (int64_t k = 0; k < depth; ++k) {
      std::memcpy(panel + k * kPanel, w + k * width + column, valid * sizeof(float));
      std::fill(panel + k * kPanel + valid, panel + (k + 1) * kPanel, 0.0f);
    }
  }
}

// out[:, p kPanel : (p + 1) kPanel] = a [rows, depth] x panels[p] for p in [first, first + count), out [rows, width].
// A last packet that crosses `width` is summed as every other (its zero columns
// add nothing) into a spill buffer, and its columns within `width` copied out.
void MultiplyPanels(const float* a, int64_t rows, int64_t depth, const float* panels, float* out, int64_t width,
                    int64_t first, int64_t count) {
  for (int64_t p = first; p < first + count; ++p) {
    const float* panel = panels + p * depth * kPanel;
    const int64_t column = p * kPanel, valid = std::min(kPanel, width - column), whole = valid / kPacket;
    OverRows<kProductRows, kProductColumns, ProductTile>(rows, a, depth, panel, kPanel, kPacket, depth,
                                                         out + column, width, kPacket, whole);
    const int64_t left = valid - whole * kPacket;
    if (left == 0) continue;
    std::vector<float> spill(rows * kPacket);
    OverRows<kProductRows, kProductColumns, ProductTile>(rows, a, depth, panel + whole * kPacket, kPanel, kPacket,
                                                         depth, spill.data(), kPacket, kPacket, 1);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(out + r * width + column + whole * kPacket, spill.data() + r * kPacket, left * sizeof(float));
    }
  }
}

// out[:, first : first + count] = a [rows, depth] x w[first : first + count, :]^T (w [*, depth]).
void MultiplyTransposedRows(const float* a, int64_t rows, int64_t depth, const float* w, float* out, int64_t ldo,
                            int64_t first, int64_t count) {
  OverRows<kDotRows, kDotColumns, DotTile>(rows, a, depth, w + first * depth, depth, depth, depth, out + first, ldo,
                                           1, count);
}

// Calls fn(first, count) over [0, size) in blocks of `block` columns, the
// blocks spread over TF's intra-op threads.
template <typename Fn>
void ForBlocks(OpKernelContext* ctx, int64_t size, int64_t block, int64_t cost_per_item, Fn fn) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  tensorflow::Shard(workers->num_threads, workers->workers, (size + block - 1) / block, block * cost_per_item,
                    [&](int64_t begin, int64_t end) {
                      fn(begin * block, std::min(end * block, size) - begin * block);
                    });
}

// The float32 recurrent products: the tiles above, on the float32 kernel,
// the forward's laid out in panels once per op call (every step reuses them).
class Fp32Products {
 public:
  Fp32Products(OpKernelContext* ctx, const Tensor& kernel, int64_t, int64_t units, bool transposed, bool)
      : kernel_(kernel.flat<float>().data()),
        n_(units),
        panels_count_(transposed ? 0 : (4 * units + kPanel - 1) / kPanel),
        panels_(panels_count_ * units * kPanel) {
    ForBlocks(ctx, panels_count_, 1, units * kPanel, [&](int64_t first, int64_t count) {
      PackPanels(kernel_, n_, 4 * n_, first, count, panels_.data());
    });
  }

  // acts = h_prev W_h, [batch, 4H].
  void Forward(OpKernelContext* ctx, const float* h_prev, int64_t batch, float* acts) const {
    ForBlocks(ctx, panels_count_, 1, 2 * batch * n_ * kPanel, [&](int64_t first, int64_t count) {
      MultiplyPanels(h_prev, batch, n_, panels_.data(), acts, 4 * n_, first, count);
    });
  }

  // d_h = d_gates W_h^T, [batch, H].
  void Backward(OpKernelContext* ctx, const float* d_gates, int64_t batch, float* d_h) const {
    ForBlocks(ctx, n_, kPacket, 2 * batch * 4 * n_, [&](int64_t first, int64_t count) {
      MultiplyTransposedRows(d_gates, batch, 4 * n_, kernel_, d_h, n_, first, count);
    });
  }

 private:
  const float* kernel_;
  const int64_t n_, panels_count_;
  std::vector<float> panels_;  // [panels_count_, H, kPanel]: W_h for the forward
};

// ---------------------------------------------------------------------------
// The bfloat16 recurrent products (mixed_bfloat16): the operands are bf16,
// W_h as the bf16 copy the decoder makes of it and h_prev or d_gates rounded
// to bf16 as tf.cast rounds them, and every product is summed in float32;
// the gate math, the cell state and every output stay float32. They run on
// AVX512_BF16's vdpbf16ps, which multiplies pairs of bf16 values and adds
// both products to a float32 lane, or on AMX tiles where the CPU and Linux
// grant them. TF's bf16 MatMul would round each product to bf16 on the way
// out; here it stays float32.
//
// The dot products take their operands in pairs along the summed dimension:
// one 32-bit word holds elements k and k + 1. The kernel is laid out once
// per op call (every step of the call reuses it) as [pairs][columns] words:
// forward, word (p, c) = W_h[2p, c], W_h[2p + 1, c]; backward, where the
// product is with W_h^T, word (p, q) = W_h[q, 2p], W_h[q, 2p + 1]. The rows
// of h_prev or d_gates are rounded into [B, pairs] words at every step.
// Pairs are padded with zeros to whole AMX tiles (16 pairs), columns to whole
// vectors (16); a zero pair adds +0 to a sum, which leaves it as it was. For
// AMX the words go in panels of 16 columns instead, each [pairs, 16] in one
// piece: every step reads the whole kernel, and read down a panel it streams
// from memory in order rather than in 16 rows far apart.
//
// As in the float32 tiles, every output element is summed over its pairs in
// one fixed order whatever the batch and the threads, so a rank's rows come
// out bit for bit as in one process (AMX rows included: each row of a tile
// product reads only its own row of the left operand).
// ---------------------------------------------------------------------------
#define TARGET_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define TARGET_AMX __attribute__((target("avx512f,avx512bw,avx512vl,amx-tile,amx-bf16")))

constexpr int64_t kLanes = 16;      // float32 lanes (and bf16 pairs) in a 512-bit vector
constexpr int64_t kTilePairs = 16;  // pairs in the summed dimension of one AMX tile product
constexpr int64_t kAmxRows = 16;    // rows of an AMX tile of the output (and of the left operand)
constexpr int kPairRows = 5;        // rows of a vdpbf16ps tile: 5 x 4 accumulators of 32 registers
constexpr int kPairColumns = 4;     // vectors of a vdpbf16ps tile

int64_t RoundUp(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

bool CpuHasAvx512Bf16() {
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

// AMX: CPUID leaf 7 lists AMX-TILE (EDX bit 24) and AMX-BF16 (bit 22), and
// Linux hands a process the tiles' 8 KB of register state only after
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): asked once, for every
// thread of the process. Where either fails the op refuses amx=true;
// texar_lite/kernels asks the same before it picks AMX over vdpbf16ps.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool AskForAmx() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  if (!(edx & (1u << 24)) || !(edx & (1u << 22))) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

bool AmxGranted() {
  static const bool granted = AskForAmx();
  return granted;
}

// out[0, padded) = `in`[0, n) rounded to bf16 as tf.cast rounds (to nearest,
// ties to even; a NaN becomes the quiet NaN of its sign), then zeros.
TARGET_BF16 void RoundToBf16(const float* in, int64_t n, int64_t padded, uint16_t* out) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i sign = _mm512_set1_epi32(0x8000), quiet = _mm512_set1_epi32(0x7fc0);
  for (int64_t i = 0; i < padded; i += kLanes) {
    const int64_t left = std::max<int64_t>(0, std::min(n - i, kLanes));
    const __mmask16 valid = static_cast<__mmask16>((1u << left) - 1);
    const __m512i x = _mm512_maskz_loadu_epi32(valid, in + i);
    const __m512i high = _mm512_srli_epi32(x, 16);
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(bias, _mm512_and_si512(high, one))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(_mm512_castsi512_ps(x), _mm512_castsi512_ps(x), _CMP_UNORD_Q);
    rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_and_si512(high, sign), quiet));
    const __mmask16 stored = static_cast<__mmask16>((1u << std::min(padded - i, kLanes)) - 1);
    _mm512_mask_cvtepi32_storeu_epi16(out + i, stored, rounded);
  }
}

// out[r, c] (c < count) = sum over pairs p of the pair dot a[r, p] . w[p, c],
// for r < R, in R x P vectors: the pairs in order, one vdpbf16ps each.
template <int R, int P>
TARGET_BF16 void PairTile(const uint32_t* a, int64_t lda, const uint32_t* w, int64_t ldw, int64_t pairs, float* out,
                          int64_t ldo, int64_t count) {
  __m512 acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) acc[r][p] = _mm512_setzero_ps();
  for (int64_t k = 0; k < pairs; ++k) {
    __m512bh wk[P];
    for (int p = 0; p < P; ++p) wk[p] = (__m512bh)_mm512_loadu_si512(w + k * ldw + p * kLanes);
    for (int r = 0; r < R; ++r) {
      const __m512bh ak = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r * lda + k]));
      for (int p = 0; p < P; ++p) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], ak, wk[p]);
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t left = std::min(count - p * kLanes, kLanes);
    const __mmask16 valid = static_cast<__mmask16>((1u << left) - 1);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * ldo + p * kLanes, valid, acc[r][p]);
  }
}

// Columns [0, count) of R rows: tiles of kPairColumns vectors, then one of the 1 to 3 left.
template <int R>
TARGET_BF16 void PairColumns(const uint32_t* a, int64_t lda, const uint32_t* w, int64_t ldw, int64_t pairs,
                             float* out, int64_t ldo, int64_t count) {
  constexpr int64_t kWidth = kPairColumns * kLanes;
  int64_t c = 0;
  for (; count - c > kWidth - kLanes; c += kWidth) {  // the last of these may end in a part of a vector
    PairTile<R, kPairColumns>(a, lda, w + c, ldw, pairs, out + c, ldo, std::min(count - c, kWidth));
  }
  switch ((count - c + kLanes - 1) / kLanes) {
    case 3: PairTile<R, 3>(a, lda, w + c, ldw, pairs, out + c, ldo, count - c); break;
    case 2: PairTile<R, 2>(a, lda, w + c, ldw, pairs, out + c, ldo, count - c); break;
    case 1: PairTile<R, 1>(a, lda, w + c, ldw, pairs, out + c, ldo, count - c); break;
    default: break;
  }
}

// out[:, first : first + count] = a [rows, pairs] . w[:, first : first + count] with vdpbf16ps.
TARGET_BF16 void MultiplyPairs(const uint32_t* a, int64_t rows, int64_t lda, int64_t pairs, const uint32_t* w,
                               int64_t ldw, float* out, int64_t ldo, int64_t first, int64_t count) {
  w += first;
  out += first;
  int64_t r = 0;
  for (; r + kPairRows <= rows; r += kPairRows) {
    PairColumns<kPairRows>(a + r * lda, lda, w, ldw, pairs, out + r * ldo, ldo, count);
  }
  const uint32_t* a_rest = a + r * lda;
  float* out_rest = out + r * ldo;
  switch (rows - r) {
    case 4: PairColumns<4>(a_rest, lda, w, ldw, pairs, out_rest, ldo, count); break;
    case 3: PairColumns<3>(a_rest, lda, w, ldw, pairs, out_rest, ldo, count); break;
    case 2: PairColumns<2>(a_rest, lda, w, ldw, pairs, out_rest, ldo, count); break;
    case 1: PairColumns<1>(a_rest, lda, w, ldw, pairs, out_rest, ldo, count); break;
    default: break;
  }
}

// One row block (up to 16 rows): tiles 0-3 accumulate up to 4 column tiles
// of the output, 16 floats wide; tile 4 holds the block's rows of the left
// operand, 16 pairs each; tiles 5 and 6 take turns holding 16 pairs of 16
// kernel columns. Two row blocks (17 to 32 rows): tiles 0-1 and 2-3
// accumulate 2 column tiles of the first and the second block, tiles 4 and 5
// hold the blocks' rows, tiles 6 and 7 the kernel's 2 column tiles, which
// both blocks then read from one load.
struct TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t bytes_per_row[16];
  uint8_t rows[16];
};

// first, second: the rows of the first and the second block (0 for one block).
TARGET_AMX void ConfigureTiles(int first, int second) {
  alignas(64) TileConfig config = {};
  config.palette = 1;
  const int tile_rows[2][8] = {{first, first, first, first, first, kTilePairs, kTilePairs, 0},
                               {first, first, second, second, first, second, kTilePairs, kTilePairs}};
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = tile_rows[second > 0][t];
    config.bytes_per_row[t] = config.rows[t] ? kLanes * 4 : 0;
  }
  _tile_loadconfig(&config);
}

// The tile instructions are asm statements that tell the compiler nothing of
// the memory they read and write.
inline void MemoryBarrier() { asm volatile("" ::: "memory"); }

// out[r, c] (r < rows, c < count <= 16) = the accumulator `buffer` [16, 16]'s
// rows, for a tile of the output's last columns: a tile stores whole rows of 16.
void StorePart(const float* buffer, float* out, int64_t ldo, int rows, int64_t count) {
  for (int r = 0; r < rows; ++r) std::memcpy(out + r * ldo, buffer + r * kLanes, count * 4);
}

// out[r, c] (r < rows, c < count <= 16 N) = sum over pairs of a[r, p] . w[p, c]:
// N column tiles, 16 pairs at a time, in order. w is laid out in panels of
// 16 columns, `panel` words apart, each [pairs, 16]: a tile of it is 1 KB in
// one piece, and the tiles down a panel follow each other in memory.
template <int N>
TARGET_AMX void AmxTile(const uint32_t* a, int64_t lda, const uint32_t* w, int64_t panel, int64_t pairs,
                        float* out, int64_t ldo, int rows, int64_t count) {
  _tile_zero(0);
  if (N > 1) _tile_zero(1);
  if (N > 2) _tile_zero(2);
  if (N > 3) _tile_zero(3);
  MemoryBarrier();
  for (int64_t k = 0; k < pairs; k += kTilePairs) {
    const uint32_t* wk = w + k * kLanes;
    _tile_loadd(4, a + k, lda * 4);
    _tile_loadd(5, wk, kLanes * 4);
    _tile_dpbf16ps(0, 4, 5);
    if (N > 1) {
      _tile_loadd(6, wk + panel, kLanes * 4);
      _tile_dpbf16ps(1, 4, 6);
    }
    if (N > 2) {
      _tile_loadd(5, wk + 2 * panel, kLanes * 4);
      _tile_dpbf16ps(2, 4, 5);
    }
    if (N > 3) {
      _tile_loadd(6, wk + 3 * panel, kLanes * 4);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  if (count == N * kLanes) {
    _tile_stored(0, out, ldo * 4);
    if (N > 1) _tile_stored(1, out + kLanes, ldo * 4);
    if (N > 2) _tile_stored(2, out + 2 * kLanes, ldo * 4);
    if (N > 3) _tile_stored(3, out + 3 * kLanes, ldo * 4);
    MemoryBarrier();
    return;
  }
  alignas(64) float buffer[N][kAmxRows * kLanes];
  _tile_stored(0, buffer[0], kLanes * 4);
  if (N > 1) _tile_stored(1, buffer[1], kLanes * 4);
  if (N > 2) _tile_stored(2, buffer[2], kLanes * 4);
  if (N > 3) _tile_stored(3, buffer[3], kLanes * 4);
  MemoryBarrier();
  for (int t = 0; t < N; ++t) {
    StorePart(buffer[t], out + t * kLanes, ldo, rows, std::min(count - t * kLanes, kLanes));
  }
}

// The same for two row blocks at once: rows [0, 16) and [16, 16 + second), N
// <= 2 column tiles. Each kernel tile is loaded once for both blocks: the
// kernel, not the rows, is what a step's product reads most of. Every output
// element is summed in the same tile products, in the same order, as above.
template <int N>
TARGET_AMX void AmxTilePair(const uint32_t* a, int64_t lda, const uint32_t* w, int64_t panel, int64_t pairs,
                            float* out, int64_t ldo, int second, int64_t count) {
  _tile_zero(0);
  _tile_zero(2);
  if (N > 1) {
    _tile_zero(1);
    _tile_zero(3);
  }
  MemoryBarrier();
  const uint32_t* a_second = a + kAmxRows * lda;
  for (int64_t k = 0; k < pairs; k += kTilePairs) {
    const uint32_t* wk = w + k * kLanes;
    _tile_loadd(4, a + k, lda * 4);
    _tile_loadd(5, a_second + k, lda * 4);
    _tile_loadd(6, wk, kLanes * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    if (N > 1) {
      _tile_loadd(7, wk + panel, kLanes * 4);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  float* out_second = out + kAmxRows * ldo;
  if (count == N * kLanes) {
    _tile_stored(0, out, ldo * 4);
    _tile_stored(2, out_second, ldo * 4);
    if (N > 1) {
      _tile_stored(1, out + kLanes, ldo * 4);
      _tile_stored(3, out_second + kLanes, ldo * 4);
    }
    MemoryBarrier();
    return;
  }
  alignas(64) float buffer[4][kAmxRows * kLanes];
  _tile_stored(0, buffer[0], kLanes * 4);
  _tile_stored(2, buffer[2], kLanes * 4);
  if (N > 1) {
    _tile_stored(1, buffer[1], kLanes * 4);
    _tile_stored(3, buffer[3], kLanes * 4);
  }
  MemoryBarrier();
  for (int t = 0; t < N; ++t) {
    const int64_t left = std::min(count - t * kLanes, kLanes);
    StorePart(buffer[t], out + t * kLanes, ldo, kAmxRows, left);
    StorePart(buffer[2 + t], out_second + t * kLanes, ldo, second, left);
  }
}

// out [rows, count] = a [rows, pairs] . w [pairs, count] (w in panels, as above) on AMX
// tiles: two row blocks at a time while more than 16 rows are left, then one.
// The tiles are configured here every time: TF's oneDNN runs its own AMX
// kernels on the same threads, with its own configuration.
TARGET_AMX void MultiplyTiles(const uint32_t* a, int64_t rows, int64_t lda, int64_t pairs, const uint32_t* w,
                              float* out, int64_t ldo, int64_t count) {
  constexpr int64_t kWidth = 4 * kLanes, kPairWidth = 2 * kLanes;
  const int64_t panel = pairs * kLanes;
  int configured[2] = {-1, -1};
  for (int64_t r = 0; r < rows;) {
    const uint32_t* a_rows = a + r * lda;
    float* out_rows = out + r * ldo;
    int64_t c = 0;
    if (rows - r > kAmxRows) {
      const int second = static_cast<int>(std::min(rows - r - kAmxRows, kAmxRows));
      if (configured[0] != kAmxRows || configured[1] != second) ConfigureTiles(kAmxRows, second);
      configured[0] = kAmxRows;
      configured[1] = second;
      for (; count - c > kLanes; c += kPairWidth) {  // the last of these may end in a part of a tile
        AmxTilePair<2>(a_rows, lda, w + c / kLanes * panel, panel, pairs, out_rows + c, ldo, second, std::min(count - c, kPairWidth));
      }
      if (c < count) AmxTilePair<1>(a_rows, lda, w + c / kLanes * panel, panel, pairs, out_rows + c, ldo, second, count - c);
      r += kAmxRows + second;
      continue;
    }
    const int block = static_cast<int>(rows - r);
    if (configured[0] != block || configured[1] != 0) ConfigureTiles(block, 0);
    configured[0] = block;
    configured[1] = 0;
    for (; count - c > kWidth - kLanes; c += kWidth) {  // the last of these may end in a part of a tile
      AmxTile<4>(a_rows, lda, w + c / kLanes * panel, panel, pairs, out_rows + c, ldo, block, std::min(count - c, kWidth));
    }
    switch ((count - c + kLanes - 1) / kLanes) {
      case 3: AmxTile<3>(a_rows, lda, w + c / kLanes * panel, panel, pairs, out_rows + c, ldo, block, count - c); break;
      case 2: AmxTile<2>(a_rows, lda, w + c / kLanes * panel, panel, pairs, out_rows + c, ldo, block, count - c); break;
      case 1: AmxTile<1>(a_rows, lda, w + c / kLanes * panel, panel, pairs, out_rows + c, ldo, block, count - c); break;
      default: break;
    }
    r += block;
  }
  // Hands the tile state back, so that a context switch need not save it.
  _tile_release();
}

// The kernel's pairs go to packed[p, c] at packed + p * ldp + (c / 16) * step,
// 16 columns c at a time: rows of ldp words (step 16), or panels of 16
// columns (ldp 16, step the panel's words), as AMX reads them.
//
// packed[p, c] = w[2p, c] | w[2p + 1, c] << 16 for p in [first, first + count):
// the rows of w [depth, width] in pairs, zeros past its edges, up to `columns`.
TARGET_BF16 void PackRowPairs(const uint16_t* w, int64_t depth, int64_t width, int64_t first, int64_t count,
                              uint32_t* packed, int64_t ldp, int64_t step, int64_t columns) {
  for (int64_t p = first; p < first + count; ++p) {
    for (int64_t c = 0; c < columns; c += kLanes) {
      const int64_t left = std::max<int64_t>(0, std::min(width - c, kLanes));
      const __mmask16 valid = static_cast<__mmask16>((1u << left) - 1);
      const __mmask16 even = 2 * p < depth ? valid : 0, odd = 2 * p + 1 < depth ? valid : 0;
      const __m512i low = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(even, w + 2 * p * width + c));
      const __m512i high = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(odd, w + (2 * p + 1) * width + c));
      _mm512_storeu_si512(packed + p * ldp + c / kLanes * step, _mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
    }
  }
}

// packed[p, q] = words[q, p] for p in [first, first + count): words [rows, columns]
// transposed, zeros past its edges, up to `width`. Read as 32-bit words, the rows of W_h
// hold the pairs of W_h^T's rows.
TARGET_BF16 void PackTransposed(const uint32_t* words, int64_t rows, int64_t columns, int64_t first, int64_t count,
                                uint32_t* packed, int64_t ldp, int64_t step, int64_t width) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t p = first; p < first + count; ++p) {
    for (int64_t q = 0; q < width; q += kLanes) {
      const int64_t left = p < columns ? std::max<int64_t>(0, std::min(rows - q, kLanes)) : 0;
      const __mmask16 valid = static_cast<__mmask16>((1u << left) - 1);
      const __m512i index = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32(q), lane),
                                                                _mm512_set1_epi32(columns)),
                                             _mm512_set1_epi32(p));
      const __m512i word = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, index, words, 4);
      _mm512_storeu_si512(packed + p * ldp + q / kLanes * step, word);
    }
  }
}

// The bf16 products of one op call: the kernel laid out in pairs once, the
// left operand rounded into `rows_` at every step.
class Bf16Products {
 public:
  // transposed: the backward's product with W_h^T, else the forward's with W_h.
  Bf16Products(OpKernelContext* ctx, const Tensor& kernel, int64_t batch, int64_t units, bool transposed, bool amx)
      : amx_(amx),
        depth_(transposed ? 4 * units : units),
        width_(transposed ? units : 4 * units),
        pairs_(RoundUp((depth_ + 1) / 2, kTilePairs)),
        ldw_(RoundUp(width_, kLanes)),
        packed_(pairs_ * ldw_),
        rows_(batch * pairs_) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(kernel.flat<tensorflow::bfloat16>().data());
    // AMX reads the kernel in panels of 16 columns, vdpbf16ps in rows.
    const int64_t ldp = amx ? kLanes : ldw_, step = amx ? pairs_ * kLanes : kLanes;
    ForBlocks(ctx, pairs_, 1, ldw_, [&](int64_t first, int64_t count) {
      if (transposed) {
        // W_h [H, 4H] as words is [H, 2H], and 4H is even: W_h^T's pairs are whole words.
        PackTransposed(reinterpret_cast<const uint32_t*>(w), units, 2 * units, first, count, packed_.data(), ldp, step,
                       ldw_);
      } else {
        PackRowPairs(w, units, 4 * units, first, count, packed_.data(), ldp, step, ldw_);
      }
    });
  }

  void Forward(OpKernelContext* ctx, const float* h_prev, int64_t batch, float* acts) { Run(ctx, h_prev, batch, acts); }
  void Backward(OpKernelContext* ctx, const float* d_gates, int64_t batch, float* d_h) {
    Run(ctx, d_gates, batch, d_h);
  }

 private:
  // out [batch, width] = bf16(a) [batch, depth] x the kernel.
  void Run(OpKernelContext* ctx, const float* a, int64_t batch, float* out) {
    uint16_t* halves = reinterpret_cast<uint16_t*>(rows_.data());
    for (int64_t b = 0; b < batch; ++b) RoundToBf16(a + b * depth_, depth_, 2 * pairs_, halves + b * 2 * pairs_);
    if (amx_) {
      // On tiles the product is a small part of a step, and a hand-over to
      // another thread and back would cost more than it saves; one thread
      // per op also leaves the other core to the other layer's op, which
      // the decoder's time chunks let run beside this one.
      MultiplyTiles(rows_.data(), batch, pairs_, pairs_, packed_.data(), out, width_, width_);
      return;
    }
    ForBlocks(ctx, width_, kLanes, 2 * batch * depth_, [&](int64_t first, int64_t count) {
      MultiplyPairs(rows_.data(), batch, pairs_, (depth_ + 1) / 2, packed_.data(), ldw_, out, width_, first, count);
    });
  }

  const bool amx_;
  const int64_t depth_, width_, pairs_, ldw_;
  std::vector<uint32_t> packed_;  // [pairs_, ldw_], or on AMX [ldw_ / 16, pairs_, 16]
  std::vector<uint32_t> rows_;    // [batch, pairs_]
};

template <typename T>
using Products = typename std::conditional<std::is_same<T, float>::value, Fp32Products, Bf16Products>::type;

// The bf16 kernels run only where the CPU has the instructions they use,
// and on AMX only where Linux grants it; `amx` says which the caller asked for.
template <typename T>
void RequireProducts(OpKernelConstruction* ctx, const char* op, bool* amx) {
  OP_REQUIRES_OK(ctx, ctx->GetAttr("amx", amx));
  if (std::is_same<T, float>::value) {
    *amx = false;  // float32 products stay float32
    return;
  }
  OP_REQUIRES(ctx, CpuHasAvx512Bf16(),
              tensorflow::errors::Unimplemented(op, " with a bfloat16 kernel needs avx512_bf16, which this CPU "
                                                "lacks: run the TF-ops cell"));
  OP_REQUIRES(ctx, !*amx || AmxGranted(),
              tensorflow::errors::Unimplemented(op, " with amx=True needs AMX tiles (amx_bf16, amx_tile), which this "
                                                "CPU lacks or Linux does not grant: run it with amx=False"));
}

// The gate math of one row goes into arrays of its own, then out to the
// row's place. Eigen runs a row from its first vector-aligned element and
// the elements before that one at a time, where the compiler fuses a*b + c
// into one rounding that the vector code does in two; a row written where it
// lies would then round by its address, which moves with the batch and the step.
struct Gates {
  explicit Gates(int64_t n) : i(n), j(n), f(n), o(n), c(n), tanh_c(n) {}
  Eigen::ArrayXf i, j, f, o, c, tanh_c;
};

// One step forward: acts = the gates of gx + h_prev W_h, then c, tanh_c and h.
template <typename P>
void ForwardStep(OpKernelContext* ctx, const float* gx, const float* h_prev, const float* c_prev, P& products,
                 int64_t batch, int64_t n, float* acts, float* c_out, float* tanh_c_out, float* h_out, Gates& g) {
  // h_prev W_h goes into the activations buffer, which the gates then overwrite.
  products.Forward(ctx, h_prev, batch, acts);
  for (int64_t b = 0; b < batch; ++b) {
    const float* x = gx + b * 4 * n;
    float* a = acts + b * 4 * n;
    // As in the TF ops: the sum is rounded first, then the function applied.
    g.i = (ConstRow(x, n) + ConstRow(a, n)).logistic();
    g.j = (ConstRow(x + n, n) + ConstRow(a + n, n)).tanh();
    g.f = (ConstRow(x + 2 * n, n) + ConstRow(a + 2 * n, n)).logistic();
    g.o = (ConstRow(x + 3 * n, n) + ConstRow(a + 3 * n, n)).logistic();
    g.c = g.f * ConstRow(c_prev + b * n, n) + g.i * g.j;
    g.tanh_c = g.c.tanh();
    Row(a, n) = g.i;
    Row(a + n, n) = g.j;
    Row(a + 2 * n, n) = g.f;
    Row(a + 3 * n, n) = g.o;
    Row(c_out + b * n, n) = g.c;
    Row(tanh_c_out + b * n, n) = g.tanh_c;
    Row(h_out + b * n, n) = g.o * g.tanh_c;  // one product: one rounding at any address
  }
}

// One step backward. On entry d_h and d_c hold the gradients of this step's
// h (besides its output's, d_output) and c; on return, those of the step
// before's: d_c_prev, and d_h_prev = d_gates W_h^T.
template <typename P>
void BackwardStep(OpKernelContext* ctx, const float* d_output, const float* acts, const float* tanh_c_in,
                  const float* c_prev, P& products, int64_t batch, int64_t n, float* d_gates, float* d_h,
                  float* d_c, Gates& g) {
  Eigen::ArrayXf& dh = g.c;
  Eigen::ArrayXf& dc = g.tanh_c;
  for (int64_t b = 0; b < batch; ++b) {
    const float* a = acts + b * 4 * n;
    ConstRow i(a, n), j(a + n, n), f(a + 2 * n, n), o(a + 3 * n, n);
    ConstRow tanh_c(tanh_c_in + b * n, n), c(c_prev + b * n, n);
    dh = ConstRow(d_h + b * n, n) + ConstRow(d_output + b * n, n);
    // From the saved values: tanh' = 1 - tanh^2 and sigmoid' = s (1 - s),
    // grouped as TF's TanhGrad and SigmoidGrad group them (same rounding).
    dc = ConstRow(d_c + b * n, n) + dh * o * (1.0f - tanh_c * tanh_c);
    g.i = (dc * j) * (i * (1.0f - i));
    g.j = dc * i * (1.0f - j * j);
    g.f = (dc * c) * (f * (1.0f - f));
    g.o = (dh * tanh_c) * (o * (1.0f - o));
    float* gates = d_gates + b * 4 * n;
    Row(gates, n) = g.i;
    Row(gates + n, n) = g.j;
    Row(gates + 2 * n, n) = g.f;
    Row(gates + 3 * n, n) = g.o;
    Row(d_c + b * n, n) = dc * f;
  }
  // Every row of d_h has been read above; the product overwrites it.
  products.Backward(ctx, d_gates, batch, d_h);
}

float* Out(Tensor* t) { return t->flat<float>().data(); }

template <typename T>
class LstmSequenceForwardOp : public OpKernel {
 public:
  explicit LstmSequenceForwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    RequireProducts<T>(ctx, "LstmSequenceForward", &amx_);
  }

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
    Products<T> products(ctx, ctx->input(3), batch, n, false, amx_);
    const int64_t state = batch * n;
    Gates gates(n);
    for (int64_t t = 0; t < steps; ++t) {
      const float* h_prev = t ? Out(outputs) + (t - 1) * state : In(ctx, 1);
      const float* c_prev = t ? Out(cells) + (t - 1) * state : In(ctx, 2);
      ForwardStep(ctx, In(ctx, 0) + t * 4 * state, h_prev, c_prev, products, batch, n, Out(acts) + t * 4 * state,
                  Out(cells) + t * state, Out(tanh_c) + t * state, Out(outputs) + t * state, gates);
    }
  }

 private:
  bool amx_;
};

template <typename T>
class LstmSequenceBackwardOp : public OpKernel {
 public:
  explicit LstmSequenceBackwardOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    RequireProducts<T>(ctx, "LstmSequenceBackward", &amx_);
  }

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
    Products<T> products(ctx, ctx->input(7), batch, n, true, amx_);
    // d_c0 and d_h0 carry the gradients from step to step, last to first.
    const int64_t state = batch * n;
    std::memcpy(Out(d_h), In(ctx, 1), state * sizeof(float));
    std::memcpy(Out(d_c), In(ctx, 2), state * sizeof(float));
    Gates gates(n);
    for (int64_t t = steps - 1; t >= 0; --t) {
      const float* c_prev = t ? In(ctx, 5) + (t - 1) * state : In(ctx, 6);
      BackwardStep(ctx, In(ctx, 0) + t * state, In(ctx, 3) + t * 4 * state, In(ctx, 4) + t * state, c_prev,
                   products, batch, n, Out(d_projected) + t * 4 * state, Out(d_h), Out(d_c), gates);
    }
  }

 private:
  bool amx_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("LstmSequenceForward").Device(DEVICE_CPU).TypeConstraint<float>("Tkernel"),
                        LstmSequenceForwardOp<float>);
REGISTER_KERNEL_BUILDER(Name("LstmSequenceBackward").Device(DEVICE_CPU).TypeConstraint<float>("Tkernel"),
                        LstmSequenceBackwardOp<float>);
REGISTER_KERNEL_BUILDER(
    Name("LstmSequenceForward").Device(DEVICE_CPU).TypeConstraint<tensorflow::bfloat16>("Tkernel"),
    LstmSequenceForwardOp<tensorflow::bfloat16>);
REGISTER_KERNEL_BUILDER(
    Name("LstmSequenceBackward").Device(DEVICE_CPU).TypeConstraint<tensorflow::bfloat16>("Tkernel"),
    LstmSequenceBackwardOp<tensorflow::bfloat16>);
