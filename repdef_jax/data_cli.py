"""``repdef-data``: download, verify and cache datasets; rebuild the sample.

``repdef-data prepare mnist cifar10`` (or ``python -m repdef_jax.data_cli``)
fetches the original archives (:mod:`repdef_jax.download`) into the cache
that :func:`repdef_jax.data.load` reads; ``repdef-data sample`` rebuilds the
embedded sample from prepared TFDS copies. See ``docs/data.md``.
"""

from __future__ import annotations

import argparse
import os
import sys

from repdef_jax import data
from repdef_jax import download


def main(argv: list[str] | None = None) -> int:
  """``repdef-data``: prepare datasets (``python -m repdef_jax.data_cli``)."""
  parser = argparse.ArgumentParser(
      prog="repdef-data", description="Datasets of repdef_jax (docs/data.md).")
  commands = parser.add_subparsers(dest="command", required=True)
  prepare = commands.add_parser(
      "prepare", help="download, verify and cache the original archives")
  names = sorted(download.ORIGINS)
  prepare.add_argument("names", nargs="+", choices=names, metavar="NAME",
                       help=f"one of {names}")
  prepare.add_argument("--mirror", help="mirror root URL or local folder "
                       f"(${download.MIRROR_ENV})")
  prepare.add_argument("--checksums", help="sha256sum-style file for a "
                       f"mirror's own files (${download.CHECKSUMS_ENV})")
  prepare.add_argument("--cache_dir", help="default $REPDEF_JAX_CACHE or "
                       "~/.cache/repdef_jax")
  prepare.add_argument(
      "--timeout", type=float,
      help=f"seconds per blocking read (${download.TIMEOUT_ENV})")
  sample = commands.add_parser(
      "sample", help="(maintainers) rebuild the embedded sample")
  sample.add_argument("--data_dir", required=True,
                      help="folder of prepared TFDS datasets")
  sample.add_argument("--out_dir", default=os.path.join(
      os.path.dirname(os.path.abspath(__file__)), "sample_data"))
  args = parser.parse_args(argv)

  if args.command == "sample":
    try:
      paths = data.write_sample(args.data_dir, args.out_dir)
    except (OSError, ValueError) as error:
      print(f"repdef-data: sample: {error}", file=sys.stderr)
      return 1
    for name, path in paths.items():
      print(f"{name}: {path} ({os.path.getsize(path)} bytes)")
    return 0
  status = 0
  for name in args.names:
    try:
      paths = data.prepare(name, cache_dir=args.cache_dir, mirror=args.mirror,
                           checksums=args.checksums, timeout=args.timeout)
    except (OSError, ValueError) as error:
      print(f"repdef-data: {name}: {error}", file=sys.stderr)
      status = 1
      continue
    print(f"{name}: ready ({', '.join(sorted(paths))}) in "
          f"{os.path.dirname(next(iter(paths.values())))}")
  return status


if __name__ == "__main__":
  raise SystemExit(main())
