from pbkv.actors.workload import Segment
from pbkv.examples import decode, encode
from pbkv.examples.chat import (
    SystemPrompt,
    assistant_opener,
    close_turn,
    end_of_turn,
    render_message,
    speaker_name,
    tokenize_system_prompt,
    tool_message,
    transcript_prompt,
)
from pbkv.live import LiveTask, State, Turn


def test_render_message_wraps_content_in_chat_markers():
    assert render_message("user", "Hi") == "<|im_start|>user\nHi<|im_end|>\n"
    assert decode(end_of_turn()) == "<|im_end|>\n"


def test_speaker_name_joins_title_cased_words():
    assert speaker_name("planner") == "Planner"
    assert speaker_name("query_rewriter") == "QueryRewriter"
    assert decode(assistant_opener("query_rewriter")) == "<|im_start|>assistant\nQueryRewriter:\n"


def test_tool_message_closes_the_body_with_its_last_line():
    message = tool_message(encode("2 passed"), "\n=== PASSED ===")
    assert decode(message) == "<|im_start|>tool\n2 passed\n=== PASSED ===<|im_end|>\n"


def test_system_prompt_is_a_shared_preamble_and_one_role_per_agent():
    system = tokenize_system_prompt("Be a team.", {"a": "You plan.", "b": "You code."})
    assert system.preamble.kind == "preamble"
    assert decode(system.preamble.token_ids) == "<|im_start|>system\nBe a team.\n\n"
    assert {agent: decode(r.token_ids) for agent, r in system.roles.items()} == {
        "a": "You plan.<|im_end|>\n",
        "b": "You code.<|im_end|>\n",
    }
    assert {r.kind for r in system.roles.values()} == {"role"}


def test_transcript_prompt_extends_the_context_turn_by_turn():
    system = SystemPrompt(Segment("preamble", (1,)), {"a": Segment("role", (2,))})
    prompt = transcript_prompt(system, "a", lambda state: (10,))
    state = State(LiveTask("t", "task"))
    opener = assistant_opener("a")
    first = prompt(state)
    assert first.segments == (system.preamble, system.roles["a"], Segment("context", (10, *opener)))
    assert first.context_tail == ""
    closed = (20, *end_of_turn())
    state.turns += [Turn("a", "agent", "x", closed), Turn("t", "tool", "log", (30,))]
    state.turns.append(Turn("t", "tool", "", (99,)))  # a tool without text adds nothing
    assert prompt(state).segments[2].token_ids == (10, *opener, *closed, 30, *opener)


def test_close_turn_ends_every_output_with_the_end_of_turn_line():
    close = end_of_turn()
    assert close_turn((5, *close)) == (5, *close)  # scripted outputs are closed already
    assert close_turn((5, close[0])) == (5, *close)  # a real stop at <|im_end|>
    assert close_turn((5,)) == (5, *close)  # cut off by its budget
