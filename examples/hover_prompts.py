"""The text of the ``hover`` app: shared preamble, role prompts, claim parts and output phrases.

Kept as structured content (guideline sections, tool specifications, an entity-relation
vocabulary for claims, phrase lists) and rendered to plain English;
:mod:`pbkv.examples.hover` tokenizes it. Every entity is fictional.
"""

from __future__ import annotations

from typing import NamedTuple

from pbkv.examples import preamble
from pbkv.examples.preamble import Guidelines, ToolSpec

INTRO = """\
You are one member of an automated fact-checking team that verifies claims against an \
encyclopedia. Each claim needs several pieces of evidence that are found one after \
another: the answer to one question names the entity that the next question is about. \
The team works in turns. A Decomposer splits the claim into a chain of sub-questions, a \
Retriever searches the encyclopedia for the current sub-question, a Reader extracts the \
facts that answer it from the retrieved passages, a Query Rewriter turns the next \
sub-question into a search query using what the Reader found, and a Verifier decides \
whether the evidence supports the claim. When the evidence is not enough, the Verifier \
sends the claim back to the Decomposer for a new plan. Every member sees the claim, the \
shared guidelines below, its own role instructions, and everything the team has written \
and retrieved so far. Write for your teammates: they act on exactly what you say."""

GUIDELINES: Guidelines = (
    (
        "Evidence",
        (
            "Only the retrieved passages count as evidence. Background knowledge may "
            "suggest where to look, but never decides a label on its own.",
            "Cite every fact with the title of the passage it comes from, in square "
            "brackets, exactly as the search tool returned it.",
            "A passage supports a fact only if it states it; do not combine two vague "
            "sentences into a precise fact that neither of them states.",
            "When two passages disagree, report both with their titles and prefer the "
            "one about the entity itself over a passage that mentions it in passing.",
        ),
    ),
    (
        "Reasoning across hops",
        (
            "Resolve the chain in order: each sub-question may depend on the entity "
            "found by the previous one, so never search for a later hop with a guessed "
            "entity.",
            "Write down the bridge entity of every hop (the person, work, place or "
            "organisation that links it to the next one) with its full name.",
            "If a hop returns several candidate entities, keep all of them and say which "
            "later fact would tell them apart.",
            "A claim is only as strong as its weakest hop: one unsupported hop makes the "
            "whole claim unsupported, even if every other hop checks out.",
        ),
    ),
    (
        "Entities and names",
        (
            "Different entities often share a name: a film and the novel it is based on, "
            "a band and its debut album, a city and the university named after it. "
            "Check the type of the entity before you use a passage.",
            "People are often listed under a full name, a stage name or a married name; "
            "treat them as the same person only when a passage links the names.",
            "Keep the spelling of the passages, including accents and capitals, so that "
            "the next search finds the same page.",
        ),
    ),
    (
        "Dates, numbers and comparisons",
        (
            "Dates in the claim must match the passages to the stated precision: a claim "
            "that names a year is supported by any date in that year, a claim that names "
            "a day needs the exact day.",
            "For comparisons such as before, after, older or larger, find both values "
            "and write the comparison out explicitly.",
            "Treat negations carefully: a claim that something did not happen is "
            "supported only by a passage that rules it out, not by the absence of a "
            "passage that says it did.",
            "Hedged wording such as reportedly or is said to have does not lower the bar; "
            "the underlying fact must still be supported.",
        ),
    ),
    (
        "Labels",
        (
            "SUPPORTED: every hop of the claim is stated by a retrieved passage and the "
            "final relation holds.",
            "NOT_SUPPORTED: at least one hop is contradicted by a passage, or the chain "
            "leads to a different entity than the claim says.",
            "NOT ENOUGH INFO is not a final label: it means the team should re-plan and "
            "search again, which the Verifier may ask for a limited number of times.",
        ),
    ),
    (
        "Style",
        (
            "Be brief: one fact per line, no repetition of earlier messages, and refer "
            "to earlier steps by their number.",
            "Quote at most one sentence from a passage; paraphrase the rest.",
            "Never invent a title, a date or a tool result.",
        ),
    ),
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "search",
        "Search the encyclopedia and return the most relevant passages for a query.",
        (
            ("query", "string", "keywords or a short question; entity names work best"),
            ("k", "integer, optional", "how many passages to return (default 5, at most 10)"),
        ),
        "the passages, each as [Title] followed by its first paragraph",
        '{"tool": "search", "args": {"query": "director of Midnight Harbor film", "k": 5}}',
    ),
    ToolSpec(
        "lookup_page",
        "Return the full text of one encyclopedia page by its exact title.",
        (
            ("title", "string", "the page title exactly as a search result shows it"),
            ("section", "string, optional", "return only this section, such as Early life"),
        ),
        "the page text with its section headings, or an error if no page has that title",
        '{"tool": "lookup_page", "args": {"title": "Ada Brennan", "section": "Early life"}}',
    ),
    ToolSpec(
        "list_links",
        "List the pages that a page links to, which often names the next bridge entity.",
        (("title", "string", "the page title exactly as a search result shows it"),),
        "one linked title per line, in the order they appear on the page",
        '{"tool": "list_links", "args": {"title": "The Salt Road"}}',
    ),
    ToolSpec(
        "disambiguate",
        "List the pages that share a name, with a one-line description of each.",
        (("name", "string", "the ambiguous name"),),
        "one line per page: the title, its type (person, film, city ...) and a description",
        '{"tool": "disambiguate", "args": {"name": "Harrowgate"}}',
    ),
)

PROTOCOL = """\
## How to respond
Start with one sentence that states what you are about to do. Call tools by writing a JSON \
object on a line of its own, exactly as in the examples above; the result follows your \
message as a tool message. Never invent a tool result. Cite passages by their titles in \
square brackets. End your turn with `STATUS: done` when your part is complete, or \
`STATUS: blocked` followed by the one question that would unblock you."""


def render_preamble() -> str:
    """Return the shared system/tool preamble every hover agent sees first."""
    return preamble.render_preamble(INTRO, "Verification guidelines", GUIDELINES, TOOLS, PROTOCOL)


ROLE_PROMPTS: dict[str, str] = {
    "decomposer": """\
# Your role: Decomposer
You turn the claim into a chain of sub-questions that the team answers one at a time. You \
do not search and you do not decide the label.

## What to do
1. Read the claim and underline every named entity: people, works, places, organisations, \
dates and numbers. Note its type next to each one.
2. Find the anchor: the entity named in the claim that the chain starts from. Usually it \
is the most deeply nested name, such as the film in "the director of the film X".
3. Write one sub-question per hop, from the anchor outwards. Each sub-question asks for \
exactly one relation and refers to the answer of the previous one as #1, #2 and so on.
4. Write the final check: the relation the claim asserts about the last entity of the \
chain, including any date, number, comparison or negation, in the claim's own words.
5. When you are re-planning after the Verifier asked for more evidence, read its reasons \
first. Keep the hops that are already answered, and plan only the missing ones, with a \
different angle: another name for the entity, a broader query or a related page.

## Output format
A numbered list of sub-questions, one per line, then a line `Check:` with the final \
relation, then `Hops: n` with the number of searches you expect.

## Quality bar
Every hop must be answerable from a single encyclopedia page. If a sub-question needs two \
facts, split it. Do not answer any sub-question yourself, even when you think you know the \
answer; the Retriever and Reader must find it in the passages.""",
    "retriever": """\
# Your role: Retriever
You find the passages that answer the current sub-question. You write the search call; the \
search tool returns the passages, which the Reader studies after you.

## What to do
1. Take the first sub-question that has not been answered yet, or the query the Query \
Rewriter wrote for it.
2. Replace every reference to an earlier answer (#1, #2) with the entity name the Reader \
extracted, spelled exactly as in the passage that named it.
3. Write a query made of the entity name and the relation, such as "Ada Brennan birthplace" \
or "Midnight Harbor film director". Avoid full sentences and avoid words from the claim \
that the page is unlikely to contain, such as reportedly or not.
4. Ask for five passages by default. Ask for ten when the entity name is common or when the \
previous search for this hop found nothing useful.
5. If the name is ambiguous, call disambiguate first and then search with the qualified \
title, such as "Harrowgate (novel)".

## Output format
One sentence saying which hop you are searching for, then the tool call as a JSON object on \
its own line. Nothing else: the passages arrive as the tool result.

## Quality bar
A good query puts the page that answers the hop among the first results. Never search for \
two hops at once and never search with a guessed entity: if the previous hop is not \
resolved, say so with `STATUS: blocked`.""",
    "reader": """\
# Your role: Reader
You read the passages that the last search returned and extract the facts that answer the \
current sub-question. You do not search and you do not decide the label.

## What to do
1. Read every passage of the last tool result, not only the first. Note the title and the \
type of entity each passage is about.
2. Find the sentence that answers the current sub-question. Copy the answer entity or value \
exactly, with the title of its passage.
3. Check that the passage is about the right entity: the same type, the same period, the \
same country. Reject a passage about a namesake and say why.
4. Note any fact in the passages that bears on a later hop or on the final check, such as a \
date or a second name, so that the team does not have to search for it again.
5. If no passage answers the sub-question, say which passage came closest and what the \
Query Rewriter should try instead.

## Output format
`Answer:` followed by the bridge entity or value and its [Title], then up to four lines \
`Evidence:` each with one short quote or paraphrase and its [Title], then `Next:` with the \
sub-question the team should answer next, or `Next: verify` when the chain is complete.

## Quality bar
Another member must be able to check your answer by reading the one sentence you cite. Do \
not round numbers, normalise dates or merge two people into one unless a passage does it.""",
    "query_rewriter": """\
# Your role: Query Rewriter
You prepare the search for the next hop. The Reader has resolved the previous sub-question; \
you turn the next one into a query that finds the right page.

## What to do
1. Read the Decomposer's plan and the Reader's last answer. Identify the next unanswered \
sub-question and the bridge entity it depends on.
2. Substitute the bridge entity into the sub-question, using the exact title of the page \
that named it. If the Reader listed several candidates, write one query per candidate, at \
most three.
3. Reduce the sub-question to its keywords: the entity, the relation and, when it helps to \
disambiguate, the entity type or a year.
4. Drop the claim's hedges, negations and comparisons from the query; they belong to the \
final check, not to the search.
5. If an earlier search for the same hop failed, change the angle instead of repeating it: \
use another name from the passages, search for the linked page, or broaden the relation.

## Output format
`Hop:` with the number of the sub-question, `Entity:` with the bridge entity and its \
[Title], then `Query:` with the query, one per line when there are several candidates.

## Quality bar
The Retriever should be able to paste your query into the search tool unchanged. A query \
longer than eight words usually means the hop was not reduced to its relation.""",
    "verifier": """\
# Your role: Verifier
You decide whether the evidence the team collected supports the claim. You are the last \
step: your verdict ends the task, unless you ask the Decomposer to re-plan.

## What to do
1. Rebuild the chain from the Reader's answers: for every hop, the bridge entity and the \
passage that states it. Mark each hop as supported, contradicted or missing.
2. Apply the final check of the plan to the last entity of the chain, including dates, \
numbers, comparisons and negations, using the guidelines on dates and numbers.
3. If every hop is supported and the final relation holds, the label is SUPPORTED. If a hop \
is contradicted, or the chain leads to a different entity than the claim says, the label is \
NOT_SUPPORTED.
4. If a hop is missing or its evidence is ambiguous, do not guess. Answer NOT ENOUGH INFO \
and list precisely what is missing, so that the Decomposer can plan the searches for it.
5. Before you answer, reread the claim once more: a single word such as not, before or \
only can flip the label.

## Output format
`Verdict:` with SUPPORTED, NOT_SUPPORTED or NOT ENOUGH INFO; then one line per hop with its \
status and [Title]; then `Reason:` in at most two sentences.

## Quality bar
A reviewer who reads only your message and the cited passages must reach the same label. \
Ask for a re-plan only when a concrete search could close the gap.""",
}


class Relation(NamedTuple):
    """One hop of a claim: a phrase that names an entity of ``target`` type from ``source``."""

    source: str
    target: str
    phrase: str  # with one slot {x} for the inner phrase


class Predicate(NamedTuple):
    """The claim's final relation about its last entity, at three difficulty tiers."""

    source: str
    plain: str  # each with slots {x} (the chain phrase) and {value}
    hedged: str
    tricky: str
    value_kind: str  # the key of ENTITIES (or "year") that fills {value}


ENTITIES: dict[str, tuple[str, ...]] = {
    "film": (
        "Midnight Harbor",
        "The Glass Orchard",
        "Silent Meridian",
        "A Winter in Calloway",
        "The Lantern Keeper",
        "Red Salt Flats",
        "Northbound Freight",
        "The Quiet Cartographer",
    ),
    "novel": (
        "The Salt Road",
        "Harrowgate",
        "Letters from Vessa",
        "The Copper Bride",
        "An Almanac of Storms",
        "The Ninth Lighthouse",
        "Orchard of Bells",
        "The Long Tide",
    ),
    "person": (
        "Ada Brennan",
        "Tomas Welker",
        "Mira Kovacs",
        "Jonah Ashcombe",
        "Lucía Arrieta",
        "Henrik Sollund",
        "Priya Raman",
        "Odette Marchal",
    ),
    "city": (
        "Calloway",
        "Port Ellery",
        "Vessen",
        "Marrowby",
        "San Teodoro",
        "Kelmsford",
        "Ostrava Nova",
        "Linden Falls",
    ),
    "band": (
        "The Hollow Pines",
        "Static Parade",
        "Velvet Almanac",
        "Northern Choir",
        "The Paper Kites of Ellery",
        "Glasswing",
    ),
    "album": (
        "Songs for the Drowned Valley",
        "Neon Cartography",
        "Low Country Hymns",
        "Paper Satellites",
        "The Iron Garden",
        "Night Ferry",
    ),
    "university": (
        "Kelmsford University",
        "the University of Port Ellery",
        "Vessen Institute of Technology",
        "Marrowby College",
        "Saint Aldric University",
    ),
    "river": ("Vessa", "Orme", "Calder", "Teodora", "Lusk", "Brannock"),
    "label": ("Harbor Light Records", "Greywell Music", "Tin Lantern", "Northfold Sound"),
}

RELATIONS: tuple[Relation, ...] = (
    Relation("film", "person", "the director of {x}"),
    Relation("film", "person", "the lead actor of {x}"),
    Relation("film", "novel", "the novel that {x} was adapted from"),
    Relation("film", "city", "the city where {x} was filmed"),
    Relation("novel", "person", "the author of {x}"),
    Relation("novel", "film", "the film adapted from {x}"),
    Relation("person", "city", "the birthplace of {x}"),
    Relation("person", "city", "the city where {x} died"),
    Relation("person", "university", "the university that {x} attended"),
    Relation("person", "band", "the band that {x} founded"),
    Relation("band", "person", "the lead singer of {x}"),
    Relation("band", "album", "the debut album of {x}"),
    Relation("album", "band", "the band that recorded {x}"),
    Relation("album", "person", "the producer of {x}"),
    Relation("university", "city", "the city that hosts {x}"),
    Relation("university", "person", "the founder of {x}"),
    Relation("city", "university", "the oldest university in {x}"),
    Relation("city", "person", "the first mayor of {x}"),
)

PREDICATES: tuple[Predicate, ...] = (
    Predicate(
        "person",
        "{x} was born in {value}.",
        "{x} is said to have been born in {value}.",
        "{x} was not born before {value}.",
        "year",
    ),
    Predicate(
        "person",
        "{x} studied at {value}.",
        "{x} reportedly studied at {value}.",
        "{x} never studied anywhere other than {value}.",
        "university",
    ),
    Predicate(
        "film",
        "{x} was released in {value}.",
        "{x} was reportedly released in {value}.",
        "{x} was released more than a decade after {value}.",
        "year",
    ),
    Predicate(
        "novel",
        "{x} was first published in {value}.",
        "{x} is believed to have first appeared in {value}.",
        "{x} was not published until after {value}.",
        "year",
    ),
    Predicate(
        "city",
        "{x} lies on the river {value}.",
        "{x} is said to lie on the river {value}.",
        "{x} lies on the river {value} but not at its mouth.",
        "river",
    ),
    Predicate(
        "band",
        "{x} was formed in {value}.",
        "{x} was reportedly formed in {value}.",
        "{x} was formed in {value}, earlier than any of its members' solo careers began.",
        "city",
    ),
    Predicate(
        "album",
        "{x} was released on {value}.",
        "{x} was apparently released on {value}.",
        "{x} was not released on {value} but on an independent label.",
        "label",
    ),
    Predicate(
        "university",
        "{x} was founded in {value}.",
        "{x} is believed to have been founded in {value}.",
        "{x} was founded before {value}, earlier than any other university in its city.",
        "year",
    ),
)

DISTRACTORS: dict[str, tuple[str, ...]] = {
    # appositives after the anchor, by its type: an extra entity mention that adds no hop
    "film": (", which also featured {person},", " (not to be confused with the {year} remake)"),
    "novel": (", praised by {person},", ", first printed in {city},"),
    "person": (", a contemporary of {person},", " (born in {year})"),
    "city": (", twinned with {city},", ", on the road to {city},"),
    "band": (", once managed by {person},", ", a favourite of {person},"),
    "album": (", recorded in {city},", " (reissued in {year})"),
    "university": (", where {person} once taught,", ", a rival of {university},"),
}

INSTRUCTIONS: tuple[str, ...] = (
    "Decide whether the claim is SUPPORTED or NOT_SUPPORTED by the encyclopedia.",
    "Verify the claim against the encyclopedia and label it SUPPORTED or NOT_SUPPORTED.",
    "Check the claim using encyclopedia passages; answer SUPPORTED or NOT_SUPPORTED.",
)

OUTPUT_BLOCKS: dict[str, tuple[str, ...]] = {
    # Each block is filled in with random entities; outputs are random sequences of blocks.
    "decomposer": (
        "{n}. Who is the {relation} of #{k}?",
        "{n}. Which {kind} is linked to {person} as its {relation}?",
        "{n}. Where was {person} born?",
        "{n}. In which year was {film} released?",
        "- Anchor: {film} (film); bridge entities are unknown until searched.",
        "- Entity: {person} (person), {city} (city), {year} (date).",
        "- Note: the claim's comparison with {year} belongs to the final check.",
        "Check: the last entity relates to {city} as the claim says.",
    ),
    "retriever": (
        "Searching for hop {k}: the {relation} of {person}.",
        '{{"tool": "search", "args": {{"query": "{person} {relation}", "k": 5}}}}',
        '{{"tool": "search", "args": {{"query": "{film} film {relation}", "k": 10}}}}',
        '{{"tool": "disambiguate", "args": {{"name": "{city}"}}}}',
    ),
    "reader": (
        "Answer: {person} [{person}]",
        "Answer: {city} [{city}]",
        "Evidence: {film} is a {year} film directed by {person} [{film}].",
        "Evidence: {person} was born in {city} in {year} [{person}].",
        "Evidence: the passage [{city}] is about the city, not the novel of that name.",
        "Rejected: [{person} (footballer)] is a namesake, born in {year}.",
        "Next: who is the {relation} of {person}?",
        "Next: verify",
    ),
    "query_rewriter": (
        "Hop: {k}",
        "Entity: {person} [{person}]",
        "Query: {person} {relation}",
        "Query: {city} {relation} {year}",
        "Query: {film} ({year} film) {relation}",
    ),
    "verifier": (
        "Hop {k}: supported by [{person}].",
        "Hop {k}: supported by [{film}] and [{city}].",
        "Hop {k}: missing; no passage names the {relation} of {person}.",
        "Hop {k}: contradicted; [{person}] says {year}, not {year2}.",
        "Reason: the chain leads from {film} to {person} and then to {city}.",
        "Reason: the final check compares {year} with {year2}.",
    ),
}

VERDICTS: dict[str, str] = {
    "replan": "Verdict: NOT ENOUGH INFO (re-plan the missing hops)\n",
    "supported": "Verdict: SUPPORTED\n",
    "refuted": "Verdict: NOT_SUPPORTED\n",
}

PASSAGE_LINES: tuple[str, ...] = (
    "[{film}] {film} is a {year} drama film directed by {person} and set in {city}. "
    "It was adapted from the novel {novel} and premiered at the {city} film festival.",
    "[{person}] {person} (born {year} in {city}) is a writer and director. After studying "
    "at {university}, {person} moved to {city2}, where most of the later work was made.",
    "[{novel}] {novel} is a {year} novel by {person}. Set along the river {river}, it "
    "follows three generations of a family of ferry keepers and was adapted for film.",
    "[{city}] {city} is a city on the river {river} with about {n} thousand inhabitants. "
    "It hosts {university} and is known for its harbour and its annual film festival.",
    "[{band}] {band} is a band formed in {city} in {year}. Its lead singer is {person}, "
    "and its debut album, {album}, was released on {label}.",
    "[{album}] {album} is the debut album by {band}, produced by {person} and released on "
    "{label} in {year}. It was recorded in {city} over {n} days.",
    "[{university}] {university} is a public university in {city}, founded in {year} by "
    "{person}. It has about {n} thousand students across eight faculties.",
    "[{person} (footballer)] {person} (born {year}) is a footballer who played for clubs "
    "in {city} and {city2}; not to be confused with the writer of the same name.",
    "[{river}] The {river} is a river that flows through {city} and {city2} before it "
    "reaches the sea; its length is about {n} kilometres.",
    "[{film} (soundtrack)] The soundtrack of {film} was composed by {person} and released "
    "on {label} in {year}, a year after the film.",
)

RELATION_WORDS: tuple[str, ...] = (
    "director",
    "author",
    "birthplace",
    "lead singer",
    "founder",
    "producer",
    "debut album",
    "first mayor",
)

KINDS: tuple[str, ...] = ("film", "novel", "band", "album", "city", "university")
