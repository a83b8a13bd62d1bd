"""Small shared helpers for the tests."""

import argparse

import pytest


def assert_usage_error(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str], *, quiet: bool = True
) -> str:
    """``shardscope ARGV`` is a user error: one line on stderr naming ``words``, exit code 2,
    no traceback, and (``quiet``) nothing on stdout. Returns the line."""
    from shardscope._src.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" or not quiet, captured.out
    assert captured.err.count("\n") == 1, captured.err
    assert words in captured.err and "Traceback" not in captured.err
    return captured.err


def sub_parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of the sub-command ``path`` (``("audit", "matmul")``) of a fresh
    ``shardscope`` parser."""
    from shardscope._src.cli.main import build_parser

    parser = build_parser()
    for word in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser
