/* test_combine_form.c: which form of combine the native backend launches
 * (runtime/variant.c), without a GPU: whether all capacity rows of y lie
 * in the variant's symmetric buffer (the test a pulling combine applies to
 * y, and by which combine = "auto" chooses per call), at the buffer's
 * edges and across them, and the form each mode takes for a y inside and
 * outside. Random shapes and addresses, fresh each run. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "moe_inputs.h"
#include "variant_internal.h"
#include "world_fork.h"

static moe_rng rng;

static void setup(void) { wf_random(&rng.s, sizeof rng.s); }

TestSuite(combine_form, .init = setup);

static uint64_t below(uint64_t n) { return moe_rng_next(&rng) % n; }

/* A random descriptor of layout rank whose capacity rows of y fit in its
 * symmetric buffer with `spare` bytes to spare, and the rows' bytes. */
static symm_variant_desc random_desc(symm_combine_mode mode, uint64_t spare, uint64_t *need)
{
    symm_variant_desc d;
    memset(&d, 0, sizeof d);
    d.name = "form";
    d.layout = SYMM_LAYOUT_RANK;
    d.combine = mode;
    d.combine_dtype = (symm_dtype)below(3);
    d.hidden = 8 * (1 + (int)below(1024));
    d.capacity = 1 + (int64_t)below(1 << 16);
    *need = (uint64_t)d.capacity * (uint64_t)d.hidden * (uint64_t)symm_dtype_size(d.combine_dtype);
    d.symmetric_bytes = *need + spare;
    return d;
}

/* A 256-byte aligned base well inside the address space (a VMM mapping). */
static CUdeviceptr random_base(void) { return (CUdeviceptr)((1ull << 40) + below(1ull << 36)) & ~(CUdeviceptr)255; }

Test(combine_form, y_inside_means_all_capacity_rows_inside_the_buffer)
{
    for (int round = 0; round < 200; round++) {
        uint64_t need;
        const uint64_t spare = 16 * below(1 << 20);
        const symm_variant_desc d = random_desc(SYMM_COMBINE_AUTO, spare, &need);
        const CUdeviceptr base = random_base(), end = base + d.symmetric_bytes;
        const struct {
            const char *where;
            CUdeviceptr y;
            bool inside;
        } cases[] = {
            {"at the start", base, true},
            {"ending at the buffer's end", end - need, true},
            {"somewhere between", base + 16 * below(spare / 16 + 1), true},
            {"straddling the end by 16 bytes", end - need + 16, false},
            {"straddling the end by a row", end - need + (uint64_t)d.hidden * 2, false},
            {"starting at the end", end, false},
            {"starting 16 bytes before the buffer", base - 16, false},
            {"starting far before it", base - (1ull << 30), false},
            {"far past it", end + (1ull << 30), false},
            {"at address 16", 16, false},
            {"near the top of the address space", UINT64_MAX - 15, false},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            cr_assert_eq(symm_variant_y_inside(&d, base, cases[i].y), cases[i].inside,
                         "y %s (capacity %lld x hidden %d, %llu bytes in a buffer of %llu): inside should be %d",
                         cases[i].where, (long long)d.capacity, d.hidden, (unsigned long long)need,
                         (unsigned long long)d.symmetric_bytes, cases[i].inside);
    }
}

/* A y of more bytes than the whole buffer is never inside, wherever it is. */
Test(combine_form, y_larger_than_the_buffer_is_never_inside)
{
    for (int round = 0; round < 100; round++) {
        uint64_t need;
        symm_variant_desc d = random_desc(SYMM_COMBINE_AUTO, 0, &need);
        d.symmetric_bytes = need - 1 - below(need);
        const CUdeviceptr base = random_base();
        for (uint64_t off = 0; off < 4096; off += 256)
            cr_assert(!symm_variant_y_inside(&d, base, base + off), "y of %llu bytes at +%llu inside %llu bytes",
                      (unsigned long long)need, (unsigned long long)off, (unsigned long long)d.symmetric_bytes);
    }
}

/* The native kernel each mode launches: "push" never pulls, "pull" always
 * does (its y was checked before), "auto" pulls exactly when y is inside. */
Test(combine_form, native_form_follows_the_mode_and_for_auto_the_place_of_y)
{
    for (int round = 0; round < 100; round++) {
        uint64_t need;
        const symm_variant_desc auto_d = random_desc(SYMM_COMBINE_AUTO, 256 * below(1024), &need);
        symm_variant_desc push_d = auto_d, pull_d = auto_d;
        push_d.combine = SYMM_COMBINE_PUSH;
        pull_d.combine = SYMM_COMBINE_PULL;
        const CUdeviceptr base = random_base(), end = base + auto_d.symmetric_bytes;
        const CUdeviceptr inside = base + 256 * below((auto_d.symmetric_bytes - need) / 256 + 1);
        const CUdeviceptr outside[] = {end - need + 16, end, base - 256, 0x1000};
        cr_assert(symm_variant_native_pulls(&auto_d, base, inside), "auto with y inside must pull");
        cr_assert(symm_variant_native_pulls(&pull_d, base, inside), "pull with y inside must pull");
        cr_assert(!symm_variant_native_pulls(&push_d, base, inside), "push with y inside must push");
        for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
            cr_assert(!symm_variant_native_pulls(&auto_d, base, outside[i]), "auto with y outside (%zu) must push",
                      i);
            cr_assert(!symm_variant_native_pulls(&push_d, base, outside[i]), "push must push");
            cr_assert(symm_variant_native_pulls(&pull_d, base, outside[i]),
                      "pull pulls whatever y (the host refused a y outside before)");
        }
    }
}
