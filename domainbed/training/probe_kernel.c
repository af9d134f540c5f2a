/* One training step's arithmetic of linear heads on cached features (probe_kernel.py).

   Each head k reads its own rows of the feature table and, row by row in a fixed order,
   computes its logits, the mean cross-entropy's loss and gradient (one pass over each row:
   the row stays in L1 from the logits to the weight gradient). Nothing a head computes
   depends on another head, on how many heads a call holds, or on the thread running it:
   a head trained alone gets the same bits as in a stack of any size.

   The fixed order, per head:
   - a logit: the dot product over the F features in 16 lanes (lane l sums the features
     f with f % 16 == l, f < F - F % 16, in increasing f), the lanes summed as
     (lane l + lane l + 8) for l = 0..7 in increasing l, then the last F % 16 features in
     increasing f; plus the bias;
   - log-sum-exp: m = the largest logit, lse = m + log(sum over classes of exp(logit - m));
   - per row: loss term lse - logit[label], gradient (exp(logit - lse) - [c == label]) / R;
   - sums over the R rows (loss, weight and bias gradients) in row order.
   Compiled with -ffp-contract=off: no fused multiply-add, so AVX2 or not, a build gives
   the same numbers (exp and log are the C library's: another libm may round them
   differently). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

/* float16 -> float32 is exact: the hardware conversion and the portable one agree */
static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {   /* subnormal half: normal float */
        int shift = 0;
        while (!(mantissa & 0x400)) { mantissa <<= 1; shift++; }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void widen(const uint16_t *src, float *dst, int64_t n) {
    int64_t f = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; f + 8 <= n; f += 8)
        _mm256_storeu_ps(dst + f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + f))));
#endif
    for (; f < n; f++) dst[f] = half_to_float(src[f]);
}

static inline float lane_sum(v8 low, v8 high) {
    v8 s = low + high;
    float t = 0.f;
    for (int l = 0; l < 8; l++) t += s[l];
    return t;
}

/* x . w0 and x . w1 in the fixed order (w1 == NULL: x . w0 alone, the same bits) */
static void dots(const float *x, const float *w0, const float *w1, int64_t F,
                 float *out0, float *out1) {
    v8 a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0};
    int64_t f = 0;
    if (w1) {
        for (; f + 16 <= F; f += 16) {
            v8 x0 = load8(x + f), x1 = load8(x + f + 8);
            a0 += x0 * load8(w0 + f); a1 += x1 * load8(w0 + f + 8);
            b0 += x0 * load8(w1 + f); b1 += x1 * load8(w1 + f + 8);
        }
    } else {
        for (; f + 16 <= F; f += 16) {
            a0 += load8(x + f) * load8(w0 + f); a1 += load8(x + f + 8) * load8(w0 + f + 8);
        }
    }
    float s0 = lane_sum(a0, a1), s1 = lane_sum(b0, b1);
    for (int64_t t = f; t < F; t++) s0 += x[t] * w0[t];
    *out0 = s0;
    if (w1) {
        for (int64_t t = f; t < F; t++) s1 += x[t] * w1[t];
        *out1 = s1;
    }
}

/* y0 += g0 * x and y1 += g1 * x, elementwise (y1 == NULL: y0 alone) */
static void accumulate(const float *x, float g0, float *y0, float g1, float *y1, int64_t F) {
    v8 G0 = {g0, g0, g0, g0, g0, g0, g0, g0}, G1 = {g1, g1, g1, g1, g1, g1, g1, g1};
    int64_t f = 0;
    for (; f + 8 <= F; f += 8) {
        v8 xv = load8(x + f);
        store8(y0 + f, load8(y0 + f) + G0 * xv);
        if (y1) store8(y1 + f, load8(y1 + f) + G1 * xv);
    }
    for (; f < F; f++) {
        y0[f] += g0 * x[f];
        if (y1) y1[f] += g1 * x[f];
    }
}

/* dots() of two rows x and z at once (each weight vector loaded once): the same bits */
static void dots_pair(const float *x, const float *z, const float *w0, const float *w1,
                      int64_t F, float *x0, float *x1, float *z0, float *z1) {
    v8 xa0 = {0}, xa1 = {0}, xb0 = {0}, xb1 = {0}, za0 = {0}, za1 = {0}, zb0 = {0}, zb1 = {0};
    int64_t f = 0;
    for (; f + 16 <= F; f += 16) {
        v8 xl = load8(x + f), xh = load8(x + f + 8), zl = load8(z + f), zh = load8(z + f + 8);
        v8 wl = load8(w0 + f), wh = load8(w0 + f + 8);
        xa0 += xl * wl; xa1 += xh * wh; za0 += zl * wl; za1 += zh * wh;
        if (w1) {
            wl = load8(w1 + f); wh = load8(w1 + f + 8);
            xb0 += xl * wl; xb1 += xh * wh; zb0 += zl * wl; zb1 += zh * wh;
        }
    }
    float sx0 = lane_sum(xa0, xa1), sz0 = lane_sum(za0, za1);
    for (int64_t t = f; t < F; t++) { sx0 += x[t] * w0[t]; sz0 += z[t] * w0[t]; }
    *x0 = sx0; *z0 = sz0;
    if (w1) {
        float sx1 = lane_sum(xb0, xb1), sz1 = lane_sum(zb0, zb1);
        for (int64_t t = f; t < F; t++) { sx1 += x[t] * w1[t]; sz1 += z[t] * w1[t]; }
        *x1 = sx1; *z1 = sz1;
    }
}

/* head_logits() of two rows x and z */
static void head_logits_pair(const float *x, const float *z, const float *w, const float *b,
                             int64_t F, int64_t C, float *lx, float *lz) {
    int64_t c = 0;
    for (; c + 2 <= C; c += 2)
        dots_pair(x, z, w + c * F, w + (c + 1) * F, F, lx + c, lx + c + 1, lz + c, lz + c + 1);
    if (c < C) dots_pair(x, z, w + c * F, NULL, F, lx + c, NULL, lz + c, NULL);
    for (c = 0; c < C; c++) { lx[c] += b[c]; lz[c] += b[c]; }
}

/* y0 = (y0 + a0 * x) + b0 * z and y1 = (y1 + a1 * x) + b1 * z, elementwise: two rows'
   terms in one pass, rounded as two passes of `accumulate` would (y1 == NULL: y0 alone) */
static void accumulate_pair(const float *x, const float *z, float a0, float b0, float *y0,
                            float a1, float b1, float *y1, int64_t F) {
    v8 A0 = {a0, a0, a0, a0, a0, a0, a0, a0}, B0 = {b0, b0, b0, b0, b0, b0, b0, b0};
    v8 A1 = {a1, a1, a1, a1, a1, a1, a1, a1}, B1 = {b1, b1, b1, b1, b1, b1, b1, b1};
    int64_t f = 0;
    for (; f + 8 <= F; f += 8) {
        v8 xv = load8(x + f), zv = load8(z + f);
        store8(y0 + f, (load8(y0 + f) + A0 * xv) + B0 * zv);
        if (y1) store8(y1 + f, (load8(y1 + f) + A1 * xv) + B1 * zv);
    }
    for (; f < F; f++) {
        y0[f] = (y0[f] + a0 * x[f]) + b0 * z[f];
        if (y1) y1[f] = (y1[f] + a1 * x[f]) + b1 * z[f];
    }
}

/* logits[c] = x . w[c] + b[c] for every class, classes in pairs (one pass over x each) */
static void head_logits(const float *x, const float *w, const float *b, int64_t F, int64_t C,
                        float *logits) {
    int64_t c = 0;
    for (; c + 2 <= C; c += 2) dots(x, w + c * F, w + (c + 1) * F, F, logits + c, logits + c + 1);
    if (c < C) dots(x, w + c * F, NULL, F, logits + c, NULL);
    for (c = 0; c < C; c++) logits[c] += b[c];
}

/* the row's float32 values: widened into `buffer` from a float16 table, else in place */
static const float *table_row(const void *table, int half, int64_t row, int64_t F,
                              float *buffer) {
    if (!half) return (const float *)table + row * F;
    widen((const uint16_t *)table + row * F, buffer, F);
    return buffer;
}

static void prefetch_row(const void *table, int half, int64_t row, int64_t F) {
    const char *start = (const char *)table + row * F * (half ? 2 : 4);
    for (int64_t o = 0; o < F * (half ? 2 : 4); o += 64) __builtin_prefetch(start + o);
}

/* a row's logits -> its loss term (added to *total) and its logits' gradient (in place) */
static int row_gradient(float *logits, int64_t C, int64_t y, float inv, float *total,
                        float *gb) {
    if (y < 0 || y >= C) return -1;
    float m = logits[0];
    for (int64_t c = 1; c < C; c++) m = logits[c] > m ? logits[c] : m;
    float s = 0.f;
    for (int64_t c = 0; c < C; c++) s += expf(logits[c] - m);
    float lse = m + logf(s);
    *total += lse - logits[y];
    for (int64_t c = 0; c < C; c++) {
        logits[c] = expf(logits[c] - lse) * inv - (c == y ? inv : 0.f);
        gb[c] += logits[c];
    }
    return 0;
}

/* One head: rows two at a time (their logits with each weight vector loaded once, their
   weight-gradient terms added in one pass, in row order: the numbers of one row at a
   time), the pair after next prefetched. `rows_buf`: 2 * F floats, `logits`: 2 * C. */
static int head_step(int64_t R, int64_t F, int64_t C, const void *table, int half,
                     const int64_t *rows, const int64_t *labels, const float *w, const float *b,
                     float *loss, float *gw, float *gb, float *rows_buf, float *logits) {
    memset(gw, 0, sizeof(float) * C * F);
    memset(gb, 0, sizeof(float) * C);
    const float inv = 1.f / (float)R;
    float total = 0.f, *g0 = logits, *g1 = logits + C;
    for (int64_t r = 0; r < R; r += 2) {
        for (int64_t next = r + 2; next < r + 4 && next < R; next++)
            prefetch_row(table, half, rows[next], F);
        const float *x0 = table_row(table, half, rows[r], F, rows_buf);
        if (r + 1 == R) {   /* an odd last row alone */
            head_logits(x0, w, b, F, C, g0);
            if (row_gradient(g0, C, labels[r], inv, &total, gb)) return -1;
            int64_t c = 0;
            for (; c + 2 <= C; c += 2)
                accumulate(x0, g0[c], gw + c * F, g0[c + 1], gw + (c + 1) * F, F);
            if (c < C) accumulate(x0, g0[c], gw + c * F, 0.f, NULL, F);
            break;
        }
        const float *x1 = table_row(table, half, rows[r + 1], F, rows_buf + F);
        head_logits_pair(x0, x1, w, b, F, C, g0, g1);
        if (row_gradient(g0, C, labels[r], inv, &total, gb) ||
            row_gradient(g1, C, labels[r + 1], inv, &total, gb)) return -1;
        int64_t c = 0;
        for (; c + 2 <= C; c += 2)
            accumulate_pair(x0, x1, g0[c], g1[c], gw + c * F, g0[c + 1], g1[c + 1],
                            gw + (c + 1) * F, F);
        if (c < C) accumulate_pair(x0, x1, g0[c], g1[c], gw + c * F, 0.f, 0.f, NULL, F);
    }
    *loss = total / (float)R;
    return 0;
}

/* K heads: rows, labels [K, R]; weight [K, C, F], bias [K, C]; out loss [K], grad_weight
   [K, C, F], grad_bias [K, C]. half: the table [N, F] holds float16, else float32.
   Returns 0, -1 for a label out of range, -2 when out of memory. */
int probe_gradients(int64_t K, int64_t R, int64_t F, int64_t C, const void *table, int half,
                    const int64_t *rows, const int64_t *labels, const float *weight,
                    const float *bias, float *loss, float *grad_weight, float *grad_bias) {
    float *scratch = malloc(sizeof(float) * 2 * (F + C));
    if (!scratch) return -2;
    int status = 0;
    for (int64_t k = 0; k < K && status == 0; k++)
        status = head_step(R, F, C, table, half, rows + k * R, labels + k * R,
                           weight + k * C * F, bias + k * C, loss + k, grad_weight + k * C * F,
                           grad_bias + k * C, scratch, scratch + 2 * F);
    free(scratch);
    return status;
}

/* torch.optim.Adam's step (amsgrad off, weight decay added to the gradient) of n values:
   grad += decay * param; m = lerp(m, grad, 1 - beta1); v = v * beta2 + (1 - beta2) * grad^2;
   param += step_size * m / (sqrt(v) / bias2_sqrt + eps), step_size = -lr / (1 - beta1^t). */
static void adam(int64_t n, float *param, float *grad, float *m, float *v, float decay,
                 float step_size, float bias2_sqrt, float beta1, float beta2, float eps) {
    const float w1 = 1.f - beta1, w2 = 1.f - beta2;
    if (decay != 0.f)
        for (int64_t i = 0; i < n; i++) grad[i] = grad[i] + decay * param[i];
    for (int64_t i = 0; i < n; i++) {
        float g = grad[i];
        m[i] = m[i] + w1 * (g - m[i]);
        v[i] = v[i] * beta2 + w2 * g * g;
        param[i] = param[i] + step_size * m[i] / (sqrtf(v[i]) / bias2_sqrt + eps);
    }
}

/* probe_gradients, then each head's Adam step in place while its gradient is in cache:
   moments m, v [K, C, F] (weight) and mb, vb [K, C] (bias); per head its decay,
   step_size and bias2_sqrt [K]. */
int probe_train(int64_t K, int64_t R, int64_t F, int64_t C, const void *table, int half,
                const int64_t *rows, const int64_t *labels, float *weight, float *bias,
                float *loss, float *m, float *v, float *mb, float *vb, const float *decay,
                const float *step_size, const float *bias2_sqrt, float beta1, float beta2,
                float eps) {
    float *scratch = malloc(sizeof(float) * (2 * F + 2 * C + C * F + C));
    if (!scratch) return -2;
    float *gw = scratch + 2 * F + 2 * C, *gb = gw + C * F;
    int status = 0;
    for (int64_t k = 0; k < K && status == 0; k++) {
        float *w = weight + k * C * F, *b = bias + k * C;
        status = head_step(R, F, C, table, half, rows + k * R, labels + k * R, w, b, loss + k,
                           gw, gb, scratch, scratch + 2 * F);
        adam(C * F, w, gw, m + k * C * F, v + k * C * F, decay[k], step_size[k],
             bias2_sqrt[k], beta1, beta2, eps);
        adam(C, b, gb, mb + k * C, vb + k * C, decay[k], step_size[k], bias2_sqrt[k], beta1,
             beta2, eps);
    }
    free(scratch);
    return status;
}

/* Logits [K, N, C] of K heads on N rows x [N, F] (float16 when half), the training
   step's order; rows in blocks that stay in cache while every head reads them. */
int probe_logits(int64_t K, int64_t N, int64_t F, int64_t C, const void *x, int half,
                 const float *weight, const float *bias, float *out) {
    const int64_t block = 32;
    float *rows = malloc(sizeof(float) * block * F);
    if (!rows) return -2;
    for (int64_t start = 0; start < N; start += block) {
        int64_t n = N - start < block ? N - start : block;
        const float *xs;
        if (half) {
            widen((const uint16_t *)x + start * F, rows, n * F);
            xs = rows;
        } else {
            xs = (const float *)x + start * F;
        }
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = 0; i < n; i++)
                head_logits(xs + i * F, weight + k * C * F, bias + k * C, F, C,
                            out + (k * N + start + i) * C);
    }
    free(rows);
    return 0;
}
