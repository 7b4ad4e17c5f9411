from pbkv.examples.preamble import ToolSpec, render_preamble


def test_render_preamble_lays_out_guidelines_tools_and_protocol():
    tool = ToolSpec(
        "search",
        "Search the notes.",
        (("query", "string", "keywords"),),
        "matching lines",
        '{"tool": "search", "args": {"query": "cache"}}',
    )
    text = render_preamble(
        "We are a team.", "Team rules", (("Style", ("Be brief.",)),), (tool,), "Reply."
    )
    assert text == (
        "We are a team.\n\n## Team rules\n### Style\n- Be brief.\n\n"
        "## Tools\nYou can call these tools. Arguments are JSON values.\n"
        "### search\nSearch the notes.\nParameters:\n- `query` (string): keywords\n"
        'Returns: matching lines.\nExample:\n{"tool": "search", "args": {"query": "cache"}}\n\n'
        "Reply."
    )
