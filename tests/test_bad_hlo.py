"""Hostile HLO text: sizes past what a program can hold, non-ASCII digits, unclosed comments and
huge values end in one HloParseError naming the line, or in an audit that renders."""

import json
import re

import pytest

import shardscope
from shardscope._src.base.comm import format_bytes
from shardscope._src.base.errors import HloParseError
from shardscope._src.hlo.groups import MAX_GROUP_IDS_PER_MODULE, parse_replica_groups
from shardscope._src.hlo.parse import (
    INT64_MAX,
    MAX_MODULE_DEVICES,
    parse_hlo,
    read_int,
    strip_comments,
)
from shardscope._src.render.audit import format_audit

ADD = """%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}
"""


def module(body: str, *, header: str = "num_partitions=8", extra: str = "") -> str:
    """One module: the ``add`` reduction, ``extra`` computations, and ENTRY around ``body``."""
    return (
        f"HloModule m, {header}\n\n{ADD}\n{extra}\n"
        "ENTRY %main (p: f32[8]) -> f32[8] {\n"
        "  %p = f32[8]{0} parameter(0)\n"
        f"{body}"
        "  ROOT %r = f32[8]{0} copy(%p)\n"
        "}\n"
    )


def all_gather(i: int, groups: str) -> str:
    return (
        f"  %ag{i} = f32[64]{{0}} all-gather(%p), channel_id={i + 1}, "
        f"replica_groups={groups}, dimensions={{0}}, use_global_device_ids=true\n"
    )


COND = """%cond (c: f32[8]) -> pred[] {
  %c = f32[8]{0} parameter(0)
  ROOT %k = pred[] constant(true)
}
"""


def trips(n: str) -> str:
    return f'backend_config={{"known_trip_count":{{"n":"{n}"}}}}'


def looped(n: str) -> str:
    """A module whose all-reduce runs in a while loop of ``n`` trips."""
    body = """%body (t: f32[8]) -> f32[8] {
  %t = f32[8]{0} parameter(0)
  ROOT %ar = f32[8]{0} all-reduce(%t), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, \
use_global_device_ids=true, to_apply=%add
}
""".replace("\\\n", "")
    call = f"  %w = f32[8]{{0}} while(%p), condition=%cond, body=%body, {trips(n)}\n"
    return module(call, extra=COND + "\n" + body)


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def refused(text: str, *words: str, line: int | None = None) -> str:
    with pytest.raises(HloParseError) as info:
        shardscope.audit(text)
    message = str(info.value)
    assert "\n" not in message
    if line is not None:
        assert f"line {line}:" in message, message
    for w in words:
        assert w in message, message
    return message


# -- 1. sizes read from the text are bounded before anything is expanded ---------------------


@pytest.mark.parametrize(
    "header, words",
    [
        ("num_partitions=8, replica_count=100000000", ["replica_count 100000000", "65,536"]),
        ("num_partitions=1000000000000", ["num_partitions 1000000000000"]),
        ("num_partitions=0", ["num_partitions=0"]),
        ("num_partitions=512, replica_count=512", ["262,144 devices", "65,536"]),
    ],
)
def test_device_counts_beyond_any_program_are_refused_on_the_header_line(header, words):
    refused(module(all_gather(0, "{}"), header=header), *words, line=1)


@pytest.mark.parametrize(
    "groups",
    [
        "[1,1048576]<=[1048576]",
        "[1024,1024]<=[1024,1024]T(1,0)",
        "mesh['a'=1024,'b'=1024] {'b'}",
        "mesh['a'=2,'b'=8], device_ids=([16]) {'a'}",
    ],
)
def test_groups_holding_more_ids_than_the_module_has_devices_are_refused_unexpanded(groups):
    text = module("".join(all_gather(i, groups) for i in range(40)))
    message = refused(text, "the module runs on 8 devices", line=line_of(text, "%ag0"))
    assert "ag0" in message


def test_a_group_form_past_any_program_is_refused_without_a_module():
    with pytest.raises(HloParseError, match="more than any single program runs on"):
        parse_replica_groups(f"[1,{2 * MAX_MODULE_DEVICES}]<=[{2 * MAX_MODULE_DEVICES}]")
    with pytest.raises(HloParseError, match="at most 32"):
        parse_replica_groups("[1,1]<=[" + ",".join(["1"] * 70) + "]")


def test_one_form_printed_by_many_collectives_is_expanded_once():
    devices = MAX_MODULE_DEVICES
    body = "".join(all_gather(i, f"[{devices // 2},2]<=[{devices}]") for i in range(200))
    a = shardscope.audit(module(body, header=f"num_partitions={devices}"))
    assert len(a.collectives) == 200
    assert {c.group_size for c in a.collectives} == {2}
    assert a.collectives[0].groups is a.collectives[199].groups


def test_distinct_forms_past_the_module_budget_are_refused():
    devices = MAX_MODULE_DEVICES
    forms = [f"[{devices // s},{s}]<=[{devices}]" for s in (2, 4, 8, 16)]
    assert len(forms) * devices > MAX_GROUP_IDS_PER_MODULE
    text = module(
        "".join(all_gather(i, g) for i, g in enumerate(forms)), header=f"num_partitions={devices}"
    )
    refused(text, "forms of replica groups", f"{MAX_GROUP_IDS_PER_MODULE:,} device ids")


def test_loops_that_multiply_past_int64_are_refused():
    # A loop of 2**62 trips inside another: its all-reduce would run 2**124 times.
    inner = looped(str(2**62))
    outer = f"""%outer (u: f32[8]) -> f32[8] {{
  %u = f32[8]{{0}} parameter(0)
  ROOT %w2 = f32[8]{{0}} while(%u), condition=%cond, body=%body, {trips(str(2**62))}
}}
"""
    text = inner.replace("body=%body, backend", "body=%outer, backend").replace(
        "ENTRY", outer + "\nENTRY"
    )
    refused(text, "run more than 9,223,372,036,854,775,807 times per program run")


def test_a_dimension_or_array_past_int64_is_refused_with_its_line():
    huge = "9" * 400
    body = f"  %ar = f32[{huge}]{{0}} all-reduce(%p), to_apply=%add\n"
    refused(module(body), "f32 dimension has 400 digits", line=line_of(module(body), "%ar"))
    body = f"  %ar = f32[{2**62},4]{{1,0}} all-reduce(%p), to_apply=%add\n"
    refused(module(body), "more than XLA can address", line=line_of(module(body), "%ar"))


def test_trip_counts_past_int64_are_refused_with_the_loop_line():
    text = looped("9" * 4000)
    refused(text, "known_trip_count has 4000 digits", line=line_of(text, "%w = "))


# -- 2. linear-time lexing -----------------------------------------------------------------


def test_unclosed_comments_are_an_error_whatever_their_number():
    text = "f32[8]{0}" + "/*x" * 50_000
    with pytest.raises(HloParseError, match="comment starting at column 10 is never closed"):
        strip_comments(text, 4)
    body = "  %c = f32[8]{0}" + "/*x" * 50_000 + " copy(%p)\n"
    refused(module(body), "never closed", line=line_of(module(body), "%c = "))
    assert strip_comments("a/*1*/b/**/c/* x */") == "abc"


# -- 3. every audit renders, however large its numbers -------------------------------------


def test_an_audit_with_the_largest_sizes_renders_and_serialises():
    text = looped(str(2**62)).replace(
        "  ROOT %r",
        f"  %big = f32[{2**60}]{{0}} parameter(1)\n"
        f"  %ar2 = f32[{2**60}]{{0}} all-reduce(%big), channel_id=9, "
        "replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, to_apply=%add\n"
        "  ROOT %r",
    )
    a = shardscope.audit(text)
    big = next(c for c in a.collectives if c.name == "ar2")
    assert big.payload_bytes == 2**62
    assert next(c for c in a.collectives if c.name == "ar").count == 2**62
    shown = format_audit(a)
    assert "EiB" in shown and str(2**62) in shown
    json.dumps(a.to_dict(), allow_nan=False)


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (2**50, "1 PiB"),
        (2**80, "1 YiB"),
        (2**90, "1024 YiB"),
        (10**30, "8.272e+05 YiB"),
        (10**400, "8.272e+375 YiB"),
        (10**5000, "8.272e+4975 YiB"),
    ],
    ids=lambda v: v if isinstance(v, str) else f"2**{v.bit_length() - 1}",
)
def test_format_bytes_formats_any_size(n, text):
    assert format_bytes(n) == text


# -- 4. only ASCII digits are digits; numeric errors are ours, with the line --------------


@pytest.mark.parametrize("digit", ["\u00b2", "\u0663", "\uff18"])
def test_digits_of_other_scripts_are_not_numbers(digit):
    assert read_int(digit) is None  # int() reads two of them as 3 and 8
    refused(module("", header=f"num_partitions={digit}"), "num_partitions", line=1)
    for body, words in [
        (f"  %c = f32[{digit}]{{0}} copy(%p)\n", "ASCII digits"),
        (all_gather(0, f"[1,{digit}]<=[{digit}]"), "replica groups"),
        (all_gather(0, "{}").replace("channel_id=1", f"channel_id={digit}"), "channel_id"),
    ]:
        text = module(body)
        refused(text, words, line=line_of(text, body.split("=")[0].strip()))
    text = looped(digit)
    refused(text, "known_trip_count", line=line_of(text, "%w = "))


@pytest.mark.parametrize(
    "text, words, line",
    [
        ("HloModule m, num_partitions=" + "9" * 5000 + "\n", ["has 5000 digits"], 1),
        (
            "HloModule m, num_partitions=8\n\nFileNames\n" + "1" * 5000 + ' "a.py"\n',
            ["row id has 5000 digits"],
            4,
        ),
        ('HloModule m, num_partitions=8\n\nFileNames\n\u00b2 "a.py"\n', ["does not start"], 4),
    ],
    ids=["header", "table-id", "table-superscript"],
)
def test_numbers_past_pythons_conversion_limit_are_our_errors(text, words, line):
    with pytest.raises(HloParseError) as info:
        parse_hlo(text)
    assert f"line {line}:" in str(info.value)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_a_backend_config_nested_past_pythons_stack_is_kept_as_text():
    body = "  %c = f32[8]{0} copy(%p), backend_config=" + "[" * 100_000 + "]" * 100_000 + "\n"
    m = parse_hlo(module(body))
    ins = m.entry.by_name["c"]
    assert isinstance(ins.backend_config, str)


def test_read_int_takes_ascii_int64_only():
    assert read_int("0") == 0 and read_int(" 0042 ") == 42
    assert read_int(str(INT64_MAX)) == INT64_MAX and read_int(str(INT64_MAX + 1)) is None
    for bad in ["", "-1", "+1", "1_000", "1e3", "0x10", "9" * 5000]:
        assert read_int(bad) is None, bad
    assert re.fullmatch(r"\d", "\u0663") and int("\u0663") == 3  # why neither is used
