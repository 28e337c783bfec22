"""One rank of a pair that test_peer_death.py starts outside torchrun (which
would stop every rank when one dies): both make a Buffer over a gloo group,
then rank 1 exits; rank 0's dispatch waits for it on the GPU until the
variant's timeout, and stats() must raise libsymm's error naming rank 1.
usage: python3 peer_death.py RANK PORT TIMEOUT_S"""
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    rank, port, timeout = int(sys.argv[1]), sys.argv[2], float(sys.argv[3])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo")
    import symmgen
    spec = dict(name="peer_death", hidden=1024, topk=2, experts=8, max_tokens=64, dtype="bf16")
    buf = symmgen.Buffer(spec=spec, timeout=timeout)
    dist.barrier()
    if rank == 1:
        print("peer_death: rank 1 exits with its variant alive", flush=True)
        os._exit(0)
    g = torch.Generator(device="cpu").manual_seed(7)
    x = torch.randn((16, 1024), generator=g).to(torch.bfloat16).cuda()
    # Every token to one expert of each rank, so that rank 1's rows are awaited.
    idx = torch.tensor([[1, 5]] * 16, dtype=torch.int32).cuda()
    w = torch.rand((16, 2), generator=g).cuda()
    start = time.monotonic()
    try:
        with torch.no_grad():
            buf.dispatch(x, idx, w)
            buf.stats()
    except symmgen.SymmError as e:
        took, msg = time.monotonic() - start, str(e)
        ok = "for rank 1" in msg and took < timeout + 30
        print(f"peer_death: {'ok' if ok else 'WRONG'}: SymmError after {took:.1f} s: {msg}", flush=True)
        os._exit(0 if ok else 1)
    print(f"peer_death: WRONG: no error after {time.monotonic() - start:.1f} s", flush=True)
    os._exit(1)


if __name__ == "__main__":
    main()
