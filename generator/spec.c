/* spec.c: runs a Lua spec in a sandbox, collects its layout { ... } calls,
 * applies -D overrides and defaults, and validates every variant. Every
 * problem is reported, not just the first, in the user's terms:
 *     specs/x.lua:12: variant dsv3: field hidden: got "7168", expected an integer > 0
 *
 * A spec is untrusted input. It gets a fresh _ENV holding only pure functions
 * (no os, io, debug, package, load), a memory cap (our allocator), an
 * instruction cap (a count hook), and a guard on the one library routine
 * that can run for hours in C where the hook cannot see it (pattern
 * matching). All of that runs in a child process that is killed at a
 * deadline (SYMM_SPEC_TIMEOUT), which bounds whatever the caps miss. Values
 * are copied out of Lua at each layout call and sent back to this process,
 * which validates them with the Lua state long gone. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "sg.h"

#define SPEC_MAX_INSTRUCTIONS 200000000LL
#define SPEC_HOOK_EVERY 10000
#define SPEC_MAX_MEMORY_MIB 256
#define SPEC_MAX_FILE_MIB 16
#define SPEC_MAX_VARIANTS 16384
#define KEEP_STRING 128      /* bytes of a string value kept for checks and messages */
#define KEEP_UNKNOWN 16      /* unknown field names kept per variant */
#define SHOW_STRING 48       /* bytes of a string shown in a message */
#define VALUE_BUF 256        /* a formatted value, quotes and escapes included */
#define MESSAGE_MAX 1024     /* bytes of a spec's own error message shown */
/* Nanoseconds of CPU time of a string or utf8 library call, run in C where
 * the count hook cannot see it, charged as one instruction (the Lua VM runs about one
 * instruction in 3 ns here: the budget stands for well under a second of
 * either). */
#define SPEC_NS_PER_INSTRUCTION 3.0
/* Bytes a spec allocates charged as one instruction: one VM instruction can
 * copy a long string (s .. "x"), which a loop repeats at no count. */
#define SPEC_ALLOC_BYTES_PER_INSTRUCTION 16
/* Seconds a spec may run at all, whatever the counts say (SYMM_SPEC_TIMEOUT
 * sets them): the child process that runs it is killed at the deadline. */
#define SPEC_TIMEOUT_DEFAULT 10.0
#define SPEC_TIMEOUT_MIN 0.1
#define SPEC_TIMEOUT_MAX 86400.0
/* What a child may send back: the layout calls of the most variants, each
 * string kept to KEEP_STRING bytes, fit many times over. */
#define SPEC_REPLY_MAX ((size_t)256 << 20)
/* Address space a child may add to what it inherits: the Lua heap's cap and
 * the copies of its layout calls, with room to spare. */
#define SPEC_CHILD_EXTRA_MEMORY ((size_t)1 << 30)
/* Attempts of one pattern match allowed, seconds at worst. */
#define PATTERN_MAX_COST 1.0e9
/* Per-rank receive and combine buffers of the worst case. */
#define BUFFER_BYTES_MAX ((int64_t)1 << 40)

/* Chunk names are "@" MARK index MARK, not the file's path: Lua cuts names
 * longer than 59 characters in its messages ("...long/path.lua:3:"), and the
 * index maps back to the full path. */
#define MARK '\001'

enum field {
    F_NAME, F_HIDDEN, F_TOPK, F_EXPERTS, F_WORLD, F_MAX_TOKENS, F_DTYPE,
    F_COMBINE_DTYPE, F_LAYOUT, F_WEIGHTS, F_CAPACITY, F_ALIGN, F_SMS, F_COMBINE, F_COMBINE_ORDER, F_HOSTS, F_COUNT
};

static const char *const field_names[F_COUNT] = {
    "name", "hidden", "topk", "experts", "world", "max_tokens", "dtype",
    "combine_dtype", "layout", "weights", "capacity", "align", "sms", "combine", "combine_order", "hosts",
};

#define ACCEPTED_FIELDS "name, hidden, topk, experts, world, max_tokens, dtype, " \
                        "combine_dtype, layout, weights, capacity, align, sms, combine, combine_order, hosts"

/* Integer fields and their ranges, checked one field at a time; the checks
 * that combine fields come after (check_combinations). */
static const struct int_rule {
    enum field field;
    int64_t min, max;
    const char *what;
    bool required;
    int64_t fallback;
} int_rules[] = {
    { F_HIDDEN, 1, 1048576, "an integer > 0", true, 0 },
    { F_TOPK, 1, 16, "an integer 1..16", true, 0 },
    { F_EXPERTS, 1, 8192, "an integer 1..8192", true, 0 },
    { F_WORLD, 2, 128, "an integer 2..128", true, 0 },
    { F_MAX_TOKENS, 1, 1048576, "an integer > 0", true, 0 },
    /* Its upper bound is the worst case, checked once that is known. */
    { F_CAPACITY, 1, INT64_MAX, "an integer > 0", false, 0 },
    { F_ALIGN, 1, 4096, "an integer 1..4096", false, 1 },
    { F_SMS, 1, 1024, "an integer 1..1024", false, 24 },
};

/* Indexed by symm_dtype and symm_layout; combine dtypes are the first three. */
static const char *const dtype_names[] = { "bf16", "fp16", "fp32", "fp8_e4m3" };
static const char *const layout_names[] = { "rank", "expert" };
/* Indexed by symm_combine_mode. */
static const char *const combine_names[] = { "push", "pull", "auto" };
/* Indexed by symm_combine_order. */
static const char *const combine_order_names[] = { "rank", "k" };

#define NAME_WHAT "a C identifier (letters, digits and _, not starting with a digit)"

/* Names that cannot prefix generated C and CUDA C++ symbols. */
static const char *const keywords[] = {
    "_Alignas", "_Alignof", "_Atomic", "_BitInt", "_Bool", "_Complex", "_Decimal128",
    "_Decimal32", "_Decimal64", "_Generic", "_Imaginary", "_Noreturn", "_Static_assert",
    "_Thread_local", "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand",
    "bitor", "bool", "break", "case", "catch", "char", "char16_t", "char32_t", "char8_t",
    "class", "co_await", "co_return", "co_yield", "compl", "concept", "const",
    "const_cast", "consteval", "constexpr", "constinit", "continue", "decltype",
    "default", "delete", "do", "double", "dynamic_cast", "else", "enum", "explicit",
    "export", "extern", "false", "float", "for", "friend", "goto", "if", "inline", "int",
    "long", "mutable", "namespace", "new", "noexcept", "not", "not_eq", "nullptr",
    "operator", "or", "or_eq", "private", "protected", "public", "register",
    "reinterpret_cast", "requires", "restrict", "return", "short", "signed", "sizeof",
    "static", "static_assert", "static_cast", "struct", "switch", "template", "this",
    "thread_local", "throw", "true", "try", "typedef", "typeid", "typename", "typeof",
    "typeof_unqual", "union", "unsigned", "using", "virtual", "void", "volatile",
    "wchar_t", "while", "xor", "xor_eq",
};

/* Names that the generated header's includes declare (NAME.h includes
 * <stdint.h> and symm_variant.h, which includes <stddef.h> and <cuda.h>,
 * which includes <stdlib.h>) and that the rules of reserved_name() do not
 * cover. NAME.h declares `typedef struct NAME NAME;`, so a variant of such a
 * name redeclares it as a different kind of thing (or, for a macro, expands
 * it). Taken from glibc with _GNU_SOURCE (the most it declares) and CUDA 12;
 * tests/cpu/test_spec.c checks the list against the headers it compiles with. */
static const char *const stdlib_names[] = {
    "BIG_ENDIAN", "BYTE_ORDER", "EXIT_FAILURE", "EXIT_SUCCESS", "FD_CLR", "FD_ISSET", "FD_SET",
    "FD_SETSIZE", "FD_ZERO", "LITTLE_ENDIAN", "MB_CUR_MAX", "NFDBITS", "PDP_ENDIAN", "RAND_MAX",
    "WCONTINUED", "WEXITED", "WEXITSTATUS", "WIFCONTINUED", "WIFEXITED", "WIFSIGNALED",
    "WIFSTOPPED", "WNOHANG", "WNOWAIT", "WSTOPPED", "WSTOPSIG", "WTERMSIG", "WUNTRACED", "a64l",
    "abort", "abs", "aligned_alloc", "alloca", "arc4random", "arc4random_buf", "arc4random_uniform",
    "at_quick_exit", "atexit", "atof", "atoi", "atol", "atoll", "be16toh", "be32toh", "be64toh",
    "bsearch", "calloc", "canonicalize_file_name", "clearenv", "div", "drand48", "drand48_data",
    "drand48_r", "ecvt", "ecvt_r", "erand48", "erand48_r", "exit", "fcvt", "fcvt_r", "fd_mask",
    "fd_set", "free", "gcvt", "getenv", "getloadavg", "getpt", "getsubopt", "grantpt", "htobe16",
    "htobe32", "htobe64", "htole16", "htole32", "htole64", "initstate", "initstate_r", "jrand48",
    "jrand48_r", "l64a", "labs", "lcong48", "lcong48_r", "ldiv", "le16toh", "le32toh", "le64toh",
    "llabs", "lldiv", "lrand48", "lrand48_r", "malloc", "mblen", "mbstowcs", "mbtowc", "mkdtemp",
    "mkostemp", "mkostemp64", "mkostemps", "mkostemps64", "mkstemp", "mkstemp64", "mkstemps",
    "mkstemps64", "mktemp", "mrand48", "mrand48_r", "nrand48", "nrand48_r", "on_exit",
    "posix_memalign", "posix_openpt", "pselect", "ptsname", "ptsname_r", "putenv", "qecvt",
    "qecvt_r", "qfcvt", "qfcvt_r", "qgcvt", "qsort", "qsort_r", "quick_exit", "rand", "rand_r",
    "random", "random_data", "random_r", "realloc", "reallocarray", "realpath", "rpmatch",
    "secure_getenv", "seed48", "seed48_r", "select", "setenv", "setstate", "setstate_r", "srand",
    "srand48", "srand48_r", "srandom", "srandom_r", "std", "strfromd", "strfromf", "strfromf128",
    "strfromf32", "strfromf32x", "strfromf64", "strfromf64x", "strfroml", "strtod", "strtod_l",
    "strtof", "strtof128", "strtof128_l", "strtof32", "strtof32_l", "strtof32x", "strtof32x_l",
    "strtof64", "strtof64_l", "strtof64x", "strtof64x_l", "strtof_l", "strtol", "strtol_l",
    "strtold", "strtold_l", "strtoll", "strtoll_l", "strtoq", "strtoul", "strtoul_l", "strtoull",
    "strtoull_l", "strtouq", "system", "timespec", "timeval", "u_char", "u_int", "u_long",
    "u_short", "uint", "ulong", "unlockpt", "unsetenv", "ushort", "valloc", "wcstombs", "wctomb",
};
static const char *const stddef_stdint_names[] = {
    "NULL", "PTRDIFF_MAX", "PTRDIFF_MIN", "PTRDIFF_WIDTH", "SIG_ATOMIC_MAX", "SIG_ATOMIC_MIN",
    "SIG_ATOMIC_WIDTH", "SIZE_MAX", "SIZE_WIDTH", "WCHAR_MAX", "WCHAR_MIN", "WCHAR_WIDTH",
    "WINT_MAX", "WINT_MIN", "WINT_WIDTH", "offsetof",
};
static const char *const cuda_names[] = {
    "CIG_DATA_TYPE_D3D12_COMMAND_QUEUE", "CIG_DATA_TYPE_NV_BLOB", "NVCL_CTX_SCHED_AUTO",
    "NVCL_CTX_SCHED_BLOCKING_SYNC", "NVCL_CTX_SCHED_SPIN", "NVCL_CTX_SCHED_YIELD",
    "NVCL_EVENT_SCHED_AUTO", "NVCL_EVENT_SCHED_BLOCKING_SYNC", "NVCL_EVENT_SCHED_SPIN",
    "NVCL_EVENT_SCHED_YIELD", "RESOURCE_ABI_EXTERNAL_BYTES", "RESOURCE_ABI_VERSION",
    "cl_context_flags", "cl_context_flags_enum", "cl_event_flags", "cl_event_flags_enum",
};

/* What NAME.h (templates/variant.h.in) declares besides NAME: functions
 * NAME_SUFFIX (and the types NAME_x_t, NAME_y_t, which the _t rule covers)
 * and macros UPPER_SUFFIX, UPPER the name in capitals. Another variant named
 * like one of them would clash with it in a file that includes both headers. */
static const char *const derived_functions[] = {
    "_desc", "_create", "_destroy", "_dispatch", "_combine", "_recv", "_stats", "_describe", "_profile",
};
static const char *const derived_macros[] = {
    "_HIDDEN", "_TOPK", "_EXPERTS", "_WORLD", "_LOCAL_EXPERTS", "_MAX_TOKENS", "_CAPACITY", "_WEIGHTS",
};

typedef enum raw_kind { RAW_ABSENT, RAW_INT, RAW_FLOAT, RAW_STRING, RAW_BOOL, RAW_OTHER, RAW_LIST } raw_kind;

/* Most elements of a list value (hosts = { ... }) kept; a longer list is
 * "a table". */
#define LIST_MAX SG_MAX_HOSTS

/* A value as the spec wrote it, copied out of Lua. */
typedef struct raw_value {
    raw_kind kind;
    int64_t i;
    double f;
    bool b;
    char *s;            /* RAW_STRING: the first KEEP_STRING bytes, NUL-terminated;
                           RAW_LIST: its integers in decimal, comma-separated */
    size_t len;         /* RAW_STRING: the full length */
    const char *other;  /* RAW_OTHER: "a table", "a function", ... */
} raw_value;

/* One layout { } call. */
typedef struct raw_variant {
    size_t source;      /* index into spec_run.sources */
    int line;
    raw_value field[F_COUNT];
    raw_value unknown[KEEP_UNKNOWN];  /* names of fields that do not exist */
    size_t n_unknown;                 /* all of them, kept or not */
    raw_value positional;             /* the first value given without a field name */
    size_t n_positional;
    bool complete;                    /* its layout call returned (not raised an error) */
} raw_variant;

/* Everything one sg_spec_load owns; the Lua state's allocator data. */
typedef struct spec_run {
    lua_State *L;            /* once created: the allocator charges the budget through it */
    const char *path;        /* the spec, as given */
    char *dir;               /* prefix of sibling modules: "specs/" or "" */
    char **sources;          /* chunk index -> file path; 0 is the spec */
    size_t n_sources;
    const char *text;        /* the spec's source while it is loaded */
    size_t text_len;
    raw_variant *vars;
    size_t n_vars, cap_vars;
    size_t mem_used;
    bool out_of_memory;
    long long instructions;
    bool too_long;
    bool finished;           /* the chunk returned: layout accepts no more calls */
} spec_run;

/* A parsed -D field=value. */
typedef struct override {
    enum field field;
    raw_value value;
    char *origin;            /* "-D hidden=7", for messages */
} override;

/* Marks a module whose chunk is running, so that a cycle is an error. */
static const char module_loading = 0;

/* ------------------------------------------------------------------------
 * Values and their text */

static void raw_free(raw_value *v)
{
    free(v->s);
    memset(v, 0, sizeof *v);
}

static int keep_string(raw_value *out, const char *s, size_t len)
{
    size_t kept = len < KEEP_STRING ? len : KEEP_STRING;
    char *copy = malloc(kept + 1);
    if (!copy)
        return -1;
    memcpy(copy, s, kept);
    copy[kept] = '\0';
    out->kind = RAW_STRING;
    out->s = copy;
    out->len = len;
    return 0;
}

static void raw_variant_free(raw_variant *v)
{
    for (int f = 0; f < F_COUNT; f++)
        raw_free(&v->field[f]);
    for (size_t k = 0; k < v->n_unknown && k < KEEP_UNKNOWN; k++)
        raw_free(&v->unknown[k]);
    raw_free(&v->positional);
    memset(v, 0, sizeof *v);
}

static bool raw_is(const raw_value *v, const char *literal)
{
    size_t n = strlen(literal);
    return v->kind == RAW_STRING && v->len == n && memcmp(v->s, literal, n) == 0;
}

/* type_phrase's answers (numbered on the wire from a spec's process). */
static const char *const other_phrases[] = {
    "a table", "a function", "a userdata", "a coroutine", "nil", "a value",
};

static const char *type_phrase(int type)
{
    switch (type) {
    case LUA_TTABLE: return other_phrases[0];
    case LUA_TFUNCTION: return other_phrases[1];
    case LUA_TUSERDATA: return other_phrases[2];
    case LUA_TLIGHTUSERDATA: return other_phrases[2];
    case LUA_TTHREAD: return other_phrases[3];
    case LUA_TNIL: return other_phrases[4];
    }
    return other_phrases[5];
}

/* Appends to buf (of size VALUE_BUF) as much as fits. */
static void append(char *buf, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append(char *buf, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= VALUE_BUF)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, VALUE_BUF - used, fmt, ap);
    va_end(ap);
}

/* A string as a Lua/C literal, escaped, cut after SHOW_STRING bytes. */
static void quote(char *buf, const char *s, size_t len)
{
    size_t kept = len < KEEP_STRING ? len : KEEP_STRING;
    size_t shown = kept < SHOW_STRING ? kept : SHOW_STRING;
    buf[0] = '\0';
    append(buf, "\"");
    for (size_t i = 0; i < shown; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            append(buf, "\\%c", c);
        else if (c == '\n')
            append(buf, "\\n");
        else if (c == '\t')
            append(buf, "\\t");
        else if (c < 0x20 || c >= 0x7f)
            append(buf, "\\x%02x", c);
        else
            append(buf, "%c", c);
    }
    append(buf, "\"");
    if (len > shown)
        append(buf, "... (%zu bytes)", len);
}

static void format_value(char *buf, const raw_value *v)
{
    buf[0] = '\0';
    switch (v->kind) {
    case RAW_INT: append(buf, "%lld", (long long)v->i); break;
    case RAW_FLOAT:
        /* An integral float in full (2^63 is 9223372036854775808, not 9.2233720368548e+18). */
        if (v->f == floor(v->f) && fabs(v->f) < 1e20)
            append(buf, "%.0f", v->f);
        else
            append(buf, "%.14g", v->f);
        break;
    case RAW_BOOL: append(buf, "%s", v->b ? "true" : "false"); break;
    case RAW_STRING: quote(buf, v->s, v->len); break;
    case RAW_OTHER: append(buf, "%s", v->other); break;
    case RAW_ABSENT: append(buf, "nothing"); break;
    case RAW_LIST:
        append(buf, "{");
        for (const char *p = v->s; *p; p++)
            append(buf, *p == ',' ? ", " : "%c", *p);
        append(buf, "}");
        break;
    }
}

/* Bytes of the UTF-8 sequence at p (before end) that a terminal shows as
 * text: 1..4, or 0 for a control character (C0, DEL, C1) or a byte that
 * does not start a valid sequence (overlong, a surrogate, past U+10FFFF). */
static size_t printable_utf8(const unsigned char *p, const unsigned char *end)
{
    if (*p < 0x80)
        return *p >= 0x20 && *p != 0x7f;
    size_t n = *p >= 0xf0 ? 4 : *p >= 0xe0 ? 3 : *p >= 0xc2 ? 2 : 0;
    if (n == 0 || *p > 0xf4 || (size_t)(end - p) < n)
        return 0;
    uint32_t cp = *p & (0x7f >> n);
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    bool overlong = (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000);
    if (overlong || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x80 && cp < 0xa0))
        return 0;
    return n;
}

char *sg_printable(const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    char *out = malloc((size_t)(end - p) * 4 + 1), *o = out;
    if (!out)
        return NULL;
    while (p < end) {
        size_t n = printable_utf8(p, end);
        if (n == 0) {
            o += sprintf(o, "\\x%02x", *p++);
            continue;
        }
        memcpy(o, p, n);
        o += n;
        p += n;
    }
    *o = '\0';
    return out;
}

bool sg_is_printable(const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *end = p + strlen(s);
    for (size_t n; p < end; p += n)
        if ((n = printable_utf8(p, end)) == 0)
            return false;
    return true;
}

static bool is_identifier(const char *s, size_t len)
{
    if (len == 0 || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
            return false;
    }
    return true;
}

static bool is_keyword(const char *s)
{
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (strcmp(s, keywords[i]) == 0)
            return true;
    return false;
}

static bool in_list(const char *s, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, list[i]) == 0)
            return true;
    return false;
}

#define IN_LIST(s, list) in_list(s, list, sizeof list / sizeof list[0])

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* <stdint.h>'s limits and constant macros: INT8_MAX, UINTMAX_C, INT8_WIDTH, ... */
static bool stdint_macro(const char *s)
{
    bool int_prefix = strncmp(s, "INT", 3) == 0 || strncmp(s, "UINT", 4) == 0;
    return int_prefix && (ends_with(s, "_MAX") || ends_with(s, "_MIN") || ends_with(s, "_C") || ends_with(s, "_WIDTH"));
}

/* The expectation a name breaks when the generated files cannot use it:
 * NAME.h declares the type NAME (and NAME_create, ...) after including
 * <stdint.h>, symm_variant.h, <stddef.h>, <cuda.h> and <stdlib.h>, so the
 * name must not be anything they declare. NULL when the name is usable. */
static const char *reserved_name(const char *s)
{
    if (is_keyword(s))
        return "a name that is not a C or C++ keyword";
    /* The runtime's names (symm_variant.h, symm_world_create, ...) would be
     * shadowed or defined twice by the generated files. */
    if (strncasecmp(s, "symm_", 5) == 0)
        return "a name that does not start with symm_ (the runtime's prefix)";
    if (s[0] == '_')
        return "a name that does not start with _ (reserved at file scope for the compiler and the "
               "C library: __int128, _Float16 and more)";
    if (ends_with(s, "_t"))
        return "a name that does not end in _t (reserved for types: the generated header includes "
               "<stdint.h> and <stddef.h>, which declare int32_t, size_t and more)";
    if (strncmp(s, "cu", 2) == 0 || strncmp(s, "CU", 2) == 0)
        return "a name that does not start with cu or CU (reserved for cuda.h, which the generated "
               "header includes: CUstream, cuInit and more)";
    if (stdint_macro(s) || IN_LIST(s, stddef_stdint_names))
        return "a name that <stddef.h> and <stdint.h> do not define (the generated header includes "
               "them and declares the variant's name as a type)";
    if (IN_LIST(s, stdlib_names))
        return "a name that <stdlib.h> does not declare (the generated header includes it, through "
               "cuda.h, and declares the variant's name as a type)";
    if (IN_LIST(s, cuda_names))
        return "a name that cuda.h does not declare (the generated header includes it and declares "
               "the variant's name as a type)";
    return NULL;
}

/* A field name as shown in a message: bare when it is an identifier. */
static void format_key(char *buf, const raw_value *key)
{
    if (key->len <= SHOW_STRING && is_identifier(key->s, key->len)) {
        buf[0] = '\0';
        append(buf, "%s", key->s);
    } else {
        quote(buf, key->s, key->len);
    }
}

static int field_index(const char *key, size_t len)
{
    for (int f = 0; f < F_COUNT; f++)
        if (strlen(field_names[f]) == len && memcmp(field_names[f], key, len) == 0)
            return f;
    return -1;
}

static char lower(char c) { return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c; }

/* Edit distance with transpositions (optimal string alignment), ignoring case. */
static int edit_distance(const char *a, size_t la, const char *b)
{
    enum { W = 16 };
    size_t lb = strlen(b);
    int d[3][W];
    if (la >= 32 || lb >= W)
        return 99;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int *cur = d[i % 3], *prev = d[(i - 1) % 3], *prev2 = d[(i + 1) % 3];
        cur[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cost = lower(a[i - 1]) != lower(b[j - 1]);
            int best = prev[j - 1] + cost;
            if (prev[j] + 1 < best)
                best = prev[j] + 1;
            if (cur[j - 1] + 1 < best)
                best = cur[j - 1] + 1;
            if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) &&
                lower(a[i - 2]) == lower(b[j - 1]) && prev2[j - 2] + 1 < best)
                best = prev2[j - 2] + 1;
            cur[j] = best;
        }
    }
    return d[la % 3][lb];
}

static bool prefix_of(const char *a, size_t la, const char *b)
{
    if (la > strlen(b))
        return false;
    for (size_t i = 0; i < la; i++)
        if (lower(a[i]) != lower(b[i]))
            return false;
    return true;
}

/* The field a misspelt name most likely meant, or NULL. */
static const char *suggest_field(const char *key, size_t len)
{
    const char *best = NULL;
    int best_d = 3;
    for (int f = 0; f < F_COUNT; f++) {
        int d = edit_distance(key, len, field_names[f]);
        if (d < best_d && d < (int)len) {
            best_d = d;
            best = field_names[f];
        }
    }
    if (best || len < 3)
        return best;
    for (int f = 0; f < F_COUNT; f++) {
        size_t lf = strlen(field_names[f]);
        if (prefix_of(key, len, field_names[f]) ||
            (lf >= 3 && len > lf && prefix_of(field_names[f], lf, key)))
            return field_names[f];
    }
    return NULL;
}

/* "did you mean "hidden"?" or the list of fields, for an unknown name. */
static void unknown_field_advice(char *buf, const char *key, size_t len)
{
    const char *near = suggest_field(key, len);
    buf[0] = '\0';
    if (near)
        append(buf, "unknown field, did you mean \"%s\"?", near);
    else
        append(buf, "unknown field, expected one of " ACCEPTED_FIELDS);
}

/* ------------------------------------------------------------------------
 * Files and chunk names */

/* read_file's answer for a path that is not a regular file (errno values
 * are positive). */
#define NOT_REGULAR (-1)

/* Reads a whole regular file. Returns 0, or an errno value (EFBIG: over the
 * size cap, EISDIR: a directory), or NOT_REGULAR with *kind saying what it
 * is. Opened without blocking and checked on the descriptor: a FIFO, socket
 * or device named as a spec or module is refused, never waited on. */
static int read_file(const char *path, char **text, size_t *len, const char **kind)
{
    const size_t limit = (size_t)SPEC_MAX_FILE_MIB << 20;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return errno;
    struct stat st;
    int err = fstat(fd, &st) != 0 ? errno : 0;
    if (err == 0 && S_ISDIR(st.st_mode))
        err = EISDIR;
    else if (err == 0 && !S_ISREG(st.st_mode)) {
        *kind = S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
              : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
              : "not a regular file";
        err = NOT_REGULAR;
    } else if (err == 0 && (uint64_t)st.st_size > limit)
        err = EFBIG;
    size_t cap = err == 0 ? (size_t)st.st_size + 1 : 0, n = 0;
    char *buf = cap ? malloc(cap) : NULL;
    if (err == 0 && !buf)
        err = ENOMEM;
    /* The size may change while it is read: read to the end, within the cap. */
    while (err == 0) {
        if (n == cap) {
            char *grown = cap > limit ? NULL : realloc(buf, cap * 2);
            if (!grown) {
                err = cap > limit ? EFBIG : ENOMEM;
                break;
            }
            buf = grown;
            cap *= 2;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            err = errno;
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    if (err == 0 && n > limit)
        err = EFBIG;
    if (err != 0) {
        free(buf);
        return err;
    }
    *text = buf;
    *len = n;
    return 0;
}

static void read_error_text(char *buf, int err, const char *kind)
{
    buf[0] = '\0';
    if (err == EFBIG)
        append(buf, "too large for a spec (more than %d MiB)", SPEC_MAX_FILE_MIB);
    else if (err == NOT_REGULAR)
        append(buf, "cannot read: %s, expected a regular file", kind);
    else
        append(buf, "cannot read: %s", strerror(err));
}

/* Takes ownership of path; returns its source index, or -1 (path freed). */
static long add_source(spec_run *run, char *path)
{
    char **grown = realloc(run->sources, (run->n_sources + 1) * sizeof *grown);
    if (!grown) {
        free(path);
        return -1;
    }
    run->sources = grown;
    run->sources[run->n_sources] = path;
    return (long)run->n_sources++;
}

static void chunk_name(char *buf, size_t size, long source)
{
    snprintf(buf, size, "@%c%ld%c", MARK, source, MARK);
}

/* The source index at the start of s (after MARK), or -1; *end is past it. */
static long marker_at(const spec_run *run, const char *s, const char **end)
{
    if (s[0] != MARK)
        return -1;
    char *stop;
    long index = strtol(s + 1, &stop, 10);
    if (stop == s + 1 || *stop != MARK || index < 0 || (size_t)index >= run->n_sources)
        return -1;
    *end = stop + 1;
    return index;
}

static size_t source_of(const spec_run *run, const char *chunkname)
{
    const char *end;
    long index = chunkname[0] == '@' ? marker_at(run, chunkname + 1, &end) : -1;
    return index < 0 ? 0 : (size_t)index;
}

/* A message from Lua (len bytes, NULs included) made presentable: chunk
 * markers replaced by paths, control bytes escaped, one line, at most
 * MESSAGE_MAX bytes of the text. */
static char *expand_message(const spec_run *run, const char *msg, size_t len)
{
    size_t cap = MESSAGE_MAX * 4 + 64, n = 0;
    for (size_t i = 0; i < run->n_sources; i++)
        cap += strlen(run->sources[i]) * 4;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    size_t shown = 0;
    const char *p = msg, *end_of_msg = msg + len;
    if (len == 0 || *p != MARK)
        n += (size_t)snprintf(out, cap, "%s: ", run->path);
    while (p < end_of_msg && shown < MESSAGE_MAX && n + 8 < cap) {
        const char *end;
        long src = marker_at(run, p, &end);
        if (src >= 0) {
            size_t len = strlen(run->sources[src]);
            if (n + len + 8 >= cap)
                break;
            memcpy(out + n, run->sources[src], len);
            n += len;
            p = end;
            continue;
        }
        unsigned char c = (unsigned char)*p++;
        shown++;
        if (c == '\n')
            n += (size_t)snprintf(out + n, cap - n, "\\n");
        else if (c < 0x20 || c == 0x7f)
            n += (size_t)snprintf(out + n, cap - n, "\\x%02x", c);
        else
            out[n++] = (char)c;
    }
    if (p < end_of_msg)
        n += (size_t)snprintf(out + n, cap - n, "...");
    out[n] = '\0';
    return out;
}

/* ------------------------------------------------------------------------
 * The Lua side: limits, layout, require, the sandbox */

static spec_run *run_of(lua_State *L)
{
    void *ud;
    lua_getallocf(L, &ud);
    return ud;
}

static void spec_hook(lua_State *L, lua_Debug *ar);

static double cpu_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *spec_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    spec_run *run = ud;
    size_t old = ptr ? osize : 0; /* without ptr, osize is a type tag */
    /* New bytes count against the instruction budget; past it, the hook
     * raises at the next instruction (lua_sethook may be called from
     * anywhere; the allocation itself goes on). */
    if (nsize > old && run->L && !run->too_long) {
        run->instructions += (long long)((nsize - old) / SPEC_ALLOC_BYTES_PER_INSTRUCTION);
        if (run->instructions > SPEC_MAX_INSTRUCTIONS) {
            run->too_long = true;
            lua_sethook(run->L, spec_hook, LUA_MASKCOUNT, 1);
        }
    }
    if (nsize == 0) {
        free(ptr);
        run->mem_used -= old;
        return NULL;
    }
    if (nsize > old && run->mem_used - old + nsize > ((size_t)SPEC_MAX_MEMORY_MIB << 20)) {
        run->out_of_memory = true;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (!p) {
        run->out_of_memory = true;
        return NULL;
    }
    run->mem_used = run->mem_used - old + nsize;
    return p;
}

/* Past the budget, every instruction raises again: a spec that catches the
 * error with pcall only gets as far as its next instruction. */
static void spec_hook(lua_State *L, lua_Debug *ar)
{
    (void)ar;
    spec_run *run = run_of(L);
    if (!run->too_long) {
        run->instructions += SPEC_HOOK_EVERY;
        if (run->instructions <= SPEC_MAX_INSTRUCTIONS)
            return;
        run->too_long = true;
        lua_sethook(L, spec_hook, LUA_MASKCOUNT, 1);
    }
    lua_pushliteral(L, "spec ran too long");
    lua_error(L);
}

/* Work done in a C loop, where the count hook cannot see it, is charged to
 * the same budget as instructions. */
static void charge(lua_State *L, double work)
{
    spec_run *run = run_of(L);
    if (!run->too_long && work <= (double)(SPEC_MAX_INSTRUCTIONS - run->instructions)) {
        run->instructions += (long long)work;
        return;
    }
    run->too_long = true;
    lua_sethook(L, spec_hook, LUA_MASKCOUNT, 1);
    lua_pushliteral(L, "spec ran too long");
    lua_error(L);
}

/* The innermost Lua function at or above level. */
static bool lua_position(lua_State *L, int level, lua_Debug *ar)
{
    for (; lua_getstack(L, level, ar); level++)
        if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0)
            return true;
    return false;
}

/* Message handler: every error gets the file and line where it happened
 * (error("x", 0) and errors raised in C have none), and no traceback. */
static int spec_msgh(lua_State *L)
{
    int type = lua_type(L, 1);
    size_t len = 0;
    const char *msg;
    if (type == LUA_TSTRING || type == LUA_TNUMBER)
        msg = lua_tolstring(L, 1, &len);
    else
        msg = lua_pushfstring(L, "error raised with %s, expected a message string", type_phrase(type));
    /* The message as a Lua string, all of it (error("a\0b") holds a NUL). */
    int at = lua_gettop(L);
    if (msg[0] == MARK)
        return 1;
    lua_Debug ar;
    if (lua_position(L, 1, &ar))
        lua_pushfstring(L, "%s:%d: ", ar.short_src, ar.currentline);
    else
        lua_pushfstring(L, "%c0%c: ", MARK, MARK);
    lua_pushvalue(L, at);
    lua_concat(L, 2);
    return 1;
}

/* A table that is a sequence of at most LIST_MAX integers (integral floats
 * included) and nothing else becomes a RAW_LIST; any other table is left
 * for copy_value to call "a table". Raw accesses only: no metamethod of the
 * spec runs. -1: out of memory. */
static int copy_list(lua_State *L, int idx, raw_value *out)
{
    idx = lua_absindex(L, idx);
    lua_Unsigned n = lua_rawlen(L, idx);
    if (n > LIST_MAX)
        return 0;
    size_t keys = 0;
    lua_pushnil(L);
    while (lua_next(L, idx) != 0) {
        keys++;
        lua_pop(L, 1);
    }
    if (keys != n)
        return 0;
    char text[LIST_MAX * 22 + 1] = "";
    size_t used = 0;
    for (lua_Unsigned i = 1; i <= n; i++) {
        lua_rawgeti(L, idx, (lua_Integer)i);
        lua_Integer x = 0;
        bool integral = lua_isinteger(L, -1);
        if (integral) {
            x = lua_tointeger(L, -1);
        } else if (lua_type(L, -1) == LUA_TNUMBER) {
            double f = lua_tonumber(L, -1);
            integral = isfinite(f) && f == floor(f) && fabs(f) < 9.0e18;
            x = integral ? (lua_Integer)f : 0;
        }
        lua_pop(L, 1);
        if (!integral)
            return 0;
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%lld", i > 1 ? "," : "", (long long)x);
    }
    if (used > KEEP_STRING)
        return 0;
    if (keep_string(out, text, used) != 0)
        return -1;
    out->kind = RAW_LIST;
    return 0;
}

static int copy_value(lua_State *L, int idx, raw_value *out)
{
    memset(out, 0, sizeof *out);
    int type = lua_type(L, idx);
    if (type == LUA_TNUMBER && lua_isinteger(L, idx)) {
        out->kind = RAW_INT;
        out->i = (int64_t)lua_tointeger(L, idx);
    } else if (type == LUA_TNUMBER) {
        out->kind = RAW_FLOAT;
        out->f = (double)lua_tonumber(L, idx);
    } else if (type == LUA_TBOOLEAN) {
        out->kind = RAW_BOOL;
        out->b = lua_toboolean(L, idx);
    } else if (type == LUA_TSTRING) {
        size_t len;
        const char *s = lua_tolstring(L, idx, &len);
        return keep_string(out, s, len);
    } else if (type == LUA_TTABLE && copy_list(L, idx, out) != 0) {
        return -1;
    } else if (out->kind != RAW_LIST) {
        out->kind = RAW_OTHER;
        out->other = type_phrase(type);
    }
    return 0;
}

/* One key/value pair of a layout table (key at -2, value at -1) that is not
 * a field. Keys are read without conversion, so lua_next stays valid. */
static int record_stray_key(lua_State *L, raw_variant *v)
{
    if (lua_type(L, -2) != LUA_TSTRING)
        return v->n_positional++ == 0 ? copy_value(L, -1, &v->positional) : 0;
    size_t len;
    const char *key = lua_tolstring(L, -2, &len);
    if (field_index(key, len) >= 0)
        return 0;
    if (v->n_unknown < KEEP_UNKNOWN && keep_string(&v->unknown[v->n_unknown], key, len) != 0)
        return -1;
    v->n_unknown++;
    return 0;
}

/* Reads the fields of layout's table (1) into slot (2) of run->vars. */
static int read_layout(lua_State *L)
{
    spec_run *run = run_of(L);
    size_t slot = (size_t)lua_tointeger(L, 2);
    lua_settop(L, 1);
    lua_pushnil(L);
    while (lua_next(L, 1) != 0) {
        if (record_stray_key(L, &run->vars[slot]) != 0)
            return luaL_error(L, "layout: out of memory");
        lua_pop(L, 1);
    }
    /* Fields are read through __index, so a table may inherit them. */
    for (int f = 0; f < F_COUNT; f++) {
        if (lua_getfield(L, 1, field_names[f]) != LUA_TNIL &&
            copy_value(L, -1, &run->vars[slot].field[f]) != 0)
            return luaL_error(L, "layout: out of memory");
        lua_pop(L, 1);
    }
    return 0;
}

/* layout { field = value, ... }: records the fields as they are now and
 * the line of the call. Everything it allocates belongs to run at once, so
 * a Lua error at any point leaks nothing. A call that raised an error (a
 * field's __index did, and the spec caught it with pcall) declares nothing. */
static int spec_layout(lua_State *L)
{
    spec_run *run = run_of(L);
    if (run->finished)
        return luaL_error(L, "layout: called after the spec finished");
    if (lua_type(L, 1) != LUA_TTABLE)
        return luaL_error(L, "layout: expected a table of fields, got %s", luaL_typename(L, 1));
    if (run->n_vars == SPEC_MAX_VARIANTS)
        return luaL_error(L, "layout: more than %d variants in one spec", SPEC_MAX_VARIANTS);
    if (run->n_vars == run->cap_vars) {
        size_t cap = run->cap_vars ? run->cap_vars * 2 : 16;
        raw_variant *grown = realloc(run->vars, cap * sizeof *grown);
        if (!grown)
            return luaL_error(L, "layout: out of memory");
        run->vars = grown;
        run->cap_vars = cap;
    }
    /* Reading a field may run __index that calls layout again and moves
     * run->vars: the slot is found by index every time. */
    size_t slot = run->n_vars++;
    raw_variant *v = &run->vars[slot];
    memset(v, 0, sizeof *v);
    lua_Debug ar;
    if (lua_position(L, 1, &ar)) {
        v->line = ar.currentline;
        v->source = source_of(run, ar.source);
    }
    lua_settop(L, 1);
    lua_pushcfunction(L, read_layout);
    lua_pushvalue(L, 1);
    lua_pushinteger(L, (lua_Integer)slot);
    /* No message handler: the error goes on as it was raised. Calls nested
     * in this one that returned keep their slots; this one is dropped when
     * the spec has finished, or now if it is the last. */
    if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
        raw_variant_free(&run->vars[slot]);
        if (slot + 1 == run->n_vars)
            run->n_vars--;
        return lua_error(L);
    }
    run->vars[slot].complete = true;
    return 0;
}

static bool is_module_name(const char *s, size_t len)
{
    if (len == 0 || len > 64)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9')))
            return false;
    return true;
}

/* A spec file's text as a chunk; a UTF-8 byte order mark at its start is
 * skipped, as Lua's own file loader does. */
static int load_text(lua_State *L, const char *text, size_t len, const char *chunk)
{
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) {
        text += 3;
        len -= 3;
    }
    return luaL_loadbufferx(L, text, len, chunk, "t");
}

/* Compiles <dir>/<name>.lua and runs it in the sandbox; leaves its result on
 * top. Upvalues of require: 1 the sandbox _ENV, 2 the loaded modules. */
static int run_module(lua_State *L, spec_run *run, const char *name)
{
    size_t plen = strlen(run->dir) + strlen(name) + 5;
    char *path = malloc(plen);
    if (!path)
        return luaL_error(L, "require \"%s\": out of memory", name);
    snprintf(path, plen, "%s%s.lua", run->dir, name);
    long source = add_source(run, path);
    if (source < 0)
        return luaL_error(L, "require \"%s\": out of memory", name);
    char *text;
    size_t len;
    const char *kind = NULL;
    int err = read_file(path, &text, &len, &kind);
    if (err == ENOENT)
        return luaL_error(L, "require \"%s\": no file %s.lua next to the spec", name, name);
    if (err != 0) {
        char why[VALUE_BUF];
        read_error_text(why, err, kind);
        return luaL_error(L, "require \"%s\": %s: %s", name, path, why);
    }
    char chunk[32];
    chunk_name(chunk, sizeof chunk, source);
    int st = load_text(L, text, len, chunk);
    free(text);
    if (st != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        if (msg && msg[0] == MARK)
            return lua_error(L);
        return luaL_error(L, "require \"%s\": %s", name, msg ? msg : "cannot load");
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_setupvalue(L, -2, 1);
    lua_pushcfunction(L, spec_msgh);
    lua_insert(L, -2);
    st = lua_pcall(L, 0, 1, -2);
    if (st != LUA_OK) {
        /* Forget the mark, so a pcall'd require of it later says why again. */
        lua_pushvalue(L, 1);
        lua_pushnil(L);
        lua_rawset(L, lua_upvalueindex(2));
        return lua_error(L);
    }
    return 1;
}

/* require "name": only <directory of the spec>/<name>.lua, cached. */
static int spec_require(lua_State *L)
{
    spec_run *run = run_of(L);
    if (lua_type(L, 1) != LUA_TSTRING)
        return luaL_error(L, "require: expected a module name of letters, digits and _, got %s",
                          luaL_typename(L, 1));
    size_t len;
    const char *name = lua_tolstring(L, 1, &len);
    if (!is_module_name(name, len)) {
        char shown[VALUE_BUF];
        quote(shown, name, len);
        return luaL_error(L, "require %s: expected a module name of letters, digits and _", shown);
    }
    lua_settop(L, 1);
    lua_pushvalue(L, 1);
    if (lua_rawget(L, lua_upvalueindex(2)) != LUA_TNIL) {
        if (lua_touserdata(L, -1) == &module_loading)
            return luaL_error(L, "require \"%s\": circular require (%s.lua is still loading)", name, name);
        return 1;
    }
    lua_pop(L, 1);
    lua_pushvalue(L, 1);
    lua_pushlightuserdata(L, (void *)&module_loading);
    lua_rawset(L, lua_upvalueindex(2));
    run_module(L, run, name);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 1);
    }
    lua_pushvalue(L, 1);
    lua_pushvalue(L, -2);
    lua_rawset(L, lua_upvalueindex(2));
    return 1;
}

/* Worst-case attempts of Lua's backtracking matcher. With q items under *,
 * + or - (or %b) and a subject of n bytes, the matcher can try every way of
 * sharing the subject among them, C(n + q, q); each ? doubles that, and an
 * unanchored search starts at each of n + 1 positions. Coarse on purpose. */
static double pattern_cost(const char *p, size_t plen, size_t n, bool can_anchor)
{
    size_t i = 0;
    int quantified = 0, optional = 0;
    bool anchored = can_anchor && plen > 0 && p[0] == '^';
    if (anchored)
        i = 1;
    while (i < plen) {
        char c = p[i];
        if (c == '(' || c == ')' || (c == '$' && i + 1 == plen)) {
            i++;
            continue;
        }
        if (c == '%' && i + 1 < plen && p[i + 1] == 'b') {
            quantified++;
            i += 4;
            continue;
        }
        if (c == '%' && i + 1 < plen && p[i + 1] == 'f') {
            i += 2;
            c = i < plen ? p[i] : '\0';
        }
        if (c == '[') {
            i++;
            if (i < plen && p[i] == '^')
                i++;
            do {
                i += (i < plen && p[i] == '%') ? 2 : 1;
            } while (i < plen && p[i] != ']');
            i++;
        } else {
            i += c == '%' ? 2 : 1;
        }
        if (i < plen && (p[i] == '*' || p[i] == '+' || p[i] == '-')) {
            quantified++;
            i++;
        } else if (i < plen && p[i] == '?') {
            optional++;
            i++;
        }
    }
    double cost = anchored ? 1.0 : (double)n + 1.0;
    for (int k = 1; k <= quantified; k++)
        cost = cost * ((double)n + k) / k;
    return cost * pow(2.0, optional);
}

/* string.find/match/gmatch/gsub: refuses matches that could run for hours
 * in C (upvalue 1: the library function, 2: its name). */
static int guarded_pattern(lua_State *L)
{
    const char *fn = lua_tostring(L, lua_upvalueindex(2));
    bool find = strcmp(fn, "find") == 0, plain = find && lua_toboolean(L, 4);
    if (lua_type(L, 1) == LUA_TSTRING && lua_type(L, 2) == LUA_TSTRING && !plain) {
        size_t n, plen;
        lua_tolstring(L, 1, &n);
        const char *p = lua_tolstring(L, 2, &plen);
        if (pattern_cost(p, plen, n, strcmp(fn, "gmatch") != 0) > PATTERN_MAX_COST)
            return luaL_error(L, "string.%s: pattern too costly for a spec over %d bytes "
                              "(it could backtrack for hours); use fewer repetitions or a shorter string",
                              fn, (int)n);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* An integer argument, or fallback when it is absent or not an integer
 * (the library function then reports it). */
static lua_Integer int_arg(lua_State *L, int idx, lua_Integer fallback)
{
    int ok;
    lua_Integer n = lua_tointegerx(L, idx, &ok);
    return ok ? n : fallback;
}

/* Elements a table.* call walks in C. With a __len, or an __index and
 * __newindex that are C functions, a tiny table can claim 2^62 of them and
 * the loop runs for years without one instruction; without a metatable the
 * elements are real, so memory bounds the loop (table.move excepted: nils
 * cost nothing). #t is taken only where the call takes it too (__len runs
 * once more than it would unguarded). */
static double table_work(lua_State *L, const char *fn)
{
    if (strcmp(fn, "move") == 0)
        return (double)int_arg(L, 3, 0) - (double)int_arg(L, 2, 1) + 1.0;
    if (strcmp(fn, "concat") == 0 && !lua_isnoneornil(L, 4))
        return (double)int_arg(L, 4, 0) - (double)int_arg(L, 3, 1) + 1.0;
    bool with_pos = strcmp(fn, "insert") == 0 ? lua_gettop(L) == 3 : !lua_isnoneornil(L, 2);
    if ((strcmp(fn, "insert") == 0 || strcmp(fn, "remove") == 0) && !with_pos)
        return 0; /* at the end: one element */
    if (!lua_getmetatable(L, 1))
        return 0;
    lua_pop(L, 1);
    double n = (double)luaL_len(L, 1);
    if (strcmp(fn, "sort") == 0)
        return n > 0 ? n * (log2(n) + 1.0) : 0;
    if (strcmp(fn, "concat") == 0)
        return n - (double)int_arg(L, 3, 1) + 1.0;
    return n - (double)int_arg(L, 2, 1) + 1.0;
}

/* table.move/insert/remove/sort/concat: charges the C loop (upvalue 1: the
 * library function, 2: its name). */
static int guarded_table(lua_State *L)
{
    const char *fn = lua_tostring(L, lua_upvalueindex(2));
    int top = lua_gettop(L);
    double work = table_work(L, fn);
    if (work > 0)
        charge(L, work);
    lua_settop(L, top);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* string.rep of an empty string and separator loops n times in C to build
 * "": answered here instead, for any count the library takes (an integer,
 * or a float or string holding one). */
static int guarded_rep(lua_State *L)
{
    size_t len = 1, sep_len = 0;
    if (lua_type(L, 1) == LUA_TSTRING)
        lua_tolstring(L, 1, &len);
    if (lua_type(L, 3) == LUA_TSTRING)
        lua_tolstring(L, 3, &sep_len);
    else if (!lua_isnoneornil(L, 3))
        sep_len = 1;
    int count_ok = 0;
    lua_tointegerx(L, 2, &count_ok);
    if (len == 0 && sep_len == 0 && count_ok) {
        lua_pushliteral(L, "");
        return 1;
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* setmetatable without __gc: Lua runs finalizers with hooks off, so a
 * finalizer's loop would escape the instruction limit (upvalue 1: the base
 * library's setmetatable). */
static int guarded_setmetatable(lua_State *L)
{
    if (lua_type(L, 2) == LUA_TTABLE) {
        lua_pushliteral(L, "__gc");
        if (lua_rawget(L, 2) != LUA_TNIL)
            return luaL_error(L, "setmetatable: a spec cannot use __gc (finalizers run outside "
                              "the spec's instruction limit)");
        lua_pop(L, 1);
    }
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

/* Opens a library and leaves a copy of its table on top, without leave_out. */
static void copy_library(lua_State *L, const char *name, lua_CFunction open, const char *leave_out)
{
    luaL_requiref(L, name, open, 0);
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, -3) != 0) {
        if (leave_out && lua_type(L, -2) == LUA_TSTRING && strcmp(lua_tostring(L, -2), leave_out) == 0) {
            lua_pop(L, 1);
            continue;
        }
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, -4);
    }
    lua_remove(L, -2);
}

/* Any string or utf8 library function (upvalue 1), its time charged to the
 * instruction budget: one call is bounded (guarded_pattern, guarded_rep,
 * the memory limit), but a loop of few instructions could repeat a long one
 * for hours (a backtracking find on a long string, a scan of 64 MiB). With
 * upvalue 2 true (gmatch, utf8.codes), the iterator it returns is timed too. */
static int timed_call(lua_State *L)
{
    const double t0 = cpu_seconds();
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    const double spent_ns = (cpu_seconds() - t0) * 1e9;
    if (lua_toboolean(L, lua_upvalueindex(2)) && lua_type(L, 1) == LUA_TFUNCTION) {
        lua_pushvalue(L, 1);
        lua_pushboolean(L, 0);
        lua_pushcclosure(L, timed_call, 2);
        lua_replace(L, 1);
    }
    charge(L, spent_ns / SPEC_NS_PER_INSTRUCTION);
    return lua_gettop(L);
}

/* Wraps every function of the library table on top in timed_call. */
static void time_library(lua_State *L)
{
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        if (lua_type(L, -1) == LUA_TFUNCTION && lua_type(L, -2) == LUA_TSTRING) {
            const char *name = lua_tostring(L, -2);
            lua_pushboolean(L, strcmp(name, "gmatch") == 0 || strcmp(name, "codes") == 0);
            lua_pushcclosure(L, timed_call, 2);
            lua_pushvalue(L, -2);
            lua_insert(L, -2);
            lua_rawset(L, -4);
        } else {
            lua_pop(L, 1);
        }
    }
}

static void sandbox_string(lua_State *L)
{
    static const char *const matchers[] = { "find", "match", "gmatch", "gsub" };
    copy_library(L, LUA_STRLIBNAME, luaopen_string, "dump");
    for (size_t i = 0; i < sizeof matchers / sizeof matchers[0]; i++) {
        lua_getfield(L, -1, matchers[i]);
        lua_pushstring(L, matchers[i]);
        lua_pushcclosure(L, guarded_pattern, 2);
        lua_setfield(L, -2, matchers[i]);
    }
    lua_getfield(L, -1, "rep");
    lua_pushcclosure(L, guarded_rep, 1);
    lua_setfield(L, -2, "rep");
    time_library(L);
    /* ("").dump must not reach the real string table either. */
    lua_pushliteral(L, "");
    lua_getmetatable(L, -1);
    lua_pushvalue(L, -3);
    lua_setfield(L, -2, "__index");
    lua_pop(L, 2);
}

/* The spec's _ENV, left on top. */
static void build_env(lua_State *L, spec_run *run)
{
    static const char *const base[] = {
        "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "rawequal",
        "rawget", "rawlen", "rawset", "select", "setmetatable", "tonumber", "tostring",
        "type", "xpcall", "_VERSION",
    };
    luaL_requiref(L, LUA_GNAME, luaopen_base, 0);
    lua_newtable(L);
    int env = lua_gettop(L);
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) {
        lua_getfield(L, env - 1, base[i]);
        lua_setfield(L, env, base[i]);
    }
    sandbox_string(L);
    lua_setfield(L, env, "string");
    static const char *const looping[] = { "move", "insert", "remove", "sort", "concat" };
    copy_library(L, LUA_TABLIBNAME, luaopen_table, NULL);
    for (size_t i = 0; i < sizeof looping / sizeof looping[0]; i++) {
        lua_getfield(L, -1, looping[i]);
        lua_pushstring(L, looping[i]);
        lua_pushcclosure(L, guarded_table, 2);
        lua_setfield(L, -2, looping[i]);
    }
    lua_setfield(L, env, "table");
    lua_getfield(L, env - 1, "setmetatable");
    lua_pushcclosure(L, guarded_setmetatable, 1);
    lua_setfield(L, env, "setmetatable");
    copy_library(L, LUA_MATHLIBNAME, luaopen_math, NULL);
    /* Same spec, same numbers: generation is deterministic. */
    lua_getfield(L, -1, "randomseed");
    lua_pushinteger(L, 0);
    lua_call(L, 1, 0);
    lua_setfield(L, env, "math");
    copy_library(L, LUA_UTF8LIBNAME, luaopen_utf8, NULL);
    time_library(L);
    lua_setfield(L, env, "utf8");
    lua_pushcfunction(L, spec_layout);
    lua_setfield(L, env, "layout");

    lua_pushvalue(L, env);
    lua_newtable(L);
    /* A spec requiring itself by name is a cycle, not a second run. */
    const char *base_name = strrchr(run->path, '/') ? strrchr(run->path, '/') + 1 : run->path;
    size_t blen = strlen(base_name);
    if (blen > 4 && strcmp(base_name + blen - 4, ".lua") == 0 && is_module_name(base_name, blen - 4)) {
        lua_pushlstring(L, base_name, blen - 4);
        lua_pushlightuserdata(L, (void *)&module_loading);
        lua_rawset(L, -3);
    }
    lua_pushcclosure(L, spec_require, 2);
    lua_setfield(L, env, "require");
    lua_pushvalue(L, env);
    lua_setfield(L, env, LUA_GNAME);
    lua_remove(L, env - 1);
}

static double spec_timeout(void);

static void report_too_long(const spec_run *run, sg_diag *diag)
{
    sg_diag_add(diag, "%s: spec ran too long (more than %lld instructions, with the time of string functions "
                "and the bytes allocated counted in, or more than %g s; SYMM_SPEC_TIMEOUT sets the seconds)",
                run->path, SPEC_MAX_INSTRUCTIONS, spec_timeout());
}

static int run_protected(lua_State *L)
{
    spec_run *run = run_of(L);
    build_env(L, run);
    const char *text = run->text;
    size_t len = run->text_len;
    /* A "#!" first line is skipped like lua does, its newline kept for line numbers. */
    if (len > 0 && text[0] == '#')
        while (len > 0 && *text != '\n') {
            text++;
            len--;
        }
    char chunk[32];
    chunk_name(chunk, sizeof chunk, 0);
    if (load_text(L, text, len, chunk) != LUA_OK)
        return lua_error(L);
    lua_pushvalue(L, -2);
    lua_setupvalue(L, -2, 1);
    lua_call(L, 0, 0);
    return 0;
}

/* Runs the spec; its layout calls end up in run->vars. */
static int run_spec(spec_run *run, sg_diag *diag)
{
    lua_State *L = lua_newstate(spec_alloc, run);
    if (!L) {
        sg_diag_add(diag, "%s: out of memory", run->path);
        return -1;
    }
    run->L = L;
    lua_sethook(L, spec_hook, LUA_MASKCOUNT, SPEC_HOOK_EVERY);
    lua_pushcfunction(L, spec_msgh);
    lua_pushcfunction(L, run_protected);
    int st = lua_pcall(L, 0, 0, 1);
    char *msg = NULL;
    bool oom = st == LUA_ERRMEM;
    if (st != LUA_OK && !oom) {
        size_t len = 0;
        const char *m = lua_tolstring(L, -1, &len);
        oom = run->out_of_memory && (!m || ends_with(m, "not enough memory"));
        msg = oom ? NULL : m ? expand_message(run, m, len) : expand_message(run, "unknown error", 13);
        oom = oom || !msg;
    }
    run->finished = true;
    run->L = NULL;
    lua_close(L);
    if (run->too_long)
        report_too_long(run, diag);
    else if (oom)
        sg_diag_add(diag, "%s: out of memory (a spec may use at most %d MiB)", run->path,
                    SPEC_MAX_MEMORY_MIB);
    else if (msg)
        sg_diag_add(diag, "%s", msg);
    free(msg);
    return st == LUA_OK && !run->too_long ? 0 : -1;
}

/* ------------------------------------------------------------------------
 * The spec's own process
 *
 * The counts above price what a spec does in Lua and in most library calls,
 * and give the same answer on every run; but one C call can loop for hours
 * where no hook runs (string.rep of a float count, a find costing n*m, a
 * back-reference, table.insert shifting millions of elements, a message
 * handler that Lua runs with hooks off), and no price list covers every
 * call. A timer in this process could only set a hook, which such a call
 * never reaches. So the spec runs in a child process, killed at a deadline:
 * that stops any call, frees all its memory at once (its address space is
 * capped too) and leaves this process as it was. The child sends back what
 * the run left in memory (the layout calls, the files it required, its
 * messages), so validation and every message are those of a run in place. */

static struct {
    double seconds;
    char error[VALUE_BUF + 160]; /* why SYMM_SPEC_TIMEOUT was refused; "" when it was not */
} spec_limit;
static pthread_once_t spec_limit_once = PTHREAD_ONCE_INIT;

static void read_spec_limit(void)
{
    const char *v = getenv("SYMM_SPEC_TIMEOUT");
    spec_limit.seconds = SPEC_TIMEOUT_DEFAULT;
    if (!v)
        return;
    char *end = NULL;
    errno = 0;
    double s = *v && strspn(v, "0123456789.") == strlen(v) ? strtod(v, &end) : NAN;
    if (end && *end == '\0' && errno == 0 && s >= SPEC_TIMEOUT_MIN && s <= SPEC_TIMEOUT_MAX) {
        spec_limit.seconds = s;
        return;
    }
    char shown[VALUE_BUF];
    quote(shown, v, strlen(v));
    snprintf(spec_limit.error, sizeof spec_limit.error, "SYMM_SPEC_TIMEOUT=%s: expected the seconds a spec "
             "may run, a number in %g..%g (default %g)", shown, SPEC_TIMEOUT_MIN, SPEC_TIMEOUT_MAX,
             SPEC_TIMEOUT_DEFAULT);
}

static double spec_timeout(void)
{
    pthread_once(&spec_limit_once, read_spec_limit);
    return spec_limit.seconds;
}

/* The reply: a byte string the child writes and the parent reads back. */
typedef struct wire {
    char *data;
    size_t len, cap;
    bool failed;          /* out of memory (writing), or short or malformed (reading) */
    size_t at;            /* reading: the next byte */
} wire;

static void put(wire *w, const void *p, size_t n)
{
    if (w->failed)
        return;
    if (w->cap - w->len < n) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap - w->len < n)
            cap *= 2;
        char *grown = realloc(w->data, cap);
        if (!grown) {
            w->failed = true;
            return;
        }
        w->data = grown;
        w->cap = cap;
    }
    memcpy(w->data + w->len, p, n);
    w->len += n;
}

static void put_u64(wire *w, uint64_t v) { put(w, &v, sizeof v); }

static void put_bytes(wire *w, const char *s, size_t n)
{
    put_u64(w, n);
    put(w, s, n);
}

static void take(wire *w, void *p, size_t n)
{
    if (w->failed || w->len - w->at < n) {
        w->failed = true;
        memset(p, 0, n);
        return;
    }
    memcpy(p, w->data + w->at, n);
    w->at += n;
}

static uint64_t take_u64(wire *w)
{
    uint64_t v;
    take(w, &v, sizeof v);
    return v;
}

/* A malloc'd, NUL-terminated copy of the next byte string, or NULL. */
static char *take_bytes(wire *w, size_t *len)
{
    uint64_t n = take_u64(w);
    if (w->failed || n > w->len - w->at) {
        w->failed = true;
        return NULL;
    }
    char *s = malloc((size_t)n + 1);
    if (!s) {
        w->failed = true;
        return NULL;
    }
    take(w, s, (size_t)n);
    s[n] = '\0';
    if (len)
        *len = (size_t)n;
    return s;
}

static void put_value(wire *w, const raw_value *v)
{
    uint64_t other = 0;
    for (size_t i = 0; v->kind == RAW_OTHER && i < sizeof other_phrases / sizeof other_phrases[0]; i++)
        if (v->other == other_phrases[i])
            other = i;
    uint64_t head[5] = { (uint64_t)v->kind, (uint64_t)v->i, 0, v->b, other };
    memcpy(&head[2], &v->f, sizeof v->f);
    put(w, head, sizeof head);
    if (v->kind == RAW_STRING || v->kind == RAW_LIST) {
        /* (The kept bytes may hold a NUL: keep_string's count, not strlen.) */
        put_u64(w, v->len);
        put_bytes(w, v->s, v->len < KEEP_STRING ? v->len : KEEP_STRING);
    }
}

static void take_value(wire *w, raw_value *v)
{
    uint64_t head[5];
    take(w, head, sizeof head);
    memset(v, 0, sizeof *v);
    if (head[0] > RAW_LIST || head[4] >= sizeof other_phrases / sizeof other_phrases[0]) {
        w->failed = true;
        return;
    }
    v->kind = (raw_kind)head[0];
    v->i = (int64_t)head[1];
    memcpy(&v->f, &head[2], sizeof v->f);
    v->b = head[3] != 0;
    if (v->kind == RAW_OTHER)
        v->other = other_phrases[head[4]];
    if (v->kind == RAW_STRING || v->kind == RAW_LIST) {
        v->len = (size_t)take_u64(w);
        size_t kept = 0;
        v->s = take_bytes(w, &kept);
        if (!v->s || kept != (v->len < KEEP_STRING ? v->len : KEEP_STRING))
            w->failed = true;
    }
}

static void put_variant(wire *w, const raw_variant *v)
{
    uint64_t head[5] = { v->source, (uint64_t)(int64_t)v->line, v->n_unknown, v->n_positional, v->complete };
    put(w, head, sizeof head);
    for (int f = 0; f < F_COUNT; f++)
        put_value(w, &v->field[f]);
    for (size_t k = 0; k < v->n_unknown && k < KEEP_UNKNOWN; k++)
        put_value(w, &v->unknown[k]);
    put_value(w, &v->positional);
}

/* Fills *v; what it holds belongs to v even when the reply is malformed. */
static void take_variant(wire *w, raw_variant *v, size_t n_sources)
{
    uint64_t head[5];
    take(w, head, sizeof head);
    memset(v, 0, sizeof *v);
    v->source = head[0] < n_sources ? (size_t)head[0] : 0;
    v->line = (int)(int64_t)head[1];
    v->n_unknown = (size_t)head[2];
    v->n_positional = (size_t)head[3];
    v->complete = head[4] != 0;
    if (head[0] >= n_sources)
        w->failed = true;
    for (int f = 0; f < F_COUNT && !w->failed; f++)
        take_value(w, &v->field[f]);
    for (size_t k = 0; k < v->n_unknown && k < KEEP_UNKNOWN && !w->failed; k++)
        take_value(w, &v->unknown[k]);
    if (!w->failed)
        take_value(w, &v->positional);
}

/* What the child sends: its verdict, its messages, the files it read, its
 * layout calls. */
static void put_reply(wire *w, const spec_run *run, const sg_diag *d, int ran)
{
    put_u64(w, (uint64_t)(int64_t)ran);
    put_u64(w, d->count);
    for (size_t i = 0; i < d->count; i++)
        put_bytes(w, d->messages[i], strlen(d->messages[i]));
    put_u64(w, run->n_sources);
    for (size_t i = 0; i < run->n_sources; i++)
        put_bytes(w, run->sources[i], strlen(run->sources[i]));
    put_u64(w, run->n_vars);
    for (size_t i = 0; i < run->n_vars; i++)
        put_variant(w, &run->vars[i]);
}

/* The parent's side of put_reply: run's sources and variants replaced by
 * the child's, its messages added to diag. Returns its verdict, or -2 when
 * the reply is malformed or memory ran out. */
static int take_reply(wire *w, spec_run *run, sg_diag *diag)
{
    int ran = (int)(int64_t)take_u64(w);
    uint64_t n = take_u64(w);
    for (uint64_t i = 0; i < n && !w->failed; i++) {
        char *msg = take_bytes(w, NULL);
        if (msg)
            sg_diag_add(diag, "%s", msg);
        free(msg);
    }
    n = take_u64(w);
    if (w->failed || n == 0 || n > w->len)
        return -2;
    for (size_t i = 0; i < run->n_sources; i++)
        free(run->sources[i]);
    run->n_sources = 0;
    for (uint64_t i = 0; i < n && !w->failed; i++) {
        char *path = take_bytes(w, NULL);
        if (path && add_source(run, path) < 0)
            w->failed = true;
    }
    n = take_u64(w);
    if (w->failed || n > SPEC_MAX_VARIANTS)
        return -2;
    run->vars = n ? calloc((size_t)n, sizeof *run->vars) : NULL;
    if (n && !run->vars)
        return -2;
    run->cap_vars = (size_t)n;
    for (uint64_t i = 0; i < n && !w->failed; i++)
        take_variant(w, &run->vars[run->n_vars++], run->n_sources);
    return w->failed || w->at != w->len ? -2 : ran;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Exit statuses of the child besides 0. */
enum { CHILD_NO_MEMORY = 3, CHILD_NO_PARENT = 4, CHILD_WRITE = 5 };

/* The child: caps, the run, the reply; never returns. */
static void child_main(spec_run *run, int fd, pid_t parent)
{
    /* Killed with the parent, so that no spec outlives symmgen. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(CHILD_NO_PARENT);
    /* The deadline is the parent's; CPU time is a backstop should the
     * parent stop waiting (SIGSTOP), with no core dump. */
    struct rlimit core = { 0, 0 };
    setrlimit(RLIMIT_CORE, &core);
    rlim_t cpu = (rlim_t)ceil(spec_timeout()) + 1;
    struct rlimit cpu_limit = { cpu, cpu + 1 };
    setrlimit(RLIMIT_CPU, &cpu_limit);
#if !defined(__SANITIZE_ADDRESS__)
    /* (AddressSanitizer reserves terabytes of address space up front.) */
    unsigned long pages = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm && fscanf(statm, "%lu", &pages) == 1) {
        rlim_t as = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + SPEC_CHILD_EXTRA_MEMORY;
        struct rlimit as_limit = { as, as };
        setrlimit(RLIMIT_AS, &as_limit);
    }
    if (statm)
        fclose(statm);
#endif
    sg_diag d = { 0 };
    int ran = run_spec(run, &d);
    wire w = { 0 };
    put_reply(&w, run, &d, ran);
    if (w.failed)
        _exit(CHILD_NO_MEMORY);
    _exit(write_all(fd, w.data, w.len) == 0 ? 0 : CHILD_WRITE);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads the child's reply until it closes the pipe or the deadline passes.
 * Returns 1 at the end of the reply, 0 at the deadline, -1 on an error. */
static int read_reply(int fd, double deadline, wire *w)
{
    for (;;) {
        double left = deadline - now_seconds();
        if (left <= 0)
            return 0;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int ready = poll(&p, 1, (int)ceil(left * 1000.0));
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0)
            return -1;
        if (ready == 0)
            continue;
        if (w->cap - w->len < 65536) {
            size_t cap = w->cap ? w->cap * 2 : 65536;
            char *grown = cap <= SPEC_REPLY_MAX ? realloc(w->data, cap) : NULL;
            if (!grown)
                return -1;
            w->data = grown;
            w->cap = cap;
        }
        ssize_t got = read(fd, w->data + w->len, w->cap - w->len);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got < 0)
            return -1;
        if (got == 0)
            return 1;
        w->len += (size_t)got;
    }
}

/* Runs the spec in a child process (see above); like run_spec, its layout
 * calls end up in run->vars and its messages in diag. */
static int run_isolated(spec_run *run, sg_diag *diag)
{
    double deadline = now_seconds() + spec_timeout();
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        sg_diag_add(diag, "%s: cannot run the spec: pipe: %s", run->path, strerror(errno));
        return -1;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        child_main(run, fds[1], parent);
    }
    int fork_error = errno;
    close(fds[1]);
    if (pid < 0) {
        close(fds[0]);
        sg_diag_add(diag, "%s: cannot run the spec: fork: %s", run->path, strerror(fork_error));
        return -1;
    }
    wire w = { 0 };
    int got = read_reply(fds[0], deadline, &w);
    int read_error = errno;
    close(fds[0]);
    if (got != 1)
        kill(pid, SIGKILL);
    int status = 0;
    pid_t waited;
    while ((waited = waitpid(pid, &status, 0)) < 0 && errno == EINTR)
        ;
    int rc = -1;
    bool exited = waited == pid && WIFEXITED(status);
    int sig = waited == pid && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (got == 0 || sig == SIGXCPU || (sig == SIGKILL && got == 1)) {
        report_too_long(run, diag);
    } else if (got < 0) {
        sg_diag_add(diag, "%s: cannot run the spec: reading its results: %s", run->path,
                    read_error == 0 ? "more than any spec declares" : strerror(read_error));
    } else if (exited && WEXITSTATUS(status) == CHILD_NO_MEMORY) {
        sg_diag_add(diag, "%s: out of memory", run->path);
    } else if (sig != 0) {
        sg_diag_add(diag, "%s: internal error: the process running the spec died of signal %d (%s)", run->path,
                    sig, strsignal(sig));
    } else if ((waited == pid && !(exited && WEXITSTATUS(status) == 0)) ||
               (rc = take_reply(&w, run, diag)) == -2) {
        /* (waitpid fails where SIGCHLD is ignored: the reply then decides.) */
        sg_diag_add(diag, "%s: internal error: the process running the spec ended without its results "
                    "(exit status %d)", run->path, exited ? WEXITSTATUS(status) : -1);
        rc = -1;
    }
    free(w.data);
    return rc;
}

/* ------------------------------------------------------------------------
 * Overrides */

static void parse_override_value(const char *text, raw_value *out)
{
    memset(out, 0, sizeof *out);
    /* Numbers as a spec writes them: decimal or 0x hexadecimal integers,
     * decimal floats (7168.0, 1e3); the checks then take an integral float
     * as the integer it is. */
    const char *digits = text + (text[0] == '-' || text[0] == '+');
    const bool hex = digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X') && digits[2] &&
                     strspn(digits + 2, "0123456789abcdefABCDEF") == strlen(digits + 2);
    if (hex || (*digits >= '0' && *digits <= '9' && strspn(digits, "0123456789") == strlen(digits))) {
        char *end;
        errno = 0;
        long long v = strtoll(text, &end, hex ? 16 : 10);
        if (errno == 0 && *end == '\0') {
            out->kind = RAW_INT;
            out->i = v;
            return;
        }
    }
    if (!hex && ((*digits >= '0' && *digits <= '9') || *digits == '.') &&
        strspn(digits, "0123456789.eE+-") == strlen(digits)) {
        char *end;
        errno = 0;
        double v = strtod(text, &end);
        if (errno == 0 && *end == '\0' && isfinite(v)) {
            out->kind = RAW_FLOAT;
            out->f = v;
            return;
        }
    }
    if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0) {
        out->kind = RAW_BOOL;
        out->b = text[0] == 't';
        return;
    }
    if (keep_string(out, text, strlen(text)) != 0) {
        out->kind = RAW_OTHER;
        out->other = "a string (out of memory copying it)";
    }
}

/* -D hosts=2,4 (or {2,4}; "" or {} for none): a RAW_LIST when every
 * element is a decimal integer, else the text as a string (which the
 * checks then refuse, quoting it). */
static void parse_override_list(const char *text, raw_value *out)
{
    memset(out, 0, sizeof *out);
    size_t n = strlen(text);
    const char *p = text, *end = text + n;
    if (n >= 2 && text[0] == '{' && text[n - 1] == '}') {
        p++;
        end--;
    }
    char canon[KEEP_STRING + 1];
    size_t used = 0, count = 0;
    bool ok = true;
    while (ok && p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        while (p < stop && *p == ' ')
            p++;
        size_t len = (size_t)(stop - p);
        while (len > 0 && p[len - 1] == ' ')
            len--;
        ok = len > 0 && len <= 9 && strspn(p, "0123456789") >= len && count < LIST_MAX;
        if (ok) {
            int k = snprintf(canon + used, sizeof canon - used, "%s%.*s", count ? "," : "", (int)len, p);
            ok = k > 0 && used + (size_t)k < sizeof canon;
            used += ok ? (size_t)k : 0;
            count++;
        }
        p = comma ? comma + 1 : end;
        ok = ok && !(comma && p == end);
    }
    if (!ok) {
        parse_override_value(text, out);
        return;
    }
    if (keep_string(out, canon, used) != 0) {
        out->kind = RAW_OTHER;
        out->other = "a string (out of memory copying it)";
        return;
    }
    out->kind = RAW_LIST;
}

/* Parses every -D; by_field[f] is the last one naming f. Returns the errors. */
static int parse_overrides(const sg_override *in, size_t n, override *out, const override **by_field,
                           sg_diag *diag)
{
    int errors = 0;
    for (size_t i = 0; i < n; i++) {
        const char *field = in[i].field ? in[i].field : "";
        const char *value = in[i].value ? in[i].value : "";
        override *o = &out[i];
        /* Shown as typed, but with what a terminal would act on escaped. */
        char *shown_field = sg_printable(field), *shown_value = sg_printable(value);
        if (!shown_field || !shown_value || asprintf(&o->origin, "-D %s=%s", shown_field, shown_value) < 0) {
            o->origin = NULL;
            free(shown_field);
            free(shown_value);
            sg_diag_add(diag, "-D: out of memory");
            errors++;
            continue;
        }
        free(shown_field);
        free(shown_value);
        int f = field_index(field, strlen(field));
        if (field[0] == '\0') {
            sg_diag_add(diag, "%s: expected -D field=value", o->origin);
        } else if (f < 0) {
            char advice[VALUE_BUF];
            unknown_field_advice(advice, field, strlen(field));
            sg_diag_add(diag, "%s: %s", o->origin, advice);
        } else if (f == F_NAME) {
            sg_diag_add(diag, "%s: name cannot be overridden (each variant needs its own)", o->origin);
        } else {
            o->field = (enum field)f;
            if (f == F_HOSTS)
                parse_override_list(value, &o->value);
            else
                parse_override_value(value, &o->value);
            by_field[f] = o;
            continue;
        }
        errors++;
    }
    return errors;
}

/* ------------------------------------------------------------------------
 * Validation */

typedef struct check {
    const spec_run *run;
    const raw_variant *rv;
    const override *const *ovr;   /* per field, or NULL */
    char label[SG_NAME_MAX + 24]; /* "dsv3" or "#3" */
    sg_diag *diag;
    int errors;
    bool alone;                   /* checking the -D values on their own (check_overrides_alone) */
    bool *bad;                    /* per field: its -D failed on its own (reported once already) */
} check;

static const raw_value *value_of(const check *c, enum field f)
{
    return c->ovr[f] ? &c->ovr[f]->value : &c->rv->field[f];
}

static void field_error(check *c, enum field f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void field_error(check *c, enum field f, const char *fmt, ...)
{
    char detail[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    const char *origin = c->ovr[f] ? c->ovr[f]->origin : NULL;
    if (c->alone || (origin && c->bad && c->bad[f])) {
        /* A -D value that is wrong whatever the variant: said once, by
         * check_overrides_alone, not once per variant; a field no -D sets
         * is left to each variant. */
        if (c->alone && origin) {
            sg_diag_add(c->diag, "%s: %s", origin, detail);
            c->bad[f] = true;
        }
        c->errors += origin != NULL;
        return;
    }
    /* The other fields' -D overrides: a bound or a rule that reads them
     * (capacity against max_tokens, align against layout) must not seem
     * to contradict what the spec's line says. */
    char others[512] = "";
    size_t used = 0;
    for (int g = 0; g < F_COUNT; g++)
        if (g != (int)f && c->ovr[g] && c->ovr[g]->origin && used < sizeof others) {
            int k = snprintf(others + used, sizeof others - used, "%s%s", used ? ", " : "", c->ovr[g]->origin);
            used += k > 0 ? (size_t)k : 0;
        }
    sg_diag_add(c->diag, "%s:%d: variant %s: field %s: %s%s%s%s%s%s%s", c->run->sources[c->rv->source],
                c->rv->line, c->label, field_names[f], detail, origin ? " (from " : "",
                origin ? origin : "", origin ? ")" : "", others[0] ? " (with " : "", others,
                others[0] ? " in effect)" : "");
    c->errors++;
}

/* "got VALUE, expected ..." for field f. */
static void got_expected(check *c, enum field f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void got_expected(check *c, enum field f, const char *fmt, ...)
{
    char value[VALUE_BUF], expected[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(expected, sizeof expected, fmt, ap);
    va_end(ap);
    format_value(value, value_of(c, f));
    field_error(c, f, "got %s, expected %s", value, expected);
}

/* 1: *out holds the value; 0: absent; -1: reported as the wrong type. */
static int take_int(check *c, enum field f, const char *what, int64_t *out)
{
    const raw_value *v = value_of(c, f);
    if (v->kind == RAW_ABSENT)
        return 0;
    if (v->kind == RAW_INT) {
        *out = v->i;
        return 1;
    }
    /* 7168.0 is an integer written as a float; 7168.5 is not. */
    if (v->kind == RAW_FLOAT && isfinite(v->f) && v->f == floor(v->f) && fabs(v->f) < 9.0e18) {
        *out = (int64_t)v->f;
        return 1;
    }
    if (v->kind == RAW_FLOAT && isfinite(v->f) && v->f == floor(v->f)) {
        char value[VALUE_BUF];
        format_value(value, v);
        field_error(c, f, "got %s, which is out of range, expected %s", value, what);
        return -1;
    }
    got_expected(c, f, "%s", what);
    return -1;
}

/* A string field with a fixed set of values; *out is the index in names. */
static bool take_choice(check *c, enum field f, const char *const *names, int count, int *out)
{
    const raw_value *v = value_of(c, f);
    for (int i = 0; i < count; i++)
        if (raw_is(v, names[i])) {
            *out = i;
            return true;
        }
    char list[VALUE_BUF] = "";
    for (int i = 0; i < count; i++)
        append(list, "%s\"%s\"", i == 0 ? "" : i == count - 1 ? " or " : ", ", names[i]);
    if (f == F_COMBINE_DTYPE && raw_is(v, "fp8_e4m3"))
        got_expected(c, f, "%s (fp8 is a dispatch dtype only: combine accumulates in fp32 "
                     "and returns 16 or 32 bits)", list);
    else
        got_expected(c, f, "%s", list);
    return false;
}

static bool name_is_usable(const raw_value *v)
{
    return v->kind == RAW_STRING && v->len < SG_NAME_MAX && is_identifier(v->s, v->len) && !is_keyword(v->s);
}

/* How a variant's name relates to the other variants' names. */
typedef struct name_use {
    const raw_variant *first;        /* the earlier variant of the same name, or NULL */
    const raw_variant *clash;        /* a variant whose header declares what this name names */
    char clash_ident[SG_NAME_MAX + 16]; /* what it declares */
} name_use;

static void variant_place(char *buf, const check *c, const raw_variant *other)
{
    buf[0] = '\0';
    if (other->source == c->rv->source)
        append(buf, "line %d", other->line);
    else
        append(buf, "%s:%d", c->run->sources[other->source], other->line);
}

static bool check_name(check *c, const name_use *use, char *name)
{
    const raw_value *v = value_of(c, F_NAME);
    if (v->kind == RAW_ABSENT) {
        field_error(c, F_NAME, "missing, expected " NAME_WHAT);
        return false;
    }
    if (v->kind != RAW_STRING || !is_identifier(v->s, v->len > KEEP_STRING ? KEEP_STRING : v->len)) {
        got_expected(c, F_NAME, NAME_WHAT);
        return false;
    }
    if (v->len >= SG_NAME_MAX) {
        got_expected(c, F_NAME, "a name of at most %d characters", SG_NAME_MAX - 1);
        return false;
    }
    const char *reserved = reserved_name(v->s);
    if (reserved) {
        got_expected(c, F_NAME, "%s", reserved);
        return false;
    }
    char place[VALUE_BUF];
    if (use->first) {
        variant_place(place, c, use->first);
        got_expected(c, F_NAME, "a name not used before, ignoring case (%s has it)", place);
        return false;
    }
    if (use->clash) {
        variant_place(place, c, use->clash);
        got_expected(c, F_NAME, "a name that no other variant's header declares (the header of variant %s, "
                     "%s, declares %s)", use->clash->field[F_NAME].s, place, use->clash_ident);
        return false;
    }
    memcpy(name, v->s, v->len + 1);
    return true;
}

static void report_extra_keys(check *c)
{
    const raw_variant *rv = c->rv;
    const char *file = c->run->sources[rv->source];
    size_t kept = rv->n_unknown < KEEP_UNKNOWN ? rv->n_unknown : KEEP_UNKNOWN;
    /* Table order depends on the string hash seed: sort for stable output. */
    size_t order[KEEP_UNKNOWN];
    for (size_t i = 0; i < kept; i++) {
        size_t j = i;
        for (; j > 0 && strcmp(rv->unknown[order[j - 1]].s, rv->unknown[i].s) > 0; j--)
            order[j] = order[j - 1];
        order[j] = i;
    }
    for (size_t i = 0; i < kept; i++) {
        const raw_value *key = &rv->unknown[order[i]];
        char shown[VALUE_BUF], advice[VALUE_BUF];
        format_key(shown, key);
        unknown_field_advice(advice, key->s, key->len > KEEP_STRING ? KEEP_STRING : key->len);
        sg_diag_add(c->diag, "%s:%d: variant %s: field %s: %s", file, rv->line, c->label, shown, advice);
        c->errors++;
    }
    if (rv->n_unknown > kept) {
        sg_diag_add(c->diag, "%s:%d: variant %s: %zu more unknown fields", file, rv->line, c->label,
                    rv->n_unknown - kept);
        c->errors++;
    }
    if (rv->n_positional > 0) {
        char value[VALUE_BUF];
        format_value(value, &rv->positional);
        sg_diag_add(c->diag, "%s:%d: variant %s: got %s without a field name%s, expected field = value",
                    file, rv->line, c->label, value, rv->n_positional > 1 ? " (and more)" : "");
        c->errors++;
    }
}

/* The integer fields: types, ranges, defaults. ok[f] says v holds f. */
static void check_ints(check *c, sg_variant *v, bool *ok)
{
    int64_t n[F_COUNT] = { 0 };
    for (size_t i = 0; i < sizeof int_rules / sizeof int_rules[0]; i++) {
        const struct int_rule *r = &int_rules[i];
        int64_t *x = &n[r->field];
        int got = take_int(c, r->field, r->what, x);
        if (got == 0 && r->required) {
            field_error(c, r->field, "missing, expected %s", r->what);
        } else if (got == 0) {
            *x = r->fallback;
            ok[r->field] = true;
        } else if (got == 1 && (*x < r->min || *x > r->max)) {
            if (r->max == INT64_MAX)
                got_expected(c, r->field, "%s", r->what);
            else
                got_expected(c, r->field, "%lld..%lld", (long long)r->min, (long long)r->max);
        } else {
            ok[r->field] = got == 1;
        }
    }
    v->hidden = (int)n[F_HIDDEN];
    v->topk = (int)n[F_TOPK];
    v->experts = (int)n[F_EXPERTS];
    v->world = (int)n[F_WORLD];
    v->max_tokens = (int)n[F_MAX_TOKENS];
    v->capacity = n[F_CAPACITY];
    v->capacity_set = value_of(c, F_CAPACITY)->kind != RAW_ABSENT;
    v->align = (int)n[F_ALIGN];
    v->sms = (int)n[F_SMS];
}

#define HOSTS_WHAT "a list of host counts, each an integer 2..world dividing world, e.g. {2, 4}"

/* hosts: absent or {} is none; else distinct integers >= 2, kept
 * ascending in v->hosts (the companions' order). The checks against world
 * and the other fields are check_hosts'. */
static bool take_hosts(check *c, sg_variant *v)
{
    const raw_value *h = value_of(c, F_HOSTS);
    v->n_hosts = 0;
    if (h->kind == RAW_ABSENT)
        return true;
    if (h->kind != RAW_LIST) {
        got_expected(c, F_HOSTS, HOSTS_WHAT);
        return false;
    }
    for (const char *p = h->s; *p;) {
        char *end;
        long long x = strtoll(p, &end, 10);
        if (x < 2 || x > 128) {
            got_expected(c, F_HOSTS, "host counts 2..128 (%lld is not; hosts lists the counts of a world of "
                         "several hosts)", x);
            return false;
        }
        for (int i = 0; i < v->n_hosts; i++)
            if (v->hosts[i] == x) {
                got_expected(c, F_HOSTS, "distinct host counts (%lld is listed twice)", x);
                return false;
            }
        int i = v->n_hosts++;
        for (; i > 0 && v->hosts[i - 1] > x; i--)
            v->hosts[i] = v->hosts[i - 1];
        v->hosts[i] = (int)x;
        p = *end == ',' ? end + 1 : end;
    }
    return true;
}

/* hosts against world, max_tokens and combine_order. */
static void check_hosts(check *c, sg_variant *v, const bool *ok)
{
    if (!ok[F_HOSTS] || v->n_hosts == 0)
        return;
    if (ok[F_WORLD])
        for (int i = 0; i < v->n_hosts; i++)
            if (v->hosts[i] > v->world || v->world % v->hosts[i] != 0) {
                got_expected(c, F_HOSTS, "host counts that divide world (%d): %d does not (every host has "
                             "world / hosts ranks)", v->world, v->hosts[i]);
                return;
            }
    if (ok[F_WORLD] && ok[F_EXPERTS] && ok[F_TOPK])
        for (int i = 0; i < v->n_hosts; i++)
            if (v->experts / v->hosts[i] < v->topk) {
                got_expected(c, F_HOSTS, "host counts H with topk (%d) at most experts / H (the companion of %d "
                             "hosts has %d experts)", v->topk, v->hosts[i], v->experts / v->hosts[i]);
                return;
            }
    if (ok[F_MAX_TOKENS])
        for (int i = 0; i < v->n_hosts; i++)
            if ((int64_t)v->hosts[i] * v->max_tokens > 1048576) {
                got_expected(c, F_HOSTS, "host counts H with H * max_tokens at most 1048576 (the companion of "
                             "%d hosts takes %d * %d tokens a call)", v->hosts[i], v->hosts[i], v->max_tokens);
                return;
            }
    if (ok[F_COMBINE_ORDER] && v->combine_order == SYMM_COMBINE_ORDER_K)
        field_error(c, F_HOSTS, "not with combine_order \"k\" (across hosts every (token, expert) row would "
                    "cross the network back): use combine_order \"rank\", or the nccl backend without hosts");
}

/* dtype, combine_dtype, layout, weights, combine. */
static void check_choices(check *c, sg_variant *v, bool *ok)
{
    int dtype = SYMM_DTYPE_BF16, combine = -1, layout = SYMM_LAYOUT_RANK;
    ok[F_DTYPE] = value_of(c, F_DTYPE)->kind == RAW_ABSENT || take_choice(c, F_DTYPE, dtype_names, 4, &dtype);
    if (value_of(c, F_COMBINE_DTYPE)->kind != RAW_ABSENT) {
        ok[F_COMBINE_DTYPE] = take_choice(c, F_COMBINE_DTYPE, dtype_names, 3, &combine);
    } else if (ok[F_DTYPE]) {
        /* fp8 is not a combine dtype: its combine defaults to bf16. */
        combine = dtype == SYMM_DTYPE_FP8_E4M3 ? SYMM_DTYPE_BF16 : dtype;
        ok[F_COMBINE_DTYPE] = true;
    }
    ok[F_LAYOUT] = value_of(c, F_LAYOUT)->kind == RAW_ABSENT ||
                   take_choice(c, F_LAYOUT, layout_names, 2, &layout);
    v->dtype = (symm_dtype)dtype;
    v->combine_dtype = (symm_dtype)(combine < 0 ? 0 : combine);
    v->layout = (symm_layout)layout;

    const raw_value *w = value_of(c, F_WEIGHTS);
    v->weights = w->kind == RAW_ABSENT || (w->kind == RAW_BOOL && w->b);
    ok[F_WEIGHTS] = w->kind == RAW_ABSENT || w->kind == RAW_BOOL;
    if (!ok[F_WEIGHTS])
        got_expected(c, F_WEIGHTS, "true or false");

    /* combine: by default "auto" for layout rank's prefill-sized variants
     * and for layout rank from world SG_AUTO_MIN_WORLD up (the pulling form
     * is the faster there wherever y permits), else "push"
     * (SG_AUTO_MIN_TOKENS, SG_AUTO_MIN_WORLD). max_tokens and world are
     * checked before. */
    int mode = v->layout == SYMM_LAYOUT_RANK &&
                       (v->max_tokens >= SG_AUTO_MIN_TOKENS || v->world >= SG_AUTO_MIN_WORLD)
                   ? SYMM_COMBINE_AUTO
                   : SYMM_COMBINE_PUSH;
    ok[F_COMBINE] = value_of(c, F_COMBINE)->kind == RAW_ABSENT ||
                    take_choice(c, F_COMBINE, combine_names, 3, &mode);
    v->combine = (symm_combine_mode)mode;

    int order = SYMM_COMBINE_ORDER_RANK;
    ok[F_COMBINE_ORDER] = value_of(c, F_COMBINE_ORDER)->kind == RAW_ABSENT ||
                          take_choice(c, F_COMBINE_ORDER, combine_order_names, 2, &order);
    v->combine_order = (symm_combine_order)order;
    ok[F_HOSTS] = take_hosts(c, v);
}

/* Layout expert with a peer and top-k above 1: dispatch leaves each peer a
 * word per token that holds the token's first row there and how many of
 * its rows follow (templates/cu/dispatch.cu.in, chain_len_value: row + 1 +
 * capacity x rows after, at most capacity x min(topk, experts/world)), in
 * an int32. The factor the worst-case capacity is multiplied by for that
 * word; 1 where there is no such word. */
static int64_t word_factor(const sg_variant *v)
{
    const int64_t local = v->experts / v->world;
    if (v->layout != SYMM_LAYOUT_EXPERT || v->topk < 2 || v->world < 2)
        return 1;
    return v->topk < local ? v->topk : local;
}

/* The largest max_tokens whose worst case is at most rows_max rows and fits
 * in 1 TiB (0 if none). */
static int64_t max_tokens_that_fit(const sg_variant *v, int64_t row_bytes, int64_t rows_max)
{
    sg_variant t = *v;
    int64_t lo = 0, hi = v->max_tokens;
    while (hi - lo > 1) {
        t.max_tokens = (int)((lo + hi) / 2);
        int64_t worst = sg_worst_capacity(&t);
        if (worst <= rows_max && worst * row_bytes <= BUFFER_BYTES_MAX)
            lo = t.max_tokens;
        else
            hi = t.max_tokens;
    }
    return lo;
}

static void check_sizes(check *c, sg_variant *v)
{
    int64_t worst = sg_worst_capacity(v);
    int elt = symm_dtype_size(v->dtype), celt = symm_dtype_size(v->combine_dtype);
    int64_t row = (int64_t)v->hidden * (elt > celt ? elt : celt);
    const char *formula = v->layout == SYMM_LAYOUT_RANK
        ? "world * max_tokens"
        : "world * max_tokens * min(topk, experts/world) + (experts/world) * (align - 1)";
    if (worst > INT32_MAX || worst * row > BUFFER_BYTES_MAX) {
        char why[VALUE_BUF] = "";
        if (worst > INT32_MAX)
            append(why, "the worst-case capacity, %lld rows, must fit in int32", (long long)worst);
        else
            append(why, "the worst-case buffers, %lld rows of %lld bytes, must fit in 1 TiB",
                   (long long)worst, (long long)row);
        int64_t fit = max_tokens_that_fit(v, row, INT32_MAX);
        if (fit > 0) {
            got_expected(c, F_MAX_TOKENS, "at most %lld (%s)", (long long)fit, why);
            return;
        }
        sg_variant one = *v;
        one.max_tokens = 1;
        got_expected(c, F_MAX_TOKENS, "a smaller hidden, experts/world or align (even at max_tokens 1 "
                     "the worst case is %lld rows of %lld bytes, more than int32 rows or 1 TiB)",
                     (long long)sg_worst_capacity(&one), (long long)row);
        return;
    }
    if (v->capacity_set && v->capacity > worst) {
        got_expected(c, F_CAPACITY, "1..%lld (the worst case, %s)", (long long)worst, formula);
        return;
    }
    if (!v->capacity_set)
        v->capacity = worst;
    /* The capacity (set, or the worst case) in dispatch's words. */
    const int64_t factor = word_factor(v), cap_max = INT32_MAX / factor;
    if (v->capacity <= cap_max)
        return;
    if (v->capacity_set) {
        got_expected(c, F_CAPACITY, "at most %lld (the capacity times min(topk, experts/world), %lld, must fit in "
                     "int32: dispatch's word per token holds a row and how many follow)", (long long)cap_max,
                     (long long)factor);
        return;
    }
    got_expected(c, F_MAX_TOKENS, "at most %lld, or a capacity of at most %lld (the worst-case capacity, %lld "
                 "rows, times min(topk, experts/world), %lld, must fit in int32: dispatch's word per token holds a "
                 "row and how many follow)", (long long)max_tokens_that_fit(v, row, cap_max), (long long)cap_max,
                 (long long)worst, (long long)factor);
}

static void check_combinations(check *c, sg_variant *v, const bool *ok)
{
    if (ok[F_HIDDEN] && ok[F_DTYPE] && ok[F_COMBINE_DTYPE]) {
        int need = 16 / symm_dtype_size(v->dtype), cneed = 16 / symm_dtype_size(v->combine_dtype);
        if (v->dtype == SYMM_DTYPE_FP8_E4M3 && v->hidden % SYMM_FP8_BLOCK != 0)
            got_expected(c, F_HIDDEN, "a multiple of %d for fp8_e4m3 (one scale per %d elements)",
                         SYMM_FP8_BLOCK, SYMM_FP8_BLOCK);
        else if (v->hidden % need != 0)
            got_expected(c, F_HIDDEN, "a multiple of %d for %s (rows of whole 16-byte vectors)",
                         need, sg_dtype_name(v->dtype));
        else if (v->hidden % cneed != 0)
            got_expected(c, F_HIDDEN, "a multiple of %d for combine_dtype %s (rows of whole 16-byte vectors)",
                         cneed, sg_dtype_name(v->combine_dtype));
    }
    if (ok[F_COMBINE_ORDER] && ok[F_LAYOUT] && v->layout == SYMM_LAYOUT_RANK &&
        v->combine_order != SYMM_COMBINE_ORDER_RANK)
        got_expected(c, F_COMBINE_ORDER, "\"rank\" (combine_order \"k\" applies only to layout \"expert\": "
                     "layout rank sends one row per token and rank)");
    bool shape = ok[F_TOPK] && ok[F_EXPERTS] && ok[F_WORLD];
    if (ok[F_TOPK] && ok[F_EXPERTS] && v->topk > v->experts) {
        got_expected(c, F_TOPK, "1..%d (at most experts)", v->experts);
        shape = false;
    }
    if (ok[F_EXPERTS] && ok[F_WORLD] && v->experts % v->world != 0) {
        got_expected(c, F_EXPERTS, "a multiple of world (%d)", v->world);
        shape = false;
    }
    if (ok[F_COMBINE] && ok[F_LAYOUT] && v->layout == SYMM_LAYOUT_EXPERT && v->combine == SYMM_COMBINE_AUTO)
        got_expected(c, F_COMBINE, "\"push\" or \"pull\" with layout \"expert\" (\"auto\", both forms chosen "
                     "per call by where y lies, is for layout \"rank\": layout expert's pushing combine is "
                     "the faster at every size measured, docs/spec.md)");
    bool aligned = ok[F_ALIGN] && ok[F_LAYOUT];
    if (aligned && v->layout == SYMM_LAYOUT_RANK && v->align != 1) {
        got_expected(c, F_ALIGN, "1 (align applies only to layout \"expert\")");
        aligned = false;
    }
    if (shape && aligned && ok[F_HIDDEN] && ok[F_MAX_TOKENS] && ok[F_DTYPE] && ok[F_COMBINE_DTYPE] &&
        ok[F_CAPACITY])
        check_sizes(c, v);
    check_hosts(c, v, ok);
}

static void check_variant(check *c, const name_use *use, sg_variant *v)
{
    bool ok[F_COUNT] = { false };
    memset(v, 0, sizeof *v);
    v->file = c->run->sources[c->rv->source];
    v->line = c->rv->line;
    report_extra_keys(c);
    ok[F_NAME] = check_name(c, use, v->name);
    check_ints(c, v, ok);
    check_choices(c, v, ok);
    check_combinations(c, v, ok);
}

/* Names in the order of strcasecmp, then of declaration. */
static int cmp_by_name(const void *a, const void *b, void *vars)
{
    const raw_variant *rv = vars;
    size_t ia = *(const size_t *)a, ib = *(const size_t *)b;
    int d = strcasecmp(rv[ia].field[F_NAME].s, rv[ib].field[F_NAME].s);
    return d ? d : (ia > ib) - (ia < ib);
}

/* The first variant in order[0..n) whose name is s[0..len) ignoring case. */
static const raw_variant *find_name(const spec_run *run, const size_t *order, size_t n, const char *s,
                                    size_t len)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const char *name = run->vars[order[mid]].field[F_NAME].s;
        int d = strncasecmp(name, s, len);
        if (d == 0)
            d = name[len] != '\0';
        if (d < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    const raw_variant *v = lo < n ? &run->vars[order[lo]] : NULL;
    return v && strncasecmp(v->field[F_NAME].s, s, len) == 0 && v->field[F_NAME].s[len] == '\0' ? v : NULL;
}

static bool is_upper_of(const char *upper, size_t len, const char *name)
{
    for (size_t i = 0; i < len; i++)
        if (upper[i] != (name[i] >= 'a' && name[i] <= 'z' ? name[i] - 'a' + 'A' : name[i]))
            return false;
    return name[len] == '\0';
}

/* Another variant whose header declares what name names: name is P_create
 * (or another of derived_functions) or P_HIDDEN (derived_macros, in
 * capitals) of a variant P, or name is P_local, whose P_LOCAL_EXPERTS would
 * be P's too. */
static void find_clash(const spec_run *run, const size_t *order, size_t n, const char *name, name_use *use)
{
    size_t len = strlen(name);
    for (size_t k = 0; k < sizeof derived_functions / sizeof derived_functions[0] && !use->clash; k++) {
        size_t sl = strlen(derived_functions[k]);
        const raw_variant *p = len > sl && strcmp(name + len - sl, derived_functions[k]) == 0
            ? find_name(run, order, n, name, len - sl) : NULL;
        if (p && strncmp(p->field[F_NAME].s, name, len - sl) == 0)
            use->clash = p;
    }
    for (size_t k = 0; k < sizeof derived_macros / sizeof derived_macros[0] && !use->clash; k++) {
        size_t sl = strlen(derived_macros[k]);
        const raw_variant *p = len > sl && strcmp(name + len - sl, derived_macros[k]) == 0
            ? find_name(run, order, n, name, len - sl) : NULL;
        if (p && is_upper_of(name, len - sl, p->field[F_NAME].s))
            use->clash = p;
    }
    if (use->clash) {
        snprintf(use->clash_ident, sizeof use->clash_ident, "%s", name);
        return;
    }
    if (len > 6 && strcasecmp(name + len - 6, "_local") == 0 &&
        (use->clash = find_name(run, order, n, name, len - 6))) {
        snprintf(use->clash_ident, sizeof use->clash_ident, "%s_EXPERTS, as this one would", name);
        for (char *p = use->clash_ident; *p != ','; p++)
            *p = *p >= 'a' && *p <= 'z' ? (char)(*p - 'a' + 'A') : *p;
    }
}

/* For each variant, the earlier variant with the same (usable) name, and a
 * variant whose generated header declares that name. */
static int find_name_uses(const spec_run *run, name_use *uses)
{
    size_t *order = malloc((run->n_vars + 1) * sizeof *order), n = 0;
    if (!order)
        return -1;
    for (size_t i = 0; i < run->n_vars; i++)
        if (name_is_usable(&run->vars[i].field[F_NAME]))
            order[n++] = i;
    qsort_r(order, n, sizeof *order, cmp_by_name, run->vars);
    for (size_t i = 1; i < n; i++) {
        const raw_variant *prev = &run->vars[order[i - 1]], *cur = &run->vars[order[i]];
        /* Names differing only in case share include guards and macros
         * (NAME_UPPER) and collide on case-insensitive file systems. */
        if (strcasecmp(prev->field[F_NAME].s, cur->field[F_NAME].s) == 0)
            uses[order[i]].first = uses[order[i - 1]].first ? uses[order[i - 1]].first : prev;
    }
    for (size_t i = 0; i < n; i++)
        find_clash(run, order, n, run->vars[order[i]].field[F_NAME].s, &uses[order[i]]);
    free(order);
    return 0;
}

/* The checks of the -D values that no variant changes (a value's type, its
 * range, its choices), run once on an empty variant: each failure is
 * reported once, naming the -D, and marked in bad so that the variants do
 * not report it again. Returns the errors. */
static int check_overrides_alone(const override *const *ovr, bool *bad, sg_diag *diag)
{
    static const raw_variant none;
    check c = { .rv = &none, .ovr = ovr, .diag = diag, .alone = true, .bad = bad };
    sg_variant v;
    bool ok[F_COUNT] = { false };
    memset(&v, 0, sizeof v);
    check_ints(&c, &v, ok);
    check_choices(&c, &v, ok);
    return c.errors;
}

static int validate(const spec_run *run, const override *const *ovr, bool *bad, sg_variant *out,
                    sg_diag *diag)
{
    name_use *uses = calloc(run->n_vars + 1, sizeof *uses);
    if (!uses || find_name_uses(run, uses) != 0) {
        free(uses);
        sg_diag_add(diag, "%s: out of memory", run->path);
        return 1;
    }
    int errors = 0;
    for (size_t i = 0; i < run->n_vars; i++) {
        check c = { .run = run, .rv = &run->vars[i], .ovr = ovr, .diag = diag, .bad = bad };
        const raw_value *name = value_of(&c, F_NAME);
        if (name_is_usable(name))
            snprintf(c.label, sizeof c.label, "%s", name->s);
        else
            snprintf(c.label, sizeof c.label, "#%zu", i + 1);
        check_variant(&c, &uses[i], &out[i]);
        errors += c.errors;
    }
    free(uses);
    return errors;
}

/* Each variant with hosts followed by its companions, one per host count
 * H: the variant of one host's ranks that the hybrid backend runs natively
 * (world / H, experts / H, H * max_tokens; the capacity is the variant's,
 * whose worst case the companion's equals; everything else the same).
 * *out is a new array (n_out entries) whose variants point to their
 * companions. Returns the errors (names too long or taken). */
static int add_companions(const sg_variant *in, size_t n, sg_variant **out, size_t *n_out, sg_diag *diag)
{
    size_t total = n;
    for (size_t i = 0; i < n; i++)
        total += (size_t)in[i].n_hosts;
    sg_variant *all = calloc(total ? total : 1, sizeof *all);
    if (!all) {
        sg_diag_add(diag, "out of memory");
        return 1;
    }
    int errors = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const sg_variant *p = &in[i];
        /* Copies with their padding, so that two loads compare equal byte for byte. */
        memcpy(&all[k++], p, sizeof *p);
        for (int h = 0; h < p->n_hosts; h++) {
            sg_variant *c = &all[k++];
            const int H = p->hosts[h];
            memcpy(c, p, sizeof *c);
            c->n_hosts = 0;
            c->companion_hosts = H;
            snprintf(c->companion_of, sizeof c->companion_of, "%s", p->name);
            c->world = p->world / H;
            c->experts = p->experts / H;
            c->max_tokens = H * p->max_tokens;
            c->capacity_set = true;
            char name[2 * SG_NAME_MAX];
            snprintf(name, sizeof name, "%s_h%d", p->name, H);
            if (strlen(name) >= SG_NAME_MAX) {
                sg_diag_add(diag, "%s:%d: variant %s: field hosts: the companion of %d hosts would be named %s, "
                            "longer than %d characters: shorten the variant's name", p->file, p->line, p->name,
                            H, name, SG_NAME_MAX - 1);
                errors++;
                continue;
            }
            snprintf(c->name, sizeof c->name, "%s", name);
        }
    }
    /* A companion's name must be free, ignoring case (files, guards). */
    for (size_t i = 0; i < total && errors == 0; i++)
        for (size_t j = 0; j < total; j++) {
            if (j == i || !all[i].companion_hosts || strcasecmp(all[i].name, all[j].name) != 0)
                continue;
            if (j < i && all[j].companion_hosts)
                continue; /* said once, at the first */
            const sg_variant *p = NULL;
            for (size_t q = i; q-- > 0;)
                if (!all[q].companion_hosts) {
                    p = &all[q];
                    break;
                }
            sg_diag_add(diag, "%s:%d: variant %s: field hosts: the companion of %d hosts is named %s, which "
                        "variant %s (%s:%d) also has: rename one", p->file, p->line, p->name,
                        all[i].companion_hosts, all[i].name, all[j].name,
                        all[j].file ? all[j].file : "?", all[j].line);
            errors++;
        }
    if (errors) {
        free(all);
        return errors;
    }
    for (size_t i = 0; i < total; i++)
        if (all[i].n_hosts) {
            all[i].companions = &all[i + 1];
            all[i].n_companions = all[i].n_hosts;
        }
    *out = all;
    *n_out = total;
    return 0;
}

/* ------------------------------------------------------------------------
 * The interface */

/* Only layout calls that returned declare a variant: the slots of those
 * that raised an error (already freed) go. */
static void drop_incomplete(spec_run *run)
{
    size_t kept = 0;
    for (size_t i = 0; i < run->n_vars; i++)
        if (run->vars[i].complete)
            run->vars[kept++] = run->vars[i];
    run->n_vars = kept;
}

static void run_free(spec_run *run)
{
    for (size_t i = 0; i < run->n_vars; i++)
        raw_variant_free(&run->vars[i]);
    free(run->vars);
    for (size_t i = 0; i < run->n_sources; i++)
        free(run->sources[i]);
    free(run->sources);
    free(run->dir);
}

static int prepare(spec_run *run, const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0;
    char *own = strdup(path);
    run->path = path;
    run->dir = strndup(path, dlen);
    if (!own || !run->dir) {
        free(own);
        return -1;
    }
    return add_source(run, own) < 0 ? -1 : 0;
}

int sg_spec_load(const char *path, const sg_override *overrides, size_t n_overrides,
                 sg_spec *out, sg_diag *diag)
{
    if (!path) {
        sg_diag_add(diag, "sg_spec_load: no spec path given");
        return -1;
    }
    spec_run run = { 0 };
    override *ovr = calloc(n_overrides + 1, sizeof *ovr);
    const override *by_field[F_COUNT] = { 0 };
    bool bad_override[F_COUNT] = { false };
    sg_variant *variants = NULL;
    char *text = NULL;
    int errors = 0, rc = -1;
    if (!ovr || prepare(&run, path) != 0) {
        sg_diag_add(diag, "%s: out of memory", path);
        goto done;
    }
    errors = parse_overrides(overrides, n_overrides, ovr, by_field, diag);
    errors += check_overrides_alone(by_field, bad_override, diag);
    /* The path goes into manifest.json (JSON strings are UTF-8), the
     * generated files and every message. */
    if (!sg_is_printable(path)) {
        char *shown = sg_printable(path);
        sg_diag_add(diag, "%s: expected a spec path of printable UTF-8 (it is written into manifest.json and "
                    "the generated files): rename the file", shown ? shown : "spec");
        free(shown);
        goto done;
    }
    spec_timeout();
    if (spec_limit.error[0]) {
        sg_diag_add(diag, "%s", spec_limit.error);
        goto done;
    }
    const char *kind = NULL;
    int err = read_file(path, &text, &run.text_len, &kind);
    if (err != 0) {
        char why[VALUE_BUF];
        read_error_text(why, err, kind);
        sg_diag_add(diag, "%s: %s", path, why);
        goto done;
    }
    run.text = text;
    int ran = run_isolated(&run, diag);
    free(text);
    run.text = NULL;
    if (ran != 0)
        goto done;
    drop_incomplete(&run);
    if (run.n_vars == 0) {
        sg_diag_add(diag, "%s: declares no variants (call layout { ... })", path);
        goto done;
    }
    variants = calloc(run.n_vars, sizeof *variants);
    if (!variants) {
        sg_diag_add(diag, "%s: out of memory", path);
        goto done;
    }
    errors += validate(&run, by_field, bad_override, variants, diag);
    size_t count = run.n_vars;
    if (errors == 0) {
        sg_variant *all = NULL;
        errors += add_companions(variants, run.n_vars, &all, &count, diag);
        if (all) {
            free(variants);
            variants = all;
        }
    }
    char *own_path = errors == 0 ? strdup(path) : NULL;
    if (errors == 0 && !own_path)
        sg_diag_add(diag, "%s: out of memory", path);
    if (own_path) {
        out->path = own_path;
        out->variants = variants;
        out->count = count;
        out->files = run.sources; /* the variants' file points into them */
        out->n_files = run.n_sources;
        run.sources = NULL;
        run.n_sources = 0;
        variants = NULL;
        rc = 0;
    }
done:
    free(variants);
    for (size_t i = 0; ovr && i < n_overrides; i++) {
        raw_free(&ovr[i].value);
        free(ovr[i].origin);
    }
    free(ovr);
    run_free(&run);
    return rc;
}

int sg_overrides_check(const sg_override *overrides, size_t n, sg_diag *diag)
{
    override *ovr = calloc(n + 1, sizeof *ovr);
    const override *by_field[F_COUNT] = { 0 };
    bool bad[F_COUNT] = { false };
    if (!ovr) {
        sg_diag_add(diag, "-D: out of memory");
        return 1;
    }
    int errors = parse_overrides(overrides, n, ovr, by_field, diag);
    errors += check_overrides_alone(by_field, bad, diag);
    for (size_t i = 0; i < n; i++) {
        raw_free(&ovr[i].value);
        free(ovr[i].origin);
    }
    free(ovr);
    return errors;
}

void sg_spec_free(sg_spec *spec)
{
    if (!spec)
        return;
    free(spec->path);
    free(spec->variants);
    for (size_t i = 0; i < spec->n_files; i++)
        free(spec->files[i]);
    free(spec->files);
    memset(spec, 0, sizeof *spec);
}

const char *sg_dtype_name(symm_dtype d)
{
    return (unsigned)d < sizeof dtype_names / sizeof dtype_names[0] ? dtype_names[d] : "unknown";
}

const char *sg_layout_name(symm_layout l)
{
    return (unsigned)l < sizeof layout_names / sizeof layout_names[0] ? layout_names[l] : "unknown";
}

const char *sg_combine_name(symm_combine_mode c)
{
    return (unsigned)c < sizeof combine_names / sizeof combine_names[0] ? combine_names[c] : "unknown";
}
