"""Scale-out: several inference engines behind one router, several trainer ranks behind one
`Trainer`, and their placement on Ray.

- `replicas`: `ReplicaEngine`, the `InferenceEngine` protocol over R torch engines, each in
  a child process (`replica_server`, spoken to by `replica_clients`) or a Ray actor
  (`ray_replica`), routed by `replica_router`;
- `distributed`: `DistributedTrainer`, the `Trainer` protocol over W data-parallel ranks
  (`rank`: a rank's process; `ray_ranks`: ranks as Ray actors), with FSDP;
- `ray_cluster`: what each replica and rank asks of a Ray cluster.

Everything loads on first use (torch, and Ray where asked for).

Left out: tensor and pipeline parallelism; vLLM's own replicas (`engine.vllm_engine`).
"""

from typing import TYPE_CHECKING

from art_langgraph.runtime.lazy import lazy_getattr

if TYPE_CHECKING:
    from art_langgraph.scaleout.distributed import DistributedTrainer
    from art_langgraph.scaleout.replicas import ReplicaEngine

__getattr__ = lazy_getattr(
    __name__,
    globals(),
    {
        "DistributedTrainer": "art_langgraph.scaleout.distributed",
        "ReplicaEngine": "art_langgraph.scaleout.replicas",
    },
)

__all__ = ["DistributedTrainer", "ReplicaEngine"]
