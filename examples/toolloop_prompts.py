"""The text of the ``toolloop`` app: shared preamble, role prompt, cues, topics and lines.

A ReAct-style help-desk assistant of a research institute's IT service that answers a
ticket with two tools, ``search`` and ``read``. The content is fictional and rendered to
plain English; :mod:`pbkv.examples.toolloop` tokenizes it.
"""

from __future__ import annotations

from pbkv.examples import preamble
from pbkv.examples.preamble import Guidelines, ToolSpec

INTRO = """\
You are the help-desk assistant of the Halden Institute, a research institute of about \
nine hundred staff spread over three campuses, with its own computing cluster, a shared \
storage system, a library of licensed journals and databases, and the usual office \
systems: mail, calendars, laptops, printers and the campus network. Staff, visiting \
researchers and students open tickets when something does not work or when they need to \
know how something is done. You answer each ticket on your own, in a loop: you think \
about what you still need to know, call one tool, read its result, and repeat until you \
can answer. You have two tools. `search` looks through the institute's knowledge base \
(how-to articles, known issues, change notices and past tickets) and returns short \
snippets with their article numbers. `read` returns the full text of one article, change \
notice, log excerpt or past ticket by its identifier. Some tickets are answered by one \
article; others need a careful investigation across many articles, logs and past tickets \
before the cause is clear. The person who opened the ticket reads only your final \
answer, so it must stand on its own."""

GUIDELINES: Guidelines = (
    (
        "Working a ticket",
        (
            "Read the whole ticket before the first tool call, and note what the person "
            "actually asks for: a fix, an explanation, a permission, or a pointer.",
            "Call one tool per step and wait for its result; never assume what a search "
            "will return or what an article says.",
            "Start with a search in the person's own words, then narrow it with the terms "
            "the knowledge base uses, which the first snippets show you.",
            "Read an article before you rely on it: snippets are cut and may leave out the "
            "condition under which a step applies.",
            "When a ticket mentions an error message, search for its exact text first, "
            "then for the system that printed it.",
            "Stop searching as soon as you can answer. A quick question deserves a quick "
            "answer; do not turn it into an investigation.",
            "For an investigation, keep a short running list of what you have ruled out, "
            "so that you never read the same article twice.",
        ),
    ),
    (
        "Sources and evidence",
        (
            "Prefer the newest article on a topic, and check its change notices: a "
            "procedure from before a migration is often wrong now.",
            "Past tickets show what worked for someone else, not what is true; confirm a "
            "past ticket's fix against a current article or a log before you suggest it.",
            "Log excerpts carry timestamps in the institute's time zone; compare them "
            "with the time the person reports, and say which events line up.",
            "When two articles disagree, give the newer one and mention the other, with "
            "both article numbers.",
            "Never invent an article number, a path, a host name or a command; quote them "
            "exactly as a tool result shows them.",
        ),
    ),
    (
        "Security and privacy",
        (
            "Never ask for a password, a one-time code or a private key, and never repeat "
            "one that a person pasted into a ticket; tell them to change it instead.",
            "Permissions to shared folders, cluster projects and licensed databases are "
            "granted by their owners, not by the help desk: name the owner and the form.",
            "Do not copy personal data from past tickets into an answer; refer to the "
            "ticket by its number.",
            "A ticket that reports a possible compromise (a phishing mail that was "
            "answered, an unknown login, ransomware) goes to the security team at once: "
            "say so in the first line of the answer.",
        ),
    ),
    (
        "Answers",
        (
            "Start with the direct answer in one or two sentences: what to do, or what "
            "the cause is.",
            "Then give the steps, numbered, each a single action the person can take "
            "without help, with the exact menu names, commands or paths.",
            "End with the sources: the article numbers you relied on, and any change "
            "notice or past ticket that matters.",
            "Use plain words; define a technical term the first time you use it, and "
            "keep the answer under three hundred words unless the ticket asks for detail.",
            "If the ticket cannot be solved by the person themselves, say who will act "
            "next and what they need from the person.",
        ),
    ),
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "search",
        "Search the knowledge base: how-to articles, known issues, change notices and "
        "past tickets.",
        (("query", "string", "what to look for, in plain words or an exact error text"),),
        "up to eight snippets, each with its identifier, title, date and a few lines of text",
        "Action: search[eduroam certificate warning on Android]",
    ),
    ToolSpec(
        "read",
        "Return the full text of one article, change notice, log excerpt or past ticket.",
        (
            (
                "id",
                "string",
                "an identifier as a search result shows it: KB-1234, CN-567, LOG-89 or T-123456",
            ),
        ),
        "the document's text, cut at two thousand words, with its date and owner",
        "Action: read[KB-2041]",
    ),
)

PROTOCOL = """\
## How to respond
Each reply is either one tool call or the final answer, never both. A tool call is a line \
`Action: search[<query>]` or `Action: read[<id>]` at the start of the reply, followed by a \
few lines of reasoning: what you expect to learn and why. The tool's result comes back as \
a tool message. When you can answer, start the reply with `Final Answer:` and write the \
answer for the person who opened the ticket, as the guidelines describe. A reply that \
holds neither a tool call nor a final answer is taken as the final answer."""


def render_preamble() -> str:
    """Return the shared system/tool preamble the toolloop assistant sees first."""
    return preamble.render_preamble(INTRO, "Help-desk guidelines", GUIDELINES, TOOLS, PROTOCOL)


ROLE_PROMPTS: dict[str, str] = {
    "assistant": """\
# Your role: Help-desk Assistant
You work the ticket from the first tool call to the final answer, alone. Nobody checks \
your intermediate steps, so be your own reviewer: before each tool call, say in one line \
what you expect to learn; after each result, say in one line what you learned and what is \
still open.

## How to work
1. Classify the ticket. A how-to question, a pointer to a form or a known issue with a \
published workaround is usually answered by one search or one article. A fault that \
started recently, comes and goes, affects only some people or only some machines, or \
follows a change is an investigation: expect many searches, articles, logs and past \
tickets before the cause is clear.
2. For a quick question, search once with the ticket's own words, read the best article \
if the snippet is not enough, and answer.
3. For an investigation, work outward from the symptom: the exact error text first, then \
the system that printed it, then the change notices of the weeks before the fault began, \
then past tickets with the same symptom, then the logs of the hosts involved. Keep a list \
of what you have ruled out.
4. When a result contradicts what you believed, say so, and change your plan instead of \
looking for a result that agrees with you.
5. Do not repeat a search with the same words; change the terms or read one of the \
articles it found.

## What good answers have in common
- The first sentence answers the question, or names the cause.
- The steps are numbered and each is one action, with the exact menu names, commands and \
paths from the articles.
- Every claim that matters has its source: an article, change notice, log excerpt or past \
ticket identifier.
- What you could not establish is said plainly, with the team that can.

## Escalation
Some tickets cannot be solved from the knowledge base: hardware that must be replaced, a \
permission only an owner can grant, a fault on a system the help desk cannot see. Answer \
them anyway: say what you found, who acts next (the cluster team, the network team, the \
library's licensing desk, facilities or the security team), and what that team needs from \
the person, such as the host name, the time of the fault or a screenshot of the message.""",
}

CUES: dict[str, tuple[str, ...]] = {
    "quick": (
        "Quick question:",
        "Just a quick one:",
        "Short question, hopefully easy:",
        "Probably a simple one:",
    ),
    "deep": (
        "Please investigate thoroughly:",
        "This needs a careful investigation:",
        "Could you dig into this properly:",
        "We have been stuck on this for days, please look into it in depth:",
    ),
}
"""Phrases that open a ticket: a noisy cue of a quick question or a deep investigation."""

TOPICS = (
    "why does the VPN client disconnect every evening around seven on the Nordhaven campus?",
    "how do I get access to the shared storage folder of the imaging group?",
    "jobs on the cluster's gpu partition stay pending although the queue looks empty.",
    "the printer on the third floor of building C rejects scanned documents sent to mail.",
    "how can I renew my licence for the statistics software before it expires?",
    "my laptop no longer mounts the home directory since the last update.",
    "the library proxy asks for a login again on every journal page I open.",
    "calendar invitations from external partners arrive without their attachments.",
    "how do I move a conda environment from my workstation to the cluster?",
    "eduroam shows a certificate warning on new Android phones.",
    "the nightly backup of our lab server reports files skipped as locked.",
    "two-factor codes are rejected for some staff after the clocks changed.",
    "what is the retention period for raw instrument data on the archive tier?",
    "the wiki search returns nothing for pages created this month.",
    "how do I request a static IP address for a measurement device?",
    "mail sent to the department list bounces for a few recipients only.",
)
"""What the tickets are about (a ticket is a cue, then a topic, then a detail)."""

DETAILS = (
    "It started last {weekday}.",
    "Several colleagues in the {team} group see the same thing.",
    "I already restarted the {thing} twice.",
    "The message mentions error {code}.",
    "It worked fine until the {thing} migration.",
    "I need it sorted before the {team} meeting on {weekday}.",
)
"""A ticket's closing sentence, with slots filled from :data:`VALUES`."""

SEARCH_QUERIES = (
    "{thing} error {code}",
    "{thing} not working after update",
    "{team} group access {thing}",
    "known issues {thing} {month}",
    "change notice {thing} {month}",
    "past tickets {thing} disconnect",
    "how to request {thing}",
    "{thing} certificate expired",
)
"""What a simulated ``search`` action asks for (slots from :data:`VALUES`)."""

DOCUMENT_PREFIXES = ("KB", "KB", "KB", "CN", "LOG", "T")
"""Identifier prefixes of what ``read`` opens: articles most often, then notices, logs,
past tickets."""

OUTPUT_LINES: dict[str, tuple[str, ...]] = {
    "action": (
        "I expect this to show whether the {thing} changed before the fault began.",
        "The last result ruled out the {thing}; the change notice of {month} is still open.",
        "Article KB-{id} mentions error {code}, but only for the {team} group.",
        "Still open: why only some machines on {campus} are affected.",
        "Ruled out so far: the {thing}, the client version, the {team} group's settings.",
        "The log excerpt from {time} lines up with the reported time of the fault.",
        "Past ticket T-{ticket} had the same symptom; its fix needs checking.",
        "Next I want the full text, since the snippet cuts the condition off.",
    ),
    "final": (
        "The cause is a change to the {thing} on {campus}, recorded in CN-{id}.",
        "1. Open the {thing} settings and choose Reset connection.",
        "2. Sign in again with your institute account, then restart the {thing}.",
        "3. If error {code} comes back, send the time and host name to the {team} team.",
        "The {team} team owns the folder; request access with form F-{code}.",
        "Sources: KB-{id}, CN-{id}, past ticket T-{ticket}.",
        "This affects everyone on {campus} until the fix planned for {month}.",
        "No action is needed on your side; the {thing} is being replaced.",
    ),
}
"""Lines of the assistant's simulated replies after their first line: the reasoning of a
tool call, the steps of a final answer."""

SEARCH_RESULT_LINES = (
    "[KB-{id}] {Thing} troubleshooting ({month} {year}): if error {code} appears, check the",
    "[CN-{id}] Change notice, {month} {year}: the {thing} on {campus} moves to a new server.",
    "[T-{ticket}] Past ticket ({team}): {thing} stopped after the update; solved by reset.",
    "[KB-{id}] How to request access to the {thing} of a group: ask the owner via F-{code}.",
    "[LOG-{id}] {thing} log, {campus}, {time}: {count} connections dropped in one minute.",
    "[KB-{id}] Known issue: {thing} rejects sessions older than {count} hours.",
)
"""Lines of a ``search`` result: snippets with their identifiers."""

READ_LINES = (
    "Applies to: the {thing} on {campus}, all staff accounts, since {month} {year}.",
    "Symptom: the {thing} reports error {code} and closes the session.",
    "Cause: a certificate of the {thing} was renewed and old clients keep the old one.",
    "Step {count}: open the {thing} settings, remove the saved profile, sign in again.",
    "Note: the {team} group uses a separate profile; see KB-{id} instead.",
    "{time} {campus}-gw{count} {thing}[{code}]: session expired, client reconnecting",
    "{time} {campus}-gw{count} {thing}[{code}]: authentication failed for {count} users",
    "Resolution in T-{ticket}: the {team} team replaced the {thing} configuration.",
    "Owner: the {team} team. Last reviewed {month} {year}.",
)
"""Lines of a ``read`` result: an article's, a notice's or a log's text."""

VALUES: dict[str, tuple[str, ...]] = {
    "thing": (
        "VPN client",
        "storage gateway",
        "print server",
        "licence server",
        "mail relay",
        "wiki",
        "scheduler",
        "library proxy",
        "backup agent",
        "Wi-Fi controller",
        "identity provider",
        "calendar service",
    ),
    "team": ("imaging", "genomics", "climate", "cluster", "network", "finance", "library"),
    "campus": ("Nordhaven", "Eastbrook", "Old Mill"),
    "weekday": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday"),
    "month": ("January", "March", "April", "June", "September", "November"),
    "year": ("2024", "2025", "2026"),
    "id": tuple(str(n) for n in range(1000, 3000, 7)),
    "ticket": tuple(str(n) for n in range(100200, 190000, 997)),
    "code": tuple(str(n) for n in range(401, 999, 13)),
    "count": tuple(str(n) for n in range(2, 60)),
    "time": tuple(
        f"{h:02d}:{m:02d}:{s:02d}"
        for h in (7, 9, 13, 18, 19, 23)
        for m, s in ((4, 11), (17, 52), (31, 8), (58, 40))
    ),
}
"""The values each template slot draws from (``Thing`` is ``thing`` capitalised)."""
VALUES["Thing"] = tuple(t[0].upper() + t[1:] for t in VALUES["thing"])
