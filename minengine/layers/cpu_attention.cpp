// Paged attention on the CPU for requests with a few new tokens (decodes, short chunks) and for short prefills
// (cpu_attention.use_kernel decides), reading the KV cache in place through each request's block table. Built at
// first use by minengine/layers/cpu_attention.py.
//
// One work item = one request x one KV head. Its rows are the G query heads that share the KV head (grouped-query
// attention) times the request's q_len new tokens, taken in tiles of up to 4 rows, so every K and V row read
// serves all the rows of a tile. A tile walks the request's blocks twice: the first pass scores every key the
// tile sees against its rows (the scores kept in per-thread scratch), then each row gets an exact softmax (max,
// exp, sum over its own keys), then the second pass adds the values with those weights, all in float32. Keeping
// the scores (4 rows x the keys) is cheap at a CPU's contexts, so no online softmax rescaling (FlashAttention, Dao
// et al. 2022, section 3.1) is needed. Nothing is gathered or copied: a block's K and V rows are read where they
// sit in the cache (PagedAttention, Kwon et al. 2023, section 4.1; vLLM's CPU backend has its own attention
// kernels of the same shape).
//
// Vectors: GCC/Clang vector extensions of 8 floats (one AVX2 register, two NEON ones); the compiler maps them to the
// machine's instructions. Head dims must be a multiple of 8 (the Python side sends any other to the torch path).
//
// An FP8 KV cache (float8 e4m3, kv_cache_dtype="fp8", minengine/layers/kv_quant.py) is read here too: its bytes are
// widened to float32 as they are loaded, and its per-tensor scales are folded in where they cost nothing, k_scale
// into the query (q . (k_scale k) = (k_scale q) . k) and v_scale into the final normalisation.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int kLanes = 8;
constexpr int kMaxChunks = 64;  // D <= 512
typedef float vfloat __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint32_t vuint __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef uint16_t vhalf __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef int32_t vint __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint8_t vbyte __attribute__((vector_size(kLanes * sizeof(uint8_t))));
using bf16_bits = uint16_t;  // a bfloat16 as its raw bits: the top half of a float32
using fp8_bits = uint8_t;    // a float8 e4m3fn as its raw bits (sign, 4 exponent bits with bias 7, 3 mantissa bits)

#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else  // GCC 11 and older
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, vint{__VA_ARGS__})
#endif

// Loads of 8 consecutive elements as floats (memcpy: no alignment needed, compiles to one load).
inline vfloat load(const float* p) {
  vfloat v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline vfloat load(const bf16_bits* p) {
  vhalf h;
  std::memcpy(&h, p, sizeof(h));
  return reinterpret_cast<vfloat>(__builtin_convertvector(h, vuint) << 16);
}

// float8 e4m3fn -> float32, 8 at a time, in integer arithmetic that vectorises (no table lookups). With e the
// exponent field and m the mantissa: a normal number (e > 0) is 2^(e - 7) (1 + m / 8), the float32 whose bits are
// the byte's low 7 bits shifted to the top of the mantissa, (b & 0x7f) << 20, plus (127 - 7) << 23 on the exponent;
// a subnormal one (e = 0, the low 7 bits < 8) is m x 2^-9. No float32 subnormal is ever formed (they are slow on
// x86). The NaN pattern (0x7f, 0xff) is never written: the writer saturates at +-448 (kv_quant.quantize_kv).
inline vfloat load(const fp8_bits* p) {
  vbyte b;
  std::memcpy(&b, p, sizeof(b));
  const vuint bits = __builtin_convertvector(b, vuint);
  const vuint magnitude = bits & 0x7fu;
  const vuint normal = (magnitude << 20) + (120u << 23);
  const vfloat subnormal = __builtin_convertvector(magnitude, vfloat) * (1.0f / 512.0f);
  const vuint is_subnormal = reinterpret_cast<vuint>(magnitude < 8u);  // all ones where e = 0
  const vuint value = (is_subnormal & reinterpret_cast<vuint>(subnormal)) | (~is_subnormal & normal);
  return reinterpret_cast<vfloat>(value | ((bits & 0x80u) << 24));
}

inline float to_float(float x) { return x; }
inline float to_float(bf16_bits x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}
// float32 -> the cache's type; bfloat16 rounds to nearest even (NaN stays NaN), as torch's conversion does.
inline void store(float x, float* dst) { *dst = x; }
inline void store(float x, bf16_bits* dst) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  *dst = (bits & 0x7fffffffu) > 0x7f800000u ? 0x7fc0 : static_cast<bf16_bits>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// Eight dot products finished at once: v[i] holds dot product i's 8 lane-wise partial sums; returns the 8 sums.
// Three levels of "pair up lanes and add" (a transpose fused with the adds): 21 vector ops for 8 sums, where
// reducing each vector alone would take a chain of ~6 dependent ops per sum.
inline vfloat sum8(const vfloat* v) {
  auto halves = [](vfloat a, vfloat b) {  // [a's 4 partials, b's 4]
    return SHUFFLE(a, b, 0, 1, 2, 3, 8, 9, 10, 11) + SHUFFLE(a, b, 4, 5, 6, 7, 12, 13, 14, 15);
  };
  auto quarters = [](vfloat a, vfloat b) {  // [2 partials each of 4 dot products]
    return SHUFFLE(a, b, 0, 1, 4, 5, 8, 9, 12, 13) + SHUFFLE(a, b, 2, 3, 6, 7, 10, 11, 14, 15);
  };
  auto eighths = [](vfloat a, vfloat b) {  // [the 8 sums]
    return SHUFFLE(a, b, 0, 2, 4, 6, 8, 10, 12, 14) + SHUFFLE(a, b, 1, 3, 5, 7, 9, 11, 13, 15);
  };
  return eighths(quarters(halves(v[0], v[1]), halves(v[2], v[3])), quarters(halves(v[4], v[5]), halves(v[6], v[7])));
}

// e^x for the softmax's shifted scores (x <= 0), float32, in arithmetic the compiler vectorises (a call to
// std::exp would not be). x = n ln2 + r with |r| <= ln2 / 2; e^r by Cephes' expf polynomial (relative error
// ~1e-7, like std::exp's own rounding); 2^n written into the exponent bits. x is clamped at -87 (e^-87 ~ 1.6e-38,
// a normal float), so 2^n never underflows; keys a row must not see get an exact 0 from the caller instead.
inline float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // x - n ln2, ln2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  return p * two_n;
}

// scalar_t: the query's and output's type (float, bf16_bits); cache_t: the KV cache's (the same, or fp8_bits).
template <typename scalar_t, typename cache_t>
struct Problem {
  scalar_t* out;                // [N * q_len, Hq, D]
  const scalar_t* query;        // [N * q_len, Hq, D]
  int64_t q_row_stride, q_head_stride, o_row_stride, o_head_stride;
  const cache_t* k_cache;       // [num_blocks, block_size, Hkv, D]
  const cache_t* v_cache;
  const int64_t* block_tables;  // [N, max_blocks], rows table_stride apart
  int64_t table_stride;
  const int32_t* seq_lens;      // [N]: tokens with K/V in the cache, this step's included
  int64_t q_len, block_size, num_kv_heads, group, head_dim;
  float scale;                  // softmax scale times k_scale (a key's true value is k_scale x its stored one)
  float v_scale;                // a value's true value is v_scale x its stored one
};

// Blocks lie anywhere in the pool, so the hardware prefetcher cannot guess the next one: ask for its rows (this
// KV head's) of one cache while the current block is computed.
template <typename scalar_t, typename cache_t>
inline void prefetch_block(const Problem<scalar_t, cache_t>& p, const cache_t* cache, int64_t block, int64_t kv_head) {
  const cache_t* base = cache + (block * p.block_size * p.num_kv_heads + kv_head) * p.head_dim;
  const int64_t line = 64 / sizeof(cache_t);  // elements per cache line
  for (int64_t t = 0; t < p.block_size; ++t) {
    for (int64_t d = 0; d < p.head_dim; d += line) __builtin_prefetch(base + t * p.num_kv_heads * p.head_dim + d);
  }
}

// Per-thread scratch, grown as needed and kept: lane-wise partial dot products and the scores (then weights).
struct Scratch {
  std::vector<vfloat> partial;
  std::vector<float> scores;
};

// R rows of one request x one KV head, rows row0 .. row0 + R - 1. Row r = j * G + g is query head
// (kv_head * G + g) of the request's new token j, at position seq_len - q_len + j; it sees keys 0 .. that
// position (causal). kChunks = D / 8 when it is a compile-time constant (the loops over D then unroll and q and
// the running sums stay in registers), 0 for any other D.
//
// Two passes over the request's blocks, the exact softmax in between: (1) every key row is loaded once and scored
// against the R rows; (2) each row's max, exp and sum over all its scores (long loops that vectorise); (3) every
// value row is loaded once and added into the R rows' sums with their weights. One request x head's K and V
// (a few hundred KB at most for the contexts a CPU serves) stay in the L2 cache between the passes.
template <typename scalar_t, typename cache_t, int R, int kChunks>
void attend_rows(const Problem<scalar_t, cache_t>& p, int64_t req, int64_t kv_head, int64_t row0, Scratch& scratch) {
  const int64_t chunks = kChunks ? kChunks : p.head_dim / kLanes;
  const int64_t G = p.group, bs = p.block_size;
  const int64_t context = p.seq_lens[req] - p.q_len;  // tokens before this step's first new one
  const int64_t token_stride = p.num_kv_heads * p.head_dim;  // between consecutive tokens of one block
  const int64_t* table = p.block_tables + req * p.table_stride;

  // q: the rows' queries times the softmax scale; acc: their sums of weighted values.
  constexpr int64_t kCap = kChunks ? kChunks : kMaxChunks;
  vfloat q[R][kCap], acc[R][kCap];
  int64_t last_key[R];  // the last position each row sees
  for (int r = 0; r < R; ++r) {
    const int64_t j = (row0 + r) / G, g = (row0 + r) % G;
    const scalar_t* src = p.query + (req * p.q_len + j) * p.q_row_stride + (kv_head * G + g) * p.q_head_stride;
    for (int64_t c = 0; c < chunks; ++c) {
      q[r][c] = load(src + c * kLanes) * p.scale;
      acc[r][c] = vfloat{};
    }
    last_key[r] = context + j;
  }
  const int64_t keys = last_key[R - 1] + 1;  // the tile's last row sees the most keys
  const int64_t stride = (keys + 7) / 8 * 8;  // one row's scores, rounded up to whole groups of 8 for sum8
  const int64_t num_blocks = (keys + bs - 1) / bs;
  scratch.partial.resize(R * stride);
  scratch.scores.resize(R * stride);
  vfloat* partial = scratch.partial.data();
  float* scores = scratch.scores.data();

  // (1) Scores: each key row is loaded once for the R rows.
  for (int64_t b = 0; b < num_blocks; ++b) {
    const cache_t* block = p.k_cache + (table[b] * bs * p.num_kv_heads + kv_head) * p.head_dim;
    if (b + 1 < num_blocks) prefetch_block(p, p.k_cache, table[b + 1], kv_head);
    const int64_t in_block = std::min(bs, keys - b * bs);
    for (int64_t t = 0; t < in_block; ++t) {
      const cache_t* key = block + t * token_stride;
      vfloat dot[R] = {};
      for (int64_t c = 0; c < chunks; ++c) {
        const vfloat k = load(key + c * kLanes);
        for (int r = 0; r < R; ++r) dot[r] += q[r][c] * k;
      }
      for (int r = 0; r < R; ++r) partial[r * stride + b * bs + t] = dot[r];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int64_t t = keys; t < stride; ++t) partial[r * stride + t] = vfloat{};
    for (int64_t i = 0; i < stride; i += 8) {
      const vfloat sums = sum8(partial + r * stride + i);
      std::memcpy(scores + r * stride + i, &sums, sizeof(sums));
    }
  }
  // (2) Softmax per row over the keys it sees; later keys (other new tokens of the chunk) get weight 0.
  float inv_sum[R];
  for (int r = 0; r < R; ++r) {
    float* s = scores + r * stride;
    const int64_t visible = last_key[r] + 1;
    float row_max = -INFINITY;
#pragma omp simd reduction(max : row_max)
    for (int64_t t = 0; t < visible; ++t) row_max = std::max(row_max, s[t]);
    float row_sum = 0.0f;
#pragma omp simd reduction(+ : row_sum)
    for (int64_t t = 0; t < visible; ++t) {
      s[t] = exp_nonpositive(s[t] - row_max);
      row_sum += s[t];
    }
    for (int64_t t = visible; t < keys; ++t) s[t] = 0.0f;
    inv_sum[r] = p.v_scale / row_sum;  // row_sum >= 1: the row's largest score contributes e^0
  }
  // (3) Values: each value row is loaded once for the R rows.
  for (int64_t b = 0; b < num_blocks; ++b) {
    const cache_t* block = p.v_cache + (table[b] * bs * p.num_kv_heads + kv_head) * p.head_dim;
    if (b + 1 < num_blocks) prefetch_block(p, p.v_cache, table[b + 1], kv_head);
    const int64_t in_block = std::min(bs, keys - b * bs);
    for (int64_t t = 0; t < in_block; ++t) {
      const cache_t* value = block + t * token_stride;
      float w[R];
      for (int r = 0; r < R; ++r) w[r] = scores[r * stride + b * bs + t];
      for (int64_t c = 0; c < chunks; ++c) {
        const vfloat v = load(value + c * kLanes);
        for (int r = 0; r < R; ++r) acc[r][c] += w[r] * v;
      }
    }
  }

  for (int r = 0; r < R; ++r) {
    const int64_t j = (row0 + r) / G, g = (row0 + r) % G;
    scalar_t* dst = p.out + (req * p.q_len + j) * p.o_row_stride + (kv_head * G + g) * p.o_head_stride;
    for (int64_t c = 0; c < chunks; ++c) {
      const vfloat o = acc[r][c] * inv_sum[r];
      for (int l = 0; l < kLanes; ++l) store(o[l], dst + c * kLanes + l);
    }
  }
}

// One request x one KV head: its q_len * G rows in tiles of up to 4 (a second tile reads the request's K/V
// again, from the L2 cache by then).
template <typename scalar_t, typename cache_t, int kChunks>
void attend_one(const Problem<scalar_t, cache_t>& p, int64_t req, int64_t kv_head) {
  thread_local Scratch scratch;
  const int64_t rows = p.q_len * p.group;
  for (int64_t row0 = 0; row0 < rows; row0 += 4) {
    switch (std::min<int64_t>(4, rows - row0)) {
      case 4: attend_rows<scalar_t, cache_t, 4, kChunks>(p, req, kv_head, row0, scratch); break;
      case 3: attend_rows<scalar_t, cache_t, 3, kChunks>(p, req, kv_head, row0, scratch); break;
      case 2: attend_rows<scalar_t, cache_t, 2, kChunks>(p, req, kv_head, row0, scratch); break;
      default: attend_rows<scalar_t, cache_t, 1, kChunks>(p, req, kv_head, row0, scratch);
    }
  }
}

template <typename scalar_t, typename cache_t>
void run(const Problem<scalar_t, cache_t>& p, int64_t num_requests, int num_threads) {
  const int64_t items = num_requests * p.num_kv_heads;
  // Items differ in length (requests of different contexts): hand them out one at a time.
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && items > 1)
  for (int64_t i = 0; i < items; ++i) {
    const int64_t req = i / p.num_kv_heads, kv_head = i % p.num_kv_heads;
    switch (p.head_dim) {
      case 32: attend_one<scalar_t, cache_t, 4>(p, req, kv_head); break;
      case 64: attend_one<scalar_t, cache_t, 8>(p, req, kv_head); break;
      case 128: attend_one<scalar_t, cache_t, 16>(p, req, kv_head); break;
      default: attend_one<scalar_t, cache_t, 0>(p, req, kv_head);
    }
  }
}

}  // namespace

// ---- PyTorch binding: torch.ops.minengine.paged_attention ------------------------------------------------
// Only torch/library.h and the Tensor class: the whole torch/extension.h (with pybind11) would take ~5x longer to
// compile, for nothing this file uses.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

// out, query: [N * q_len, Hq, D] (last dim contiguous; request i owns rows i * q_len .. (i + 1) * q_len - 1);
// k_cache, v_cache: [num_blocks, block_size, Hkv, D] contiguous, this step's K/V already written;
// block_tables: [N, max_blocks] int64 (rows contiguous, any row stride); seq_lens: [N] int32 (context + q_len per
// request, q_len <= seq_len <= max_blocks * block_size); query and out float32 or bfloat16, the caches of the same
// dtype or float8 e4m3fn (each stored element times k_scale / v_scale is the true key / value); D a multiple of 8,
// at most 512. Runs on num_threads OpenMP threads. Raises (RuntimeError in Python) on anything that would read
// outside a tensor: the kernel reads through the block tables unchecked, so they are checked here, once per call.
void paged_attention(const at::Tensor& out, const at::Tensor& query, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                     int64_t q_len, double scale, int64_t num_threads, double k_scale, double v_scale) {
  TORCH_CHECK(query.device().is_cpu() && out.device().is_cpu() && k_cache.device().is_cpu() &&
                  v_cache.device().is_cpu() && block_tables.device().is_cpu() && seq_lens.device().is_cpu(),
              "CPU tensors only");
  TORCH_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), "query and out must be [N * q_len, Hq, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes(), "k_cache, v_cache must be contiguous [blocks, bs, Hkv, D]");
  TORCH_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "query and out need a contiguous last dimension");
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  TORCH_CHECK(out.scalar_type() == query.scalar_type() && v_cache.scalar_type() == k_cache.scalar_type() &&
                  (fp8 || k_cache.scalar_type() == query.scalar_type()),
              "query and out must share a dtype, and the caches that dtype or float8_e4m3fn");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && block_tables.dim() == 2 &&
                  (block_tables.stride(1) == 1 || block_tables.size(1) == 1),
              "block_tables must be an [N, max_blocks] int64 tensor with contiguous rows");
  TORCH_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "seq_lens must be int32");
  const int64_t n = block_tables.size(0), heads = query.size(1), kv_heads = k_cache.size(2), dim = k_cache.size(3);
  TORCH_CHECK(seq_lens.numel() == n && query.size(0) == n * q_len && q_len >= 1, "N, q_len and the rows disagree");
  TORCH_CHECK(query.size(2) == dim && heads % kv_heads == 0, "query heads must be a multiple of the KV heads");
  TORCH_CHECK(dim % kLanes == 0 && dim <= kLanes * kMaxChunks, "head_dim must be a multiple of 8, at most 512");
  TORCH_CHECK(kv_heads >= 1 && k_cache.size(1) >= 1, "k_cache needs at least one KV head and block_size >= 1");
  // Every block a request reads: its first cdiv(seq_len, block_size) table entries, each a block of the pool.
  const int64_t pool = k_cache.size(0), bs = k_cache.size(1), width = block_tables.size(1);
  const int64_t* tables = static_cast<const int64_t*>(block_tables.data_ptr());
  const int32_t* lens = static_cast<const int32_t*>(seq_lens.data_ptr());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = lens[i], needed = (len + bs - 1) / bs;
    TORCH_CHECK(len >= q_len, "request ", i, ": seq_len ", len, " is less than q_len ", q_len);
    TORCH_CHECK(needed <= width, "request ", i, ": seq_len ", len, " needs ", needed, " blocks, its block table has ",
                width);
    for (int64_t b = 0; b < needed; ++b) {
      const int64_t block = tables[i * block_tables.stride(0) + b];
      TORCH_CHECK(block >= 0 && block < pool, "request ", i, ": block table entry ", b, " = ", block,
                  " is outside the pool of ", pool, " blocks");
    }
  }
  if (n == 0) return;

  auto launch = [&](auto* type_tag, auto* cache_tag) {
    using scalar_t = std::remove_pointer_t<decltype(type_tag)>;
    using cache_t = std::remove_pointer_t<decltype(cache_tag)>;
    const Problem<scalar_t, cache_t> p{
        static_cast<scalar_t*>(out.data_ptr()), static_cast<const scalar_t*>(query.data_ptr()),
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        static_cast<const cache_t*>(k_cache.data_ptr()), static_cast<const cache_t*>(v_cache.data_ptr()),
        static_cast<const int64_t*>(block_tables.data_ptr()), block_tables.stride(0),
        static_cast<const int32_t*>(seq_lens.data_ptr()), q_len, k_cache.size(1), kv_heads, heads / kv_heads, dim,
        static_cast<float>(scale * k_scale), static_cast<float>(v_scale)};
    run(p, n, static_cast<int>(std::max<int64_t>(1, num_threads)));
  };
  if (query.scalar_type() == at::kFloat) {
    fp8 ? launch(static_cast<float*>(nullptr), static_cast<fp8_bits*>(nullptr))
        : launch(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
  } else if (query.scalar_type() == at::kBFloat16) {
    fp8 ? launch(static_cast<bf16_bits*>(nullptr), static_cast<fp8_bits*>(nullptr))
        : launch(static_cast<bf16_bits*>(nullptr), static_cast<bf16_bits*>(nullptr));
  } else {
    TORCH_CHECK(false, "paged_attention: a float32 or bfloat16 query only, got ", query.scalar_type());
  }
}

TORCH_LIBRARY(minengine, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
        "Tensor seq_lens, int q_len, float scale, int num_threads, float k_scale=1.0, float v_scale=1.0) -> ()",
        &paged_attention);
}
