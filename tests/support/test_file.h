/* test_file.h: a whole file read into memory, for the CPU tests that
 * compare or edit generated sources, fixtures and templates. */
#ifndef TEST_FILE_H
#define TEST_FILE_H

#include <stddef.h>

/* The bytes of the file at path with a NUL after them (so text reads as a
 * string), in memory to free(); *len (unless NULL) their count. Fails the
 * calling test, naming the path, where the file cannot be opened or read
 * whole (paths are relative to the repository root, where the tests run). */
void *test_slurp(const char *path, size_t *len);

#endif
