/* world_expect.h: what the ranks of a forked world (world_fork.h) report of
 * the library's calls, and the parent's checks of those reports: shared by the
 * tests of worlds on one host and across hosts. */
#ifndef WORLD_EXPECT_H
#define WORLD_EXPECT_H

#include "symm_world.h"
#include "world_fork.h"

/* In a rank: report a failed call of the library with its status and message
 * (returns 1, a failing code). */
int wf_failed_call(wf_result *res, const char *what, symm_status st);

/* In a rank: record the status (and message) it expects, and the time since
 * t0, for the parent to check (returns 0). */
int wf_record(wf_result *res, symm_status st, double t0);

/* In the parent: rank i finished and recorded want, its message holding
 * needle (unless NULL). */
void wf_expect_status(const wf_result *r, int i, symm_status want, const char *needle);

/* In the parent: ranks 0..n-1 all finished and succeeded. */
void wf_expect_success(const wf_result *r, int n);

#endif
