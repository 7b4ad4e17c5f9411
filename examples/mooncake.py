"""The Mooncake FAST'25 request traces (bundled; Apache-2.0, see ``data/mooncake/``).

One request per line: arrival ``timestamp`` (ms from the trace start), ``input_length`` and
``output_length`` (tokens) and ``hash_ids``, one id per 512-token block of the prompt (equal
ids = identical prefix block). The traces carry no agent or session labels, so they serve
prefix-reuse studies at the block level, not the agent predictor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import msgspec

from pbkv.actors.workload import Segment, Step, Workflow
from pbkv.examples.apps import register_app
from pbkv.examples.data import find_data_file, read_data_text
from pbkv.predictor.trace import END

MOONCAKE_TRACES = ("conversation", "synthetic")
MOONCAKE_BLOCK_TOKENS = 512
"""Tokens per ``hash_ids`` entry (Mooncake's block size)."""
_MAX_TOKENS = 10_000_000

_Count = Annotated[int, msgspec.Meta(ge=0, le=_MAX_TOKENS)]


class MooncakeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One request of a Mooncake trace (fields renamed to carry their units)."""

    timestamp_ms: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(name="timestamp")
    input_tokens: _Count = msgspec.field(name="input_length")
    output_tokens: _Count = msgspec.field(name="output_length")
    hash_ids: tuple[Annotated[int, msgspec.Meta(ge=0)], ...] = msgspec.field(name="hash_ids")


_DECODER = msgspec.json.Decoder(MooncakeRequest)


def load_mooncake(
    name: str, data_dir: str | os.PathLike[str] | None = None
) -> tuple[MooncakeRequest, ...]:
    """Return the requests of the Mooncake trace ``name``, in file (arrival) order.

    Args:
        name: ``"conversation"`` (12,031 requests, ~59 min) or ``"synthetic"`` (3,993, ~17 min).
        data_dir: a data directory holding ``mooncake/``; ``$PBKV_DATA_DIR`` or the bundled
            traces when omitted.

    Raises:
        ValueError: an unknown ``name`` (lists the known ones), or a malformed line (names
            the file, line and field).
        FileNotFoundError: the trace file is missing.
    """
    if name not in MOONCAKE_TRACES:
        raise ValueError(f"unknown Mooncake trace {name!r}; known: {', '.join(MOONCAKE_TRACES)}")
    path = find_data_file(Path("mooncake") / f"{name}_trace.jsonl", data_dir)
    requests = []
    for number, line in enumerate(read_data_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            requests.append(_DECODER.decode(line))
        except msgspec.ValidationError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from exc
        except msgspec.DecodeError as exc:
            raise ValueError(f"{path}:{number}: not valid JSON: {exc}") from exc
    return tuple(requests)


OUTPUT_TOKEN_ID = 0
"""The token every synthesised output repeats (prompt token ids start at 1)."""


def block_token_ids(hash_id: int) -> range:
    """Return the 512 token ids that stand for Mooncake block ``hash_id``
    (``1 + 512 hash_id`` up to ``512 hash_id + 512``; disjoint for distinct ids)."""
    start = 1 + MOONCAKE_BLOCK_TOKENS * hash_id
    return range(start, start + MOONCAKE_BLOCK_TOKENS)


def request_prompt_ids(request: MooncakeRequest) -> tuple[int, ...]:
    """Return the synthesised prompt of ``request``: its blocks' token ids in order, cut
    to ``input_tokens`` (the last block is partial when the length is not a multiple of 512).
    """
    ids = [t for h in request.hash_ids for t in block_token_ids(h)]
    return tuple(ids[: request.input_tokens])


class MooncakeApp:
    """Replay of a Mooncake trace as unlabeled traffic (see the module docstring).

    ``generate(n, seed)`` returns the trace's first ``n`` requests in arrival order, for
    every ``seed`` (a replay has nothing to draw; the seed only names the workflows). The
    call graph is ``request → END``: there are no agent or session labels, so a forecast
    has nothing to offer and a policy must do as well as recency alone.

    Args:
        trace: ``"conversation"`` or ``"synthetic"``.
        data_dir: as :func:`load_mooncake`.

    Attributes:
        open_loop: ``True``: the bench starts each request no earlier than its arrival
            (``Workflow.arrival_s``), as the trace was recorded; ``concurrency`` still caps
            the requests in flight.
    """

    agents = ("request",)
    entry_agents = ("request",)
    edges = (("request", END),)
    open_loop = True

    def __init__(
        self, trace: str = "conversation", data_dir: str | os.PathLike[str] | None = None
    ) -> None:
        if trace not in MOONCAKE_TRACES:
            raise ValueError(
                f"unknown Mooncake trace {trace!r}; known: {', '.join(MOONCAKE_TRACES)}"
            )
        self.name = "mooncake" if trace == "conversation" else f"mooncake-{trace}"
        self._trace = trace
        self._data_dir = data_dir

    def generate(self, n_workflows: int, seed: int) -> list[Workflow]:
        """Return the first ``n_workflows`` requests as one-step workflows.

        Raises:
            ValueError: ``n_workflows`` is not an int >= 0 or exceeds the trace's length.
        """
        if isinstance(n_workflows, bool) or not isinstance(n_workflows, int) or n_workflows < 0:
            raise ValueError(f"n_workflows must be an int >= 0, got {n_workflows!r}")
        requests = load_mooncake(self._trace, self._data_dir)
        if n_workflows > len(requests):
            raise ValueError(
                f"the {self._trace} trace holds {len(requests)} requests, "
                f"{n_workflows} were asked for"
            )
        output = {}
        workflows = []
        for i, r in enumerate(requests[:n_workflows]):
            out = output.setdefault(r.output_tokens, (OUTPUT_TOKEN_ID,) * r.output_tokens)
            step = Step("request", (Segment("context", request_prompt_ids(r)),), out)
            workflows.append(
                Workflow(
                    workflow_id=f"{self.name}-{seed}-{i}",
                    app=self.name,
                    task_id=f"{self.name}-{i}",
                    task_text="",
                    steps=(step,),
                    arrival_s=r.timestamp_ms / 1000,
                )
            )
        return workflows


register_app("mooncake", MooncakeApp)
