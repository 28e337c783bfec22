/* symm_manifest.h: opening generated variants by name, from the manifest.json
 * that symmgen writes beside them, without linking their C stubs.
 *
 *     symm_manifest *m;
 *     const symm_variant_desc *d;
 *     SYMM_TRY(symm_manifest_open("out/default/manifest.json", &m));
 *     SYMM_TRY(symm_manifest_variant(m, "bf16_rank_w2", &d));   // reads and checks bf16_rank_w2.cu
 *     ... symm_variant_create(world, d, NULL, &v) ... symm_variant_destroy(v) ...
 *     symm_manifest_close(m);
 *
 * or, in one call, symm_variant_open(world, path, "bf16_rank_w2", NULL, &v).
 *
 * The manifest is checked as a whole when it is opened (format version, every
 * variant's fields, types, ranges and buffer layout); a variant's CUDA source
 * is read when that variant is asked for, and refused unless its SHA-256 is the
 * one the manifest records. A manifest is used by one thread at a time. */
#ifndef SYMM_MANIFEST_H
#define SYMM_MANIFEST_H

#include <stddef.h>

#include "symm_status.h"
#include "symm_variant.h"
#include "symm_world.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The manifest format this libsymm reads (its "format" member). */
#define SYMM_MANIFEST_FORMAT 2

/* NVRTC options (besides --gpu-architecture) of every variant opened from a
 * manifest. They must equal SG_NVRTC_OPTIONS in generator/sg.h, which the
 * generated stubs carry (tests/cpu/test_manifest.c checks that they do). */
#define SYMM_NVRTC_DEFAULT_OPTIONS "-std=c++17", "-default-device"

typedef struct symm_manifest symm_manifest;

/* Read and check the manifest at path. Errors:
 *   SYMM_ERR_SYSTEM: the file cannot be read;
 *   SYMM_ERR_INVALID_ARG: "PATH:LINE:COL: JSON syntax error: ...", or a field
 *     that is missing, of the wrong type or out of range, named with its
 *     variant: "PATH: variant NAME: field F: got V, expected ...";
 *   SYMM_ERR_UNSUPPORTED: a "format" other than SYMM_MANIFEST_FORMAT.
 * Members this libsymm does not know are ignored, so the format can grow. */
symm_status symm_manifest_open(const char *path, symm_manifest **out);

/* Free the manifest and every descriptor it handed out. NULL is ignored. */
symm_status symm_manifest_close(symm_manifest *m);

/* Number of variants, and the name of the i-th (in the manifest's order;
 * NULL when i is out of range). */
size_t symm_manifest_count(const symm_manifest *m);
const char *symm_manifest_name(const symm_manifest *m, size_t i);

/* The descriptor of the variant called name, ready for symm_variant_create:
 * every parameter and region of the manifest, its CUDA source (the .cu file
 * the manifest names, relative to the manifest's directory), and the NVRTC
 * options SYMM_NVRTC_DEFAULT_OPTIONS. The source is read on the first request
 * and checked against the manifest's source_sha256 (SYMM_ERR_MISMATCH when it
 * differs: the files were edited or regenerated apart). An unknown name is
 * SYMM_ERR_INVALID_ARG listing the names the manifest has. *out is owned by
 * m and valid until symm_manifest_close(m). */
symm_status symm_manifest_variant(symm_manifest *m, const char *name, const symm_variant_desc **out);

/* Collective, like symm_variant_create. Open the manifest at manifest_path,
 * take the variant called name and create it on world. The manifest is
 * checked before any GPU work, so a bad manifest or name fails the same way
 * with or without a GPU. The variant keeps what it needs of the manifest
 * (symm_variant_describe stays valid) until symm_variant_destroy. */
symm_status symm_variant_open(symm_world *world, const char *manifest_path, const char *name,
                              const symm_variant_options *opts, symm_variant **out);

#ifdef __cplusplus
}
#endif
#endif
