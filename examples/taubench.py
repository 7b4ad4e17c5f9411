"""The ``taubench`` app: a replay of the 200 real τ-bench airline episodes (§8).

Source: ``taubench/gpt-4o-airline.json`` (bundled gzipped, MIT licence beside it; see
:func:`pbkv.examples.data.find_data_dir`). Each episode becomes one workflow whose steps
are its LLM calls, in order:

- ``agent``: every ``assistant`` message (the airline agent). Prompt = ``preamble``: the
  episode's system policy as a system message (identical in every episode); ``role``: a
  fixed system message listing the airline tools (names and argument names as the
  trajectories use them); ``context``: the conversation so far, ending with
  ``<|im_start|>assistant\\n``. Output = the message's content and its tool calls (as
  ``<tool_call>`` JSON blocks) + ``<|im_end|>\\n``.
- ``user``: every ``user`` message after the first (the user simulator). It shares no
  text with the agent, so its ``preamble`` segment is empty; ``role``: a user-simulator
  guide (our own words, in the spirit of τ-bench's); ``context``: the task instruction
  (``info.task.instruction``), the agent's greeting, then the conversation with roles
  flipped (the simulator's own messages are ``assistant`` turns; it sees the agent's text
  but neither tool calls nor tool results).

Each step's ``context_tail`` is the text of the messages its context gained since the
same side's previous call (``role: content`` lines, the last :data:`TAIL_CHARS`
characters): for ``agent``, the user's message or the tool results; for ``user``, the
agent's message.
- ``tool`` messages are not LLM calls: each adds :data:`TOOL_LATENCY_S` to the ``gap_s``
  of the next step and its text enters the agent's context.

The first ``user`` message opens the task: it is the start of the agent's first context
(and the workflow's ``task_text``), not an LLM call. Messages are rendered in SmolLM2's
chat format and tokenized one by one, so a step's prompt plus output is a prefix of the
same agent's next prompt.

A :class:`pbkv.live.App` graph that replays the recording (a mode of the live
runtime): agent ⇒ {``tool`` → agent, user → agent, END}, whose routers follow the
episode's recorded messages; each prompt is the recorded one, each simulated reply the
recorded message, and the ``tool`` node costs :data:`TOOL_LATENCY_S`. So the call graph
is agent ⇒ {agent (after tools), user, END}, user ⇒ {agent, END}.

Gaps: under the ``bundled`` gap model a user turn follows the agent at once (τ-bench's
user is a language model); under ``cited`` (:mod:`pbkv.examples.gaps`) each ``user``
call waits for a human's think time first: the agent's messages since the user's last
turn read and the recorded reply typed, at one :class:`~pbkv.examples.gaps.Typist`'s
rates per workflow. :data:`TOOL_LATENCY_S` is uncited under both.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

from pbkv.actors.workload import Segment, Step
from pbkv.assets import decode, encode
from pbkv.examples.apps import register_app
from pbkv.examples.chat import END_OF_TURN, render_message
from pbkv.examples.data import find_data_file, read_data_text
from pbkv.examples.gaps import GAP_STREAM, Typist, check_gap_model
from pbkv.live.graph import END, START, App, LiveTask, State, TokenPrompt, ToolResult
from pbkv.live.session import Reply, Simulated

AGENTS = ("agent", "user")
DATA_FILE = Path("taubench") / "gpt-4o-airline.json"
TOOL_LATENCY_S = 0.5
"""Latency of one tool call (a database lookup or update in τ-bench's airline domain)."""
TAIL_CHARS = 1500
"""A step's ``context_tail`` keeps at most this many of the latest characters."""

_ROLES = ("system", "user", "assistant", "tool")
GREETING = "Hi! How can I help you today?"
USER_SIM_GUIDE = """\
You are role-playing a customer who is chatting with an airline's customer service agent. \
The next system message is your instruction: it says who you are, what you want, and how \
you behave. Follow these rules for the whole conversation.
- Write one chat message per turn, short and natural, the way a real customer types.
- Reveal information only when the agent asks for it or when the conversation cannot move \
forward without it; never paste your instruction or list everything you know at once.
- Never make up details that your instruction does not give you, such as ids, dates, \
amounts or names. If you are asked for something you do not know, say so.
- Stay in character. Do not say that you are an AI, a simulator, or following instructions.
- Keep pursuing the goal in your instruction. If the agent offers something that does not \
match it, decline politely and ask for what you actually want, within what the instruction \
allows.
- When your goal is met, or it is clear that it cannot be met, or you are transferred to a \
human agent, end your final message with ###STOP### and write nothing after it."""


@dataclass(frozen=True, slots=True)
class Episode:
    """One τ-bench episode, tokenized as workflow steps.

    Args:
        task_id: ``"{task_id}-{trial}"`` of the source episode.
        opener: the user's first message (the workflow's task text).
        instruction: the user simulator's task instruction.
        reward: the episode's reward (0 or 1).
        n_tool_calls: tool calls the agent made.
        steps: the LLM calls, in order.
        route: the recorded messages after the opener, as graph nodes (``agent``,
            ``user``, ``tool``), in order.
    """

    task_id: str
    opener: str
    instruction: str
    reward: float
    n_tool_calls: int
    steps: tuple[Step, ...]
    route: tuple[str, ...] = ()


_NODE_OF_ROLE = {"assistant": "agent", "user": "user", "tool": "tool"}


class TauBenchApp(App):
    """Replay of the τ-bench airline trajectories (see the module docstring).

    Workflow ``i`` of ``seed`` replays episode ``order[i]``, where ``order`` is shuffled
    passes over all episodes drawn with ``seed``: up to the number of episodes each is
    used at most once; beyond it, repeats are verbatim replays and each episode is used
    equally often, give or take one.

    Args:
        data_dir: a data directory holding ``taubench/``; ``$PBKV_DATA_DIR`` or the bundled
            traces when omitted (see :func:`pbkv.examples.data.find_data_dir`).
        gap_model: ``bundled`` (user turns without think time) or ``cited`` (a human's
            reading and typing time before each user turn; see the module docstring).

    Raises:
        ValueError: ``gap_model`` is unknown.
    """

    def __init__(
        self, data_dir: str | os.PathLike[str] | None = None, gap_model: str = "bundled"
    ) -> None:
        super().__init__("taubench", recursion_limit=256)
        self._data_dir = data_dir
        self._gap_model = check_gap_model(gap_model)
        for agent in AGENTS:
            simulate = self._user_reply if agent == "user" else self._reply
            self.agent(agent, role="", prompt=self._prompt, max_new_tokens=1024, simulate=simulate)
        self.tool(
            "tool", replay_tool, simulate=lambda state: ToolResult("tool", "", TOOL_LATENCY_S)
        )
        self.edge(START, "agent")
        self.route("agent", self._follow, ["tool", "user"])
        self.route("tool", self._follow, ["agent", END])
        self.route("user", self._follow, ["agent", END])
        self.tasks(self._task)

    def episodes(self) -> tuple[Episode, ...]:
        """Return all episodes in file order (tokenized once per process and file version).

        Raises:
            FileNotFoundError: the data directory or file is missing.
            ValueError: the file is not a list of τ-bench episodes (names the field).
        """
        path = find_data_file(DATA_FILE, self._data_dir).resolve()
        stat = path.stat()
        return load_episodes(path, stat.st_size, stat.st_mtime_ns)

    def _task(self, seed: int, index: int) -> LiveTask:
        episodes = self.episodes()
        episode = episodes[_order(seed, len(episodes), 1 + index // len(episodes))[index]]
        features = {
            "task": episode.task_id.rsplit("-", 1)[0],  # trials of one task share it
            "reward": episode.reward,
            "n_tool_calls": float(episode.n_tool_calls),
        }
        return LiveTask(episode.task_id, episode.opener, features)

    def _episode(self, state: State) -> Episode:
        episode = state.values.get("episode")
        if episode is None:
            by_id = {e.task_id: e for e in self.episodes()}
            episode = state.values["episode"] = by_id[state.task.task_id]
        return episode

    def _recorded_step(self, state: State) -> Step:
        calls = sum(turn.kind == "agent" for turn in state.turns)
        return self._episode(state).steps[calls]

    def _prompt(self, state: State) -> TokenPrompt:
        step = self._recorded_step(state)
        return TokenPrompt(step.segments, step.context_tail)

    def _reply(self, state: State) -> Simulated:
        return Simulated(token_ids=self._recorded_step(state).output_token_ids)

    def _user_reply(self, state: State) -> Simulated:
        """The recorded user message, after a human's think time under ``cited``."""
        step = self._recorded_step(state)
        if self._gap_model == "bundled":
            return Simulated(token_ids=step.output_token_ids)
        typist = state.values.get("typist")
        if typist is None:
            typist = state.values["typist"] = Typist.draw(state.rng(GAP_STREAM))
        read_words, typed_words = user_turn_words(step)
        return Simulated(
            token_ids=step.output_token_ids, gap_s=typist.turn_s(read_words, typed_words)
        )

    def _follow(self, state: State, out: Reply | ToolResult) -> str:
        route = self._episode(state).route
        return route[len(state.turns)] if len(state.turns) < len(route) else END


def user_turn_words(step: Step) -> tuple[int, int]:
    """Return the words a human user reads and types for the ``user`` step ``step``.

    Read: the agent's messages since the user's last turn (the step's ``context_tail``,
    whose ``agent:`` labels are not counted; at most :data:`TAIL_CHARS` characters).
    Typed: the recorded reply, end-of-turn marker excluded.
    """
    tail = step.context_tail.split()
    read = len(tail) - sum(word == "agent:" for word in tail)
    typed = decode(step.output_token_ids).removesuffix(END_OF_TURN).split()
    return read, len(typed)


async def replay_tool(state: State) -> str:
    """Spend one tool call's modelled latency (the recording holds its result)."""
    await trio.sleep(TOOL_LATENCY_S)
    return ""


@functools.cache
def _order(seed: int, n_episodes: int, passes: int) -> tuple[int, ...]:
    """Return ``passes`` shuffled passes over ``n_episodes`` episodes, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    return tuple(i for _ in range(passes) for i in rng.permutation(n_episodes).tolist())


@functools.cache
def load_episodes(path: Path, size_bytes: int, mtime_ns: int) -> tuple[Episode, ...]:
    """Parse and tokenize the trajectories file, plain or gzipped (cached per file version).

    ``size_bytes`` and ``mtime_ns`` only key the cache. Tokenizing all 200 episodes takes
    about a second, so nothing is cached on disk.

    Raises:
        ValueError: the file is not valid JSON or an episode lacks a field (names it).
    """
    try:
        raw = json.loads(read_data_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{path}: expected a non-empty JSON list of episodes")
    for i, episode in enumerate(raw):
        _check_episode(episode, f"{path}: episode {i}")
    ids = _Memo()
    tools = _tools_role(raw, ids)
    guide = Segment("role", ids(render_message("system", USER_SIM_GUIDE)))
    return tuple(_episode(e, ids, tools, guide) for e in raw)


def _check_episode(episode: Any, where: str) -> None:
    """Raise ``ValueError`` naming the first missing or malformed field of ``episode``."""
    if not isinstance(episode, dict):
        raise ValueError(f"{where}: expected an object")
    for field in ("task_id", "reward", "info", "traj"):
        if field not in episode:
            raise ValueError(f"{where}: missing field {field!r}")
    info = episode["info"]
    task = info.get("task") if isinstance(info, dict) else None
    if not isinstance(task, dict) or not isinstance(task.get("instruction"), str):
        raise ValueError(f"{where}: missing string field 'info.task.instruction'")
    traj = episode["traj"]
    if not isinstance(traj, list) or len(traj) < 3:
        raise ValueError(f"{where}: field 'traj' must list at least 3 messages")
    for j, message in enumerate(traj):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in _ROLES or (j < 2 and role != _ROLES[j]):
            expected = repr(_ROLES[j]) if j < 2 else f"one of {_ROLES}"
            raise ValueError(f"{where}: traj[{j}].role is {role!r}, expected {expected}")
        if role != "assistant" and not isinstance(message.get("content"), str):
            raise ValueError(f"{where}: traj[{j}].content must be a string")


class _Memo:
    """Tokenize strings, remembering each result (shared pieces get the same tuple)."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[int, ...]] = {}

    def __call__(self, text: str) -> tuple[int, ...]:
        ids = self._ids.get(text)
        if ids is None:
            ids = self._ids[text] = encode(text)
        return ids


def _tools_role(raw: list[dict[str, Any]], ids: Callable[[str], tuple[int, ...]]) -> Segment:
    """Return the agent's role segment: the tools the trajectories call, with their arguments."""
    arguments: dict[str, set[str]] = {}
    for episode in raw:
        for message in episode["traj"]:
            for call in message.get("tool_calls") or ():
                function = call["function"]
                names = arguments.setdefault(function["name"], set())
                names.update(json.loads(function["arguments"]))
    lines = [f"- {name}({', '.join(sorted(args))})" for name, args in sorted(arguments.items())]
    text = (
        "# Tools\nYou can call the functions below. To call one, write a <tool_call> block "
        'holding a JSON object with "name" and "arguments"; its result comes back as a tool '
        "message.\n" + "\n".join(lines)
    )
    return Segment("role", ids(render_message("system", text)))


def _assistant_body(message: dict[str, Any]) -> str:
    """Render an assistant message's content and tool calls as the text it generated."""
    parts = [message["content"]] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        function = call["function"]
        payload = {"name": function["name"], "arguments": json.loads(function["arguments"])}
        parts.append(f"<tool_call>\n{json.dumps(payload)}\n</tool_call>")
    return "\n".join(parts)


def _tail(messages: list[str]) -> str:
    """Return the last :data:`TAIL_CHARS` characters of ``messages`` and empty the list.

    Mutates: ``messages`` is cleared (the next call starts a new tail).
    """
    text = "\n".join(messages)[-TAIL_CHARS:]
    messages.clear()
    return text


def _episode(
    raw: dict[str, Any],
    ids: Callable[[str], tuple[int, ...]],
    tools: Segment,
    guide: Segment,
) -> Episode:
    """Turn one raw episode into its LLM-call steps (see the module docstring)."""
    traj = raw["traj"]
    instruction, opener = raw["info"]["task"]["instruction"], traj[1]["content"]
    policy = Segment("preamble", ids(render_message("system", traj[0]["content"])))
    no_preamble = Segment("preamble", ())
    start, close = ids("<|im_start|>assistant\n"), ids(END_OF_TURN)
    agent_view = list(ids(render_message("user", opener)))
    user_view = list(ids(render_message("system", f"# Your instruction\n{instruction}")))
    user_view += ids(render_message("user", GREETING)) + start + ids(opener) + close
    agent_new, user_new = [f"user: {opener}"], []  # messages since each side's last call
    steps: list[Step] = []
    tools_since_last_call = 0
    for message in traj[2:]:
        role, content = message["role"], message.get("content") or ""
        gap_s = tools_since_last_call * TOOL_LATENCY_S
        if role == "tool":
            tools_since_last_call += 1
            agent_view += ids(render_message("tool", content))
            agent_new.append(f"tool: {content}")
            continue
        tools_since_last_call = 0
        if role == "assistant":
            output = ids(_assistant_body(message)) + close
            context = Segment("context", tuple(agent_view) + start)
            tail = _tail(agent_new)
            steps.append(Step("agent", (policy, tools, context), output, gap_s, tail))
            agent_view += start + output
            if content:
                user_view += ids(render_message("user", content))
                user_new.append(f"agent: {content}")
        else:
            output = ids(content) + close
            context = Segment("context", tuple(user_view) + start)
            tail = _tail(user_new)
            steps.append(Step("user", (no_preamble, guide, context), output, gap_s, tail))
            user_view += start + output
            agent_view += ids(render_message("user", content))
            agent_new.append(f"user: {content}")
    return Episode(
        task_id=f"{raw['task_id']}-{raw.get('trial', 0)}",
        opener=opener,
        instruction=instruction,
        reward=float(raw["reward"]),
        n_tool_calls=sum(len(m.get("tool_calls") or ()) for m in traj),
        steps=tuple(steps),
        route=tuple(_NODE_OF_ROLE[m["role"]] for m in traj[2:]),
    )


register_app("taubench", TauBenchApp)
