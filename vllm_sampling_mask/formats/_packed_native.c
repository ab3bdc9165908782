/* The wire's encoders, compiled: `packed-rice-v2` text of a mask (its `data`, or the
 * whole object's JSON, `packed_json`), base85, and the lists format's JSON text of a
 * mask (`lists_json`).
 *
 * The layout is the docstring of vllm_sampling_mask/formats/packed_wire.py; this file
 * writes the same bytes as that module's numpy and plain-Python encoders
 * (tests/formats/test_packed_wire.py holds them equal) in one pass over the tokens and
 * two over the ids, then base85 straight into the str. It exists because the API
 * server encodes every response and stream chunk alone, where numpy's cost per
 * call, or Python's per id, came to 2-3x json's C encoder of the same ids as lists
 * (benchmarks/bench_wire.py).
 *
 * Optional: setup.py builds it when a C compiler is there, and packed_wire falls
 * back to its own encoders when it is not built. Input it does not take as it is
 * (anything but a valid mask) gets None back, and packed_wire's encoder then
 * raises its ValueError naming what is wrong.
 */
#include "_native_buffer.h"
#include <stdint.h>

#define PACKED_FORMAT "packed-rice-v2"    /* packed_wire.PACKED_FORMAT */

static const char ALPHABET[] =
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "abcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~";

/* A bit string, most significant bit of each byte first. */
typedef struct {
    uint8_t *out;
    size_t pos;      /* bytes written */
    uint64_t acc;    /* the last `bits` bits not yet written (higher bits: stale) */
    int bits;        /* 0..7 between calls */
} Bits;

/* `width` (0..32) bits of `value` (below 2**width). */
static inline void put(Bits *b, uint64_t value, int width)
{
    b->acc = (b->acc << width) | value;
    b->bits += width;
    while (b->bits >= 8) {
        b->bits -= 8;
        b->out[b->pos++] = (uint8_t)(b->acc >> b->bits);
    }
}

/* `count` zero bits, then a one bit. */
static inline void put_unary(Bits *b, uint64_t count)
{
    for (; count > 32; count -= 32)
        put(b, 0, 32);
    put(b, 0, (int)count);
    put(b, 1, 1);
}

/* Zero bits up to the next byte boundary. */
static inline void pad(Bits *b)
{
    if (b->bits)
        put(b, 0, 8 - b->bits);
}

static void put_uleb128(Bits *b, uint64_t value)
{
    while (value >= 0x80) {
        b->out[b->pos++] = (uint8_t)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    b->out[b->pos++] = (uint8_t)value;
}

static int bit_length(uint64_t value)
{
    int n = 0;
    for (; value; value >>= 1)
        n++;
    return n;
}

static inline int32_t id_at(const char *ids, Py_ssize_t i)
{
    int32_t value;
    memcpy(&value, ids + 4 * i, 4);      /* a numpy view may be unaligned */
    return value;
}

static inline int64_t offset_at(const char *offsets, Py_ssize_t i)
{
    int64_t value;
    memcpy(&value, offsets + 8 * i, 8);
    return value;
}

/* The base85 text (RFC 1924 alphabet, `base64.b85encode` without padding) of
 * `size` bytes: each 4 as 5 digits, a last group of r bytes as r + 1; between
 * `prefix` and `suffix` (ASCII) when they are given. */
static PyObject *base85_between(const uint8_t *raw, Py_ssize_t size,
                                const char *prefix, const char *suffix)
{
    Py_ssize_t full = size / 4, rest = size % 4;
    size_t before = prefix ? strlen(prefix) : 0, after = suffix ? strlen(suffix) : 0;
    Py_ssize_t digits_len = 5 * full + (rest ? rest + 1 : 0);
    PyObject *text = PyUnicode_New((Py_ssize_t)before + digits_len + (Py_ssize_t)after, 127);
    if (text == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    memcpy(out, prefix ? prefix : "", before);
    out += before;
    for (Py_ssize_t g = 0; g <= full; g++) {
        Py_ssize_t have = g < full ? 4 : rest;
        if (have == 0)
            break;
        uint32_t word = 0;
        for (Py_ssize_t i = 0; i < 4; i++)
            word = (word << 8) | (i < have ? raw[4 * g + i] : 0);
        char digits[5];
        for (int i = 4; i >= 0; i--) {
            digits[i] = ALPHABET[word % 85];
            word /= 85;
        }
        memcpy(out + 5 * g, digits, (size_t)(have == 4 ? 5 : have + 1));
    }
    memcpy(out + digits_len, suffix ? suffix : "", after);
    return text;
}

static PyObject *base85(const uint8_t *raw, Py_ssize_t size)
{
    return base85_between(raw, size, NULL, NULL);
}

PyDoc_STRVAR(b85encode_doc,
"b85encode(raw) -> str: base85 text of a bytes-like object, the characters of\n"
"base64.b85encode(raw) (unpadded).");

static PyObject *b85encode(PyObject *self, PyObject *arg)
{
    Py_buffer raw;
    if (PyObject_GetBuffer(arg, &raw, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *text = base85((const uint8_t *)raw.buf, raw.len);
    PyBuffer_Release(&raw);
    return text;
}

/* The v2 bytes of a valid mask into `b`; 0, or -1 when the mask is not valid
 * (offsets that do not span the ids or go down, a negative id, a support not
 * strictly ascending). `b->out` holds `capacity(n, tokens)` bytes. */
static int encode_v2_bytes(Bits *b, const char *ids, Py_ssize_t n,
                           const char *offsets, Py_ssize_t tokens)
{
    if (offset_at(offsets, 0) != 0 || offset_at(offsets, tokens) != n)
        return -1;
    uint64_t limit = 0;                          /* R: one more than the largest id */
    for (Py_ssize_t t = 0; t < tokens; t++) {
        int64_t start = offset_at(offsets, t), end = offset_at(offsets, t + 1);
        if (end < start || end > n)
            return -1;
        if (end == start)
            continue;
        if (id_at(ids, start) < 0)
            return -1;
        int32_t previous = id_at(ids, start);
        for (int64_t i = start + 1; i < end; i++) {
            int32_t id = id_at(ids, i);
            if (id <= previous)
                return -1;
            previous = id;
        }
        if ((uint64_t)previous + 1 > limit)
            limit = (uint64_t)previous + 1;
    }
    int order = bit_length((uint64_t)(n / tokens)) - 2;     /* g */
    if (order < 0)
        order = 0;
    put_uleb128(b, (uint64_t)order);
    put_uleb128(b, limit);
    uint64_t base = (uint64_t)1 << order;
    for (Py_ssize_t t = 0; t < tokens; t++) {               /* A1 */
        uint64_t v = (uint64_t)(offset_at(offsets, t + 1) - offset_at(offsets, t)) + base;
        put_unary(b, (uint64_t)(bit_length(v) - 1 - order));
    }
    for (Py_ssize_t t = 0; t < tokens; t++) {               /* A2 */
        uint64_t v = (uint64_t)(offset_at(offsets, t + 1) - offset_at(offsets, t)) + base;
        int width = bit_length(v) - 1;
        put(b, v - ((uint64_t)1 << width), width);
    }
    for (int section = 0; section < 2; section++) {        /* A3, then B */
        for (Py_ssize_t t = 0; t < tokens; t++) {
            int64_t start = offset_at(offsets, t), end = offset_at(offsets, t + 1);
            if (end == start)
                continue;
            int rice = bit_length(limit / (uint64_t)(end - start + 1)) - 1;
            if (rice < 0)
                rice = 0;
            uint64_t low = ((uint64_t)1 << rice) - 1;
            int64_t following = 0;               /* the least id the next may be */
            for (int64_t i = start; i < end; i++) {
                int32_t id = id_at(ids, i);
                uint64_t gap = (uint64_t)(id - following);
                following = (int64_t)id + 1;
                if (section == 0)
                    put(b, gap & low, rice);
                else
                    put_unary(b, gap >> rice);
            }
        }
        pad(b);
    }
    return 0;
}

/* Bytes enough for any valid mask of n ids over `tokens` tokens: the header (at
 * most 5 + 5 bytes), A1 and A2 at most 2 x 33 bits a token, A3 at most 31 bits an
 * id, B at most 3 k + 2 bits a token of k ids (its quotients sum to under
 * R / 2**b + k < 2 (k + 1) + k), two paddings. */
static size_t capacity(Py_ssize_t n, Py_ssize_t tokens)
{
    return 16 + ((size_t)66 * tokens + (size_t)31 * n + 7) / 8
              + ((size_t)3 * n + (size_t)2 * tokens + 7) / 8;
}

/* Decimal digits of `value` written at `out`; their count. */
static int put_decimal(char *out, uint64_t value)
{
    char digits[20];
    int n = 0;
    do {
        digits[n++] = (char)('0' + value % 10);
        value /= 10;
    } while (value);
    for (int i = 0; i < n; i++)
        out[i] = digits[n - 1 - i];
    return n;
}

/* The (ids, offsets) arguments of the encoders below as buffers: 1 when both are
 * taken (1-D C-ordered int32 ids and int64 offsets; the caller releases them), 0
 * when one is not (the caller answers None), -1 with TypeError set for a call
 * without two arguments. */
static int mask_buffers(PyObject *const *args, Py_ssize_t nargs, const char *name,
                        Py_buffer *ids, Py_buffer *offsets)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s takes ids and offsets", name);
        return -1;
    }
    if (typed_buffer(args[0], ids, 1, "ilq", 4, 0) < 0)
        return 0;
    if (typed_buffer(args[1], offsets, 1, "ilq", 8, 0) < 0) {
        PyBuffer_Release(ids);
        return 0;
    }
    return 1;
}

/* The packed-rice-v2 text of the mask in `args` (ids, offsets), between `prefix`
 * and `suffix`; when `framed`, the prefix is the packed object's opening up to
 * its `data` string (with the token count) and the suffix closes it. None for
 * arrays it does not take or a mask that is not valid. */
static PyObject *encode_v2_text(PyObject *const *args, Py_ssize_t nargs, const char *name,
                                int framed)
{
    Py_buffer ids, offsets;
    int taken = mask_buffers(args, nargs, name, &ids, &offsets);
    if (taken <= 0)
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = NULL;
    Py_ssize_t n = ids.shape[0], tokens = offsets.shape[0] - 1;
    static const char head[] = "{\"format\":\"" PACKED_FORMAT "\",\"tokens\":";
    char prefix[sizeof head + 32] = "";
    if (framed && tokens >= 0) {
        char *at = prefix + sizeof head - 1;
        memcpy(prefix, head, sizeof head - 1);
        at += put_decimal(at, (uint64_t)tokens);
        memcpy(at, ",\"data\":\"", sizeof ",\"data\":\"");
    }
    const char *suffix = framed ? "\"}" : NULL;
    if (tokens < 0) {
        result = Py_NewRef(Py_None);
    } else if (tokens == 0) {
        result = n == 0 ? base85_between(NULL, 0, prefix, suffix) : Py_NewRef(Py_None);
    } else {
        size_t size = capacity(n, tokens);
        uint8_t *buffer = PyMem_Malloc(size);
        if (buffer == NULL) {
            PyErr_NoMemory();
        } else {
            Bits b = {buffer, 0, 0, 0};
            int status;
            if (n < ((Py_ssize_t)1 << 16)) {     /* a few microseconds: keep the GIL */
                status = encode_v2_bytes(&b, ids.buf, n, offsets.buf, tokens);
            } else {
                Py_BEGIN_ALLOW_THREADS
                status = encode_v2_bytes(&b, ids.buf, n, offsets.buf, tokens);
                Py_END_ALLOW_THREADS
            }
            result = status == 0 ? base85_between(buffer, (Py_ssize_t)b.pos, prefix, suffix)
                                 : Py_NewRef(Py_None);
            PyMem_Free(buffer);
        }
    }
    PyBuffer_Release(&ids);
    PyBuffer_Release(&offsets);
    return result;
}

/* A module function `NAME(ids, offsets)` that answers encode_v2_text's text,
 * `FRAMED` or not, and its docstring `NAME_doc`. */
#define V2_TEXT_FUNCTION(NAME, FRAMED, DOC)                                        \
    PyDoc_STRVAR(NAME##_doc, DOC);                                                 \
    static PyObject *NAME(PyObject *self, PyObject *const *args, Py_ssize_t nargs) \
    {                                                                              \
        return encode_v2_text(args, nargs, #NAME, FRAMED);                         \
    }

V2_TEXT_FUNCTION(encode_v2, 0,
"encode_v2(ids, offsets) -> str | None: the `data` text of the packed-rice-v2\n"
"object of a mask; `ids` the supports' ids back to back (1-D int32, C order),\n"
"`offsets` each token's start and the end (1-D int64, C order, length T + 1).\n"
"None for anything else, and for a mask that is not valid (the caller's own\n"
"encoder says why).")

V2_TEXT_FUNCTION(packed_json, 1,
"packed_json(ids, offsets) -> str | None: the compact JSON text of the whole\n"
"packed-rice-v2 object of a mask, `{\"format\":...,\"tokens\":T,\"data\":...}`\n"
"(what json writes of packed_wire.encode_packed's object); as encode_v2 otherwise.")

PyDoc_STRVAR(lists_json_doc,
"lists_json(ids, offsets) -> str | None: the compact JSON text of a mask's\n"
"supports as lists, `[[3,17],[5]]` (what `json.dumps(mask.token_ids,\n"
"separators=(',', ':'))` writes); `ids` and `offsets` as for encode_v2. None for\n"
"anything else: other arrays, offsets that do not run from 0 to len(ids) without\n"
"going back, a negative id.");

static PyObject *lists_json(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer ids, offsets;
    int taken = mask_buffers(args, nargs, "lists_json", &ids, &offsets);
    if (taken <= 0)
        return taken < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *result = NULL;
    Py_ssize_t n = ids.shape[0], tokens = offsets.shape[0] - 1;
    int valid = tokens >= 0 && offset_at(offsets.buf, 0) == 0
                && offset_at(offsets.buf, tokens) == n;
    for (Py_ssize_t t = 0; valid && t < tokens; t++)
        valid = offset_at(offsets.buf, t) <= offset_at(offsets.buf, t + 1);
    for (Py_ssize_t i = 0; valid && i < n; i++)
        valid = id_at(ids.buf, i) >= 0;
    if (!valid) {
        result = Py_NewRef(Py_None);
    } else {
        /* at most 10 digits and a comma an id; "[]," a token; the outer brackets */
        char *buffer = PyMem_Malloc(11 * (size_t)n + 3 * (size_t)tokens + 2);
        if (buffer == NULL) {
            PyErr_NoMemory();
        } else {
            char *at = buffer;
            *at++ = '[';
            for (Py_ssize_t t = 0; t < tokens; t++) {
                if (t)
                    *at++ = ',';
                *at++ = '[';
                Py_ssize_t end = (Py_ssize_t)offset_at(offsets.buf, t + 1);
                for (Py_ssize_t i = (Py_ssize_t)offset_at(offsets.buf, t); i < end; i++) {
                    at += put_decimal(at, (uint32_t)id_at(ids.buf, i));
                    *at++ = ',';
                }
                if (at[-1] == ',')
                    at--;
                *at++ = ']';
            }
            *at++ = ']';
            result = PyUnicode_DecodeASCII(buffer, at - buffer, NULL);
            PyMem_Free(buffer);
        }
    }
    PyBuffer_Release(&ids);
    PyBuffer_Release(&offsets);
    return result;
}

static PyMethodDef methods[] = {
    {"encode_v2", (PyCFunction)(void (*)(void))encode_v2, METH_FASTCALL, encode_v2_doc},
    {"packed_json", (PyCFunction)(void (*)(void))packed_json, METH_FASTCALL, packed_json_doc},
    {"lists_json", (PyCFunction)(void (*)(void))lists_json, METH_FASTCALL, lists_json_doc},
    {"b85encode", b85encode, METH_O, b85encode_doc},
    {NULL, NULL, 0, NULL},
};

NATIVE_MODULE(_packed_native, "The packed wire's encoder, compiled (see packed_wire).")
