/* json.c: the manifest's JSON reader (json.h). A recursive descent parser
 * over a byte range, strict to RFC 8259 (no comments, no trailing commas, no
 * leading zeros), with every value allocated from one arena so that a failure
 * anywhere frees everything at once, and the arena capped (json.h): a value
 * costs a node of about 90 bytes however few bytes of text it takes ("0,"),
 * so the size of the text alone does not bound the memory. */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* Arena blocks are at least this big; larger requests get a block of their own. */
#define ARENA_BLOCK ((size_t)64 << 10)

typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    max_align_t data[];
} arena_block;

struct symm_json_doc {
    arena_block *blocks;
    symm_json *root;
    size_t allocated;    /* bytes of all blocks */
    size_t budget;       /* the most they may take */
    int over_budget;     /* an allocation was refused for the budget, not by malloc */
};

typedef struct parser {
    const char *p, *end;
    const char *line_start;
    int line;
    int depth;
    symm_json_doc *doc;
    int failed;          /* SYMM_JSON_SYNTAX or SYMM_JSON_NOMEM once something went wrong */
    int err_line, err_col;
    char *why;
    size_t why_size;
} parser;

/* n bytes aligned to align (a power of two): nodes to theirs, text to 1. */
static void *arena_alloc(symm_json_doc *doc, size_t n, size_t align)
{
    if (n > SIZE_MAX / 2)
        return NULL;
    arena_block *b = doc->blocks;
    size_t at = b ? (b->used + align - 1) & ~(align - 1) : 0;
    if (!b || at > b->cap || b->cap - at < n) {
        size_t cap = n > ARENA_BLOCK ? n : ARENA_BLOCK;
        if (doc->allocated > doc->budget || sizeof *b + cap > doc->budget - doc->allocated) {
            doc->over_budget = 1;
            return NULL;
        }
        b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = doc->blocks;
        b->used = 0;
        b->cap = cap;
        doc->blocks = b;
        doc->allocated += sizeof *b + cap;
        at = 0;
    }
    void *r = (unsigned char *)b->data + at;
    b->used = at + n;
    return r;
}

static int column_of(const parser *ps, const char *at)
{
    ptrdiff_t c = at - ps->line_start + 1;
    return c > INT_MAX ? INT_MAX : c < 1 ? 1 : (int)c;
}

static void fail_at(parser *ps, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at(parser *ps, const char *at, const char *fmt, ...)
{
    if (ps->failed)
        return;
    ps->failed = SYMM_JSON_SYNTAX;
    ps->err_line = ps->line;
    ps->err_col = column_of(ps, at);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->why, ps->why_size, fmt, ap);
    va_end(ap);
}

static void out_of_memory(parser *ps)
{
    if (ps->failed)
        return;
    ps->failed = ps->doc->over_budget ? SYMM_JSON_TOO_LARGE : SYMM_JSON_NOMEM;
    ps->err_line = ps->line;
    ps->err_col = column_of(ps, ps->p);
    if (ps->doc->over_budget)
        snprintf(ps->why, ps->why_size, "too many values for a document of its size: reading it would take more "
                 "than %zu MiB (%d bytes for each byte of text, at most %d MiB)", ps->doc->budget >> 20,
                 SYMM_JSON_MEMORY_PER_BYTE, (int)(SYMM_JSON_MAX_MEMORY >> 20));
    else
        snprintf(ps->why, ps->why_size, "out of memory");
}

/* What stands at `at`, for "expected X, got Y". */
static const char *describe(const parser *ps, const char *at, char *buf, size_t n)
{
    if (at >= ps->end)
        return "end of file";
    unsigned char c = (unsigned char)*at;
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, n, "'%c'", c);
    else
        snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r') {
            ps->p++;
        } else if (c == '\n') {
            ps->p++;
            if (ps->line < INT_MAX)
                ps->line++;
            ps->line_start = ps->p;
        } else {
            break;
        }
    }
}

static symm_json *new_value(parser *ps, symm_json_type type, const char *at)
{
    symm_json *v = arena_alloc(ps->doc, sizeof *v, _Alignof(symm_json));
    if (!v) {
        out_of_memory(ps);
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = type;
    v->line = ps->line;
    v->col = column_of(ps, at);
    return v;
}

static int is_digit(const parser *ps, const char *at) { return at < ps->end && *at >= '0' && *at <= '9'; }

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Four hex digits at s (before end), or -1. */
static long hex4(const char *s, const char *end)
{
    if (end - s < 4)
        return -1;
    long v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hex_value(s[i]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

static char *put_utf8(char *d, unsigned long cp)
{
    if (cp < 0x80) {
        *d++ = (char)cp;
    } else if (cp < 0x800) {
        *d++ = (char)(0xc0 | (cp >> 6));
        *d++ = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        *d++ = (char)(0xe0 | (cp >> 12));
        *d++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *d++ = (char)(0x80 | (cp & 0x3f));
    } else {
        *d++ = (char)(0xf0 | (cp >> 18));
        *d++ = (char)(0x80 | ((cp >> 12) & 0x3f));
        *d++ = (char)(0x80 | ((cp >> 6) & 0x3f));
        *d++ = (char)(0x80 | (cp & 0x3f));
    }
    return d;
}

/* A \uXXXX escape at s (just after the 'u'), with its low surrogate when it
 * is a high one. Returns the code point and moves *s past it, or -1. */
static long unicode_escape(parser *ps, const char **s, const char *close)
{
    long cp = hex4(*s, close);
    if (cp < 0) {
        fail_at(ps, *s - 2, "invalid escape: \\u needs four hex digits");
        return -1;
    }
    *s += 4;
    if (cp >= 0xdc00 && cp <= 0xdfff) {
        fail_at(ps, *s - 6, "invalid escape: \\u%04lx is a low surrogate without a high one", cp);
        return -1;
    }
    if (cp < 0xd800 || cp > 0xdbff)
        return cp;
    long lo = close - *s >= 6 && (*s)[0] == '\\' && (*s)[1] == 'u' ? hex4(*s + 2, close) : -1;
    if (lo < 0xdc00 || lo > 0xdfff) {
        fail_at(ps, *s - 6, "invalid escape: \\u%04lx is a high surrogate without a low one after it", cp);
        return -1;
    }
    *s += 6;
    return 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
}

/* The string starting at ps->p (a '"'), decoded into the arena. Decoding
 * never lengthens: an escape of n bytes gives at most n bytes of UTF-8. */
static int parse_string(parser *ps, const char **out, size_t *out_len)
{
    const char *q = ps->p + 1;
    for (;;) {
        if (q >= ps->end) {
            fail_at(ps, q, "end of file inside a string (it starts at column %d)", column_of(ps, ps->p));
            return -1;
        }
        unsigned char c = (unsigned char)*q;
        if (c == '"')
            break;
        if (c < 0x20) {
            fail_at(ps, q, "control character (byte 0x%02x) inside a string: it must be escaped", c);
            return -1;
        }
        q += c == '\\' && q + 1 < ps->end ? 2 : 1;
    }
    char *dst = arena_alloc(ps->doc, (size_t)(q - ps->p), 1);
    if (!dst) {
        out_of_memory(ps);
        return -1;
    }
    char *d = dst;
    for (const char *s = ps->p + 1; s < q;) {
        if (*s != '\\') {
            *d++ = *s++;
            continue;
        }
        char e = s[1];
        s += 2;
        switch (e) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
            long cp = unicode_escape(ps, &s, q);
            if (cp < 0)
                return -1;
            d = put_utf8(d, (unsigned long)cp);
            break;
        }
        default: {
            char what[16];
            fail_at(ps, s - 2, "invalid escape: backslash followed by %s", describe(ps, s - 1, what, sizeof what));
            return -1;
        }
        }
    }
    *d = '\0';
    *out = dst;
    *out_len = (size_t)(d - dst);
    ps->p = q + 1;
    return 0;
}

static void skip_digits(parser *ps)
{
    while (is_digit(ps, ps->p))
        ps->p++;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static symm_json *parse_number(parser *ps)
{
    const char *start = ps->p;
    symm_json *v = new_value(ps, SYMM_JSON_NUMBER, start);
    if (!v)
        return NULL;
    char what[16];
    int negative = *ps->p == '-';
    ps->p += negative;
    if (!is_digit(ps, ps->p)) {
        fail_at(ps, ps->p, "expected a digit after '-', got %s", describe(ps, ps->p, what, sizeof what));
        return NULL;
    }
    if (*ps->p == '0' && is_digit(ps, ps->p + 1)) {
        fail_at(ps, start, "a number may not start with 0 (leading zeros are not JSON)");
        return NULL;
    }
    skip_digits(ps);
    const char *int_end = ps->p;
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (!is_digit(ps, ps->p)) {
            fail_at(ps, ps->p, "expected a digit after '.', got %s", describe(ps, ps->p, what, sizeof what));
            return NULL;
        }
        skip_digits(ps);
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-'))
            ps->p++;
        if (!is_digit(ps, ps->p)) {
            fail_at(ps, ps->p, "expected a digit in the exponent, got %s", describe(ps, ps->p, what, sizeof what));
            return NULL;
        }
        skip_digits(ps);
    }
    size_t len = (size_t)(ps->p - start);
    char *text = arena_alloc(ps->doc, len + 1, 1);
    if (!text) {
        out_of_memory(ps);
        return NULL;
    }
    memcpy(text, start, len);
    text[len] = '\0';
    v->str = text;
    v->len = len;
    if (int_end != ps->p)
        return v;
    /* An integer: its magnitude, overflow-checked against int64. */
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, mag = 0;
    for (const char *s = start + negative; s < int_end; s++) {
        uint64_t digit = (uint64_t)(*s - '0');
        if (mag > (limit - digit) / 10)
            return v;
        mag = mag * 10 + digit;
    }
    v->is_int = 1;
    v->integer = negative ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return v;
}

static symm_json *parse_literal(parser *ps)
{
    static const struct { const char *word; symm_json_type type; int boolean; } words[] = {
        {"true", SYMM_JSON_BOOL, 1}, {"false", SYMM_JSON_BOOL, 0}, {"null", SYMM_JSON_NULL, 0},
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(ps->end - ps->p) >= n && memcmp(ps->p, words[i].word, n) == 0) {
            symm_json *v = new_value(ps, words[i].type, ps->p);
            if (!v)
                return NULL;
            v->boolean = words[i].boolean;
            ps->p += n;
            return v;
        }
    }
    char what[16];
    fail_at(ps, ps->p, "expected a value, got %s", describe(ps, ps->p, what, sizeof what));
    return NULL;
}

static symm_json *parse_value(parser *ps);

/* Adds v after *last under parent. */
static void append(symm_json *parent, symm_json **last, symm_json *v)
{
    if (*last)
        (*last)->next = v;
    else
        parent->first = v;
    *last = v;
    parent->count++;
}

static symm_json *open_container(parser *ps, symm_json_type type)
{
    if (ps->depth >= SYMM_JSON_MAX_DEPTH) {
        fail_at(ps, ps->p, "arrays and objects nested deeper than %d levels", SYMM_JSON_MAX_DEPTH);
        return NULL;
    }
    symm_json *v = new_value(ps, type, ps->p);
    if (!v)
        return NULL;
    ps->depth++;
    ps->p++;
    skip_ws(ps);
    return v;
}

static symm_json *parse_array(parser *ps)
{
    symm_json *arr = open_container(ps, SYMM_JSON_ARRAY), *last = NULL;
    if (!arr)
        return NULL;
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
        ps->depth--;
        return arr;
    }
    for (;;) {
        symm_json *el = parse_value(ps);
        if (!el)
            return NULL;
        append(arr, &last, el);
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == ']')
            break;
        char what[16];
        fail_at(ps, ps->p, "expected ',' or ']' after an array element, got %s", describe(ps, ps->p, what, sizeof what));
        return NULL;
    }
    ps->p++;
    ps->depth--;
    return arr;
}

static int parse_member(parser *ps, symm_json *obj, symm_json **last)
{
    char what[16];
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"') {
        fail_at(ps, ps->p, "expected a string key%s, got %s", obj->count ? "" : " or '}'",
                describe(ps, ps->p, what, sizeof what));
        return -1;
    }
    const char *key;
    size_t key_len;
    if (parse_string(ps, &key, &key_len) != 0)
        return -1;
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != ':') {
        fail_at(ps, ps->p, "expected ':' after key \"%.40s\", got %s", key, describe(ps, ps->p, what, sizeof what));
        return -1;
    }
    ps->p++;
    symm_json *v = parse_value(ps);
    if (!v)
        return -1;
    v->key = key;
    v->key_len = key_len;
    append(obj, last, v);
    return 0;
}

static symm_json *parse_object(parser *ps)
{
    symm_json *obj = open_container(ps, SYMM_JSON_OBJECT), *last = NULL;
    if (!obj)
        return NULL;
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        ps->depth--;
        return obj;
    }
    for (;;) {
        if (parse_member(ps, obj, &last) != 0)
            return NULL;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}')
            break;
        char what[16];
        fail_at(ps, ps->p, "expected ',' or '}' after a member, got %s", describe(ps, ps->p, what, sizeof what));
        return NULL;
    }
    ps->p++;
    ps->depth--;
    return obj;
}

static symm_json *parse_value(parser *ps)
{
    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail_at(ps, ps->p, "expected a value, got end of file");
        return NULL;
    }
    switch (*ps->p) {
    case '{': return parse_object(ps);
    case '[': return parse_array(ps);
    case '"': {
        symm_json *v = new_value(ps, SYMM_JSON_STRING, ps->p);
        if (!v || parse_string(ps, &v->str, &v->len) != 0)
            return NULL;
        return v;
    }
    case '-':
    case '0': case '1': case '2': case '3': case '4':
    case '5': case '6': case '7': case '8': case '9':
        return parse_number(ps);
    default:
        return parse_literal(ps);
    }
}

int symm_json_parse(const char *text, size_t len, symm_json_doc **out, int *line, int *col,
                    char *why, size_t why_size)
{
    *out = NULL;
    symm_json_doc *doc = calloc(1, sizeof *doc);
    if (!doc) {
        snprintf(why, why_size, "out of memory");
        *line = *col = 1;
        return SYMM_JSON_NOMEM;
    }
    size_t budget = len <= (SYMM_JSON_MAX_MEMORY - SYMM_JSON_MEMORY_FLOOR) / SYMM_JSON_MEMORY_PER_BYTE
                        ? len * SYMM_JSON_MEMORY_PER_BYTE + SYMM_JSON_MEMORY_FLOOR
                        : SYMM_JSON_MAX_MEMORY;
    doc->budget = budget;
    parser ps = {.p = text, .end = text + len, .line_start = text, .line = 1, .doc = doc,
                 .why = why, .why_size = why_size};
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        ps.p += 3;
    doc->root = parse_value(&ps);
    if (doc->root) {
        skip_ws(&ps);
        if (ps.p < ps.end) {
            char what[16];
            fail_at(&ps, ps.p, "unexpected %s after the end of the top-level value",
                    describe(&ps, ps.p, what, sizeof what));
        }
    }
    if (ps.failed) {
        *line = ps.err_line;
        *col = ps.err_col;
        symm_json_free(doc);
        return ps.failed;
    }
    *out = doc;
    return SYMM_JSON_OK;
}

const symm_json *symm_json_root(const symm_json_doc *doc) { return doc ? doc->root : NULL; }

void symm_json_free(symm_json_doc *doc)
{
    if (!doc)
        return;
    for (arena_block *b = doc->blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    free(doc);
}

const symm_json *symm_json_member(const symm_json *obj, const char *key, int *count)
{
    const symm_json *found = NULL;
    int n = 0;
    size_t key_len = strlen(key);
    if (obj && obj->type == SYMM_JSON_OBJECT) {
        for (const symm_json *m = obj->first; m; m = m->next) {
            if (m->key_len == key_len && memcmp(m->key, key, key_len) == 0) {
                if (!found)
                    found = m;
                if (n < INT_MAX)
                    n++;
            }
        }
    }
    if (count)
        *count = n;
    return found;
}

const char *symm_json_type_name(symm_json_type type)
{
    switch (type) {
    case SYMM_JSON_NULL: return "null";
    case SYMM_JSON_BOOL: return "a boolean";
    case SYMM_JSON_NUMBER: return "a number";
    case SYMM_JSON_STRING: return "a string";
    case SYMM_JSON_ARRAY: return "an array";
    case SYMM_JSON_OBJECT: return "an object";
    }
    return "a value";
}
