/* heap_internal.h: what heap.c lends the other runtime modules; not
 * installed. */
#ifndef SYMM_HEAP_INTERNAL_H
#define SYMM_HEAP_INTERNAL_H

#include "internal.h"
#include "symm_world.h"

/* Collective: every rank reports how its own part of a collective step went,
 * so that all ranks fail together instead of some waiting for the others
 * until the timeout. Returns local (its message kept) where it failed;
 * otherwise SYMM_ERR_PEER "<call>: rank R failed: <R's message>" for the
 * lowest failing rank, or SYMM_OK when every rank succeeded. Also a barrier. */
symm_status symm_agree(symm_world *world, symm_status local, const char *call);

/* "2 hosts (node01, node02)" for the messages that refuse a world across
 * hosts (machine ids shown by hostname). */
void symm_hosts_text(const symm_world *world, char *buf, size_t n);

#endif
