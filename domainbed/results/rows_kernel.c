/* The numbers of a results.jsonl of the usual shape, read in one pass (rows_kernel.py).

   A file of the usual shape (lines.py) has, on every line, the first line's leading
   {"args": {...}, bytes, then "key": value pairs joined by ", " and a closing "}", where
   the first "hparams" key's value is the first line's hparams bytes and every other value
   is a number. This reads exactly that and nothing else: anything it does not know for
   certain to read as json reads it (another separator or whitespace, a key with an escape,
   a control or non-ASCII byte, a repeated key, a number outside JSON's grammar or of 17
   digits or more, a magnitude of 2^53 or more, an overflow or underflow, a line of other
   keys or kinds than the first) declines the whole file, and the Python readers decide.
   Every read stays within the `n` bytes given and the output sizes given. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define EXACT_LIMIT 9007199254740992.0   /* 2^53: a float64 holds every integer below */
#define KIND_INT 1
#define KIND_FLOAT 2
#define KIND_HPARAMS 3
#define KEY_LIMIT 512                    /* keys a line may hold at most */
#define MAX_TOKEN 63                     /* a longer number token declines the file */

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* 10^0 .. 10^22: each one a double exactly */
static const double POWERS_OF_TEN[] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* The float token s[0:len] as strtod reads it (correctly rounded in glibc, as json's
   float() is), or *ok = 0: too long, another locale's decimal point, out of range. */
static double strtod_value(const char *s, int64_t len, int *ok) {
    char buf[MAX_TOKEN + 1];
    *ok = 0;
    if (len > MAX_TOKEN) return 0.0;
    memcpy(buf, s, (size_t)len);
    buf[len] = '\0';
    char *stop = NULL;
    errno = 0;
    double value = strtod(buf, &stop);
    if (stop != buf + len || errno != 0) return 0.0;
    *ok = 1;
    return value;
}

#ifdef __SIZEOF_INT128__
typedef unsigned __int128 wide;

static int bit_length(wide x) {
    uint64_t high = (uint64_t)(x >> 64);
    return high ? 128 - __builtin_clzll(high) : x ? 64 - __builtin_clzll((uint64_t)x) : 0;
}

/* significand * 10^power (power within +-22) rounded to the nearest double, ties to even,
   with integers alone: for a significand of more than 53 bits, where the fast path above
   would round twice. The quotient (or product) is taken with 54 bits or more and what lies
   beyond 53 decides the rounding; *ok = 0 where the numbers do not fit 128 bits. */
static double scaled_exactly(uint64_t significand, int power, int *ok) {
    wide ten_power = 1, quotient, rest = 0;
    int shift = 0;
    for (int i = 0; i < (power < 0 ? -power : power); i++) ten_power *= 10;
    int bits = bit_length(significand), ten_bits = bit_length(ten_power);
    *ok = 0;
    if (power < 0) {
        shift = 54 + ten_bits - bits;   /* (so the quotient has 54 bits or more) */
        if (shift < 0) shift = 0;
        if (bits + shift > 128) return 0.0;
        wide numerator = (wide)significand << shift;
        quotient = numerator / ten_power;
        rest = numerator % ten_power;
    } else {
        if (bits + ten_bits > 127) return 0.0;
        quotient = (wide)significand * ten_power;
    }
    int drop = bit_length(quotient) - 53;
    if (drop <= 0) {   /* (a product of 53 bits or fewer: exact) */
        *ok = 1;
        return ldexp((double)(uint64_t)quotient, -shift);
    }
    uint64_t mantissa = (uint64_t)(quotient >> drop);
    wide dropped = quotient & (((wide)1 << drop) - 1), half = (wide)1 << (drop - 1);
    if (dropped > half || (dropped == half && (rest != 0 || (mantissa & 1)))) {
        if (++mantissa == (1ULL << 53)) {
            mantissa >>= 1;
            drop++;
        }
    }
    *ok = 1;
    return ldexp((double)mantissa, drop - shift);
}
#endif

/* Reads the JSON number at p (within end) in one pass: its kind (KIND_INT, KIND_FLOAT),
   *stop after it and *value, or 0 where no JSON number starts there or it is not read
   exactly: an integer of 17 digits or more, a magnitude of 2^53 or more. A float whose
   significand (at most 19 digits) is at most 2^53 and whose power of ten is within 22 is
   one IEEE operation of two exact doubles, correctly rounded (Clinger's fast path);
   strtod reads the others. */
static int read_number(const char *p, const char *end, const char **stop, double *value) {
    const char *start = p;
    int negative = 0, digits = 0, scale = 0, is_int = 1, exponent = 0;
    uint64_t significand = 0;
    if (p < end && *p == '-') negative = 1, p++;
    if (p >= end) return 0;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        for (; p < end && is_digit(*p); p++, digits++)
            if (digits < 19) significand = significand * 10 + (uint64_t)(*p - '0');
    } else {
        return 0;
    }
    if (p < end && *p == '.') {
        is_int = 0;
        if (++p >= end || !is_digit(*p)) return 0;
        for (; p < end && is_digit(*p); p++) {
            if (digits == 0 && *p == '0') {
                scale++;   /* (a zero before the first significant digit) */
            } else if (++digits <= 19) {
                significand = significand * 10 + (uint64_t)(*p - '0');
                scale++;
            }
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int exponent_negative = 0;
        is_int = 0;
        if (++p < end && (*p == '+' || *p == '-')) exponent_negative = *p++ == '-';
        if (p >= end || !is_digit(*p)) return 0;
        for (; p < end && is_digit(*p); p++)
            if (exponent < 100000) exponent = exponent * 10 + (*p - '0');
        if (exponent_negative) exponent = -exponent;
    }
    *stop = p;
    double result;
    if (is_int) {
        if (digits > 16) return 0;
        result = (double)(negative ? -(int64_t)significand : (int64_t)significand);
    } else {   /* ("-0" is the integer 0 above; "-0.0" is -0.0 here) */
        int power = exponent - scale, ok = 1;
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
        if (digits <= 19 && significand <= (1ULL << 53) && power >= -22 && power <= 22) {
            result = (double)significand;
            result = power < 0 ? result / POWERS_OF_TEN[-power] : result * POWERS_OF_TEN[power];
            if (negative) result = -result;
        } else
#endif
#ifdef __SIZEOF_INT128__
        if (digits <= 19 && significand > 0 && power >= -22 && power <= 22 &&
                (result = scaled_exactly(significand, power, &ok), ok)) {
            if (negative) result = -result;
        } else
#endif
            result = strtod_value(start, p - start, &ok);
        if (!ok) return 0;
    }
    if (!(result < EXACT_LIMIT && result > -EXACT_LIMIT)) return 0;
    *value = result;
    return is_int ? KIND_INT : KIND_FLOAT;
}

static int same_key(const char *a, int64_t a_len, const char *b, int64_t b_len) {
    return a_len == b_len && memcmp(a, b, (size_t)a_len) == 0;
}

/* Rows read (>= 1), or 0: the file is declined. data[0:n] the file; cut: the length of the
   first line's leading {"args": {...}, bytes; hp[0:hp_len]: its hparams object's bytes.
   Out: sizes[0] the keys a line holds (width), sizes[1] the length of `layout`: the first
   line's keys, each followed by a '"', then their kinds (one KIND_* byte each), at most
   max_layout bytes; values[row * width + k] (0 for hparams), max_rows * max_keys of them
   at most. At most max_rows rows and max_keys (<= KEY_LIMIT) keys, else 0. */
int64_t results_rows(const char *data, int64_t n, int64_t cut, const char *hp, int64_t hp_len,
                     int64_t max_rows, int64_t max_keys, int64_t max_layout, int64_t *sizes,
                     char *layout, double *values) {
    int64_t key_spans[2 * KEY_LIMIT];   /* the first line's keys: offset in data, length */
    unsigned char kinds[KEY_LIMIT];     /* and their KIND_* */
    int64_t rows = 0, width = -1, step_key = -1, start = 0, used = 0;
    if (n <= 0 || cut <= 0 || hp_len <= 0 || max_keys > KEY_LIMIT) return 0;
    while (start < n) {
        const char *line = data + start;
        const char *nl = memchr(line, '\n', (size_t)(n - start));
        const char *end = nl ? nl : data + n;
        if (rows >= max_rows || end - line < cut || memcmp(line, data, (size_t)cut) != 0)
            return 0;
        const char *p = line + cut;
        int64_t k = 0;
        for (;;) {
            if (k >= max_keys || p >= end || *p != '"') return 0;
            const char *key = ++p;
            while (p < end && *p != '"') {
                unsigned char c = (unsigned char)*p;
                if (c < 0x20 || c > 0x7e || c == '\\') return 0;
                p++;
            }
            int64_t key_len = p - key;
            if (p + 2 >= end || p[1] != ':' || p[2] != ' ') return 0;
            p += 3;
            if (rows == 0) {
                for (int64_t j = 0; j < k; j++)
                    if (same_key(key, key_len, data + key_spans[2 * j], key_spans[2 * j + 1]))
                        return 0;   /* a repeated key: json keeps the last */
                if (same_key(key, key_len, "args", 4)) return 0;
                if (used + key_len + 1 + k + 1 > max_layout) return 0;   /* (+ k + 1 kinds) */
                memcpy(layout + used, key, (size_t)key_len);
                used += key_len;
                layout[used++] = '"';
                key_spans[2 * k] = key - data;
                key_spans[2 * k + 1] = key_len;
                kinds[k] = same_key(key, key_len, "hparams", 7) ? KIND_HPARAMS : 0;
                if (same_key(key, key_len, "step", 4)) step_key = k;
            } else if (k >= width || !same_key(key, key_len, data + key_spans[2 * k],
                                               key_spans[2 * k + 1])) {
                return 0;
            }
            double *slot = values + rows * width + k;   /* (row 0: from 0, width unknown) */
            if (kinds[k] == KIND_HPARAMS) {
                if (end - p < hp_len || memcmp(p, hp, (size_t)hp_len) != 0) return 0;
                p += hp_len;
                *slot = 0.0;
            } else {
                const char *stop;
                unsigned char kind = (unsigned char)read_number(p, end, &stop, slot);
                if (kind == 0 || (rows == 0 ? (kinds[k] = kind, 0) : kinds[k] != kind)) return 0;
                if (k == step_key && *slot < 0) return 0;
                p = stop;
            }
            k++;
            if (p < end && *p == '}' && p + 1 == end) break;
            if (end - p < 2 || p[0] != ',' || p[1] != ' ') return 0;
            p += 2;
        }
        if (rows == 0) {
            width = k;
            memcpy(layout + used, kinds, (size_t)k);   /* (room kept above) */
            used += k;
        } else if (k != width) {
            return 0;
        }
        rows++;
        start = end - data + 1;
    }
    sizes[0] = width;
    sizes[1] = used;
    return rows;
}
