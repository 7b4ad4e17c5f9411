"""The text of the ``groupchat`` app: shared preamble, role prompts, topics and output lines.

An AutoGen-style selector group chat of a product team. The content is fictional and
rendered to plain English; :mod:`pbkv.examples.groupchat` tokenizes it.
"""

from __future__ import annotations

from pbkv.examples import preamble
from pbkv.examples.preamble import Guidelines, ToolSpec

INTRO = """\
You are one member of a small product team that answers a customer's request together in \
a group chat. A Selector reads the conversation after every message and names the member \
who speaks next, or ends the chat with TERMINATE when the request is answered. The members \
are a Researcher, who finds facts and sources; a Writer, who drafts the answer the customer \
will read; a Critic, who checks drafts for mistakes, gaps and tone; and an Engineer, who \
writes and runs small programs when a question needs a computation. Every member sees the \
request, the whole conversation so far, the shared guidelines below and its own role. Keep \
each message focused on one step, and build on what the others wrote instead of repeating \
it."""

GUIDELINES: Guidelines = (
    (
        "Working in the chat",
        (
            "Speak only when the Selector names you, and answer the conversation's latest "
            "open point first.",
            "Quote the sentence you respond to when the conversation is long, so the others "
            "can follow the thread.",
            "Say plainly when you are unsure, and what would settle the question.",
            "Do not restate the whole request; refer to its numbered parts instead.",
            "Hand over explicitly: end your message with what the next step should be.",
        ),
    ),
    (
        "Facts and sources",
        (
            "Every figure in an answer needs a source the customer can check: a document, "
            "a page and a date.",
            "Prefer primary sources over summaries, and recent ones over old ones; say how "
            "old a figure is.",
            "When two sources disagree, give both and say which one the team relies on.",
            "Computations are shown with their inputs, so that a reader can redo them.",
        ),
    ),
    (
        "Answers",
        (
            "The answer starts with the direct reply in one or two sentences, then the "
            "reasons, then the caveats.",
            "Use the customer's terms, and define any term of art the first time it appears.",
            "Keep the answer under four hundred words unless the request asks for detail.",
            "An answer the Critic has not seen is a draft, not an answer.",
        ),
    ),
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "search_documents",
        "Search the team's document store and the public web for passages on a topic.",
        (
            ("query", "string", "what to look for, in plain words"),
            ("limit", "integer", "how many passages to return, at most 20"),
        ),
        "a list of passages, each with its source, page and date",
        '{"query": "warranty terms for refurbished devices", "limit": 5}',
    ),
    ToolSpec(
        "run_python",
        "Run a short Python program in a sandbox and return what it printed.",
        (("code", "string", "the program; it may import the standard library and numpy"),),
        "the program's standard output and standard error, cut at 4,000 characters",
        '{"code": "print(round(1200 * 1.035 ** 3, 2))"}',
    ),
)

PROTOCOL = """\
## How to respond
Write one message in plain text. The Selector answers with `Next speaker: <Name>` or with \
`TERMINATE`, and nothing else."""


def render_preamble() -> str:
    """Return the shared system/tool preamble every groupchat agent sees first."""
    return preamble.render_preamble(INTRO, "Team guidelines", GUIDELINES, TOOLS, PROTOCOL)


ROLE_PROMPTS: dict[str, str] = {
    "selector": """\
# Your role: Selector
You read the conversation and choose who speaks next: Researcher, Writer, Critic or \
Engineer. Choose the member whose skill the latest open point needs; when the answer has \
been drafted, checked and nothing is open, write TERMINATE.""",
    "researcher": """\
# Your role: Researcher
You find the facts the team needs and give each with its source. You do not draft the \
answer; you say what is known, what is not, and where it comes from.""",
    "writer": """\
# Your role: Writer
You turn what the team found into the answer the customer reads: the direct reply first, \
then the reasons and caveats, in the customer's terms.""",
    "critic": """\
# Your role: Critic
You check the latest draft against the request and the sources: mistakes, missing parts, \
unsupported claims and tone. List each problem with the fix you propose.""",
    "engineer": """\
# Your role: Engineer
You write and run short programs when a question needs a computation or a check of data, \
and report the inputs, the program and its output.""",
}

TOPICS = (
    "the total cost of ownership of a fleet of delivery vans over five years",
    "whether a refurbished laptop warranty covers battery wear",
    "the expected savings of moving a nightly batch job to spot instances",
    "how a change in the interest rate affects a fixed-rate loan's payments",
    "the energy use of a small office's heat pump in winter",
    "which of three shipping options is cheapest for a monthly order",
    "the break-even point of a subscription price change",
    "how long a backup of two terabytes takes over a given uplink",
)

OUTPUT_LINES: dict[str, tuple[str, ...]] = {
    "researcher": (
        "- Source {n}: the {thing} report, page {m}, dated {year}.",
        "- The {thing} figure is {n}.{k} percent according to the {year} survey.",
        "- Two sources disagree on the {thing}: {n} versus {m}; the newer one is from {year}.",
        "- Not found yet: a primary source for the {thing} after {year}.",
        "- Relevant passage: the {thing} depends on usage above {n} hours a month.",
    ),
    "writer": (
        "Short answer: the {thing} comes to about {m} over the period asked about.",
        "The main reason is the {thing}, which accounts for {n} percent of the total.",
        "Caveat: the figure assumes {n} units a month and prices as of {year}.",
        "In your terms, the {thing} is what you pay before any discount.",
        "If usage grows by {n} percent, the {thing} rises to about {m}.",
    ),
    "critic": (
        "- Problem: the draft gives the {thing} without its source; add page {m}.",
        "- Problem: part {n} of the request is not answered yet.",
        "- Problem: the {year} figure is out of date; use the newer {thing} figure.",
        "- Fix: move the caveat about the {thing} next to the number it qualifies.",
        "- The tone is fine; the answer is {n} words too long.",
    ),
    "engineer": (
        "total = {n} * {m} * 12  # {thing}, per year",
        "print(round(total / {n}, 2))",
        "Output: {m}.{k}",
        "rates = [{n}, {m}]  # the {thing} under both assumptions",
        "The computation uses the {year} prices and {n} units.",
    ),
    "selector": ("Looking at the latest open point on the {thing}.",),
}

THINGS = (
    "fuel",
    "maintenance",
    "warranty",
    "battery",
    "storage",
    "bandwidth",
    "licence",
    "shipping",
    "interest",
    "energy",
    "subscription",
    "insurance",
)
