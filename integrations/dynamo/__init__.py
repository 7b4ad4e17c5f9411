"""pbkv past one machine, on NVIDIA Dynamo (DESIGN §7.6).

:mod:`~pbkv.integrations.dynamo.placement` places each request of a workflow on a
replica (plain code, no Dynamo import; the multi-replica study runs it too), and
:mod:`~pbkv.integrations.dynamo.events` turns the radix tree's hooks into Dynamo KV
events. The Dynamo worker (:mod:`~pbkv.integrations.dynamo.worker`) and the placement
service (:mod:`~pbkv.integrations.dynamo.router`) need the ``dynamo`` extra and are
imported only when used (``docs/dynamo.md``).
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
