/* json.h: a small, strict JSON reader for the manifest that symmgen writes.
 * It parses a whole document into a tree held in one arena (freed at once),
 * records where every value starts, keeps each number's text as written (so
 * a message can quote it) and says whether it is an integer that fits int64.
 * Nesting is capped and every number is overflow-checked: any input, however
 * broken, gives either a tree or a line:column and a reason. Memory is
 * capped too (below): a tiny value ("0,") costs a node far larger than its
 * text. Internal; not installed. */
#ifndef SYMM_JSON_H
#define SYMM_JSON_H

#include <stddef.h>
#include <stdint.h>

/* Arrays and objects nested deeper than this are refused (the parser recurses). */
#define SYMM_JSON_MAX_DEPTH 64

/* The tree of a text of n bytes may take at most
 * min(n * SYMM_JSON_MEMORY_PER_BYTE + SYMM_JSON_MEMORY_FLOOR, SYMM_JSON_MAX_MEMORY)
 * bytes; a manifest symmgen writes takes about 6 per byte of text. */
#define SYMM_JSON_MEMORY_PER_BYTE 16
#define SYMM_JSON_MEMORY_FLOOR ((size_t)1 << 20)
#define SYMM_JSON_MAX_MEMORY ((size_t)1 << 30)

typedef enum symm_json_type {
    SYMM_JSON_NULL,
    SYMM_JSON_BOOL,
    SYMM_JSON_NUMBER,
    SYMM_JSON_STRING,
    SYMM_JSON_ARRAY,
    SYMM_JSON_OBJECT,
} symm_json_type;

typedef struct symm_json symm_json;
struct symm_json {
    symm_json_type type;
    int line, col;        /* where the value starts, 1-based (col in bytes) */
    int boolean;          /* BOOL */
    int is_int;           /* NUMBER: an integer (no fraction or exponent) within int64 */
    int64_t integer;      /* NUMBER when is_int */
    const char *str;      /* STRING: decoded, NUL-terminated; NUMBER: the text as written */
    size_t len;           /* bytes of str (a STRING may hold a NUL: len says where it ends) */
    const char *key;      /* member of an OBJECT: its key, decoded, NUL-terminated */
    size_t key_len;
    symm_json *first;     /* ARRAY, OBJECT: first element or member */
    symm_json *next;      /* the next element or member of the same parent */
    size_t count;         /* ARRAY, OBJECT: elements or members */
};

typedef struct symm_json_doc symm_json_doc;

enum { SYMM_JSON_OK = 0, SYMM_JSON_SYNTAX = -1, SYMM_JSON_NOMEM = -2, SYMM_JSON_TOO_LARGE = -3 };

/* Parse text[0..len) (no NUL needed; a UTF-8 byte order mark is skipped).
 * Returns SYMM_JSON_OK with *out, or SYMM_JSON_SYNTAX with *line and *col
 * (1-based) where the text goes wrong and why ("expected ':' after a key,
 * got '}'"), or SYMM_JSON_TOO_LARGE (the memory cap above; where it was met
 * and why), or SYMM_JSON_NOMEM. */
int symm_json_parse(const char *text, size_t len, symm_json_doc **out, int *line, int *col,
                    char *why, size_t why_size);

const symm_json *symm_json_root(const symm_json_doc *doc);
void symm_json_free(symm_json_doc *doc);

/* The first member called key of obj (NULL when there is none or obj is not
 * an object); *count, when given, receives how many members have that key. */
const symm_json *symm_json_member(const symm_json *obj, const char *key, int *count);

/* "a string", "an object", ... for messages. */
const char *symm_json_type_name(symm_json_type type);

#endif
