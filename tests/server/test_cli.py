"""``pbkv serve`` as a command: options, and a real process on 127.0.0.1 stopped by Ctrl-C."""

from __future__ import annotations

import signal

import openai
import pytest

from pbkv.cli import build_parser
from pbkv.server.cli import forecasters
from tests.server.conftest import serve_process


def test_options_parse_and_bad_api_keys_are_refused(capsys):
    args = build_parser().parse_args(
        ["serve", "--engine", "sim", "--port", "0", "--api-key", "k1=acme", "--api-key", "k2=b"]
    )
    assert (args.engine, args.port, args.api_keys) == ("sim", 0, [("k1", "acme"), ("k2", "b")])
    for bad in (["--api-key", "no-tenant"], ["--api-key", "k=a/b"], ["--port", "70000"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", *bad])
    assert "KEY=TENANT" in capsys.readouterr().err


def test_a_predictor_needs_traces_and_none_needs_nothing():
    assert forecasters("none", None, None) == ()
    with pytest.raises(ValueError, match="needs --traces"):
        forecasters("markov", None, None)


def test_serve_runs_until_interrupted():
    """The sim engine starts in about a second (no torch): enough to test the command."""
    with serve_process() as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)
        [model] = client.models.list().data
        reply = client.chat.completions.create(
            model=model.id, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.usage.completion_tokens == 4
        server.proc.send_signal(signal.SIGINT)
        out = server.stopped()
    assert model.id == "sim/qwen3-32b"
    assert server.proc.returncode == 0
    assert out.strip() == "pbkv serve: stopped"


def _serve_fails(capsys, *options: str) -> str:
    """Run ``pbkv serve`` in-process with ``options``; return its one-line error."""
    from pbkv.cli import main

    assert main(["serve", *options]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_a_server_that_cannot_start_says_why_in_one_line(capsys, tmp_path):
    import socket

    err = _serve_fails(capsys, "--engine", "sim", "--model", "nosuchprofile", "--port", "0")
    assert "--model nosuchprofile" in err and "qwen3-32b" in err
    err = _serve_fails(capsys, "--engine", "torch", "--model", "nosuchmodel", "--port", "0")
    assert "--model nosuchmodel" in err and "tiny" in err
    err = _serve_fails(capsys, "--engine", "torch", "--model", str(tmp_path), "--port", "0")
    assert f"--model {tmp_path}" in err
    err = _serve_fails(capsys, "--engine", "sim", "--host", "999.1.1.1", "--port", "0")
    assert "--host 999.1.1.1" in err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        err = _serve_fails(capsys, "--engine", "sim", "--port", port)
    assert f"--port {port}" in err and "already in use" in err


def test_kv_tier_sizes_are_refused_with_the_rule_they_break(capsys):
    for option, value, rule in (
        ("--host-kv-tokens", "-1", "must be >= 0 (0: no host tier), got -1"),
        ("--gpu-kv-tokens", "0", "must be >= 1"),
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", option, value])
        assert rule in capsys.readouterr().err
    args = build_parser().parse_args(["serve", "--host-kv-tokens", "0"])
    assert args.host_kv_tokens == 0


def test_sigterm_drains_refusing_new_requests_then_cuts_what_still_runs():
    import json
    import threading
    import time

    import httpx

    with serve_process("--graceful-timeout-s", "1") as server:
        url = server.url
        model = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]
        events: list[str] = []
        started = threading.Event()

        def stream() -> None:  # ~4000 modelled decode steps: still running after 1 s
            body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            body |= {"max_tokens": 4000, "stream": True}
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
                for event in r.iter_lines():
                    if event:
                        events.append(event)
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(30)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with httpx.Client(timeout=30) as client:
            refused = client.post(
                f"{url}/v1/chat/completions",
                json={"model": model, "messages": [{"role": "user", "content": "hi"}]},
            )
        reader.join(30)
        out = server.stopped()
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "shutting_down"
    assert len(events) > 3  # it streamed during the drain, then was cut
    assert server.proc.returncode == 0
    assert out.strip() == "pbkv serve: stopped"


def test_timeouts_that_are_not_finite_or_too_short_are_refused_naming_the_option(capsys):
    for option, value in (
        ("--idle-timeout-s", "nan"),
        ("--idle-timeout-s", "1e-9"),
        ("--idle-timeout-s", "inf"),
        ("--graceful-timeout-s", "nan"),
        ("--body-timeout-s", "0"),
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", option, value])
        err = capsys.readouterr().err
        assert f"argument {option}: must be a finite number of seconds >=" in err, err
        assert f"got {value}" in err


def test_one_api_key_names_one_tenant_several_keys_may_share_one(capsys):
    args = build_parser().parse_args(
        ["serve", "--api-key", "k1=acme", "--api-key", "k2=acme", "--api-key", "k1=acme"]
    )
    assert dict(args.api_keys) == {"k1": "acme", "k2": "acme"}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--api-key", "k1=acme", "--api-key", "k1=globex"])
    assert "key 'k1' given twice, for tenants 'acme' and 'globex'" in capsys.readouterr().err


def test_a_second_sigint_cuts_streams_with_an_error_and_done_not_silence():
    import json
    import threading
    import time

    import httpx

    streams: list[list[str]] = [[] for _ in range(6)]
    started = [threading.Event() for _ in streams]
    with serve_process("--graceful-timeout-s", "60") as server:
        url = server.url

        def stream(i: int) -> None:  # ~4000 modelled decode steps: minutes
            body = {"model": "sim/qwen3-32b", "messages": [{"role": "user", "content": "hi"}]}
            body |= {"max_tokens": 4000, "stream": True}
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
                for event in r.iter_lines():
                    if event:
                        streams[i].append(event)
                        started[i].set()

        readers = [threading.Thread(target=stream, args=(i,)) for i in range(len(streams))]
        for reader in readers:
            reader.start()
        assert all(s.wait(30) for s in started)
        server.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # trio merges a signal that arrives again before it is read
        server.proc.send_signal(signal.SIGINT)
        for reader in readers:
            reader.join(30)
        out = server.stopped()
    for events in streams:
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "shutting_down"
    assert server.proc.returncode == 0
    assert out.strip() == "pbkv serve: stopped"


def test_ctrl_c_while_loading_ends_the_command_without_a_traceback(monkeypatch, capsys):
    import pbkv.server.cli as serve_cli
    from pbkv.cli import main

    def interrupted(*args: object) -> tuple[()]:
        raise KeyboardInterrupt

    monkeypatch.setattr(serve_cli, "forecasters", interrupted)
    assert main(["serve", "--engine", "sim", "--port", "0"]) == 130
    captured = capsys.readouterr()
    assert "pbkv serve: interrupted" in captured.out
    assert "Traceback" not in captured.err + captured.out


def test_served_model_names_and_the_tool_call_parser_are_options(capsys):
    args = build_parser().parse_args(
        ["serve", "--served-model-name", "smol", "gpt-4o", "--tool-call-parser", "qwen25"]
    )
    assert (args.served_model_name, args.tool_call_parser) == (["smol", "gpt-4o"], "qwen25")
    err = _serve_fails(capsys, "--engine", "sim", "--port", "0", "--tool-call-parser", "pythonic")
    assert "unknown tool-call parser 'pythonic'; known: hermes, qwen25" in err
