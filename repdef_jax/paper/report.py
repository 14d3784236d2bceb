"""REPORT.md from the experiments' result JSONs: ours beside the paper's.

:func:`collect` reads what each experiment wrote under one workdir (one
sub-folder per part, as ``experiments/reproduce.py`` lays it out);
:func:`render` turns those dicts into markdown with every figure and table,
each of our numbers beside the paper's (labelled "paper"), the pixel space of
every metric, the commands, seeds and wall times; :func:`write_report`
writes it atomically. Missing parts are listed as "not run" rather than
failing, so a partial run still gets a report.

Reference: Sun et al., "Provable Defense against Privacy Leakage in Federated
Learning from Representation Perspective", CVPR 2021, arXiv 2012.06043.
"""

from __future__ import annotations

import math
import os
from typing import Any

from repdef_jax import storage

# part name -> (result file, figures) inside workdir/<part>/.
PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "tradeoff": ("tradeoff.json", ("tradeoff.png", "tradeoff_raw_mse.png")),
    "repinfer": ("repinfer.json", ("repinfer.png",)),
    "visual": ("visual.json", ("visual.png",)),
    "convergence": ("curves.json", ("loss_vs_round.png",)),
    "certified": ("certified.json", ("certified.png",)),
    "adaptive": ("adaptive.json", ("adaptive.png",)),
}

PAPER = {
    "ratio": ">160x higher MSE than the baselines at no accuracy cost (DLG "
             "and GS, MNIST and CIFAR-10)",
    "threshold": "at the human-unrecognisable threshold Soteria loses no "
                 "accuracy; baselines lose up to 6 % (DLG) and 9 % (GS)",
    "holds": "accuracy holds until MSE 0.8",
    "visual": "GS on CIFAR-10: unrecognisable after Soteria prunes 50-60 % of "
              "the FC layer; GC still recognisable after pruning 80 % of the "
              "whole model",
    "correlation": "correlation of inferred and true representations up to "
                   "0.99, > 0.8 in almost all settings",
    "reconstruction": "reconstruction from inferred representations works as "
                      "well as from the whole gradient; conv-layer gradients "
                      "alone fail",
    "convergence": "LR + FedAvg with the defense converges",
    "certified": "Theorem 1 certifies a lower bound on ||X - X'||; the paper "
                 "gives no numbers",
    "adaptive": "not in the paper (later work broke Soteria with adaptive "
                "attacks)",
}


def collect(workdir: str) -> dict[str, dict | None]:
  """``{part: result dict or None}`` for every part in :data:`PARTS`."""
  return {part: storage.read_json(os.path.join(workdir, part, fname))
          for part, (fname, _) in PARTS.items()}


def _f(v: Any, digits: int = 3) -> str:
  if v is None:
    return "n/a"
  if isinstance(v, str):
    return v
  if isinstance(v, bool):
    return str(v)
  try:
    x = float(v)
  except (TypeError, ValueError):
    return str(v)
  if math.isnan(x):
    return "nan"
  if math.isinf(x):
    return "inf"
  if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
    return f"{x:.{digits - 1}e}"
  return f"{x:.{digits}g}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
  out = ["| " + " | ".join(header) + " |",
         "|" + "|".join("---" for _ in header) + "|"]
  out += ["| " + " | ".join(_f(c) for c in r) + " |" for r in rows]
  return out + [""]


def _figures(part: str, workdir: str, report_dir: str) -> list[str]:
  out = []
  for fig in PARTS[part][1]:
    path = os.path.join(workdir, part, fig)
    if os.path.exists(path):
      rel = os.path.relpath(path, report_dir)
      out += [f"![{part}: {fig}]({rel})", ""]
  return out


def _tradeoff(res: dict) -> list[str]:
  lines = [f"Pixel space: {res['pixel_space']}. Definitions:", ""]
  lines += [f"- **{k}**: {v}" for k, v in res["definitions"].items()]
  lines.append("")
  claims = []
  for key, panel in res["panels"].items():
    lines += [f"### {key}", ""]
    rows = []
    for name, pts in panel["curves"].items():
      for p in sorted(pts, key=lambda p: float(p["strength"])):
        rows.append([name, p["strength"], p["accuracy"], p["mse"],
                     p["mse_clamped"], p["ssim"]])
    lines += _table(["defense", "strength", "accuracy", "MSE raw [0,1]",
                     "MSE clamped [0,1]", "SSIM"], rows)
    for b, r in panel["ratios"].items():
      claims.append([f"{key}: Soteria / {b} MSE at equal accuracy (max; "
                     "median)",
                     f"{_f(r['mse']['max'])}x; {_f(r['mse']['median'])}x raw, "
                     f"{_f(r['mse_clamped']['max'])}x; "
                     f"{_f(r['mse_clamped']['median'])}x clamped",
                     "> 160x"])
    for d, u in panel["unrecognisable"].items():
      paper = "0 (no drop)" if d == "soteria" else (
          "up to 0.06 (DLG)" if "dlg" in key else "up to 0.09 (GS)")
      if not u["reached"]:
        ours = "not reached in the sweep"
      elif u["strength"] == 0:
        ours = "n/a: unrecognisable even undefended (the attack fails)"
      else:
        ours = f"{_f(u['accuracy_drop'])} at strength {_f(u['strength'])}"
      claims.append([f"{key}: accuracy drop of {d} at the unrecognisable "
                     "threshold", ours, paper])
    sot = panel["curves"].get("soteria", [])
    base = [p for p in sot if float(p["strength"]) == 0]
    if sot and base:
      tol = res["config"].get("equal_accuracy_tol", 0.01)
      ok = [float(p["mse"]) for p in sot
            if p["accuracy"] >= base[0]["accuracy"] - tol]
      claims.append([f"{key}: largest Soteria raw MSE with accuracy within "
                     f"{tol} of undefended", _f(max(ok)) if ok else "n/a",
                     "0.8 (accuracy holds until MSE 0.8)"])
  lines += ["### Claims", ""]
  lines += _table(["claim", "ours", "paper"], claims)
  return lines


def _repinfer(res: dict) -> list[str]:
  inf = res["inference"]
  lines = ["Correlation (Pearson) of inferred vs true class-mean "
           "representation, per FC layer input (representation space):", ""]
  rows = [[layer, s["mean"], s["median"], s["max"], s["min"],
           s["frac_above_0.8"], s["n"]]
          for layer, s in inf["correlation_summary"].items()]
  lines += _table(["layer", "mean", "median", "max", "min", "frac > 0.8",
                   "n"], rows)
  best = max(s["max"] for s in inf["correlation_summary"].values())
  frac = min(s["frac_above_0.8"] for s in inf["correlation_summary"].values())
  claims = [["max correlation", best, "up to 0.99"],
            ["fraction of (device, class) above 0.8 (worst layer)", frac,
             "> 0.8 in almost all settings"]]
  if "reconstruction" in res:
    rec = res["reconstruction"]
    lines += [f"Reconstruction on the leakage model, pixel space "
              f"{rec['pixel_space']}:", ""]
    lines += _table(["source", "MSE", "PSNR (dB)"],
                    [[k, v["mse"], v["psnr"]]
                     for k, v in rec["summary"].items()])
    s = rec["summary"]
    claims.append(["MSE from inferred representation / whole gradient / "
                   "conv gradients only",
                   " / ".join(_f(s[k]["mse"]) for k in
                              ("representation", "gradient", "conv_gradient")
                              if k in s),
                   "inferred ~ whole gradient; conv alone fails"])
  lines += ["Claims:", ""] + _table(["claim", "ours", "paper"], claims)
  return lines


def _visual(res: dict) -> list[str]:
  cfg = res["config"]
  lines = [f"{cfg['attack']} on {cfg['model']}/{cfg['dataset']} "
           f"({res.get('image_source', '?')} images); metrics on [0,1] "
           "images (SSIM, MSE clamped).", ""]
  rows = []
  for s in res["settings"]:
    ims = s["images"]
    rows.append([s["defense"], s["strength"],
                 sum(float(m["mse"]) for m in ims) / len(ims),
                 sum(m["mse_clamped"] for m in ims) / len(ims),
                 sum(m["ssim"] for m in ims) / len(ims)])
  lines += _table(["defense", "strength", "MSE raw", "MSE clamped", "SSIM"],
                  rows)
  return lines


def _convergence(res: dict) -> list[str]:
  rows = []
  for name, c in res["curves"].items():
    gl = c["global_loss"]
    rows.append([name, c["defense"], len(gl), gl[0] if gl else None,
                 gl[-1] if gl else None,
                 c["test_accuracy"][-1] if c["test_accuracy"] else None])
  lines = ["Global objective F(w) (l2 term included) of logistic regression "
           "on non-IID MNIST, [0,1] pixels.", ""]
  lines += _table(["setting", "defense", "rounds", "F(w) round 1",
                   "F(w) last", "test accuracy last"], rows)
  if any(r[2] < 2 for r in rows):
    verdict = "n/a (fewer than 2 rounds)"
  elif all(r[4] < r[3] for r in rows):
    verdict = "every curve decreases"
  else:
    verdict = "NOT every curve decreases: " + ", ".join(
        r[0] for r in rows if not r[4] < r[3])
  lines += _table(["claim", "ours", "paper"],
                  [["defended LR+FedAvg converges", verdict, "converges"]])
  return lines


def _certified(res: dict) -> list[str]:
  attacks = res["config"]["attacks"]
  rows = [[c["rate"], c["certified_bound"]] +
          [c[f"{a}_distance"] for a in attacks] for c in res["rates"]]
  lines = [f"Pixel space: {res['pixel_space']}.", ""]
  lines += _table(["pruning rate (%)", "Theorem 1 bound"] +
                  [f"{a} ||X - X'||" for a in attacks], rows)
  lines += ["Fraction of (image, rate) pairs with the attack's distance at "
            "or above the bound: " + ", ".join(
                f"{a} {_f(v)}" for a, v in
                res["fraction_attack_distance_above_bound"].items()), ""]
  return lines


def _adaptive(res: dict) -> list[str]:
  rows = [[c["model"], c["stage"], c["variant"], c["rate"], c["attack"],
           c["mse"], c["mse_clamped"], c["ssim"],
           c.get("defense/effective_pruned_fraction"), c["verdict"]]
          for c in res["cells"]]
  lines = [f"Pixel space {res['pixel_space']}; {res['verdict_rule']}.", ""]
  lines += _table(["model", "stage", "variant", "rate", "attack", "MSE raw",
                   "MSE clamped", "SSIM", "effective pruned", "verdict"],
                  rows)
  fails = [c for c in res["cells"] if c["verdict"] == "fails"]
  holds = [c for c in res["cells"] if c["verdict"] == "holds"]
  lines += [f"The defense holds in {len(holds)} and fails in {len(fails)} "
            "defended cells" + (": it fails against " + ", ".join(sorted(
                {c['attack'] for c in fails})) if fails else "") + ".", ""]
  return lines


_SECTIONS = (
    ("tradeoff", "Utility-privacy trade-off (Section 6)", _tradeoff),
    ("visual", "Visual comparison (Section 6)", _visual),
    ("repinfer", "Representation leakage (Section 3)", _repinfer),
    ("convergence", "Convergence of defended FedAvg (Section 5)",
     _convergence),
    ("certified", "Certified bound (Theorem 1)", _certified),
    ("adaptive", "Beyond the paper: adaptive attacks", _adaptive),
)


def render(results: dict[str, dict | None], *, workdir: str,
           report_dir: str, runs: dict[str, dict] | None = None,
           preset: str = "", title: str = "repdef_jax: reproduction report"
           ) -> str:
  """Markdown for the given results.

  Args:
    results: ``{part: result dict or None}`` (e.g. from :func:`collect`).
    workdir: where the parts' folders (and figures) are.
    report_dir: the folder the report will live in (figure links are
      relative to it).
    runs: ``{part: {'command', 'seconds', 'status'}}`` from the runner.
    preset: the preset name, for the header.
    title: the first heading.

  Returns:
    The markdown text.
  """
  runs = runs or {}
  lines = [f"# {title}", ""]
  lines += [f"Preset: `{preset or '?'}`. Paper: Sun et al., CVPR 2021 "
            "(arXiv 2012.06043). Numbers labelled **paper** are the paper's; "
            "every other number was measured by this run.", ""]
  total = sum(float(r.get("seconds") or 0) for r in runs.values())
  rows = []
  for part in PARTS:
    r = runs.get(part, {})
    res = results.get(part) or {}
    seed = (res.get("config") or {}).get("seed")
    if seed is None and isinstance(res.get("base"), dict):
      seed = res["base"].get("seed")
    status = r.get("status") or ("done" if results.get(part) else "not run")
    rows.append([part, f"`{r['command']}`" if r.get("command") else "n/a",
                 seed, r.get("seconds"), status])
  lines += ["## Runs", ""]
  lines += _table(["part", "command", "seed", "wall time (s)", "status"],
                  rows)
  lines += [f"Total wall time: {total:.0f} s.", ""]
  for part, heading, fn in _SECTIONS:
    lines += [f"## {heading}", "", f"**paper**: {PAPER.get(part, '')}"
              if part in PAPER else "", ""]
    if part == "tradeoff":
      lines[-2] = (f"**paper**: {PAPER['ratio']}; {PAPER['threshold']}; "
                   f"{PAPER['holds']}")
    if part == "repinfer":
      lines[-2] = (f"**paper**: {PAPER['correlation']}; "
                   f"{PAPER['reconstruction']}")
    res = results.get(part)
    if not res:
      lines += ["Not run.", ""]
      continue
    try:
      lines += fn(res)
    except (KeyError, TypeError, ValueError) as e:
      lines += [f"Could not summarise this part ({type(e).__name__}: {e}).",
                ""]
    lines += _figures(part, workdir, report_dir)
  return "\n".join(lines).rstrip() + "\n"


def write_report(workdir: str, path: str | None = None, *,
                 runs: dict[str, dict] | None = None,
                 preset: str = "") -> str:
  """Collects the parts under ``workdir`` and writes the report atomically.

  Args:
    workdir: the reproduction workdir (one folder per part).
    path: output file; default ``workdir/REPORT.md``.
    runs: the runner's per-part command, wall time and status.
    preset: the preset name.

  Returns:
    The path written.
  """
  path = path or os.path.join(workdir, "REPORT.md")
  text = render(collect(workdir), workdir=workdir,
                report_dir=os.path.dirname(os.path.abspath(path)),
                runs=runs, preset=preset)
  storage.write_text(path, text)
  return path
