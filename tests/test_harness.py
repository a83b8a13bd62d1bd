import json
import math
import os

import numpy as np
import pytest

from shardscope import Lab, ShardscopeError, bootstrap
from shardscope._src.base.errors import OutputPathError


def make_lab(tmp_path, **kw):
    return Lab("unit", out_dir=tmp_path, verbose=kw.pop("verbose", False), **kw)


def test_check_pass_fail_and_raise(tmp_path):
    lab = make_lab(tmp_path)
    assert lab.check("ok", lambda: True, "fine") is True
    assert lab.check("no", lambda: 0) is False
    assert lab.check("boom", lambda: 1 / 0, "divides") is False
    assert lab.check("plain bool", True) is True
    assert lab.check("with details", lambda: (False, {"got": 3}), "measures") is False
    assert lab.results[-1].details == {"got": 3} and lab.results[-1].message == "measures"
    by_name = {r.name: r for r in lab.results}
    assert by_name["boom"].message == "divides: ZeroDivisionError: division by zero"
    assert by_name["boom"].details == {"error_type": "ZeroDivisionError"}
    assert by_name["ok"].message == "fine"


def test_assert_close_records_values(tmp_path):
    lab = make_lab(tmp_path)
    assert lab.assert_close("near", 1.04, 1.0) is True
    assert lab.assert_close("far", 1.2, 1.0, rtol=0.1) is False
    assert lab.assert_close("arrays", np.ones(4) * 1.001, np.ones(4), rtol=1e-2) is True
    assert lab.assert_close("shape", np.ones(3), np.ones(4)) is False
    r = {r.name: r for r in lab.results}
    assert r["near"].details["actual"] == 1.04
    assert r["near"].details["expected"] == 1.0
    assert math.isclose(r["near"].details["rel_error"], 0.04, rel_tol=1e-9)
    assert r["near"].details["rtol"] == 0.05
    assert r["arrays"].details["actual"] == {"shape": [4]}
    assert "shapes differ" in r["shape"].message


def test_benchmark_directions(tmp_path):
    lab = make_lab(tmp_path)
    assert lab.benchmark("just a number", 3.0, unit="s")
    assert lab.benchmark("faster", 10.0, baseline=4.0, must_beat=2.0)
    assert not lab.benchmark("not fast enough", 7.0, baseline=4.0, must_beat=2.0)
    assert lab.benchmark("time halves", 1.0, baseline=2.0, must_beat=2.0, higher_is_better=False)
    assert not lab.benchmark(
        "time too long", 1.5, baseline=2.0, must_beat=2.0, higher_is_better=False
    )
    assert not lab.benchmark("nan", float("nan"))


def test_summary_and_save(tmp_path, capsys):
    lab = make_lab(tmp_path, verbose=True)
    lab.check("a", lambda: True)
    lab.check("b", lambda: False)
    lab.skip("c", "needs 16 devices")
    out = capsys.readouterr().out
    assert "PASS a" in out and "FAIL b" in out and "SKIP c  needs 16 devices" in out
    s = lab.scorecard()
    assert capsys.readouterr().out == ""  # the scorecard is data
    printed = lab.summary()
    assert printed.keys() == s.keys() and printed["results"] == s["results"]
    assert capsys.readouterr().out == "[unit] 1/2 checks passed (50%); skipped=1\n"
    assert lab.print_summary()["results"] == s["results"]  # the former name
    assert capsys.readouterr().out == "[unit] 1/2 checks passed (50%); skipped=1\n"
    assert (s["lab_id"], s["passed"], s["total"], s["skipped"], s["score"]) == (
        "unit",
        1,
        2,
        1,
        0.5,
    )
    assert [r["name"] for r in s["results"]] == ["a", "b", "c"]
    assert set(s["results"][0]) == {"name", "passed", "skipped", "message", "duration_s", "details"}
    path = lab.save()
    assert capsys.readouterr().out == ""  # saving prints nothing
    assert path == tmp_path / "unit.json"
    saved = json.loads(path.read_text())
    assert saved["results"] == s["results"] and saved["passed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["unit.json"]  # no temporary left


def test_save_is_atomic(tmp_path, monkeypatch):
    lab = make_lab(tmp_path)
    lab.check("a", lambda: True)
    lab.save()
    before = (tmp_path / "unit.json").read_text()
    lab.check("b", lambda: False)

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dump", broken)
    with pytest.raises(OutputPathError, match=r"cannot write .*unit.json.: disk full"):
        lab.save()
    assert (tmp_path / "unit.json").read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["unit.json"]


def test_non_finite_values_stay_valid_json(tmp_path):
    lab = make_lab(tmp_path)
    lab.assert_close("nan", float("nan"), 1.0)
    data = json.loads(lab.save().read_text())
    assert data["results"][0]["passed"] is False


def test_bad_names(tmp_path):
    with pytest.raises(ShardscopeError, match="lab id"):
        Lab("no/slashes", out_dir=tmp_path)
    lab = make_lab(tmp_path)
    lab.check("twice", True)
    with pytest.raises(ValueError, match="used twice"):
        lab.check("twice", True)


def test_bootstrap_seeds_and_reports(tmp_path, capsys):
    import jax

    lab = bootstrap("boot", seed=3, out_dir=tmp_path)
    assert f"boot: JAX {jax.__version__}, backend cpu, 8 x cpu" in capsys.readouterr().out
    assert lab.hardware["device_count"] == 8
    a = np.random.rand()
    bootstrap("boot2", seed=3, out_dir=tmp_path, verbose=False)
    assert np.random.rand() == a
    assert jax.random.key_data(lab.key).tolist() == jax.random.key_data(jax.random.key(3)).tolist()


def test_saved_files_have_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        path = make_lab(tmp_path).save()
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
