"""``pbkv serve``: an OpenAI-compatible HTTP server over the live runtime (§7.4).

Apps written against an OpenAI client (LangGraph, AutoGen, CrewAI, the OpenAI SDK) point
``base_url`` at it and say who is calling with headers (``X-PBKV-Workflow-Id``,
``X-PBKV-Agent``, ``X-PBKV-Final``; Dynamo's ``X-Dynamo-Session-ID``) or a ``pbkv`` body
object (``extra_body``); a server session is a live workflow. Routes:
``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``,
``GET /health``, ``GET /stats`` (JSON) and ``GET /metrics`` (Prometheus text).
Needs the ``serve`` extra (hypercorn).
"""

from pbkv.server.app import OpenAIApp
from pbkv.server.config import ServerConfig
from pbkv.server.errors import APIError
from pbkv.server.hints import Hints, resolve_hints
from pbkv.server.serve import Server, ServerAddress, open_server, run_server, serve, shut_down
from pbkv.server.sessions import SessionRegistry, SessionStatistics, WorkflowRecord
from pbkv.server.stop import StopCutter

__all__ = [
    "APIError",
    "Hints",
    "OpenAIApp",
    "Server",
    "ServerAddress",
    "ServerConfig",
    "SessionRegistry",
    "SessionStatistics",
    "StopCutter",
    "WorkflowRecord",
    "open_server",
    "resolve_hints",
    "run_server",
    "serve",
    "shut_down",
]
