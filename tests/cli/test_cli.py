"""The command line refuses bad input with one clear line (issue 9 reproducers)."""

import dataclasses
import json
import re

import pytest

from pbkv.cli import build_parser, main
from pbkv.predictor import read_traces, write_traces


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    """20 codegen traces, written once."""
    path = tmp_path_factory.mktemp("traces") / "codegen.jsonl"
    assert (
        main(["trace", "generate", "--app", "codegen", "--workflows", "20", "--out", str(path)])
        == 0
    )
    return path


def copy_of(traces, tmp_path, name="t.jsonl"):
    path = tmp_path / name
    path.write_bytes(traces.read_bytes())
    return path


def test_split_refuses_an_output_that_overwrites_its_input(traces, tmp_path, capsys):
    path = copy_of(traces, tmp_path)
    code = main(["trace", "split", str(path), "--train-out", str(path), "--test-out", str(path)])
    assert code == 2
    assert "--train-out and the input are the same file" in capsys.readouterr().err
    assert len(read_traces(path).records) == 20  # untouched (it used to shrink to 5)
    other = tmp_path / "o.jsonl"
    code = main(["trace", "split", str(path), "--train-out", str(other), "--test-out", str(other)])
    assert code == 2 and not other.exists()


def test_writing_traces_replaces_the_file_only_when_complete(traces, tmp_path):
    path = copy_of(traces, tmp_path)
    records = read_traces(path).records

    def failing():
        yield records[0]
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_traces(path, failing())
    assert read_traces(path).records == records
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temporary left behind
    assert write_traces(path, records[:3]) == 3 and len(read_traces(path).records) == 3


def test_counts_are_bounded_by_the_schema(traces, tmp_path, capsys):
    line = json.loads(traces.read_text().splitlines()[0])
    line["steps"][0]["output_tokens"] = 10**30
    bad = tmp_path / "huge.jsonl"
    bad.write_text(json.dumps(line) + "\n")
    (error,) = read_traces(bad).errors
    assert "$.steps[0].output_tokens" in error.message
    code = main(["train", "--app", "codegen", "--traces", str(bad), "--out", str(tmp_path / "c")])
    assert code == 2  # it used to crash inside training
    assert "no trace records to use: all 1 lines are bad" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "why"), [("", "the file is empty"), ("{}\nnope\n", "all 2")])
def test_an_empty_or_all_bad_traces_file_is_refused(traces, tmp_path, capsys, content, why):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    argv = ["eval-predictor", "--app", "codegen", "--traces", str(bad)]
    code = main([*argv, "--train-traces", str(traces), "--predictors", "markov-1"])
    assert code == 2  # it used to exit 0 with a table of NaN
    err = capsys.readouterr().err
    assert f"{bad}: no trace records to use: {why}" in err.replace("\n", "")


def test_strict_refuses_a_bad_line_and_each_warning_is_printed_once(
    traces, tmp_path, capsys, caplog
):
    mixed = copy_of(traces, tmp_path, "mixed.jsonl")
    with open(mixed, "a") as f:
        f.write('{"version": 1}\n')
    argv = ["eval-predictor", "--app", "codegen", "--traces", str(mixed)]
    argv += ["--train-traces", str(traces), "--predictors", "markov-1"]
    assert main(argv) == 0
    assert caplog.text.count("skipping bad trace line") == 1
    assert main([*argv, "--strict"]) == 2
    assert f"{mixed}:21: " in capsys.readouterr().err
    out = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    split = ["trace", "split", str(mixed), "--train-out", str(out[0]), "--test-out", str(out[1])]
    assert main([*split, "--strict"]) == 2 and not out[0].exists()
    assert main(split) == 0


def bad_checkpoints(tmp_path):
    """Checkpoint folders with a valid sidecar and an empty, random or truncated weights file."""
    from pbkv.examples import get_app
    from pbkv.predictor.checkpoint import CHECKPOINT_VERSION, FORMAT, SIDECAR_FILE, WEIGHTS_FILE
    from pbkv.predictor.graphsage import GraphSageConfig

    app = get_app("codegen")
    sidecar = {
        "format": FORMAT,
        "version": CHECKPOINT_VERSION,
        "app": "codegen",
        "agents": list(app.agents),
        "edges": [list(e) for e in app.edges],
        "config": dataclasses.asdict(GraphSageConfig()),
    }
    weights = {"empty": b"", "random": bytes(range(256)) * 8}
    header = json.dumps({"x": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}})
    weights["truncated"] = len(header).to_bytes(8, "little") + header.encode() + b"\0" * 100
    for name, data in weights.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / SIDECAR_FILE).write_text(json.dumps(sidecar))
        (folder / WEIGHTS_FILE).write_bytes(data)
        yield folder


def test_a_broken_checkpoint_is_one_line_and_only_read_when_needed(tmp_path, capsys):
    small = ["bench", "--app", "codegen", "--workflows", "1", "--train-workflows", "1"]
    for i, folder in enumerate(bad_checkpoints(tmp_path)):
        if i == 0:  # lru never reads it
            assert main([*small, "--policies", "lru", "--checkpoint", str(folder)]) == 0
        argv = [*small, "--policies", "pbkv", "--predictor", "graphsage"]
        assert main([*argv, "--checkpoint", str(folder)]) == 2
        err = capsys.readouterr().err
        assert "graphsage.safetensors: not a readable safetensors file" in err.replace("\n", "")
        assert "Traceback" not in err


def test_a_huge_host_tier_is_lazy(capsys):
    argv = ["bench", "--app", "codegen", "--workflows", "1", "--policies", "lru"]
    assert main([*argv, "--host-kv-tokens", str(10**15)]) == 0  # was a MemoryError
    assert "\nlru:fcfs " in capsys.readouterr().out


def test_check_integrity_reaches_the_engine(monkeypatch, capsys):
    from pbkv.kvmanager import KVManager

    calls = []
    check = KVManager.check_integrity
    monkeypatch.setattr(KVManager, "check_integrity", lambda self: calls.append(check(self)))
    argv = ["bench", "--app", "codegen", "--workflows", "1", "--policies", "lru"]
    assert main(argv) == 0 and calls == []
    assert main([*argv, "--check-integrity"]) == 0 and len(calls) > 10
    args = build_parser().parse_args(["sweep", "noise", "--check-integrity"])
    assert args.check_integrity


def test_open_loop_flag_and_mooncake_reach_the_json_config(tmp_path):
    from pbkv.cli.workload import config_from

    parse = build_parser().parse_args
    assert not config_from(parse(["bench", "--app", "codegen"])).open_loop
    assert config_from(parse(["bench", "--app", "codegen", "--open-loop"])).open_loop
    assert config_from(parse(["bench", "--app", "mooncake"])).open_loop  # arrivals always
    path = tmp_path / "mooncake.json"
    argv = ["bench", "--app", "mooncake", "--workflows", "3", "--policies", "lru"]
    assert main([*argv, "--hardware", "h200", "--model", "qwen3-14b", "--json", str(path)]) == 0
    assert json.loads(path.read_text())["config"]["open_loop"] is True


def test_the_hit_timeline_reaches_the_json_only_when_asked(tmp_path):
    argv = ["bench", "--app", "codegen", "--workflows", "2", "--policies", "lru"]
    plain, full = tmp_path / "plain.json", tmp_path / "full.json"
    assert main([*argv, "--json", str(plain)]) == 0
    assert main([*argv, "--json", str(full), "--timeline"]) == 0
    (lean,), (timed,) = (json.loads(p.read_text())["results"] for p in (plain, full))
    assert "hit_timeline" not in lean and len(timed["hit_timeline"]) > 0
    timed.pop("hit_timeline")
    assert timed.keys() == lean.keys()
    assert main([*argv, "--timeline"]) == 2  # nowhere to write it


def test_bench_decode_prints_the_engine_beside_plain_transformers(capsys):
    argv = ["bench-decode", "--model", "tiny", "--batch", "2", "--contexts", "12,24"]
    assert main([*argv, "--steps", "2", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^│ +(\d+) │ +([\d.]+) │ +([\d.]+) │ +([\d.]+) │ +([\d.]+) │$", out, re.M)
    assert [r[0] for r in rows] == ["12", "24"]
    for _, plain_ms, engine_ms, wall, _cpu in rows:
        assert float(plain_ms) > 0 and float(engine_ms) > 0 and float(wall) > 0
    with pytest.raises(SystemExit):
        main(["bench-decode", "--contexts", "512,x"])


def test_an_apps_own_error_in_a_bench_is_one_line_naming_the_node(tmp_path, monkeypatch, capsys):
    (tmp_path / "raising_app.py").write_text(
        "import pbkv\n"
        "app = pbkv.App('raising').agent('p', role='Plan.').agent('q', role='Do.')\n"
        "app.edge(pbkv.START, 'p').route('p', lambda s, out: {}['oops'], ['q', pbkv.END])\n"
        "app.edge('q', pbkv.END)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    status = main(["bench", "--app", "raising_app:app", "--workflows", "2", "--policies", "lru"])
    err = capsys.readouterr().err
    assert status == 2
    assert "node 'p' (router) raised KeyError" in err and "Traceback" not in err
