import pytest

from pbkv.examples import App, app_names, get_app, register_app, validate_path


def test_registry_knows_the_bundled_apps():
    assert {"codegen", "taubench"} <= set(app_names())
    for name in ("codegen", "taubench"):
        app = get_app(name)
        assert isinstance(app, App)
        assert app.name == name


def test_unknown_app_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown app 'nope'; known apps: .*codegen.*taubench"):
        get_app("nope")


def test_registering_a_name_twice_fails():
    with pytest.raises(ValueError, match="already registered"):
        register_app("codegen", lambda: get_app("codegen"))


def test_validate_path_accepts_a_walk_and_names_a_bad_transition():
    app = get_app("codegen")
    validate_path(app, ("planner", "coder", "tester", "analyzer", "coder", "tester"))
    with pytest.raises(ValueError, match=r"step 1: transition 'coder' -> 'analyzer'"):
        validate_path(app, ("planner", "coder", "analyzer"))
    with pytest.raises(ValueError, match="not an entry agent"):
        validate_path(app, ("coder", "tester"))
    with pytest.raises(ValueError, match=r"step 1: transition 'coder' -> 'END'"):
        validate_path(app, ("planner", "coder"))
    with pytest.raises(ValueError, match="at least one agent"):
        validate_path(app, ())


@pytest.mark.parametrize("name", ["codegen", "taubench"])
@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_generate_rejects_a_bad_count(name, bad):
    with pytest.raises(ValueError, match="n_workflows"):
        get_app(name).generate(bad, 0)
