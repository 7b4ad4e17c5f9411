"""The error a graph node's own code raises, named by node and part (§4, live graph API)."""

from __future__ import annotations


class NodeFailed(RuntimeError):
    """A node's own code raised: the workflow's error names the node and what it did.

    The original exception is chained (``__cause__``), so tracebacks show it.

    Attributes:
        node: the node (agent or tool) whose code raised.
        part: what it was doing: ``router``, ``tool``, ``prompt builder``,
            ``simulate`` (a simulated reply or tool result) or ``call`` (the runtime
            refused the agent's call, e.g. ``PromptTooLong``).
    """

    def __init__(self, node: str, part: str, error: BaseException) -> None:
        super().__init__(f"node {node!r} ({part}) raised {type(error).__name__}: {error}")
        self.node = node
        self.part = part
