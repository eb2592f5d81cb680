"""`attn experiment order|heads` from the command line: the JSON form of
docs/experiments.md and the weight files, on short runs (the claims themselves
are asserted in tests/test_train.cc)."""
import json
import os
import subprocess

import numpy as np

CLI = os.environ.get("ATTN_CLI", os.path.join(os.path.dirname(__file__), "..", "..", "build",
                                              "bin", "attn"))


def test_order_json_and_weights(tmp_path):
    out = subprocess.run([CLI, "experiment", "order", "--steps", "100", "--json",
                          "--out", str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stderr == ""  # no progress bar when stderr is not a terminal
    result = json.loads(out.stdout)
    assert set(result["variants"]) == {"none", "sinusoidal", "learned", "rope", "alibi"}
    assert result["variants"]["none"]["accuracy"] <= 0.6 and result["heads"] == 2
    for variant in ("none", "sinusoidal", "learned", "rope", "alibi"):
        cat = np.load(tmp_path / f"order_{variant}_cat_bites_dog.npy")
        dog = np.load(tmp_path / f"order_{variant}_dog_bites_cat.npy")
        assert cat.shape == dog.shape == (2, 3, 3)
        assert np.allclose(cat.sum(-1), 1) and np.allclose(dog.sum(-1), 1)
    # without positions, the mirrored sentence's weights are the permuted ones
    cat = np.load(tmp_path / "order_none_cat_bites_dog.npy")
    dog = np.load(tmp_path / "order_none_dog_bites_cat.npy")
    assert np.allclose(dog, cat[:, ::-1, ::-1], atol=1e-12)


def test_heads_json():
    out = subprocess.run([CLI, "experiment", "heads", "--steps", "30", "--json"],
                         capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert set(result["heads"]) == {"1", "2", "4", "8"}
    assert len({h["parameters"] for h in result["heads"].values()}) == 1
    assert [len(result["heads"][h]["top_positions"]) for h in ("1", "2", "4", "8")] == [1, 2, 4, 8]


def test_order_heads():
    out = subprocess.run([CLI, "experiment", "order", "--steps", "20", "--heads", "8", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["heads"] == 8
    bad = subprocess.run([CLI, "experiment", "order", "--heads", "3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--heads" in bad.stderr


def test_bad_flag_is_a_usage_error():
    out = subprocess.run([CLI, "experiment", "heads", "--positional", "absolute"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "positional" in out.stderr
