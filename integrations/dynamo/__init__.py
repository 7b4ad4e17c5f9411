"""pbkv past one machine, on NVIDIA Dynamo (DESIGN §7.6).

:mod:`~pbkv.integrations.dynamo.placement` places each request of a workflow on a
replica (plain code, no Dynamo import; the multi-replica study runs it too). The
Dynamo worker and router service (:mod:`~pbkv.integrations.dynamo.worker`) need the
``dynamo`` extra and are imported only when used.
"""

from pbkv.integrations.dynamo.placement import (
    HOST_HIT_WEIGHT,
    PLACEMENTS,
    Decision,
    InFlight,
    KvAffinityPlacement,
    KvPlacement,
    PbkvPlacement,
    PbkvPlacementConfig,
    Placement,
    PlacementRequest,
    PlacementStatistics,
    ReplicaView,
    RoundRobinPlacement,
    blocks_of,
    kv_cost,
    make_placement,
)

__all__ = [
    "HOST_HIT_WEIGHT",
    "PLACEMENTS",
    "Decision",
    "InFlight",
    "KvAffinityPlacement",
    "KvPlacement",
    "PbkvPlacement",
    "PbkvPlacementConfig",
    "Placement",
    "PlacementRequest",
    "PlacementStatistics",
    "ReplicaView",
    "RoundRobinPlacement",
    "blocks_of",
    "kv_cost",
    "make_placement",
]
