"""`pbkv demo` runs real generation and prints one wall-clock table per app."""

from pbkv.cli import main


def test_demo_on_the_tiny_model_prints_a_table_per_app(capsys):
    code = main(
        [
            "demo",
            "--model",
            "tiny",
            "--apps",
            "codegen,taubench",
            "--workflows",
            "1",
            "--concurrency",
            "1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("wall-clock seconds") == 2
    assert "codegen: 1 workflows" in out and "taubench: 1 workflows" in out
    assert out.count("│ pbkv") == 2 and out.count("│ lru") == 2


def test_demo_rejects_unknown_model(capsys):
    assert main(["demo", "--model", "no-such-model", "--workflows", "1"]) == 2
    assert "smollm2, tiny" in capsys.readouterr().err


def test_app_help_names_every_registered_app():
    from pbkv.cli import APP_HELP
    from pbkv.examples import app_names

    assert all(name in APP_HELP for name in app_names())
