"""``--set`` and ``--set-string`` read as Helm reads them.

Three sets of cases, each from Helm itself:

1. the examples of Helm's documentation ("The Format and Limitations of --set" in
   docs/intro/using_helm.mdx, and "Deleting a default key" in chart_template_guide/values_files),
   written as the shell hands them over (quotes removed);
2. the cases of Helm's own parser tests (pkg/strvals/parser_test.go: TestParseSet, TestParseInto,
   TestParseIntoString, TestParseSetNestedLevels, TestSetIndex);
3. what Helm's parser was seen to do when run on inputs its documentation gets wrong or leaves
   out (the Go parser compiled and run, recorded in the project's research notes).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuledger.commands.render.helm_set import parse_into
from gpuledger.errors import SetSyntaxError


def parsed(line: str, base: dict[str, Any] | None = None, *, as_string: bool = False) -> Any:
    data = {} if base is None else base
    parse_into(line, data, as_string=as_string)
    return data


# ---------------------------------------------------------------------- 1. Helm's documentation

DOCUMENTED = [
    ("name=value", {"name": "value"}),
    ("a=b,c=d", {"a": "b", "c": "d"}),
    ("outer.inner=value", {"outer": {"inner": "value"}}),
    # The page shows a, b, c; the parser keeps the spaces after the commas (see section 3).
    ("name={a,b,c}", {"name": ["a", "b", "c"]}),
    ("servers[0].port=80", {"servers": [{"port": 80}]}),
    ("servers[0].port=80,servers[0].host=example", {"servers": [{"port": 80, "host": "example"}]}),
    # --set name="value1\,value2": the shell removes the quotes
    ("name=value1\\,value2", {"name": "value1,value2"}),
    # --set nodeSelector."kubernetes\.io/role"=master
    (
        "nodeSelector.kubernetes\\.io/role=master",
        {"nodeSelector": {"kubernetes.io/role": "master"}},
    ),
    # "--set foo=true results Helm to cast true into" a typed value; --set-string keeps a string
    ("foo=true", {"foo": True}),
    # values_files: "--set livenessProbe.httpGet=null" deletes a default (None here, deleted on
    # the merge with the defaults: test_render_values)
    ("livenessProbe.httpGet=null", {"livenessProbe": {"httpGet": None}}),
]


@pytest.mark.parametrize(("line", "expected"), DOCUMENTED)
def test_helm_documented_example(line: str, expected: Any) -> None:
    assert parsed(line) == expected


def test_helm_documented_set_string_keeps_a_string() -> None:
    assert parsed("foo=true", as_string=True) == {"foo": "true"}


# ---------------------------------------------------------------------- 2. Helm's parser tests

PARSE_SET = [
    ("name1=null,f=false,t=true", {"name1": None, "f": False, "t": True}),
    ("name1=value1", {"name1": "value1"}),
    ("name1=value1,name2=value2", {"name1": "value1", "name2": "value2"}),
    ("name1=value1,name2=value2,", {"name1": "value1", "name2": "value2"}),
    ("name1=,name2=value2", {"name1": "", "name2": "value2"}),
    ("leading_zeros=00009", {"leading_zeros": "00009"}),
    ("zero_int=0", {"zero_int": 0}),
    ("long_int=1234567890", {"long_int": 1234567890}),
    ("boolean=true", {"boolean": True}),
    ("is_null=null", {"is_null": None}),
    ("name1=one\\,two,name2=three\\,four", {"name1": "one,two", "name2": "three,four"}),
    ("name1=one\\=two,name2=three\\=four", {"name1": "one=two", "name2": "three=four"}),
    (
        "name1=one two three,name2=three two one",
        {"name1": "one two three", "name2": "three two one"},
    ),
    ("outer.inner=value", {"outer": {"inner": "value"}}),
    ("outer.middle.inner=value", {"outer": {"middle": {"inner": "value"}}}),
    ("outer.inner1=value,outer.inner2=value2", {"outer": {"inner1": "value", "inner2": "value2"}}),
    (
        "outer.inner1=value,outer.middle.inner=value",
        {"outer": {"inner1": "value", "middle": {"inner": "value"}}},
    ),
    ("name1.name2=", {"name1": {"name2": ""}}),
    ("name1={value1,value2}", {"name1": ["value1", "value2"]}),
    (
        "name1={value1,value2},name2={value1,value2}",
        {"name1": ["value1", "value2"], "name2": ["value1", "value2"]},
    ),
    ("name1={1021,902}", {"name1": [1021, 902]}),
    ("name1.name2={value1,value2}", {"name1": {"name2": ["value1", "value2"]}}),
    ("list[0]=foo", {"list": ["foo"]}),
    ("list[0].foo=bar", {"list": [{"foo": "bar"}]}),
    ("list[0].foo=bar,list[0].hello=world", {"list": [{"foo": "bar", "hello": "world"}]}),
    ("list[0]=foo,list[1]=bar", {"list": ["foo", "bar"]}),
    ("list[0]=foo,list[1]=bar,", {"list": ["foo", "bar"]}),
    ("list[0]=foo,list[3]=bar", {"list": ["foo", None, None, "bar"]}),
    ("noval[0]", {"noval": []}),
    ("noval[0]=", {"noval": [""]}),
    ("nested[0][0]=1", {"nested": [[1]]}),
    ("nested[1][1]=1", {"nested": [None, [None, 1]]}),
    (
        "name1.name2[0].foo=bar,name1.name2[1].foo=bar",
        {"name1": {"name2": [{"foo": "bar"}, {"foo": "bar"}]}},
    ),
    (
        "name1.name2[1].foo=bar,name1.name2[0].foo=bar",
        {"name1": {"name2": [{"foo": "bar"}, {"foo": "bar"}]}},
    ),
    ("name1.name2[1].foo=bar", {"name1": {"name2": [None, {"foo": "bar"}]}}),
]

PARSE_SET_ERRORS = [
    "name1=value1,,,,name2=value2,",
    "name1,name2=",
    "name1,name2=value2",
    "name1,name2=value2\\",
    "name1,name2",
    "name1.name2",
    "name1.name2,name1.name3",
    "name1.=name2",
    "name1.,name2",
    "name1={1021,902",
    "list[0].foo=bar,list[-30].hello=world",
    "list[0]=foo,list[-20]=bar",
    "illegal[0]name.foo=bar",
    "]={}].",
]


@pytest.mark.parametrize(("line", "expected"), PARSE_SET)
def test_helm_parser_test_case(line: str, expected: Any) -> None:
    assert parsed(line) == expected


@pytest.mark.parametrize("line", PARSE_SET_ERRORS)
def test_helm_parser_test_error(line: str) -> None:
    with pytest.raises(SetSyntaxError):
        parsed(line)


def test_set_string_keeps_every_value_a_string() -> None:
    line = "long_int_string=1234567890,boolean=true,is_null=null,zero=0"
    assert parsed(line, as_string=True) == {
        "long_int_string": "1234567890",
        "boolean": "true",
        "is_null": "null",
        "zero": "0",
    }


def test_parse_into_overwrites_and_keeps_the_rest() -> None:
    base = {"outer": {"inner1": "overwrite", "inner2": "value2"}}
    assert parsed("outer.inner1=value1,outer.inner3=value3,outer.inner4=4", base) == {
        "outer": {"inner1": "value1", "inner2": "value2", "inner3": "value3", "inner4": 4}
    }


def test_parse_into_string() -> None:
    base = {"outer": {"inner1": "overwrite", "inner2": "value2"}}
    assert parsed("outer.inner1=1,outer.inner3=3", base, as_string=True) == {
        "outer": {"inner1": "1", "inner2": "value2", "inner3": "3"}
    }


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            ["listOuter[0][0].type=listValue", "listOuter[0][0].status=alive"],
            [[{"type": "listValue", "status": "alive"}]],
        ),
        (
            ["listOuter[0][0].type=listValue", "listOuter[1][0].status=alive"],
            [[{"type": "listValue"}], [{"status": "alive"}]],
        ),
    ],
)
def test_parse_into_nested_lists(lines: list[str], expected: Any) -> None:
    data: dict[str, Any] = {}
    for line in lines:
        parse_into(line, data)
    assert data == {"listOuter": expected}


def test_parse_into_an_existing_nested_list() -> None:
    data: dict[str, Any] = {"listOuter": [[[{"exited": "old"}]]]}
    parse_into("listOuter[0][1][0].type=listValue", data)
    parse_into("listOuter[0][0][1].status=alive", data)
    assert data == {
        "listOuter": [[[{"exited": "old"}, {"status": "alive"}], [{"type": "listValue"}]]]
    }


def test_thirty_dots_are_allowed_and_thirty_one_are_not() -> None:
    thirty = ".".join(f"name{i}" for i in range(1, 32)) + "=value"
    assert thirty.count(".") == 30
    parsed(thirty)
    with pytest.raises(SetSyntaxError, match="maximum supported nested level of 30"):
        parsed(".".join(f"name{i}" for i in range(1, 33)) + "=value")


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("a[-1]=x", "negative -1 index not allowed"),
        ("a[65537]=x", "index of 65537 is greater than maximum supported index of 65536"),
    ],
)
def test_set_index_bounds(line: str, error: str) -> None:
    with pytest.raises(SetSyntaxError, match=error):
        parsed(line)


def test_the_largest_index_pads_the_list() -> None:
    assert len(parsed("a[65536]=x")["a"]) == 65537


# ---------------------------------------------------------------------- 3. seen run


SEEN = [
    ("a=b\\", {"a": "b"}),  # a trailing backslash is dropped
    ("a b=c", {"a b": "c"}),
    ("name={a, b, c}", {"name": ["a", " b", " c"]}),  # the page shows no spaces
    ("name={}", {"name": [""]}),
    ("name=[]", {"name": "[]"}),  # the page says an empty list: the parser gives a string
    ("=b", {}),  # an empty key is ignored
    ("a==b", {"a": "=b"}),
    ("a=b=c", {"a": "b=c"}),
    ("a[0]", {"a": []}),
    ("a[01]=x,b[+1]=y", {"a": [None, "x"], "b": [None, "y"]}),
    ("a.b=c,a=x", {"a": "x"}),
    ("a[0]=x,a[0].b=c", {"a": [{"b": "c"}]}),
    ("a[1].b=c,a[0]=x", {"a": ["x", {"b": "c"}]}),
    ("a={x,y}z=1", {"a": ["x", "y"], "z": 1}),
    ("a=\\{x}", {"a": "{x}"}),
    ("t=TRUE,f=False,n=NULL", {"t": True, "f": False, "n": None}),
    ("a=-0,b=+5,c=-05,d=010,e=00", {"a": 0, "b": 5, "c": -5, "d": "010", "e": "00"}),
    (
        "a=1.5,b=.5,c=0x10,d=1e3,e=1_000",
        {"a": "1.5", "b": ".5", "c": "0x10", "d": "1e3", "e": "1_000"},
    ),
    ("a=yes,b=on,c=~,d=Inf", {"a": "yes", "b": "on", "c": "~", "d": "Inf"}),
    ("a=\u0663", {"a": "\u0663"}),  # an Arabic-Indic digit is no number to Go
    ("a= 5", {"a": " 5"}),  # no trimming
    ("big=9223372036854775807", {"big": 9223372036854775807}),
    ("small=-9223372036854775808", {"small": -9223372036854775808}),
    ("over=9223372036854775808", {"over": "9223372036854775808"}),
    ("a={1,true},b={x}", {"a": [1, True], "b": ["x"]}),
]


@pytest.mark.parametrize(("line", "expected"), SEEN)
def test_helm_seen_behaviour(line: str, expected: Any) -> None:
    assert parsed(line) == expected


def test_set_string_list_items_stay_strings() -> None:
    assert parsed("a={1,true},n=null", as_string=True) == {"a": ["1", "true"], "n": "null"}


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("a", 'key "a" has no value'),
        ("x.y", 'key "y" has no value'),
        ("a.=b", 'key map "a" has no value'),
        ("a=b,,c=d", 'key "" has no value \\(cannot end with ,\\)'),
        ("a[1]b=c", "unexpected data at end of array index: 'b'"),
        ("a={x,y", "list must terminate with '}'"),
        ("a={x,y}z", 'key "z" has no value'),
        ("a[x]=1", 'error parsing index: strconv.Atoi: parsing "x": invalid syntax'),
        ("a[ 1]=1", "invalid syntax"),
        ("a[]=1", "invalid syntax"),
        ("a=x,a.b=c", "'a' holds a string, not a map"),
        ("a.b=c,a[0]=x", "'a' holds a map, not a list"),
        ("a[0]=x,a[0][1]=y", "item \\[0\\] holds a string, not a list"),
        ("a=null,a.b=c", "'a' holds null, not a map"),
    ],
)
def test_helm_seen_errors(line: str, error: str) -> None:
    with pytest.raises(SetSyntaxError, match=error):
        parsed(line)


@pytest.mark.parametrize(
    ("base", "line", "expected"),
    [
        ({"a": [1, 2, 3]}, "a[1]=x", [1, "x", 3]),
        ({"a": [1, 2, 3]}, "a[5]=x", [1, 2, 3, None, None, "x"]),
        ({"a": [1, 2, 3]}, "a={x}", ["x"]),
        ({"a": [{"b": 1, "c": 2}]}, "a[0].b=9", [{"b": 9, "c": 2}]),
        ({"a": {"b": 1}}, "a.c=2", {"b": 1, "c": 2}),
        ({"a": {"b": 1}}, "a=5", 5),
    ],
)
def test_set_edits_what_the_files_made(base: dict[str, Any], line: str, expected: Any) -> None:
    assert parsed(line, base)["a"] == expected
