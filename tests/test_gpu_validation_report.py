"""bench/gpu/gpu_validation.py's report (issue 44): the first committed comparison's figures are its own rows'
medians, and the per-run table puts every run's error, sensitivity and group where a reader finds it
(synthetic rows with errors known by construction; the script's predictions are not run here)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gv():
    spec = importlib.util.spec_from_file_location("gpu_validation",
                                                  ROOT / "bench" / "gpu" / "gpu_validation.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_first_comparison_medians_are_its_rows(gv):
    fc = gv.FIRST_COMPARISON
    err = fc["calibrated_rel_error"]
    kor = [v for k, v in err.items() if k.startswith("Korthikanti Table 5")]
    nar = [v for k, v in err.items() if k.startswith("Narayanan Table 1")]
    assert (len(kor), len(nar)) == (len(gv.KORTHIKANTI_T3) * 2, len(gv.NARAYANAN_T1))
    med = fc["calibrated_median_abs_rel_error"]
    # the 10.0 / 18.6 / 11.5 %
    assert np.median(np.abs(kor)) == pytest.approx(med["korthikanti_table5"], abs=1e-5) == \
        pytest.approx(0.100, abs=5e-4)
    assert np.median(np.abs(nar)) == pytest.approx(med["narayanan_table1_b1"], abs=1e-5) == \
        pytest.approx(0.186, abs=5e-4)
    assert np.median(np.abs(kor + nar)) == pytest.approx(med["all"], abs=1e-5) == \
        pytest.approx(0.115, abs=5e-4)
    # run names are the ones the report writes
    names = {f"Korthikanti Table 5 {lab} {m}" for lab, *_ in gv.KORTHIKANTI_T3
             for m in ("full recompute", "present work (sequence parallel + selective)")}
    names |= {f"Narayanan Table 1 {r[0]}" for r in gv.NARAYANAN_T1}
    assert set(err) == names


def _pred(s):
    return {"calibrated": {"iteration_s": s, "rel_error": s / 2.0 - 1}}


def test_rows_table_by_construction(gv):
    kor = [{"paper": "Korthikanti et al. 2022", "table": "Table 5", "label": "175B full recompute", "tp": 8,
            "pp": 8, "dp": 1, "micro_batch": 1, "virtual_stages": 3, "published": {"iteration_s": 2.0},
            "predicted": _pred(2.2),
            "v1_sensitivity": {"calibrated": {"iteration_s": 2.4, "rel_error": 0.2}}}]
    nar = [{"paper": "Narayanan et al. 2021", "table": "Table 1", "label": lab, "tp": 2, "pp": p, "dp": 4,
            "micro_batch": 1, "virtual_stages": 1, "published": {"iteration_s_implied": 2.0},
            "predicted": _pred(s), "b_sensitivity": {"calibrated": {"1": {"rel_error": s / 2 - 1},
                                                                    "2": {"rel_error": 0.05}}}}
           for lab, p, s in (("3.6B", 1, 2.8), ("39B", 2, 2.1))]
    nar[1]["v_sensitivity"] = {"calibrated": {"virtual_stages": 12, "iteration_s": 2.0, "rel_error": 0.0}}
    rows = gv.rows_table(kor, nar, ["calibrated"])
    assert [r["run"] for r in rows] == ["Korthikanti Table 5 175B full recompute", "Narayanan Table 1 3.6B",
                                        "Narayanan Table 1 39B"]
    assert [r["group"] for r in rows] == ["korthikanti_table5", "narayanan_table1_p1",
                                          "narayanan_table1_p_gt1"]
    k, n1, n2 = rows
    assert k["calibrated_rel_error"] == pytest.approx(0.1) and k["calibrated_rel_error_v1"] == 0.2
    assert k["first_comparison_calibrated_rel_error"] == 0.13906
    assert n1["calibrated_rel_error"] == pytest.approx(0.4) and n1["calibrated_rel_error_b"]["2"] == 0.05
    assert "calibrated_rel_error_vmax" not in n1
    assert n2["calibrated_rel_error_vmax"] == {"virtual_stages": 12, "rel_error": 0.0}
    assert n2["first_comparison_calibrated_rel_error"] == 0.23505 and n2["published_s"] == 2.0
