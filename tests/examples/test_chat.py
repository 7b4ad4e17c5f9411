from pbkv.actors.workload import Segment
from pbkv.examples import decode, encode
from pbkv.examples.chat import (
    SystemPrompt,
    Transcript,
    assistant_opener,
    end_of_turn,
    render_message,
    speaker_name,
    tokenize_system_prompt,
    tool_message,
)


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


def test_transcript_steps_extend_the_context_in_order():
    system = SystemPrompt(Segment("preamble", (1,)), {"a": Segment("role", (2,))})
    chat = Transcript(system, (10,))
    first = chat.take_turn("a", (20,), 0.5)
    chat.append((30,))
    second = chat.take_turn("a", (40,), 0.0)
    opener = assistant_opener("a")
    assert first.segments == (system.preamble, system.roles["a"], Segment("context", (10, *opener)))
    assert (first.output_token_ids, first.gap_s) == ((20,), 0.5)
    assert second.segments[2].token_ids == (10, *opener, 20, 30, *opener)
    assert chat.history == (10, *opener, 20, 30, *opener, 40)
