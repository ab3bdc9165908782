/* The supports of a CPU host's step, compiled: the finite entries of each row of
 * the processed logits, in one pass over their memory.
 *
 * `extraction.extract_on_host` calls it where it is built. Its numpy path, which
 * gives the same arrays (tests/worker/test_extraction_native.py holds them equal), makes
 * a bool per logit (`isfinite`) and reads those again (`flatnonzero`); that was
 * most of the mask's own cost in a CPU step. Here each row is read once, sixteen
 * logits at a time, and only a block that holds a finite logit is looked at one
 * by one: a truncated row is almost all -inf. The GIL is released while it reads.
 * Given the tokens the sampler drew, it also says per row whether the support
 * describes the draw (`HostSupports.drawn`), in the same pass.
 * Side by side: benchmarks/bench_extraction.py --cpu-sections onhost.
 *
 * A logit is finite when its exponent bits are not all ones (IEEE 754: that is
 * infinity or NaN), for float32, float64 and float16 alike; a block holds a finite
 * one when some exponent bit is clear in the OR of its logits' complements (an OR,
 * which the compiler turns into vector instructions).
 *
 * Optional, like _packed_native: setup.py builds it when a C compiler is there.
 * Input it does not take as it is gets None back, and the caller uses numpy.
 */
#include "_native_buffer.h"
#include <stdint.h>

#define BLOCK 16

/* One row type per logit width: the scan, stores and all. */
#define DEFINE_SCAN(NAME, UINT, EXPONENT)                                            \
    static Py_ssize_t NAME(const UINT *row, Py_ssize_t vocab, Py_ssize_t max_size,    \
                           int32_t *ids, UINT *values, Py_ssize_t *count_out)         \
    {                                                                                 \
        Py_ssize_t count = 0, j = 0;                                                  \
        for (; j + BLOCK <= vocab; j += BLOCK) {                                      \
            UINT cleared = 0;  /* exponent bits clear in some logit of the block */  \
            for (int k = 0; k < BLOCK; k++)                                           \
                cleared |= (UINT)~row[j + k];                                         \
            if (!(cleared & EXPONENT))                                                \
                continue;                                                             \
            for (int k = 0; k < BLOCK; k++) {                                         \
                if ((row[j + k] & EXPONENT) != EXPONENT) {                            \
                    if (count < max_size) {                                           \
                        ids[count] = (int32_t)(j + k);                                \
                        if (values)                                                   \
                            values[count] = row[j + k];                               \
                    }                                                                 \
                    count++;                                                          \
                }                                                                     \
            }                                                                         \
        }                                                                             \
        for (; j < vocab; j++) {                                                      \
            if ((row[j] & EXPONENT) != EXPONENT) {                                    \
                if (count < max_size) {                                               \
                    ids[count] = (int32_t)j;                                          \
                    if (values)                                                       \
                        values[count] = row[j];                                       \
                }                                                                     \
                count++;                                                              \
            }                                                                         \
        }                                                                             \
        *count_out = count;                                                           \
        return count <= max_size ? count : 0; /* stored: a row past the limit, none */ \
    }

/* The exponent bits of each float width (all ones: infinity or NaN) */
#define EXPONENT16 0x7c00u
#define EXPONENT32 0x7f800000u
#define EXPONENT64 0x7ff0000000000000ull

DEFINE_SCAN(scan16, uint16_t, EXPONENT16)
DEFINE_SCAN(scan32, uint32_t, EXPONENT32)
DEFINE_SCAN(scan64, uint64_t, EXPONENT64)

/* Whether logit `j` of a row of `itemsize`-byte floats is finite. */
static int finite_at(const char *row, Py_ssize_t itemsize, Py_ssize_t j)
{
    if (itemsize == 4)
        return (((const uint32_t *)row)[j] & EXPONENT32) != EXPONENT32;
    if (itemsize == 8)
        return (((const uint64_t *)row)[j] & EXPONENT64) != EXPONENT64;
    return (((const uint16_t *)row)[j] & EXPONENT16) != EXPONENT16;
}

PyDoc_STRVAR(finite_support_doc,
"finite_support(x, rows, max_size, ids, values, counts, offsets[, tokens, drawn])\n"
"    -> int | None\n\n"
"The finite entries of the rows of `x` (2-D float32, float64 or float16, C order)\n"
"named by `rows` (1-D int64, or None: every row), in order: each row's count into\n"
"`counts` (int32 [R]), its ids ascending into `ids` (int32) and, unless `values`\n"
"is None, its logits into `values` (x's dtype), from `offsets[r]` (int64 [R + 1]);\n"
"a row with more than `max_size` stores none. `ids` and `values` hold at least\n"
"R * min(V, max_size) items. With `tokens` (1-D int64, the token drawn from\n"
"each row of `x`), `drawn` (int64 [R]) gets each row's token where its logit is\n"
"finite and the row within `max_size`, else -1. Returns how many ids were\n"
"stored, or None for arguments it does not take (the caller then uses numpy).");

static PyObject *finite_support(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 && nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "finite_support takes x, rows, max_size, ids, "
                        "values, counts, offsets and, optionally, tokens and drawn");
        return NULL;
    }
    Py_ssize_t max_size = PyLong_AsSsize_t(args[2]);
    if (max_size == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer x, rows = {0}, ids, values = {0}, counts, offsets, tokens = {0}, drawn = {0};
    int have_rows = args[1] != Py_None, have_values = args[4] != Py_None;
    int have_tokens = nargs == 9 && args[7] != Py_None;
    int taken = 0;    /* the arguments are ones it takes: an int comes back */
    Py_ssize_t stored = 0;
    if (max_size < 0 || typed_buffer(args[0], &x, 2, "efd", 0, 0) < 0)
        Py_RETURN_NONE;
    char x_format[2] = {native_format(&x), '\0'};
    if (have_rows && typed_buffer(args[1], &rows, 1, "lq", 8, 0) < 0)
        goto no_rows;
    if (typed_buffer(args[3], &ids, 1, "il", 4, 1) < 0)
        goto no_ids;
    if (have_values && typed_buffer(args[4], &values, 1, x_format, x.itemsize, 1) < 0)
        goto no_values;
    if (typed_buffer(args[5], &counts, 1, "il", 4, 1) < 0)
        goto no_counts;
    if (typed_buffer(args[6], &offsets, 1, "lq", 8, 1) < 0)
        goto no_offsets;
    if (have_tokens && typed_buffer(args[7], &tokens, 1, "lq", 8, 0) < 0)
        goto no_tokens;
    if (have_tokens && typed_buffer(args[8], &drawn, 1, "lq", 8, 1) < 0)
        goto no_drawn;

    Py_ssize_t batch = x.shape[0], vocab = x.shape[1];
    Py_ssize_t n = have_rows ? rows.shape[0] : batch;
    Py_ssize_t width = vocab < max_size ? vocab : max_size;
    const int64_t *row_index = have_rows ? rows.buf : NULL;
    taken = counts.shape[0] == n && offsets.shape[0] == n + 1
            && ids.shape[0] >= n * width
            && (!have_values || values.shape[0] >= n * width)
            && vocab <= INT32_MAX
            && (!have_tokens || (tokens.shape[0] == batch && drawn.shape[0] == n));
    for (Py_ssize_t r = 0; taken && row_index && r < n; r++)
        taken = row_index[r] >= 0 && row_index[r] < batch;
    if (taken) {
        int32_t *count_of = counts.buf;
        int64_t *offset_of = offsets.buf;
        const int64_t *token_of = have_tokens ? tokens.buf : NULL;
        int64_t *drawn_of = have_tokens ? drawn.buf : NULL;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < n; r++) {
            Py_ssize_t source = row_index ? row_index[r] : r, count = 0;
            const char *row = (const char *)x.buf + source * vocab * x.itemsize;
            int32_t *row_ids = (int32_t *)ids.buf + stored;
            offset_of[r] = stored;
            if (x.itemsize == 4)
                stored += scan32((const uint32_t *)row, vocab, max_size, row_ids,
                                 have_values ? (uint32_t *)values.buf + stored : NULL, &count);
            else if (x.itemsize == 8)
                stored += scan64((const uint64_t *)row, vocab, max_size, row_ids,
                                 have_values ? (uint64_t *)values.buf + stored : NULL, &count);
            else
                stored += scan16((const uint16_t *)row, vocab, max_size, row_ids,
                                 have_values ? (uint16_t *)values.buf + stored : NULL, &count);
            count_of[r] = (int32_t)count;
            if (token_of) {
                int64_t token = token_of[source];
                drawn_of[r] = token >= 0 && token < vocab && count <= max_size
                              && finite_at(row, x.itemsize, token) ? token : -1;
            }
        }
        offset_of[n] = stored;
        Py_END_ALLOW_THREADS
    }

    if (have_tokens)
        PyBuffer_Release(&drawn);
no_drawn:
    if (have_tokens)
        PyBuffer_Release(&tokens);
no_tokens:
    PyBuffer_Release(&offsets);
no_offsets:
    PyBuffer_Release(&counts);
no_counts:
    if (have_values)
        PyBuffer_Release(&values);
no_values:
    PyBuffer_Release(&ids);
no_ids:
    if (have_rows)
        PyBuffer_Release(&rows);
no_rows:
    PyBuffer_Release(&x);
    if (!taken)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(stored);
}

static PyMethodDef methods[] = {
    {"finite_support", (PyCFunction)(void (*)(void))finite_support, METH_FASTCALL,
     finite_support_doc},
    {NULL, NULL, 0, NULL},
};

NATIVE_MODULE(_supports_native, "A CPU host's supports, compiled (see extraction.extract_on_host).")
