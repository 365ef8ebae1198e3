"""`strand worker`: the tensor-parallel ranks of a node other than the engine's.

    # node 0 (the engine):  strand serve --model DIR --tensor-parallel-size 4 --nnodes 2 \
    #                           --master-addr 10.0.0.1 --master-port 29500
    # node 1:               strand worker --tensor-parallel-size 4 --nnodes 2 --node-rank 1 \
    #                           --master-addr 10.0.0.1 --master-port 29500

The worker needs no model flags: rank 0 sends every rank the engine's model, cache and scheduler
configuration once the group is joined (the model directory must exist at the same path here).
"""

from __future__ import annotations

import argparse
import sys

from strand.engine_core.distributed.parallel_state import DistributedInit
from strand.engine_core.distributed.worker import serve_node


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="strand worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensor-parallel-size", type=int, required=True,
                        help="ranks over all nodes (the engine's --tensor-parallel-size)")
    parser.add_argument("--nnodes", type=int, required=True, help="nodes the ranks span")
    parser.add_argument("--node-rank", type=int, required=True,
                        help="this node's index, 1..nnodes-1 (0 is the engine's)")
    parser.add_argument("--master-addr", required=True, help="the engine node's address")
    parser.add_argument("--master-port", type=int, required=True,
                        help="the engine's --master-port")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: NCCL, one GPU per rank of this node; cpu: gloo")
    parser.add_argument("--distributed-timeout-s", type=float, default=60.0,
                        help="seconds to wait for the other ranks to join")
    args = parser.parse_args(argv)
    init = DistributedInit(world_size=args.tensor_parallel_size, master_addr=args.master_addr,
                           master_port=args.master_port, nnodes=args.nnodes,
                           node_rank=args.node_rank,
                           backend="nccl" if args.device == "cuda" else "gloo",
                           timeout_s=args.distributed_timeout_s)
    sys.exit(serve_node(init))
