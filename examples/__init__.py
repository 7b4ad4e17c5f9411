from pbkv.examples import codegen  # noqa: F401
