"""Installs repdef_jax: the Soteria defense, gradient-inversion attacks and
vectorized FedAvg in JAX."""

import setuptools

INSTALL_REQUIRES = [
    "absl-py>=2.1",
    "array_record>=0.5",
    "chex>=0.1.86",
    "dm-pix>=0.4.3",
    "dp-accounting>=0.4.4",
    "flax>=0.10",
    "importlib_resources>=6.0",
    "jax>=0.4.35",
    "matplotlib>=3.8",
    "ml-collections>=0.1.1",
    "numpy>=1.26",
    "optax>=0.2.4",
    "orbax-checkpoint>=0.11",
    "pillow>=10.0",
    "scipy>=1.11",
    "tensorflow-datasets>=4.9.6",
]

EXTRAS_REQUIRE = {
    "test": [
        "hypothesis>=6.100",
        "ipykernel>=6.29",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "pytest>=8.0",
        "pytest-xdist>=3.5",
        # tests/test_notebooks.py builds the wheel offline
        # (--no-build-isolation): setuptools with its own bdist_wheel.
        "setuptools>=70.1",
        # The Flower integration's tests run in the default suite (about
        # 25 s to install, 15 s to run); without it they were skipped. The
        # version it was written against: InProcessGrid uses Flower
        # internals that a later minor release may move.
        "flwr>=1.42,<1.43",
    ],
    # Optional PyTorch peers for the benchmarks (CPU wheel on these machines).
    # Not in 'test' (gigabytes with CUDA): tests that need it skip without it.
    "torch": ["torch>=2.3"],
    # repdef_jax.integrations.flower and examples/flower_app (Message API).
    "flower": ["flwr>=1.42"],
}

setuptools.setup(
    name="repdef_jax",
    version="0.1.0",
    description=("Provable defense against privacy leakage in federated "
                 "learning from the representation perspective (Soteria), "
                 "its attacks and FedAvg, in JAX."),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # experiments/ (the entry points and their configs) is installed too, so
    # that `python -m experiments.attack` and the console scripts run from
    # any folder.
    packages=setuptools.find_packages(
        include=["repdef_jax", "repdef_jax.*", "experiments",
                 "experiments.*"]),
    package_data={"repdef_jax": ["sample_data/*.npz",
                                 "sample_data/README.md"]},
    entry_points={"console_scripts": [
        "repdef-attack = experiments.console:attack",
        "repdef-reproduce = experiments.console:reproduce",
        "repdef-fedavg = experiments.console:fedavg",
        "repdef-benchmark = experiments.console:benchmark",
        "repdef-data = repdef_jax.data_cli:main",
    ]},
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    license="Apache-2.0",
)
