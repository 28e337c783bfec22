/* symm_jit.h: the JIT of libsymm: compile CUDA C++ source to a cubin with
 * NVRTC, cache the cubin on disk, and load it with the CUDA driver.
 *
 * Compiling needs NVRTC (opened at run time: libnvrtc.so.13, then .12, by
 * soname, then under $CUDA_HOME/lib64 and /usr/local/cuda/lib64), not a GPU;
 * without NVRTC it fails with SYMM_ERR_NVRTC "NVRTC is not available: ...".
 * Loading needs the GPU driver and a current context. Every function is
 * thread-safe.
 *
 * The cache. An entry is keyed by the SHA-256 of: the cache format version,
 * the source name and bytes, every option passed to NVRTC in order (the
 * ones listed at symm_jit_compile included), NVRTC's version (major.minor)
 * and the architecture. It is the file <cache dir>/<key in hex>.cubin: a
 * header (magic, format version, key, payload size, SHA-256 of the payload)
 * then the cubin. An entry whose header, size or payload hash does not check
 * out is never loaded: it is compiled again and replaced, and the result's
 * warning says so. Writes go to a temporary file in the same directory
 * (mkstemp), are fsync'ed and renamed over the entry, so several processes
 * (ranks) that compile the same variant at once each write a complete file
 * and readers only ever see complete files. Directories are created with
 * mode 0700 (mkdir -p). Leftover temporary files (".<key>.cubin.XXXXXX", from a
 * process killed mid-write) are never read and may be deleted at any time.
 *
 * A cache directory is only used when it is owned by the calling user and
 * writable by nobody else, its group included (a writer could plant code that
 * runs on our GPU);
 * otherwise, and when it cannot be created or written, the call compiles
 * without caching and says so in the result's warning: a cache problem is
 * never an error. A read-only directory still serves its entries.
 * One cache directory shared by several users is therefore not supported.
 *
 * The environment, read once per process (on the first compile):
 *   SYMM_CACHE_DIR   the cache directory when the request gives none. Set to
 *                    an empty string it is an error (to turn the cache off,
 *                    use SYMM_JIT_CACHE=0). Unset: $XDG_CACHE_HOME/symmgen
 *                    (when XDG_CACHE_HOME is an absolute path, as the XDG
 *                    spec asks), else $HOME/.cache/symmgen, else no cache
 *                    (with a warning).
 *   SYMM_JIT_CACHE   1 (default): use the cache; 0: neither read nor write it.
 *   SYMM_JIT_DUMP    0 (default); 1: after each compile call, write beside
 *                    the entry, in the cache directory (also when caching is
 *                    off; created if needed): <key>.cu (the source),
 *                    <key>.options (one option per line), <key>.elf (the raw
 *                    cubin, for cuobjdump -sass / nvdisasm) and, when NVRTC
 *                    ran in this call, <key>.log and <key>.ptx (when NVRTC
 *                    produced PTX, as 12.x and 13.x do for sm_XX targets).
 *                    A cache hit runs no NVRTC, so it has no PTX or log: add
 *                    SYMM_JIT_CACHE=0 to get them. A dump that cannot be
 *                    written is a warning.
 *   SYMM_JIT_LINEINFO 0 (default); 1: compile with -lineinfo (a line table
 *                    for profilers; the machine code is the same). The option
 *                    is in the cache key: such entries are kept apart.
 *   CUDA_HOME        where NVRTC and the CUDA headers are looked for (default
 *                    /usr/local/cuda).
 * Values other than the ones listed are an error (SYMM_ERR_INVALID_ARG)
 * naming the variable and the accepted values, returned by every compile. */
#ifndef SYMM_JIT_H
#define SYMM_JIT_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda.h>

#include "symm_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flags of a request. */
enum {
    SYMM_JIT_NO_CACHE = 1u << 0, /* neither read nor write the cache */
};

typedef struct symm_jit_request {
    const char *source;      /* NUL-terminated CUDA C++; required */
    const char *source_name; /* e.g. "dsv3_w2.cu", shown in NVRTC's messages;
                              * required */
    const char *arch;        /* "sm_90a": sm_<digits> with an optional a or f
                              * suffix (a cubin target, never compute_XX);
                              * required: see symm_jit_device_arch */
    const char *const *options; /* extra NVRTC options, after the defaults */
    size_t option_count;
    const char *cache_dir;   /* NULL: the default (see the top of this file) */
    unsigned flags;          /* SYMM_JIT_* */
} symm_jit_request;

typedef struct symm_jit_result {
    void *cubin;        /* the cubin (malloc'd; freed by symm_jit_result_free) */
    size_t cubin_size;
    bool cache_hit;     /* the cubin came from the cache, NVRTC did not run */
    double compile_ms;  /* time in NVRTC (0 on a cache hit) */
    double total_ms;    /* time of the whole call */
    char *cache_path;   /* the entry read or written; "" when none was */
    char *warning;      /* what went wrong on the side, e.g. "cache directory
                         * /x cannot be created (...): compiled without
                         * caching"; "" when nothing did */
    char *log;          /* NVRTC's log (warnings), also on failure; "" when
                         * empty or on a cache hit */
} symm_jit_result;

/* Compile req->source for req->arch, or take the cubin from the cache.
 * NVRTC gets, in this order: --gpu-architecture=<arch>, -std=c++17,
 * -default-device, -split-compile=0 (NVRTC 12.4 and later: the kernels are
 * optimised in parallel threads), -I<CUDA_HOME or /usr/local/cuda>/include (when that
 * directory exists), then req->options (a later option overrides an earlier
 * one, with a warning in the log; the architecture is set only through
 * req->arch, never as an option). No math option (--fmad, --use_fast_math)
 * is passed unless the caller passes it.
 *
 * *res is always initialised (zeroed first) and must be released with
 * symm_jit_result_free, also when the call fails. On success every string of
 * *res is non-NULL. Errors: SYMM_ERR_INVALID_ARG (a bad request or
 * environment value), SYMM_ERR_NVRTC (NVRTC is not available, or the source
 * did not compile: "symm_jit_compile: NVRTC failed to compile dsv3_w2.cu for
 * sm_90a:\n<NVRTC's log>"; the message is cut at 8 KiB, res->log holds all
 * of the log), SYMM_ERR_NOMEM. */
symm_status symm_jit_compile(const symm_jit_request *req, symm_jit_result *res);

/* Compile parts 1..parts of one source at once, each with -DSYMM_PART=<i>
 * after req->options, through the cache like symm_jit_compile, part i + 1
 * into res[i]. The generated kernels are cut in parts (1 dispatch; 2
 * combine; 3 the NCCL and hybrid backends' kernels, compiled for those
 * backends only; 4 with combine = "auto", the pulling combine), so a
 * variant's cold compile takes as long as its longest part instead of all.
 * Parts after the first run on threads of their own. Fails, with the message
 * of the first part that failed, when any part does; every res[i] is
 * initialised and must be released with symm_jit_result_free either way.
 * parts: 1..SYMM_JIT_MAX_PARTS. */
#define SYMM_JIT_MAX_PARTS 4
symm_status symm_jit_compile_parts(const symm_jit_request *req, int parts, symm_jit_result *res);

/* symm_jit_compile_parts of the parts list[0..parts), distinct, each
 * 1..SYMM_JIT_MAX_PARTS, part list[i] into res[i] (SYMM_ERR_INVALID_ARG
 * naming the entry otherwise). */
symm_status symm_jit_compile_part_list(const symm_jit_request *req, const int *list, int parts,
                                       symm_jit_result *res);

/* Free what a compile put in *res and zero it; NULL and a zeroed result are
 * fine. Always SYMM_OK. */
symm_status symm_jit_result_free(symm_jit_result *res);

/* The version of the NVRTC that compiles (the one in the cache key).
 * SYMM_ERR_NVRTC when NVRTC is not available. */
symm_status symm_jit_nvrtc_version(int *major, int *minor);

/* The architecture to compile for on a GPU of compute capability
 * major.minor: "sm_<major><minor>", with the suffix "a" from 9.0 on (sm_90a,
 * sm_100a, sm_103a, sm_110a, sm_120a, ...), which enables the
 * architecture-specific features (wgmma, setmaxnreg, tcgen05, ...). An "a"
 * cubin runs only on exactly that compute capability, which is what we want
 * for code compiled for the GPU it runs on. Needs no GPU (for build
 * pipelines). SYMM_ERR_INVALID_ARG when major is not 1..99 or minor not
 * 0..9, or buf (size n) is too small ("sm_100a" needs 8 bytes). */
symm_status symm_jit_arch_for(int major, int minor, char *buf, size_t n);

/* symm_jit_arch_for of device dev's compute capability ("sm_90a" on an H100
 * or H200). SYMM_ERR_NO_GPU without a driver. */
symm_status symm_jit_device_arch(CUdevice dev, char *buf, size_t n);

/* Load a cubin (an ELF image, as symm_jit_compile returns) into the current
 * context. SYMM_ERR_INVALID_ARG for a NULL or non-ELF image (checked before
 * any driver call); SYMM_ERR_STATE when no context is current; SYMM_ERR_CUDA
 * when the driver refuses it (e.g. built for another architecture). */
symm_status symm_jit_load(const void *cubin, size_t size, CUmodule *out);

/* The kernel called name in mod (an extern "C" kernel's name, or a mangled
 * one). SYMM_ERR_INVALID_ARG, naming the kernel, when there is none. */
symm_status symm_jit_get_function(CUmodule mod, const char *name, CUfunction *out);

/* Unload a module from symm_jit_load; NULL is a no-op. */
symm_status symm_jit_unload(CUmodule mod);

#ifdef __cplusplus
}
#endif
#endif
