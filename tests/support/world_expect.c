/* world_expect.c: see world_expect.h. */
#include "world_expect.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

int wf_failed_call(wf_result *res, const char *what, symm_status st)
{
    return wf_failf(res, "%s: %s: %s", what, symm_status_name(st), symm_last_error());
}

int wf_record(wf_result *res, symm_status st, double t0)
{
    res->status = (int)st;
    res->elapsed_s = wf_now() - t0;
    snprintf(res->msg, sizeof res->msg, "%s", st ? symm_last_error() : "");
    return 0;
}

void wf_expect_status(const wf_result *r, int i, symm_status want, const char *needle)
{
    cr_assert(r[i].done, "rank %d did not finish: %s", i, r[i].msg);
    cr_assert_eq(r[i].code, 0, "rank %d: %s", i, r[i].msg);
    cr_assert_eq(r[i].status, (int)want, "rank %d: got %s (%s), expected %s", i,
                 symm_status_name((symm_status)r[i].status), r[i].msg, symm_status_name(want));
    if (needle)
        cr_assert(strstr(r[i].msg, needle), "rank %d: message \"%s\" lacks \"%s\"", i, r[i].msg, needle);
}

void wf_expect_success(const wf_result *r, int n)
{
    for (int i = 0; i < n; i++) {
        cr_assert(r[i].done, "rank %d did not finish: %s", i, r[i].msg);
        cr_assert_eq(r[i].code, 0, "rank %d: %s", i, r[i].msg);
    }
}
