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
    ((1.0, 0.5, 1.5), (None, None, None), None),  # One side: nothing.
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
  # The replica shares exactly two of the reference's four images.
  ref_ids = [5, 17, 42, 99]
  shared = [ref_ids[0], ref_ids[3]]
  fresh = [1, 2]
  result = replication.compare(
      {"tradeoff": _tradeoff_result([0], {"0": ref_ids})},
      {"tradeoff": _tradeoff_result([9], {"9": shared + fresh})})
  assert result["shared_images"] == {"p": 2}
  assert result["attacked_images"] == {"p": 4}
  assert result["seeds"] == {"tradeoff": ([0], [9])}
  assert result["counts"] == {"replicates": 1}
  text = replication.render(result, "ref")
  assert "4 attacked test images, 2 shared with the reference" in text
  assert text.startswith("# Replication on unseen seeds and images\n")
  # The same seeds and images check reproduction, not replication, and say
  # so.
  rerun = replication.render(replication.compare(
      {"tradeoff": _tradeoff_result([0], {"0": ref_ids})},
      {"tradeoff": _tradeoff_result([0], {"0": ref_ids})}), "ref")
  assert rerun.startswith("# Rerun with the reference's seeds\n")
  assert "not that its verdicts hold on unseen data" in rerun
  # Same seeds but other images (another key scheme): said, not a rerun.
  other = replication.render(replication.compare(
      {"tradeoff": _tradeoff_result([0], {"0": ref_ids})},
      {"tradeoff": _tradeoff_result([0], {"0": shared + fresh})}), "ref")
  assert other.startswith("# Same seeds, other images\n")
  assert "do not hinge on which images were drawn" in other
  # Same seeds and scheme, more images per seed in the replica: its draw
  # contains the reference's, so it is a rerun.
  more = replication.compare(
      {"tradeoff": _tradeoff_result([0], {"0": ref_ids})},
      {"tradeoff": _tradeoff_result([0], {"0": ref_ids + fresh})})
  assert more["reference_images"] == {"p": 4}
  assert replication.render(more, "ref").startswith(
      "# Rerun with the reference's seeds\n")


def test_images_a_run_did_not_record_are_not_guessed():
  """A run from before the attacked indices were recorded drew them with an
  older key scheme: the comparison says they are unknown instead of
  recomputing them with today's keys."""
  result = replication.compare(
      {"tradeoff": _tradeoff_result([0])},
      {"tradeoff": _tradeoff_result([9], {"9": [1, 2, 3, 4]})})
  assert result["shared_images"] == {"p": None}
  assert result["attacked_images"] == {"p": 4}
  text = replication.render(result, "ref")
  assert "- p: attacked test images not recorded by one of the runs" in text
  assert text.startswith("# Replication on unseen seeds and images\n")
  # With the same seeds it does not claim the same images either.
  same = replication.render(replication.compare(
      {"tradeoff": _tradeoff_result([0])},
      {"tradeoff": _tradeoff_result([0], {"0": [1, 2, 3, 4]})}), "ref")
  assert "the same partitions, inits and images" not in same
  assert "whether they are the same is not known" in same


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
          "verdict alone: one run or both have no estimate), 1 give another "
          "verdict") in text
  assert ("1 claims the replica did not run (parts or panels it lacks) are "
          "not replicated") in text
  assert "| c | held | did not hold | verdict differs |" in text
  readme.write_text("no markers\n")
  with pytest.raises(ValueError, match="replication:begin"):
    replication.update_readme(str(readme), str(dest))


def test_estimates_overlap_at_the_boundaries_and_from_either_side():
  """The rule of the module docstring, case by case (hand-worked)."""
  cases = [
      # Intervals that share one end point overlap.
      ((1.0, 0.5, 1.5), (2.0, 1.5, 2.5), True),
      ((2.0, 1.5, 2.5), (1.0, 0.5, 1.5), True),
      # A value on an end point of the other's interval lies in it.
      ((1.0, 0.5, 1.5), (1.5, None, None), True),
      ((1.0, 0.5, 1.5), (0.5, None, None), True),
      # Only the second run has an interval: its value must lie in it.
      ((1.2, None, None), (1.0, 0.5, 1.5), True),
      ((1.7, None, None), (1.0, 0.5, 1.5), False),
      # Neither has an interval: the values themselves are compared.
      ((1.0, None, None), (1.0, None, None), True),
      ((1.0, None, None), (2.0, None, None), False),
      # One run has nothing to compare.
      ((1.0, None, None), (None, None, None), None),
      ((None, None, None), (1.0, 0.5, 1.5), None),
  ]
  for a, b, expected in cases:
    got = replication.estimates_overlap(_claim("c", *a, "held"),
                                        _claim("c", *b, "held"))
    assert got is expected, (a, b, got)


def test_compare_takes_every_seed_of_both_runs_attacked_images():
  # Recorded indices of two seeds on each side: the union per run.
  ref = {"tradeoff": _tradeoff_result([0, 1], {"0": [1, 2], "1": [3, 4]})}
  rep = {"tradeoff": _tradeoff_result([9, 10], {"9": [2, 5], "10": [4, 6]})}
  result = replication.compare(ref, rep)
  assert result["attacked_images"] == {"p": 4}  # {2, 4, 5, 6}
  assert result["shared_images"] == {"p": 2}    # {2, 4}


def test_render_gives_each_claim_both_runs_and_the_overlap():
  """One row per claim: reference then replica, each with its verdict, and
  whether the estimates agree (not whether the verdicts do)."""
  ref = {"visual": {"claims": [
      _claim("flip", 1.0, 0.5, 1.5, "held"),
      _claim("word", None, None, None, "inconclusive (a)"),
      _claim("gone", 2.0, 1.0, 3.0, "held")]}}
  rep = {"visual": {"claims": [
      _claim("flip", 1.25, 0.75, 2.0, "did not hold"),
      _claim("word", None, None, None, "inconclusive (b)"),
      _claim("new", 4.0, None, None, "reported")]}}
  text = replication.render(replication.compare(ref, rep), "ref")
  rows = {l.split(" | ")[0][2:]: l for l in text.splitlines()
          if l.startswith("| ") and not l.startswith("| claim")}
  assert rows == {
      "flip": "| flip | 1 [0.5, 1.5] | held | 1.25 [0.75, 2] | did not hold "
              "| yes | verdict differs |",
      "word": "| word | n/a | inconclusive (a) | n/a | inconclusive (b) | n/a "
              "| replicates |",
      "gone": "| gone | 2 [1, 3] | held | n/a | n/a | n/a | not replicated |",
      "new": "| new | n/a | n/a | 4 | reported | n/a | only in the replica |"}
  assert ("Counts: not replicated 1, only in the replica 1, replicates 1, "
          "verdict differs 1") in text


def test_readme_block_counts_only_compared_claims_as_run():
  """The claims compared are those that replicate, differ in verdict or
  differ in estimate; a claim only the replica has is not among them."""
  ref = {"visual": {"claims": [_claim("same", 1.0, 0.5, 1.5, "held"),
                               _claim("flip", 1.0, 0.5, 1.5, "held"),
                               _claim("gone", 1.0, 0.5, 1.5, "held")]}}
  rep = {"visual": {"claims": [_claim("same", 1.0, 0.5, 1.5, "held"),
                               _claim("flip", 1.0, 0.5, 1.5, "did not hold"),
                               _claim("new", 1.0, 0.5, 1.5, "held")]}}
  text = replication.readme_block(replication.compare(ref, rep), "src")
  assert ("Of the 2 claims the replica ran, 1 replicate (0 of them by "
          "verdict alone: one run or both have no estimate), 1 give another "
          "verdict and 0 the same verdict with disjoint intervals; 1 claims "
          "the replica did not run") in text
