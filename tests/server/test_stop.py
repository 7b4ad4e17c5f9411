"""Stop sequences cut streamed pieces exactly where they cut the whole text."""

from hypothesis import given
from hypothesis import strategies as st

from pbkv.server.stop import StopCutter, StopWatch, cut, streamed_text


def test_cut_at_the_first_stop():
    assert cut("abc STOP def END", ["END", "STOP"]) == ("abc ", True)
    assert cut("no stop here", ["STOP"]) == ("no stop here", False)
    assert cut("text", []) == ("text", False)


def test_the_stop_completed_first_wins_streamed_or_whole():
    # hypothesis found it: "b" is complete at "Sb", before "SbS" is, so a streamed reply
    # stopped at "S" while the whole one was cut at "" (the earliest start)
    assert cut("SbS", ["b", "SbS"]) == ("S", True)
    cutter = StopCutter(["b", "SbS"])
    assert cutter.feed("Sb") + cutter.feed("S") + cutter.flush() == "S"
    assert cut("xSTOP", ["STOP", "xSTOP"]) == ("", True)  # ending together: earlier start


def test_a_stop_split_across_pieces_is_held_back_then_cut():
    cutter = StopCutter(["\nObservation:"])
    assert cutter.feed("Thought: x\nObs") == "Thought: x"
    assert cutter.feed("ervation: y") == ""
    assert cutter.stopped
    assert cutter.flush() == ""


def test_held_text_is_released_when_it_is_not_a_stop():
    cutter = StopCutter(["STOP"])
    assert cutter.feed("abc ST") == "abc "
    assert cutter.feed("ART") == "START"
    assert cutter.feed("ST") == ""
    assert cutter.flush() == "ST"


@given(
    text=st.text(alphabet="abST\n", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    stops=st.lists(st.text(alphabet="abST\n", min_size=1, max_size=4), max_size=3),
)
def test_pieces_joined_equal_the_whole_cut(text, cuts, stops):
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    cutter = StopCutter(stops)
    streamed = "".join(cutter.feed(text[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    streamed += cutter.flush()
    assert (streamed, cutter.stopped) == cut(text, stops)


def test_the_stop_watch_fires_at_the_token_that_completes_a_stop():
    pieces = ["Thought", ": x", "\nObs", "ervation", ":", " y"]
    watch = StopWatch(["\nObservation:"], lambda ids: "".join(pieces[i] for i in ids))
    assert [watch(i) for i in range(6)] == [False, False, False, False, True, True]


def test_a_reply_cut_inside_a_character_reads_as_its_stream_does():
    from pbkv.assets import decode, encode
    from pbkv.live.chat import END_OF_TURN, IncrementalDecoder

    ids = encode("ok \U0001f600 fine" + END_OF_TURN + " after")
    for n in range(len(ids) + 1):
        incremental = IncrementalDecoder(decode)
        streamed = "".join(incremental.push(t) for t in ids[:n]).split(END_OF_TURN)[0]
        assert streamed_text(ids[:n], decode, END_OF_TURN) == streamed
    assert streamed_text(ids[:2], decode, END_OF_TURN) == "ok"  # not "ok \ufffd"
    assert streamed_text(ids, decode, END_OF_TURN) == "ok \U0001f600 fine"
