"""Does a claim's verdict survive new images and seeds? Replica vs reference.

A replica is the same protocol (preset, parts) run with other seeds: other
federated partitions, initialisations, client draws, attack starts and
attacked test images (``python -m experiments.reproduce --seeds=...
--compare_with=docs/results``). Each claim of the replica is matched by name
to the reference run's and compared by the rule of docs/evaluation.md
("Replication"), fixed before the first replica ran:

* the verdicts agree: same verdict word ('held', 'did not hold',
  'inconclusive', 'reported'; the reason in parentheses is not compared);
* the estimates agree: the two 95 % intervals overlap (where one run has no
  interval, its value must lie in the other's; where neither has a value,
  there is nothing to compare).

A claim replicates when both hold. Claims of parts the replica did not run
are listed as not replicated, never as agreeing.
"""

from __future__ import annotations

import os
from typing import Any

from repdef_jax import storage
from repdef_jax.paper import report
from repdef_jax.paper import tradeoff

JSON_FILE = "replication.json"
REPORT_FILE = "REPLICATION.md"
# Size of the real MNIST and CIFAR-10 test splits: recomputes the attacked
# images of a reference trade-off run that predates their recording.
REAL_TEST_SIZE = 10_000


def verdict_word(verdict: str | None) -> str | None:
  """'held' / 'did not hold' / 'inconclusive' / 'reported' (no reason)."""
  return None if verdict is None else verdict.split(" (")[0].strip()


def _interval(c: dict[str, Any]) -> tuple[float, float] | None:
  if c.get("low") is None or c.get("high") is None:
    return None
  return float(c["low"]), float(c["high"])


def estimates_overlap(a: dict[str, Any], b: dict[str, Any]) -> bool | None:
  """Whether two claims' estimates agree (module docstring); None: neither
  has a value to compare."""
  ia, ib = _interval(a), _interval(b)
  if ia and ib:
    return ia[0] <= ib[1] and ib[0] <= ia[1]
  for interval, other in ((ia, b), (ib, a)):
    if interval and other.get("value") is not None:
      return interval[0] <= float(other["value"]) <= interval[1]
  if a.get("value") is not None and b.get("value") is not None:
    return float(a["value"]) == float(b["value"])
  return None


def compare_claims(reference: list[dict[str, Any]],
                   replica: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per reference claim (then replica-only claims), with status
  'replicates', 'verdict differs', 'estimates differ' or 'not replicated'."""
  by_name = {c["claim"]: c for c in replica}
  rows = []
  for ref in reference:
    rep = by_name.pop(ref["claim"], None)
    row = {"claim": ref["claim"], "reference": ref, "replica": rep}
    if rep is None:
      row.update(same_verdict=None, overlap=None, status="not replicated")
    else:
      same = verdict_word(ref["verdict"]) == verdict_word(rep["verdict"])
      overlap = estimates_overlap(ref, rep)
      status = ("verdict differs" if not same else
                "estimates differ" if overlap is False else "replicates")
      row.update(same_verdict=same, overlap=overlap, status=status)
    rows.append(row)
  rows += [{"claim": name, "reference": None, "replica": rep,
            "same_verdict": None, "overlap": None,
            "status": "only in the replica"} for name, rep in by_name.items()]
  return rows


def _attacked(part: dict[str, Any]) -> dict[str, set[int]]:
  """Per trade-off panel, every test index attacked (any seed)."""
  out = {}
  for name, panel in part.get("panels", {}).items():
    recorded = panel.get("attacked_images")
    if recorded is None:  # A run from before the indices were recorded.
      recorded = {s: tradeoff.attacked_indices(
          int(s), part["config"]["num_images"], REAL_TEST_SIZE).tolist()
                  for s in part["config"]["seeds"]}
    out[name] = {int(i) for ids in recorded.values() for i in ids}
  return out


def compare(reference: dict[str, dict | None],
            replica: dict[str, dict | None]) -> dict[str, Any]:
  """Compares two runs' results (``{part: result}``, as
  :func:`repdef_jax.paper.report.collect` reads them).

  Returns:
    ``{'rows', 'counts' {status: n}, 'seeds' {part: (reference, replica)},
    'shared_images' {panel: n attacked by both}, 'attacked_images' {panel:
    n attacked by the replica}}``.
  """
  rows = compare_claims(report.all_claims(reference),
                        report.all_claims(replica))
  counts = {}
  for r in rows:
    counts[r["status"]] = counts.get(r["status"], 0) + 1
  seeds = {part: (list(reference[part]["config"].get("seeds", [])),
                  list(res["config"].get("seeds", [])))
           for part, res in replica.items()
           if res and reference.get(part) and "config" in res}
  shared, attacked = {}, {}
  if reference.get("tradeoff") and replica.get("tradeoff"):
    ref_ids = _attacked(reference["tradeoff"])
    for name, ids in _attacked(replica["tradeoff"]).items():
      attacked[name] = len(ids)
      shared[name] = len(ids & ref_ids.get(name, set()))
  return {"rows": rows, "counts": counts, "seeds": seeds,
          "shared_images": shared, "attacked_images": attacked}


def render(result: dict[str, Any], reference_dir: str) -> str:
  """REPLICATION.md: the rule, the counts and one row per claim."""
  iv = lambda c: ("n/a" if c is None else report.fmt_interval(  # noqa: E731
      c.get("value"), c.get("low"), c.get("high")))
  lines = [
      "# Replication on unseen seeds and images", "",
      f"Reference: `{reference_dir}`. Rule (docs/evaluation.md, "
      "Replication): a claim replicates when both runs give the same "
      "verdict and their 95 % intervals overlap.", ""]
  for part, (ref, rep) in result["seeds"].items():
    lines.append(f"- {part}: reference seeds {ref}, replica seeds {rep}")
  for name, n in result["attacked_images"].items():
    lines.append(f"- {name}: the replica attacks {n} test images, "
                 f"{result['shared_images'][name]} of them attacked by the "
                 "reference too")
  lines += ["", "Counts: " + ", ".join(
      f"{k} {v}" for k, v in sorted(result["counts"].items())), ""]
  lines += report.table(
      ["claim", "reference", "verdict", "replica", "verdict", "status"],
      [[r["claim"], iv(r["reference"]),
        (r["reference"] or {}).get("verdict", "n/a"), iv(r["replica"]),
        (r["replica"] or {}).get("verdict", "n/a"), r["status"]]
       for r in result["rows"]])
  return "\n".join(lines) + "\n"


def load_reference(reference_dir: str) -> dict[str, dict | None]:
  """The reference run's results (``{part: result}``).

  Raises:
    ValueError: ``reference_dir`` holds no part's results.
  """
  reference = report.collect(reference_dir)
  if not any(reference.values()):
    raise ValueError(f"compare_with={reference_dir!r} holds no results; "
                     "give a folder written by --publish (e.g. docs/results).")
  return reference


def write(reference_dir: str, replica_dir: str,
          dest: str | None = None) -> dict[str, Any]:
  """Compares the results in ``replica_dir`` with ``reference_dir`` and
  writes ``replication.json`` and ``REPLICATION.md`` to ``dest`` (default
  ``replica_dir``).

  Raises:
    ValueError: as :func:`load_reference`.
  """
  result = compare(load_reference(reference_dir),
                   report.collect(replica_dir))
  dest = dest or replica_dir
  storage.write_json(os.path.join(dest, JSON_FILE), result)
  storage.write_bytes(os.path.join(dest, REPORT_FILE),
                      render(result, reference_dir).encode())
  return result
