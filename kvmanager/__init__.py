"""The KV manager: radix tree over GPU and host tiers, PBKV scoring, eviction, prefetch (§5).

Plain synchronous code (no trio, no torch), driven by an engine's scheduler step and by
the KV-manager actor.
"""

from pbkv.kvmanager.belady import BeladyTracker, FutureStep
from pbkv.kvmanager.blocks import BlockPool
from pbkv.kvmanager.bounds import AccessLog, ceiling_hits, min_hits
from pbkv.kvmanager.continuum import ContinuumStatistics, ContinuumTracker
from pbkv.kvmanager.eviction import EvictionIndex
from pbkv.kvmanager.keys import block_keys
from pbkv.kvmanager.kvflow import KVFlowTracker, StepGraph
from pbkv.kvmanager.manager import Admission, AdmitRequest, BaselineInputs, KVConfig, KVManager
from pbkv.kvmanager.node import Node
from pbkv.kvmanager.policies import POLICIES, Policy, get_policy
from pbkv.kvmanager.prefetch import Prefetcher
from pbkv.kvmanager.radix import HOST_TIERS, Lease, LoadTransfer, MatchResult, RadixTree
from pbkv.kvmanager.scoring import ScoreBoard, agent_weights, validate_forecast
from pbkv.kvmanager.stats import KVStatistics
from pbkv.kvmanager.survival import MarkovChain, SurvivalTracker, WarmupPrefetcher
from pbkv.kvmanager.waiting import QueuedPrompt, QueuedWalk, WaitingPrefixes

__all__ = [
    "HOST_TIERS",
    "POLICIES",
    "AccessLog",
    "Admission",
    "AdmitRequest",
    "BaselineInputs",
    "BeladyTracker",
    "KVFlowTracker",
    "StepGraph",
    "BlockPool",
    "ContinuumStatistics",
    "ContinuumTracker",
    "EvictionIndex",
    "FutureStep",
    "KVConfig",
    "KVManager",
    "KVStatistics",
    "Lease",
    "LoadTransfer",
    "MarkovChain",
    "MatchResult",
    "Node",
    "Policy",
    "Prefetcher",
    "QueuedPrompt",
    "QueuedWalk",
    "RadixTree",
    "ScoreBoard",
    "SurvivalTracker",
    "WaitingPrefixes",
    "WarmupPrefetcher",
    "agent_weights",
    "block_keys",
    "ceiling_hits",
    "get_policy",
    "min_hits",
    "validate_forecast",
]
