"""Replica vs reference: the agreement rule on claims with known answers."""

import json

import numpy as np
import pytest

from repdef_jax.paper import replication
from repdef_jax.paper import reproduce
from repdef_jax.paper import tradeoff


def _claim(name, value, low, high, verdict):
  return {"claim": name, "value": value, "low": low, "high": high,
          "verdict": verdict}


def test_verdict_word_drops_the_reason():
  assert replication.verdict_word("did not hold (never unrecognisable)") == (
      "did not hold")
  assert replication.verdict_word("inconclusive") == "inconclusive"


@pytest.mark.parametrize("a, b, expected", [
    ((1.0, 0.5, 1.5), (2.0, 1.4, 2.5), True),     # Intervals overlap.
    ((1.0, 0.5, 1.5), (2.0, 1.6, 2.5), False),    # Disjoint.
    ((1.0, 0.5, 1.5), (1.2, None, None), True),   # Value inside.
    ((1.0, 0.5, 1.5), (1.7, None, None), False),  # Value outside.
    ((None, None, None), (None, None, None), None),
])
def test_estimates_overlap(a, b, expected):
  assert replication.estimates_overlap(
      _claim("c", *a, "held"), _claim("c", *b, "held")) is expected


def test_compare_claims_statuses():
  ref = [_claim("same", 1.0, 0.5, 1.5, "held"),
         _claim("flip", 1.0, 0.5, 1.5, "held"),
         _claim("apart", 1.0, 0.9, 1.1, "held"),
         _claim("reason", None, None, None, "inconclusive (a)"),
         _claim("missing", 1.0, 0.5, 1.5, "held")]
  rep = [_claim("same", 1.2, 0.8, 1.6, "held"),
         _claim("flip", 1.2, 0.8, 1.6, "inconclusive"),
         _claim("apart", 2.0, 1.9, 2.1, "held"),
         _claim("reason", None, None, None, "inconclusive (b)"),
         _claim("new", 1.0, 0.5, 1.5, "held")]
  status = {r["claim"]: r["status"]
            for r in replication.compare_claims(ref, rep)}
  assert status == {"same": "replicates", "flip": "verdict differs",
                    "apart": "estimates differ", "reason": "replicates",
                    "missing": "not replicated", "new": "only in the replica"}


def _tradeoff_result(seeds, recorded=None):
  panel = {} if recorded is None else {"attacked_images": recorded}
  return {"config": {"seeds": list(seeds), "num_images": 4},
          "claims": [_claim("c", 1.0, 0.5, 1.5, "held")],
          "panels": {"p": panel}}


def test_compare_counts_images_attacked_by_both():
  # The reference predates recorded indices: they are recomputed from its
  # seeds; the replica shares exactly two of them.
  ref_ids = tradeoff.attacked_indices(0, 4, replication.REAL_TEST_SIZE)
  assert len(set(ref_ids.tolist())) == 4
  shared = [int(ref_ids[0]), int(ref_ids[3])]
  fresh = [i for i in range(20) if i not in ref_ids][:2]
  result = replication.compare(
      {"tradeoff": _tradeoff_result([0])},
      {"tradeoff": _tradeoff_result([9], {"9": shared + fresh})})
  assert result["shared_images"] == {"p": 2}
  assert result["attacked_images"] == {"p": 4}
  assert result["seeds"] == {"tradeoff": ([0], [9])}
  assert result["counts"] == {"replicates": 1}
  text = replication.render(result, "ref")
  assert "4 attacked test images, 2 shared with the reference" in text


def test_attacked_indices_differ_between_seeds():
  a = tradeoff.attacked_indices(0, 8, 10_000)
  b = tradeoff.attacked_indices(1, 8, 10_000)
  assert len(np.unique(a)) == 8 and not np.array_equal(a, b)
  np.testing.assert_array_equal(a, tradeoff.attacked_indices(0, 8, 10_000))


def test_load_reference_without_results_is_a_one_line_error(tmp_path):
  with pytest.raises(ValueError, match="compare_with="):
    replication.load_reference(str(tmp_path))


@pytest.mark.parametrize("seeds, expected", [
    ("100,101, 102", (100, 101, 102)), ("", ()), ((3,), (3,))])
def test_parse_seeds(seeds, expected):
  assert reproduce.parse_seeds(seeds) == expected


@pytest.mark.parametrize("seeds", ["a,b", "1,1", "-2"])
def test_parse_seeds_rejects(seeds):
  with pytest.raises(ValueError, match="seeds must be"):
    reproduce.parse_seeds(seeds)


def test_part_args_pass_the_seeds_as_a_tuple():
  args = reproduce.part_args("visual", "medium", "w", None, (100, 101))
  assert args[-1] == "--config.seeds=(100,101,)"
  assert "--config.seeds" not in " ".join(
      reproduce.part_args("visual", "medium", "w", None))


def test_readme_block_counts_and_lists_what_differs(tmp_path):
  ref = {"tradeoff": _tradeoff_result([0])}
  rep = {"tradeoff": _tradeoff_result([9], {"9": [1, 2, 3, 4]})}
  rep["tradeoff"]["claims"][0].update(verdict="did not hold", low=0.1,
                                      high=0.2, value=0.15)
  ref["visual"] = {"claims": [_claim("v", 1.0, 0.5, 1.5, "held")]}
  for run in (ref, rep):
    run["tradeoff"]["claims"].append(_claim("r", None, None, None,
                                            "inconclusive (why)"))
  result = replication.compare(ref, rep)
  dest = tmp_path / "replica"
  dest.mkdir()
  (dest / replication.JSON_FILE).write_text(json.dumps(result))
  readme = tmp_path / "README.md"
  readme.write_text(f"top\n{replication.README_BEGIN}\nPLACEHOLDER\n"
                    f"{replication.README_END}\nbottom\n")
  assert replication.update_readme(str(readme), str(dest))
  text = readme.read_text()
  assert text.startswith("top\n") and text.endswith("bottom\n")
  assert "PLACEHOLDER" not in text
  assert ("Of the 2 claims the replica ran, 1 replicate (1 of them by "
          "verdict alone: neither run has an estimate), 1 give another "
          "verdict") in text
  assert ("1 claims the replica did not run (parts or panels it lacks) are "
          "not replicated") in text
  assert "| c | held | did not hold | verdict differs |" in text
  readme.write_text("no markers\n")
  with pytest.raises(ValueError, match="replication:begin"):
    replication.update_readme(str(readme), str(dest))
