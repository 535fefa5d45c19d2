// AVX-512's 16-float packet held in two AVX2 registers, for
// tests/test_affine_layouts.py: compiled into texar_lite/kernels/affine.cc in
// place of Eigen's packet, it runs the AVX-512 build's tile (8 rows by 2
// packets of 16 floats) on a CPU with AVX2 and FMA alone. Each lane is the same
// fused multiply-add as in a 512-bit register. The aligned load and store
// check the 64-byte alignment that _mm512_load_ps and _mm512_store_ps fault
// without.
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

struct Packet {
  __m256 lo, hi;
};
constexpr int64_t kPacket = 16;

inline void CheckAligned(const float* p) {
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) {
    std::fprintf(stderr, "packet16_avx2.h: an aligned access at %p is not on 64 bytes\n", static_cast<const void*>(p));
    std::abort();
  }
}
template <class P>
inline P pload(const float* p) {
  CheckAligned(p);
  return {_mm256_load_ps(p), _mm256_load_ps(p + 8)};
}
template <class P>
inline P ploadu(const float* p) {
  return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
}
template <class P>
inline P pset1(float value) {
  return {_mm256_set1_ps(value), _mm256_set1_ps(value)};
}
inline Packet pmadd(Packet a, Packet b, Packet c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline Packet padd(Packet a, Packet b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline void pstore(float* p, Packet a) {
  CheckAligned(p);
  _mm256_store_ps(p, a.lo);
  _mm256_store_ps(p + 8, a.hi);
}
inline void pstoreu(float* p, Packet a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
